"""``MCPCA``'s parameters: their constraints, declared once, and the public check (:func:`check_params`).

:class:`~dask_mcpca.MCPCA` takes :data:`PARAMETER_CONSTRAINTS` as its
``_parameter_constraints`` (scikit-learn's declarative validation);
:func:`check_params` applies them, with the rules between parameters, as
``fit`` does before any data is opened, and gives other callers (the command
line) the same check.
"""

from __future__ import annotations

import os
from numbers import Integral, Real

from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval, Options, StrOptions, validate_parameter_constraints

from ._choices import CENTERS, NAN_POLICIES, SOLVERS
from ._scale import SCALES

__all__ = ["KERNEL_FACTOR_RANGE", "PARAMETER_CONSTRAINTS", "check_params"]

#: Allowed ``kernel_factor``: its square scales kernel sizes and radii, and
#: beyond this range they leave float64's comfortable range (1e200 overflowed
#: in ``kernel_factor**2``) while the fit is long since ordinary PCA (above)
#: or rests on a handful of rows (below).
KERNEL_FACTOR_RANGE = (1e-3, 1e6)

#: ``MCPCA``'s ``_parameter_constraints``: parameter -> the values it accepts.
PARAMETER_CONSTRAINTS: dict = {
    "n_components": [Interval(Integral, 1, None, closed="left"), None],
    "solver": [StrOptions(set(SOLVERS))],
    "center": [StrOptions({c for c in CENTERS if c}), Options(bool, {False})],
    "eta": [Interval(Real, 0, 1, closed="neither")],
    "n_decay": [Interval(Integral, 1, None, closed="left")],
    "kernel_factor": [Interval(Real, KERNEL_FACTOR_RANGE[0], KERNEL_FACTOR_RANGE[1], closed="both")],
    "tol": [Interval(Real, 0, None, closed="neither"), None],
    "max_iter": [Interval(Integral, 1, None, closed="left"), None],
    "nan_policy": [StrOptions(set(NAN_POLICIES))],
    "checkpoint": [str, os.PathLike, None],
    "sample_size": [Interval(Integral, 10, None, closed="left")],
    "random_state": [Interval(Integral, 0, 2**64 - 1, closed="both"), None],
    "progress": ["boolean"],
    "warm_start": ["boolean"],
    "contamination": [StrOptions({"auto"}), Interval(Real, 0, 0.5, closed="right")],
    "cellwise": ["boolean"],
    "scale": [StrOptions({s for s in SCALES if s}), None],
    "modes": [StrOptions({"auto"}), None],
}


def check_params(estimator: BaseEstimator) -> None:
    """Check the parameters of ``estimator`` as :meth:`MCPCA.fit` does first.

    The rules are the declarative ``MCPCA._parameter_constraints``
    (:data:`PARAMETER_CONSTRAINTS`, scikit-learn's mechanism); this is the
    public path to the same check for other callers, such as the command
    line, before any data is opened.

    Parameters
    ----------
    estimator : MCPCA
        The estimator whose constructor parameters are checked.

    Raises
    ------
    sklearn.utils._param_validation.InvalidParameterError
        A subclass of ``ValueError`` and ``TypeError`` whose message names the
        parameter, the expected values and the value given.

    Examples
    --------
    >>> from dask_mcpca import MCPCA, check_params
    >>> check_params(MCPCA(solver="paper"))
    >>> check_params(MCPCA(eta=1.5))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    sklearn.utils._param_validation.InvalidParameterError: The 'eta' parameter of MCPCA must be ... Got 1.5 instead.
    """
    validate_parameter_constraints(
        type(estimator)._parameter_constraints,
        estimator.get_params(deep=False),
        caller_name=type(estimator).__name__,
    )
    if estimator.center == "mean" and (estimator.nan_policy == "partial" or estimator.cellwise):
        what = "nan_policy='partial'" if estimator.nan_policy == "partial" else "cellwise=True"
        raise ValueError(
            f"{type(estimator).__name__}: center='mean' with {what}: the ordinary mean of rows whose cells are "
            "missing or left out is not the mean of the data (it would be the complete rows' mean, biased where "
            "gaps depend on the values); use center='robust' (the default), whose location is estimated with "
            "the gaps under the model"
        )
    if estimator.nan_policy == "partial" and estimator.solver != "auto":
        raise ValueError(
            f"{type(estimator).__name__}: nan_policy='partial' needs solver='auto' (the paper's algorithm "
            f"weighs whole rows); got solver={estimator.solver!r}: use nan_policy='omit' with it"
        )
