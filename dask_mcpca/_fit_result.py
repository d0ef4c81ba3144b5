"""A fit's result as a value: the records :mod:`._fit` assembles once, and the model's fields they hold.

:class:`ModelView` is the fitted model as :mod:`._model`'s algebra reads
it while a fit is assembled (:func:`model_view` computes it from the
components, variances and centre; :func:`with_cutoff` gives the same model
with another outlier cutoff); :class:`UpdateSums` the sums kept for
``partial_fit`` (:func:`update_sums`); :class:`FitResult` what a fit or an
update sets: the view, the sums and the fit's counts, each fitted attribute
declared once, built once by :func:`fit_result` and never changed.  All three
are frozen.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from ._block import BlockStats
from ._passes import NumericalRangeError
from ._robust_step import RobustState
from ._schedule import outlier_cutoff_d2

__all__ = ["FitResult", "ModelView", "UpdateSums", "fit_result", "model_view", "update_sums", "with_cutoff"]


@dataclass(frozen=True)
class ModelView:
    """The model as :mod:`._model`'s algebra reads it while a fit is assembled, built once as a value.

    The centre, components, variances and cutoff of a fit, with what its
    distances depend on (``scale_``, ``quantization_steps_``,
    ``saturation_limits_``, ``repeated_*``, ``cell_cutoff_``, ``shift_scale_``); a field left
    None was not set.  The outlier cutoff is calibrated on distances under
    such a view; a new cutoff gives a new view (:func:`with_cutoff`).
    """

    components_: np.ndarray
    mean_: np.ndarray
    explained_variance_: np.ndarray
    explained_variance_ratio_: np.ndarray
    noise_variance_: float
    n_components_: int
    kernel_scale_: float
    sigmas_: np.ndarray
    covariance_: np.ndarray
    repeated_values_: np.ndarray
    repeated_rows_: np.ndarray
    outlier_cutoff_: float
    outlier_threshold_: float
    n_features_in_: int | None = None
    support_: float | None = None
    quantization_steps_: np.ndarray | None = None
    saturation_limits_: np.ndarray | None = None
    scale_: np.ndarray | None = None
    cell_cutoff_: float | None = None
    shift_scale_: np.ndarray | None = None


@dataclass(frozen=True)
class UpdateSums:
    """The sums of every row seen and the state that weighs new rows, kept for ``partial_fit``."""

    update_log_weights_: np.ndarray
    update_means_: np.ndarray
    update_covariances_: np.ndarray
    update_location_: np.ndarray
    update_scatter_: np.ndarray
    update_radii_: np.ndarray
    update_unit_: int
    n_samples_seen_: int


@dataclass(frozen=True)
class FitResult:
    """What a fit or an update sets on the estimator: its model, its kept sums and its counts.

    Built once, at the end of :func:`._fit.fit_rows` or :func:`._update.update_rows`, from
    the :class:`ModelView` (``view``), the :class:`UpdateSums` (``sums``; None: the
    paper's solver keeps none) and the fit's counts (:func:`fit_result`), and never
    changed after.  Each fitted attribute is declared once, in the record that holds
    it; :meth:`fitted_attributes` gives them all by name, and a result reads as the
    model it holds (``result.mean_`` is ``result.view.mean_``; an update sum of a
    result without sums is None).  A field left None was not set by this fit (an
    update keeps ``quantization_steps_`` and ``converged_``; the paper's solver sets
    no ``support_``).  ``robust_state`` and ``robust_unit`` are what a
    ``warm_start`` refit continues from (the default solver's state, in the working
    unit ``2**robust_unit``; None for the state when there is none, None for the
    unit when it is unchanged); ``unconverged`` is the ``ConvergenceWarning``
    message of a fit that stopped before converging, and ``breakdown`` the
    :class:`._cells.BreakdownWarning` message of one that found no clean majority,
    for the estimator to warn once its attributes are set.
    """

    view: ModelView
    sums: UpdateSums | None = None
    n_samples_: int | None = None
    n_samples_partial_: int | None = None
    n_iter_: int | None = None
    converged_: bool | None = None
    n_passes_: int | None = None
    n_partial_reads_: int | None = None
    n_blocks_read_: int | None = None
    robust_state: RobustState | None = None
    robust_unit: int | None = None
    unconverged: str | None = None
    breakdown: str | None = None

    def fitted_attributes(self) -> dict[str, Any]:
        """The fitted attributes this result sets: name -> value (names ending in ``_``, not None)."""
        parts = [self.view, self] if self.sums is None else [self.view, self.sums, self]
        return {f.name: getattr(part, f.name) for part in parts for f in fields(part)
                if f.name.endswith("_") and getattr(part, f.name) is not None}

    def __getattr__(self, name: str) -> Any:
        """A fitted attribute of the model or of the kept sums, read through the result."""
        if name in _VIEW_FIELDS:
            return getattr(self.__dict__["view"], name)
        if name in _SUMS_FIELDS:
            sums = self.__dict__.get("sums")
            return None if sums is None else getattr(sums, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


#: The fields a :class:`FitResult` reads through from its ``view`` and its ``sums``.
_VIEW_FIELDS = frozenset(f.name for f in fields(ModelView))
_SUMS_FIELDS = frozenset(f.name for f in fields(UpdateSums))


def fit_result(view: ModelView, sums: UpdateSums | None = None, **rest: Any) -> FitResult:
    """The one :class:`FitResult` of a fit: the model, the update sums (if any) and the rest by name."""
    return FitResult(view, sums, **rest)


def model_view(components, lam, rest, total, center, kernel_scale, **known: Any) -> ModelView:
    """The model of these components, variances, centre and kernel scale, or a named error.

    The covariance, the variance ratios, the kernel widths ``sigmas_`` and
    the Gaussian outlier cutoff follow; no repeated values or rows.  Fields
    in ``known`` are set as given, over those that follow.
    """
    p = len(center)
    noise_variance = float(rest.mean()) if len(rest) else 0.0
    with np.errstate(over="ignore"):
        C = (components.T * lam) @ components
        if len(rest):
            C += noise_variance * (np.eye(p) - components.T @ components)
    if not (np.all(np.isfinite(C)) and np.isfinite(total)):
        raise NumericalRangeError(
            "the robust covariance of these data overflows float64 (total variance "
            f"{total:.3g}); multiply the data by a power of two such as 2**-100 before fitting: "
            "the components do not change and the variances scale by its square"
        )
    cutoff = outlier_cutoff_d2(p)
    fields_ = {
        "components_": components,
        "mean_": np.asarray(center, dtype=np.float64),
        "explained_variance_": lam,
        "explained_variance_ratio_": lam / total if total > 0 else np.zeros_like(lam),
        "noise_variance_": noise_variance,
        "n_components_": len(lam),
        "kernel_scale_": float(kernel_scale),
        "sigmas_": kernel_scale * np.sqrt(lam),
        "covariance_": C,
        "repeated_values_": np.empty((0, 2)),
        "repeated_rows_": np.empty((0, p)),
        "outlier_cutoff_": float(cutoff),
        "outlier_threshold_": _threshold(cutoff, kernel_scale),
    }
    return ModelView(**{**fields_, **known})


def _threshold(cutoff: float, kernel_scale: float) -> float:
    """The kernel weight at the outlier cutoff: ``outlier_threshold_``."""
    return float(np.exp(-cutoff / (2 * float(kernel_scale)**2)))


def with_cutoff(view: ModelView, cutoff: float) -> ModelView:
    """The same model with another outlier cutoff (and its threshold)."""
    return replace(view, outlier_cutoff_=float(cutoff), outlier_threshold_=_threshold(cutoff, view.kernel_scale_))


def update_sums(state, sums: BlockStats, unit: int) -> UpdateSums:
    """The core and final kernels' sums of every row seen, and the state that weighs new rows."""
    with np.errstate(divide="ignore"):
        log_weights = np.log(np.asarray(sums.weight, np.float64)) + sums.log_scale
    return UpdateSums(
        update_log_weights_=log_weights,
        update_means_=np.array(sums.mean, np.float64),
        update_covariances_=np.stack([sums.covariance(j) for j in range(2)]),
        update_location_=np.array(state.location, np.float64),
        update_scatter_=np.array(state.scatter, np.float64),
        update_radii_=np.array([state.kernel_size2, state.cutoff, state.final_cutoff], np.float64),
        update_unit_=int(unit),
        n_samples_seen_=int(sums.n_rows),
    )
