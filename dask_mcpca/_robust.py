"""``solver="auto"``: the robust default, all components in a handful of passes.

Real archives are multi-regime and heavy-tailed, and their contamination
includes tight groups of rows (a stuck sensor, a frozen logger) near the bulk.
A robust estimator for them must neither call most rows outliers nor let a
tight minority capture it.  The default works on a row sample drawn during the
first pass, in memory, and then on the full data, one pass per step:

1. **Start** (:func:`._start.robust_start`): the Stahel-Donoho outlyingness of every
   sample row (its largest robust z-score over directions through pairs of
   sample rows, as in ROBPCA's first stage), and the mean and covariance of
   the least outlying half, scaled so that the median squared Mahalanobis
   distance is the chi-square median.  Outlyingness looks at one direction at
   a time, so a tight cluster is as outlying as its distance makes it; the
   half-sample determinant that ranked DetMCD's starts rewards a tight
   cluster instead, and 50 %-breakdown S-estimators are drawn to one.
2. **Core fixed point**: each row gets the correntropy weight of a flat-top
   kernel, ``w = exp(-max(d^2 - q, 0) / (2 c^2))``: 1 inside the ellipsoid
   ``d^2 <= q``, a steep Gaussian fall-off beyond.  The weighted mean and
   covariance, made consistent at the Gaussian, are the next state.  The
   radius is first the Gaussian quantile (so the start's neighbourhood, not
   the data's tails, decides what is in), then calibrated on the data's own
   distances (:func:`._schedule.calibrated_cutoff`), so that heavy tails and
   several regimes widen it and the fit cannot shrink onto one quiet regime.
3. **Final, inclusive kernel**: the same kernel with a wider calibrated radius,
   untrimmed, lets the bulk's tails and regimes in, stopping short of a tight
   group of rows between the two radii.  It gives the components.
4. **Repeated rows and values**: a whole row repeated exactly in many sample
   rows, far more often than the rows next to it on the data's lattice (a
   frozen logger's record; :func:`._repeated.repeated_rows`), and a value one column
   holds exactly in many of the other rows, far more often than its
   neighbouring values (a stuck sensor; :func:`._repeated.repeated_values`), exclude
   their rows from every kernel's sums.  A repeat must also be one the data's
   model cannot explain: a value holds 5 times the rows a robust Gaussian
   marginal puts in its lattice cell (quantization levels, integer counts, a
   range limit are no faults), and a record is no set point (zeros, round
   values: an idle device).

Each full-data pass evaluates all kernels from the current state with one
quadratic form; the core is iterated until the estimated distance to its fixed
point is below ``tol``.  All p components come from one p x p
eigendecomposition of the final kernel's covariance.

Coverage guarantee: the core radius is never below the median of the sample's
``d^2``, so at least half of the sample's rows (and of all rows, up to
sampling error) carry full weight in every step, whatever the data's shape
(``MCPCA.support_`` reports the final kernel's share).

This module holds :func:`fit_robust`, which runs the stages; their parts
live beside it: the state and one full-data step (:mod:`._robust_step`),
the start and the fixed point on the in-memory sample
(:mod:`._robust_sample`), a ``warm_start`` refit's first step and
``partial_fit``'s update (:mod:`._robust_warm`).
"""

from __future__ import annotations

import numpy as np

from . import _cells
from ._passes import PassResult, PassRunner
from ._repeated import find_repeated, held_out, quantization_steps
from ._robust_sample import cellwise_start, gap_patterns, iterate_on_sample
from ._robust_step import FALL_OFF2, FAR_ROW, RobustState, archive_repeats, floored, full_step, remaining
from ._start import START_FRACTION, robust_start

__all__ = ["DEFAULT_TOL", "SAMPLE_SIZE", "STATISTICAL_TOL", "fit_robust"]

#: Rows drawn during the first pass for the in-memory robust start.
SAMPLE_SIZE = 20_000

#: Default tolerance of the fixed point, and the share of the scatter's own
#: sampling error (``sqrt(p / n)`` in the metric of :func:`._robust_step.relative_change`)
#: below which the default stops too: at p = 200 the core's shape converges
#: slowly (rate 0.6-0.9 per pass), far below the noise of the estimate.
DEFAULT_TOL = 1e-3
STATISTICAL_TOL = 0.1

#: A cellwise fit's full-data steps have stalled when the ratio of their last two changes is at least this
#: (:func:`_at_flag_floor`).
STALL_RATE = 0.8
#: ... and the last change, under this many ``tol``, is the toggling of the cells at the cutoff.
FLAG_FLOOR = 3.0


def fit_robust(
    runner: PassRunner,
    *,
    moments: PassResult,
    fixed_center: np.ndarray | None,
    kernel_factor: float = 1.0,
    tol: float | None,
    max_passes: int,
    state: RobustState | None = None,
    on_step=None,
    seed: int = 0,
    final_step: bool = True,
    partial_sample: np.ndarray | None = None,
    archive_sample_rate: float = 0.0,
    cellwise: bool = False,
) -> RobustState:
    """Robust location and scatter by the calibrated re-weighting fixed point.

    Parameters
    ----------
    runner : PassRunner
        Passes over the full data (counted), in working units.
    moments : PassResult
        The first pass, with its row sample, in the runner's working units
        (the estimator maps it; see :func:`._robust_step.working_exponent`).  Sample rows
        beyond ``FAR_ROW`` are left out of the in-memory work.
    fixed_center : ndarray or None
        Keep the location fixed (``center="mean"`` or ``False``); None
        estimates it robustly.
    kernel_factor : float
        Multiplies the kernel: the flat-top radius and the fall-off grow with
        its square; a huge value gives every row weight 1 (ordinary PCA).
    tol : float or None
        Stop when the estimated distance to the fixed point (relative, in the
        metric of the scatter; see :func:`._robust_step.remaining`) is below ``tol``.
        None: below ``max(DEFAULT_TOL, STATISTICAL_TOL * sqrt(p / n))``, a
        tenth of the sampling error of the scatter itself in that metric
        (about ``sqrt(p / n)``): iterating further moves the fit by less
        than its own noise.
    max_passes : int
        Bound on the full-data passes of this stage.
    seed : int
        Seed of the outlyingness directions.
    final_step : bool, default=True
        Also evaluate the final, inclusive kernel in each full-data pass (the
        default solver's estimate; the paper solver needs only the location).
    partial_sample : ndarray or None
        Sample rows with missing cells (NaN), in working units
        (``nan_policy="partial"``): the start and the radii come from the
        complete rows, and the sample's fixed point also weighs these by
        their observed cells (EM, :func:`._block.block_stats`'s
        ``partial``), so that the full-data passes start near the EM fixed
        point.
    archive_sample_rate : float, default=0.0
        Where ``moments``' sample comes from a spread of the row blocks
        only (:func:`._passes.spread_blocks`): the first full-data step also
        draws a row sample of the whole archive at this rate, and the
        repeated values and rows (stuck sensors, frozen records) are found
        anew in it (:func:`._robust_step.archive_repeats`).  A stuck stretch outside the
        spread's blocks is then found as a full first pass finds it.
    cellwise : bool, default=False
        Judge cells one by one (:mod:`._cells`): the start and the sample's
        fixed point are :func:`._robust_sample.cellwise_start`'s, and every full-data pass
        leaves out the cells the current model cannot explain.
    """
    p = runner.n_features
    sample = moments.sample
    n_sample = len(sample) + (0 if partial_sample is None else len(partial_sample))
    runner.gap_patterns = gap_patterns(partial_sample, n_sample) if runner.nan_policy == "partial" else ()
    if tol is None:
        tol = max(DEFAULT_TOL, STATISTICAL_TOL * np.sqrt(p / max(moments.n_rows, 1)))
    with np.errstate(invalid="ignore"):
        sample = sample[np.all(np.abs(sample) <= FAR_ROW, axis=1)]
    if cellwise:
        runner.cell_cutoff2 = _cells.cell_cutoff2()
    gaps = partial_sample is not None and len(partial_sample) > 0
    if state is None and (cellwise or (gaps and len(sample) < p + 2)):
        # A cellwise fit, or too few complete rows for the row-wise start (wide rows, each with a gap
        # somewhere): start from every row by its good or observed cells (no cell flagged then).
        whole = np.concatenate([sample, partial_sample]) if gaps else sample
        with np.errstate(invalid="ignore"):
            whole = whole[~(np.abs(whole) > FAR_ROW).any(axis=1)]
        state = cellwise_start(whole, sample, fixed_center=fixed_center, kernel_factor=kernel_factor,
                                cutoff2=runner.cell_cutoff2 if cellwise else np.inf, tol=tol,
                                to_stored=runner.stored_units())
        if on_step is not None:
            on_step(state)
    if state is None:
        if len(sample) < p + 2:
            raise ValueError(
                f"{len(sample)} usable rows are too few for {p} features: "
                f"the robust fit needs at least {p + 2} in its row sample"
            )
        with_gaps = sample if partial_sample is None or not len(partial_sample) else np.concatenate(
            [sample, partial_sample])
        # a value stuck while another channel is offline, too
        repeated, rows = find_repeated(with_gaps, runner.stored_units())
        # the start from the rows the fit weighs: a stuck stretch's rows in the start's half widened it over
        # a second operating state (the rows of two states of three taken for one, 33 % of rows flagged)
        free = sample[~held_out(sample, repeated, rows)]
        location, scatter = robust_start(free if len(free) >= p + 2 else sample, seed=seed)
        if fixed_center is not None:
            location = fixed_center
        resolution = quantization_steps(sample) ** 2 / 12
        state = RobustState(
            location=location,
            scatter=floored(scatter, resolution),
            resolution=resolution,
            kernel_size2=kernel_factor**2 * FALL_OFF2,
            core_support=min(1.0, max(START_FRACTION, (p + 2) / len(sample))),
            repeated=repeated,
            repeated_rows=rows,
        )
        iterate_on_sample(state, sample, fixed_center=fixed_center, tol=tol, partial=partial_sample,
                          part=moments.n_rows > n_sample)
        if on_step is not None:
            on_step(state)
    while not state.converged and state.n_iter < max_passes:  # a resumed state continues its count
        resample = archive_sample_rate > 0 and state.n_iter == 0
        res, change = full_step(
            runner, state, fixed_center=fixed_center, label=f"robust step {state.n_iter + 1}", final=final_step,
            sample_rate=archive_sample_rate if resample else 0.0, seed=seed,
        )
        if np.isfinite(state.last_change) and state.last_change > 0:
            state.rate = change / state.last_change
        state.converged = remaining(change, state.rate) < tol or (cellwise and _at_flag_floor(change, state.rate, tol))
        state.last_change = change
        if resample and archive_repeats(state, res.sample, runner.unit_exp, runner.stored_units()):
            state.converged = False  # the next step leaves out rows this one weighed
        if on_step is not None:
            on_step(state)
    return state



def _at_flag_floor(change: float, rate: float, tol: float) -> bool:
    """Whether a cellwise fit's steps have stalled at the noise of its cell flags: no longer contracting
    (``rate >= STALL_RATE``), each moving it by under ``FLAG_FLOOR * tol``.

    A full-data pass keeps no cell's flag from the pass before (out of core), so the cells at the cutoff
    are flagged in one pass and not the next, and the steps go on moving the state by about ``tol``
    (1.0-1.3 ``tol`` at p = 100 and 20,000 rows, 1.8-2.4 at 4,000 rows) without contracting: the
    extrapolated distance left (:func:`._robust_step.remaining`) never fell under ``tol``, and most
    cellwise fits at p = 100 warned after their last pass.  ``tol`` is a tenth of the sampling noise's
    scale ``sqrt(p / n)``: the state is as settled as the flags allow.
    """
    return bool(np.isfinite(rate) and rate >= STALL_RATE and change < FLAG_FLOOR * tol)
