"""A fitted default solver's state continued: a ``warm_start`` refit's first step and ``partial_fit``'s update.

:func:`warm_step` runs a refit's first full-data step straight from the
previous fit's state (no start, no sample stage) and recalibrates the radii
and the repeated rows and values on the new row sample; :func:`update_robust`
weighs new rows by the current state in one pass over them and merges their
sums with the kept ones.  :func:`state_in_units` maps a state to another
working unit (exactly: a power of two).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ._exceptions import NumericalRangeError
from ._passes import PassResult, PassRunner
from ._repeated import find_repeated
from ._robust_sample import pass_radii
from ._robust_step import (
    RobustState,
    consistent_scatters,
    em_completed,
    full_step,
    kernel_rank,
    relative_change,
    sample_in_units,
    step_plan,
    working_exponent,
)
from ._schedule import flat_top_consistency
from ._stats import BlockStats, combine

__all__ = ["state_in_units", "update_robust", "warm_step"]


def state_in_units(state: RobustState, d: int) -> RobustState | None:
    """``state`` with its location, scatters, repeated values and rows multiplied by ``2**d`` (scatters by ``4**d``).

    Exact (powers of two) unless a value overflows or its scatter's largest
    eigenvalue underflows, when None is returned.  Radii and kernel size are
    in units of the scatter (Mahalanobis), so they do not change.
    """
    with np.errstate(over="ignore", under="ignore"):
        mapped = replace(
            state,
            location=np.ldexp(state.location, d),
            scatter=np.ldexp(state.scatter, 2 * d),
            final_location=None if state.final_location is None else np.ldexp(state.final_location, d),
            final_scatter=None if state.final_scatter is None else np.ldexp(state.final_scatter, 2 * d),
        )
        if state.repeated is not None:
            mapped.repeated = state.repeated.copy()
            mapped.repeated[:, 1] = np.ldexp(state.repeated[:, 1], d)
        if state.repeated_rows is not None:
            mapped.repeated_rows = np.ldexp(state.repeated_rows, d)
        if state.resolution is not None:
            mapped.resolution = np.ldexp(state.resolution, 2 * d)
    for M, M0 in ((mapped.scatter, state.scatter), (mapped.final_scatter, state.final_scatter)):
        if M is None:
            continue
        top = np.abs(np.diag(M)).max(initial=0.0)
        lost = np.abs(np.diag(M0)).max(initial=0.0) > 0 and not top >= np.finfo(np.float64).tiny
        if lost or not np.all(np.isfinite(M)):
            return None
    values = [mapped.location, mapped.final_location, None if mapped.repeated is None else mapped.repeated[:, 1],
              mapped.repeated_rows]
    if not all(v is None or np.all(np.isfinite(v)) for v in values):
        return None
    return mapped


def warm_step(
    runner: PassRunner,
    state: RobustState,
    *,
    fixed_center: np.ndarray | None,
    sample_rate: float,
    seed: int = 0,
) -> tuple[PassResult, RobustState | None]:
    """The first full-data step of a warm start, from a previous fit's ``state``.

    No start and no sample stage: the previous fit's location, scatter and
    radii go straight into a full-data step, which also draws the row sample
    (so the pass gives the new data's row count and the sample that the
    outlier cutoff is calibrated on).  The radii, repeated rows and values are then
    recalibrated on the new sample, as a cold fit sets them after its sample
    stage, and :func:`._robust.fit_robust` continues from the returned state (the
    pass's result is returned too, with the sample).  A
    refit of an archive grown by rows like the old ones typically stops
    after one more pass (``tests/test_mcpca.py``).
    """
    state = replace(state, n_iter=0, converged=False, last_change=float("nan"), rate=float("nan"))
    res, change = full_step(
        runner,
        state,
        fixed_center=fixed_center,
        label="warm step 1",
        final=True,
        sample_rate=sample_rate,
        seed=seed,
        keep_runs=True,
    )
    state.last_change = change
    # Units.  The step ran in the runner's unit, the previous fit's, in which
    # ``state`` is.  The unit is now chosen from this pass's row sample as a
    # cold fit chooses it from its first pass's; if it changed, the state is
    # mapped to it (exact: a power of two) and the runner switched, so the
    # rest of the fit is the one a cold fit would run in that unit.  A state
    # that does not survive the mapping (a change of scale by ~1e150) refuses
    # the warm start: None is returned and the estimator fits cold.
    unit = working_exponent(res.sample, np.zeros(0), np.zeros(0)) if len(res.sample) else runner.unit_exp
    if unit != runner.unit_exp:
        state = state_in_units(state, runner.unit_exp - unit)
        if state is None:
            return res, None
        runner.unit_exp = unit
    sample = sample_in_units(res.sample, runner.unit_exp)
    state.repeated, state.repeated_rows = find_repeated(sample, runner.stored_units())
    state.cutoff, state.final_cutoff = pass_radii(state, sample, state.core_support * len(sample))
    return res, state


def update_robust(
    runner: PassRunner, state: RobustState, sums: BlockStats, *, fixed_center: np.ndarray | None
) -> tuple[RobustState, BlockStats, BlockStats]:
    """One update of a fitted robust state by new rows (``MCPCA.partial_fit``): one pass over them only.

    ``sums`` are the core and the final kernel's weighted sums of every row
    seen so far (``n_rows``, total weight with its log-scale, weighted mean
    and scatter, in the runner's working unit), as the last full-data pass
    of the fit (:func:`._robust_step.full_step`) and the previous updates left them.  The new
    rows are weighted by the plan of the current state (:func:`._robust_step.step_plan`:
    its location and scatter, its core and final radii, its repeated values
    and rows), exactly as the next full-data step of a fit would weigh them;
    their sums are merged with ``sums`` by the pairwise formula
    (:func:`._block.combine`), and the state's location, scatter, final
    location and final scatter are set from the merged sums as :func:`._robust_step.full_step`
    sets them (made consistent at the Gaussian, floored at the channels'
    rounding error).  Radii, kernel size, repeated values and rows are kept.

    Each row thus keeps the weight the model gave it when it arrived: rows
    like the fitted ones enter with the weights a refit would give them
    (the fit is a fixed point), while rows far from the model (outliers, or
    every row of a new regime) get little or no weight, so the model does
    not follow a change of regime (see ``MCPCA.partial_fit``).

    Returns the updated state (a copy), the merged sums (to keep) and the
    new rows' sums (their ``weight * exp(log_scale) / n_rows`` is the new
    rows' weighted share).
    """
    c2, p = state.kernel_size2, kernel_rank(state.scatter)
    cutoffs = [state.cutoff, state.final_cutoff]
    # a cellwise model's update judges cells as its fit's passes did (a row with one bad cell keeps the rest)
    plan = step_plan(state.location, state.scatter, c2, cutoffs, excluded=state.repeated,
                     excluded_rows=state.repeated_rows, partial=runner.nan_policy == "partial",
                     cells=getattr(runner, "cell_cutoff2", None), missing_ok=runner.nan_policy == "partial")
    new = runner.run(plan, label="update")
    if new.gaps:
        new = em_completed(new, plan, [flat_top_consistency(p, c2, q) for q in cutoffs], fixed_center,
                            [(state.location, state.scatter)] * len(cutoffs))
    merged = combine(sums, new)
    covs = consistent_scatters([merged.covariance(j, about=fixed_center) for j in (0, 1)], c2, cutoffs, p,
                               state.resolution)
    means = [merged.mean[j] if fixed_center is None else fixed_center for j in (0, 1)]
    if not all(np.all(np.isfinite(a)) for a in (*covs, *means)):
        raise NumericalRangeError(
            "the merged weighted scatter of the model's rows and the new rows is not finite in float64 "
            "(new rows of magnitude near the float64 limit carry weight); remove those rows"
        )
    shares = merged.weight * np.exp(merged.log_scale) / max(merged.n_rows, 1)
    updated = replace(state, location=means[0], scatter=covs[0], final_location=means[1], final_scatter=covs[1],
                      core_support=float(shares[0]), support=float(shares[1]), n_iter=1, rate=float("nan"))
    updated.last_change = relative_change(state, updated.location, updated.scatter)
    return updated, merged, new
