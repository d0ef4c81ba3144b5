"""How :meth:`MCPCA.partial_fit` updates a fitted model by new rows in one pass: :func:`update_rows`.

The fit keeps the sums of its last pass (``update_*``, :class:`._fit_result.UpdateSums`); an
update merges the new rows' sums into them (:func:`._robust_warm.update_robust`) and returns a
:class:`._fit_result.FitResult` of the attributes that change.  A sensor stuck since the fit (a run
of one value, read in order; :func:`._stuck.stuck_cells`) gives its rows no weight.
"""

from __future__ import annotations

import warnings
from functools import partial

import numpy as np

from ._block import BlockStats
from ._exceptions import NonFiniteRowsError
from ._fit import variances_in_data_units
from ._fit_result import FitResult, fit_result, model_view, update_sums, with_cutoff
from ._model import CONTEXT_ROWS
from ._passes import PassRunner
from ._power import descending_eigh, orient_rows
from ._robust_step import RobustState
from ._robust_warm import update_robust
from ._stats import PassPlan, merge_moments
from ._stuck import stuck_cells

__all__ = ["UPDATE_ATTRIBUTES", "UPDATE_WARN_SHARE", "update_rows"]

#: Fitted attributes that hold what :meth:`MCPCA.partial_fit` updates from (see its docstring).
UPDATE_ATTRIBUTES = ("update_log_weights_", "update_means_", "update_covariances_", "update_location_",
                     "update_scatter_", "update_radii_", "update_unit_", "n_samples_seen_")

#: ``partial_fit`` warns when the new rows' weighted share under the final kernel is below this:
#: most of them lie beyond it, where they are flagged and barely move the model (a new regime).
UPDATE_WARN_SHARE = 0.5


def _update_state(model) -> RobustState:
    """The robust state kept for :meth:`MCPCA.partial_fit`, in the working unit ``2**update_unit_``."""
    unit = int(model.update_unit_)
    repeated_values = model.repeated_values_.copy()
    repeated_values[:, 1] = np.ldexp(repeated_values[:, 1], -unit)  # exact: a power of two
    steps = np.ldexp(model.quantization_steps_, -unit)
    c2, cutoff, final_cutoff = (float(v) for v in model.update_radii_)
    return RobustState(
        location=model.update_location_.copy(), scatter=model.update_scatter_.copy(), kernel_size2=c2,
        cutoff=cutoff, final_cutoff=final_cutoff, repeated=repeated_values if len(repeated_values) else None,
        repeated_rows=np.ldexp(model.repeated_rows_, -unit) if len(model.repeated_rows_) else None,
        resolution=steps**2 / 12, converged=True,
    )


def _stuck_rows(model, block, before) -> np.ndarray:
    """Rows of ``block`` holding a sensor stuck since the fit (:func:`._stuck.stuck_cells`)."""
    return stuck_cells(model, block, before).any(axis=1)


def _merged_center(X, model, runner: PassRunner, location: np.ndarray) -> np.ndarray | None:
    """The centre an update takes its covariances about: None (the merged weighted means) for
    ``center="robust"``; for ``center="mean"``, the plain mean of every row seen (working units).

    A ``center="mean"`` fit centres on the plain mean of its finite rows (:func:`._fit.robust_stage`),
    kept as ``update_location_`` with their count ``n_samples_seen_``; the new rows' plain mean and
    count are read in a moments pass (every finite row, as the fit's, stuck sensors too) and merged
    with them by the pairwise rule (:func:`._stats.merge_moments`), so that the update's ``mean_``
    is the plain mean of all the rows, as ``fit`` on them sets it.  ``center=False``: the origin.
    """
    if model.center == "robust":
        return None
    if model.center is False:
        return location
    plain = PassRunner(X, nan_policy=model.nan_policy, progress=model.progress)
    plain.scale = runner.scale
    try:
        moments = plain.run(PassPlan(center=np.zeros(len(location))), label="update: mean")
    finally:
        runner.n_passes += plain.n_passes
        runner.n_usable_rows = plain.n_usable_rows
    moments = moments.in_units(int(model.update_unit_))
    _, mean, _ = merge_moments(float(model.n_samples_seen_), location, np.zeros((len(location),) * 2),
                               float(moments.n_rows), moments.mean[0], np.zeros((len(location),) * 2))
    return mean


def update_rows(X, model) -> FitResult | None:
    """An update of the fitted ``model`` by the new rows ``X``, in one pass; see :meth:`MCPCA.partial_fit`.

    Parameters
    ----------
    X : ndarray or dask array of shape (n_samples, n_features_in_)
        The new rows, as full-row blocks.
    model : MCPCA
        A fitted estimator that keeps the ``update_*`` sums; its parameters
        and public fitted attributes are read, never written.

    Returns
    -------
    FitResult or None
        The attributes the update changes (``quantization_steps_``,
        ``converged_`` and ``n_features_in_`` stay as they are); None when
        no row of ``X`` can be used (each holds NaN or inf under
        ``nan_policy="omit"``, or no observed cell under ``"partial"``):
        there is nothing to update.
    """
    unit, k = int(model.update_unit_), model.n_components_
    state = _update_state(model)
    sums = BlockStats(n_rows=int(model.n_samples_seen_), n_nonfinite=0, log_scale=model.update_log_weights_.copy(),
                      weight=np.ones(2), mean=model.update_means_.copy(), scatter=model.update_covariances_.copy())
    # a sensor stuck since the fit (a run of one value, read in order) gets no weight, as is_outlier flags it
    runner = PassRunner(X, nan_policy=model.nan_policy, progress=model.progress,
                        hold_out=partial(_stuck_rows, model), context=CONTEXT_ROWS, keep_bulk=False)  # one pass
    runner.unit_exp = unit
    runner.scale = getattr(model, "scale_", None)  # the fit's scales: the sums are in its units
    runner.cell_cutoff2 = getattr(model, "cell_cutoff_", None)  # a cellwise model judges the new rows' cells
    try:
        fixed = _merged_center(X, model, runner, state.location)
        state, merged, new = update_robust(runner, state, sums, fixed_center=fixed)
    except NonFiniteRowsError:  # nan_policy="raise": its own error
        raise
    except ValueError:
        if runner.n_usable_rows != 0:
            raise
        return None  # no usable row: the caller leaves the model as it is (and warns)
    share = float(new.weight[1] * np.exp(new.log_scale[1]) / max(new.n_rows, 1))
    if share < UPDATE_WARN_SHARE:
        warnings.warn(
            f"MCPCA.partial_fit: most of the {new.n_rows} new rows lie beyond the model's final kernel "
            f"(their weighted share is {share:.1%}): they are flagged as outliers and barely move the "
            "model, which does not follow a change of regime; if the process changed, refit "
            "(fit on the new regime's rows, or warm_start=True and fit on the whole archive)",
            UserWarning,
            stacklevel=3,
        )
    cutoff, repeated_values, repeated_rows = model.outlier_cutoff_, model.repeated_values_, model.repeated_rows_
    lam, V = descending_eigh(state.final_scatter)
    lam = variances_in_data_units(np.maximum(lam, 0.0), unit)
    view = model_view(orient_rows(V[:, :k].T), lam[:k], lam[k:], lam.sum(), np.ldexp(state.final_location, unit),
                       model.kernel_scale_, repeated_values_=repeated_values, repeated_rows_=repeated_rows,
                       support_=state.support)
    return fit_result(
        with_cutoff(view, cutoff), update_sums(state, merged, unit),
        n_samples_=int(new.n_rows), n_passes_=runner.n_passes, n_samples_partial_=int(new.n_partial),
        n_partial_reads_=0, n_blocks_read_=0, n_iter_=1,
        robust_state=state, robust_unit=unit,  # a warm_start refit continues from the update
    )
