"""Parameters changed by ``set_params`` after a fit that the fitted model contradicts: refused by ``save`` and
``partial_fit``.

A fitted model keeps no copy of the parameters it was fitted with; its
attributes tell the ones that define it (:func:`fitted_values`):

- ``scale``: ``scale_`` is set exactly for ``scale="robust"``;
- ``n_components``: ``n_components_``, which is ``n_features_in_`` for None;
- ``solver``: the default solver sets ``support_`` (and the ``update_*``
  sums), the paper's neither;
- ``cellwise``: a cellwise fit sets ``cell_cutoff_``; one with the
  ``update_*`` sums (the default solver) sets it exactly when cellwise;
- ``center``: ``False`` fixes the centre at 0 (``mean_`` is all 0, exactly);
  with the ``update_*`` sums, the model's ``mean_`` is the final kernel's
  weighted mean (``update_means_[1]``) for ``"robust"`` and the fixed
  ``update_location_`` for ``"mean"`` or ``False`` (both, and so either
  value, where the kernels are wide enough to weigh every row alike);
- ``kernel_factor``: ``kernel_scale_`` lies in the range it allows (the
  range :func:`dask_mcpca.load` checks).

A model whose parameters disagree with these would be saved as a file that
``load`` refuses as damaged, or updated by ``partial_fit`` with another
centre or width than it was fitted with; both refuse it instead, in one line
naming each parameter, its value and the fitted one
(:func:`check_fitted_params`).  The parameters that only steer a fit
(``eta``, ``n_decay``, ``tol``, ``max_iter``, ``sample_size``,
``random_state``, ``warm_start``, ``checkpoint``, ``contamination``,
``modes``) may change: they are what a refit uses, and a file records them
as set.  ``nan_policy`` and ``progress`` are read at run time and may change
too; a model with modes hands them to its modes' models
(:meth:`ModesMixin._update_modes`).
"""

from __future__ import annotations

import math

import numpy as np

from ._schedule import robust_kernel_size2

__all__ = ["FIXED_CENTRE_TOL", "changed_params", "check_fitted_params", "fitted_values", "kernel_scale_range"]

#: Largest distance (a share of the largest spread) between ``update_location_`` and ``mean_`` of a fixed centre.
FIXED_CENTRE_TOL = 1e-9


def _fitted_center(model) -> tuple:
    """The ``center`` values the fitted ``model`` allows (see the module docstring)."""
    at_zero = not np.any(model.mean_)
    fixed = (False,) if at_zero else ("mean",)
    if not hasattr(model, "update_location_"):
        return fixed if at_zero else ("robust", "mean")
    unit = int(model.update_unit_)
    spread = float(np.sqrt(np.max(np.diag(model.covariance_)))) or 1.0

    def gives_mean(centre) -> bool:
        return float(np.max(np.abs(np.ldexp(centre, unit) - model.mean_))) <= FIXED_CENTRE_TOL * spread

    # kernels wide enough to weigh every row alike give the robust and the fixed centre alike: both allowed
    allowed = ("robust",) * gives_mean(model.update_means_[1]) + fixed * gives_mean(model.update_location_)
    return allowed or ("robust", "mean", False)  # sums that give no centre are load's to refuse, not ours


def fitted_values(model) -> dict[str, tuple]:
    """The values of the parameters that define the fitted ``model`` which its attributes allow: name -> values.

    ``kernel_factor`` is left out (a range, not values: see :func:`changed_params`).
    """
    sums = hasattr(model, "update_location_")
    solver = ("auto",) if sums or getattr(model, "support_", None) is not None else ("paper",)
    k, p = int(model.n_components_), int(model.n_features_in_)
    cellwise = getattr(model, "cell_cutoff_", None) is not None
    return {
        "scale": ("robust",) if getattr(model, "scale_", None) is not None else (None,),
        "n_components": (k, None) if k == p else (k,),
        "solver": solver,
        "cellwise": (True,) if cellwise else ((False,) if sums else (False, True)),
        "center": _fitted_center(model),
    }


def _same(value, fitted) -> bool:
    """Whether a parameter's ``value`` is the ``fitted`` one (``False`` is not ``0``, ``None`` only ``None``)."""
    if fitted is None or value is None:
        return value is fitted
    if isinstance(fitted, bool) or isinstance(value, (bool, np.bool_)):
        return isinstance(value, (bool, np.bool_)) and isinstance(fitted, bool) and bool(value) == fitted
    return value == fitted


def changed_params(params, model) -> list[str]:
    """``name=value (fitted with ...)`` for each of the estimator ``params``' parameters that the fitted ``model``
    contradicts (the same estimator, or a mode's model for a model with modes)."""
    out = []
    for name, allowed in fitted_values(model).items():
        value = getattr(params, name)
        if not any(_same(value, a) for a in allowed):
            out.append(f"{name}={value!r} (fitted with {' or '.join(map(repr, allowed))})")
    low, high = kernel_scale_range(params, int(model.n_features_in_))
    if not low <= float(model.kernel_scale_) <= high:
        out.append(f"kernel_factor={params.kernel_factor!r} (fitted with another: kernel_scale_ is "
                   f"{float(model.kernel_scale_):.6g})")
    return out


def check_fitted_params(model, action: str) -> None:
    """Refuse, naming them, the parameters of the fitted ``model`` that ``set_params`` changed against the fit.

    Parameters
    ----------
    model : MCPCA
        A fitted estimator; with modes, its parameters are checked against each mode's model.
    action : str
        What is refused, for the message (``"save"``, ``"partial_fit"``).

    Raises
    ------
    ValueError
        In one line: each contradicted parameter, its value and the fitted one.
    """
    models = getattr(model, "mode_models_", None) or [model]
    found = list(dict.fromkeys(text for one in models for text in changed_params(model, one)))
    if found:
        raise ValueError(
            f"{type(model).__name__}.{action}: set_params changed parameter(s) that define the fitted model: "
            f"{', '.join(found)}; set them back, or refit with fit"
        )


def kernel_scale_range(model, p: int) -> tuple[float, float]:
    """Bounds of a fitted ``kernel_scale_``: ``sqrt(c^2)`` of 1..p features, times ``kernel_factor`` or 1
    (what ``load`` accepts, and what a ``kernel_factor`` changed after the fit must still allow)."""
    factor = float(getattr(model, "kernel_factor", 1.0))
    low = math.sqrt(robust_kernel_size2(1)) * min(1.0, factor)
    high = math.sqrt(robust_kernel_size2(p)) * max(1.0, factor)
    return low * (1 - 1e-12), high * (1 + 1e-12)
