"""The default solver's start and its fixed point on the in-memory row sample (:mod:`._robust`).

From the first pass's row sample: the row-wise start's core fixed point, first
with the Gaussian radius, then the calibrated one (:func:`iterate_on_sample`,
one in-memory step each, :func:`_sample_step`), or a cellwise fit's start
(:func:`cellwise_start`, cells judged one by one); then the radii of the
full-data passes (:func:`pass_radii`: the core's, and the final kernel's,
stopping short of a tight group of rows).  Also the patterns of observed
cells whose rows a ``"partial"`` pass returns for the client's EM
(:func:`gap_patterns`).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg.blas import dtrmm as _blas_trmm
from scipy.spatial import cKDTree

from . import _cells
from ._block import block_stats
from ._exceptions import NumericalRangeError
from ._missing import MAX_PATTERNS, pattern_key, rare_pattern_rows
from ._power import spread_directions
from ._repeated import TIGHT_MIN_ROWS, TIGHT_SHARE, find_repeated, held_out, quantization_steps
from ._robust_step import (
    FALL_OFF2,
    RobustState,
    change_in_metric,
    covariance_about,
    floored,
    relative_change,
    remaining,
    step_plan,
)
from ._schedule import CUTOFF_QUANTILE, FINAL_QUANTILE, calibrated_cutoff, flat_top_consistency, hotelling_quantile
from ._start import START_FRACTION, TINY_EIGENVALUE, _mahalanobis2, _rank
from ._stats import WIDE_FEATURES, BlockStats, combine

__all__ = [
    "CELL_SAMPLE_STEPS",
    "GAP_PATTERN_SHARE",
    "MAX_SAMPLE_STEPS",
    "SAMPLE_TOL_DIVISOR",
    "STALL_STEPS",
    "TIGHT_RADIUS",
    "TRIANGULAR_ROWS",
    "cellwise_start",
    "core_radius",
    "gap_patterns",
    "iterate_on_sample",
    "pass_radii",
]

#: Fixed-point steps on the in-memory sample.
MAX_SAMPLE_STEPS = 200

#: The sample's fixed point is iterated until the estimated distance left is below the fit's
#: ``tol`` divided by this: on data no larger than the sample, the first full-data step then proves
#: convergence alone (one pass).
SAMPLE_TOL_DIVISOR = 10

# From ``WIDE_FEATURES`` columns on (:mod:`._stats`), where the sample is a part of the rows, the
# sample's fixed point stops at ``tol`` itself: it differs from the data's by the sample's own noise (about
# ``sqrt(p / n_sample)``, 0.12 at p = 300 and 20,000 rows, 30 times ``tol`` at 200k rows), which two
# full-data steps remove whatever the last tenth of ``tol``, and a sample step costs two p^2
# products per sample row (at p = 300 it saved one of 7 steps; issue 37).  Narrower fits keep
# their steps and bits.

#: A sample row with ``max(TIGHT_MIN_ROWS, TIGHT_SHARE * n)`` sample rows (itself
#: included, :mod:`._repeated`) within ``TIGHT_RADIUS`` in the whitened metric
#: belongs to a tight group.
TIGHT_RADIUS = 0.05

#: Sample steps without a new smallest change after which the calibrated
#: phase stops: its radius is a step function of the state (a median of the
#: sample's distances), so the iteration can settle into a jitter of the size
#: of one row's weight rather than converge.
STALL_STEPS = 10

# From ``WIDE_FEATURES`` columns on (full rank), a sample step whitens its rows by the lower
# Cholesky factor of the precision, a triangular product (as :func:`._kernels.numpy_part` does).

#: Rows whitened by one triangular product (:func:`_triangular_d2`): 16 MB of rows at p = 1000.
TRIANGULAR_ROWS = 2048

#: A pattern of observed cells gets the client's EM to convergence only if at least this share of the
#: sample's rows hold it (a channel offline for a while), and at least :func:`._missing.rare_pattern_rows`.
GAP_PATTERN_SHARE = 0.01

#: Bound on the cellwise fixed point's steps on the in-memory sample.
CELL_SAMPLE_STEPS = 30

#: Steps on the sample that judge every cell afresh, after those that carry the last step's flags
#: (:func:`cellwise_start`): a full-data pass keeps no flag from pass to pass, so the start ends at the
#: fixed point of the passes' own map.  Ending at the carried flags' fixed point left the first passes to
#: travel from one to the other (p = 100, 20,000 rows: changes 0.038, 0.015, 0.010 against tol 0.007, and 3
#: of 3 fits warned after their last pass).
CELL_FREE_STEPS = 3


def _whiten(Y: np.ndarray, scatter: np.ndarray) -> np.ndarray:
    w, V = spread_directions(scatter)
    return Y @ (V / np.sqrt(w))


def _tight_rows(Z: np.ndarray, n_sample: int) -> np.ndarray:
    """Rows of ``Z`` (whitened) with many others within ``TIGHT_RADIUS``: a point mass."""
    if len(Z) < 2 or Z.shape[1] == 0:
        return np.zeros(len(Z), bool)
    k = max(TIGHT_MIN_ROWS, int(TIGHT_SHARE * n_sample))
    counts = cKDTree(Z).query_ball_point(Z, r=TIGHT_RADIUS, return_length=True)
    return np.asarray(counts) >= k


def core_radius(d2: np.ndarray, p: int, n_effective: float, *, calibrate: bool = True) -> float:
    """The core kernel's radius (d^2 units) from the sample's distances ``d2``.

    The Gaussian quantile at the effective sample size, or (``calibrate``)
    the trimmed calibrated one, never below the median distance (the
    coverage guarantee).  A median distance that overflows float64 raises
    :class:`NumericalRangeError`.
    """
    med = float(np.median(d2))
    if not np.isfinite(med):
        raise NumericalRangeError(
            "the squared distances of most sample rows from the fit's centre overflow float64: the centre "
            "lies ~1e150 spreads from the bulk (center='mean' with rows near the float64 limit does this); "
            "use center='robust'"
        )
    if calibrate:
        q_fit = calibrated_cutoff(d2, CUTOFF_QUANTILE, p=p, n_effective=n_effective, trim=True)
    else:
        q_fit = hotelling_quantile(p, n_effective, CUTOFF_QUANTILE)
    return max(q_fit, med)


def _free_rows(sample: np.ndarray, state: RobustState) -> np.ndarray:
    """The sample's rows the fit weighs (:func:`._repeated.held_out`): ``sample`` itself where none is
    held out (a copy of the sample is 160 MB at p = 1000)."""
    held = held_out(sample, state.repeated, state.repeated_rows)
    return sample[~held] if held.any() else sample


def pass_radii(state: RobustState, sample: np.ndarray, n_effective: float):
    """Radii ``(q_fit, q_final)`` of the next pass, from the sample's distances now.

    ``q_fit`` keeps the fixed point robust (:func:`core_radius`, calibrated).
    ``q_final`` lets in all the bulk, heavy tails and regimes included
    (untrimmed, ``FINAL_QUANTILE``), except a tight group of rows: if one lies
    between the two radii, ``q_final`` stops short of it.
    """
    p = max(_rank(state.scatter), 1)
    Y = _free_rows(sample, state) - state.location
    d2 = _whitened_d2(Y, state.scatter)
    if d2 is None:
        d2 = _mahalanobis2(Y, state.scatter)
    q_fit = core_radius(d2, p, n_effective)
    scale = state.kernel_size2 / FALL_OFF2  # kernel_factor ** 2
    q_final = max(calibrated_cutoff(d2, FINAL_QUANTILE, p=p, n_effective=n_effective), q_fit)
    shell = (d2 > q_fit) & (d2 <= q_final)
    if shell.sum() > 1:
        tight = _tight_rows(_whiten(Y[shell], state.scatter), len(sample))
        if tight.any():
            q_final = max(q_fit, 0.9 * d2[shell][tight].min())
    return q_fit * scale, q_final * scale


def _sample_step(
    state: RobustState, free: np.ndarray, n_sample: int, *, fixed_center, calibrate: bool, partial=None
) -> float:
    """One core step on the sample's rows ``free`` (the repeated rows and values left out); the change.

    The core radius (:func:`core_radius`), then the re-weighting of
    :func:`._robust_step.full_step`, from one eigendecomposition and one quadratic form of the
    rows, in memory: at p = 500 a step costs a third of the two passes, three
    eigendecompositions and the shell search that those functions make.
    Same numerics as those functions: eigenvalues below ``TINY_EIGENVALUE``
    do not enter the distances (:func:`._start.precision`), distances that overflow
    are inf (weight 0), and a median distance that overflows raises
    :class:`NumericalRangeError`.  Sample rows with missing cells
    (``partial``) enter as a ``"partial"`` pass weighs them (EM; the radius
    comes from the complete rows).
    """
    w, V = spread_directions(state.scatter)
    p = max(len(w), 1)
    Y = free - state.location
    W = V / np.sqrt(w)  # whitening: the metric of relative_change
    keep = w > TINY_EIGENVALUE
    L = _triangular_whitening(W) if keep.all() else None
    if L is None:
        with np.errstate(over="ignore", invalid="ignore"):
            Z = Y @ W[:, keep]  # d^2 = |Z|^2, as _mahalanobis2 under precision(scatter)
            d2 = np.einsum("ij,ij->i", Z, Z)
        del Z
        d2[np.isnan(d2)] = np.inf
    else:  # wide rows: the same d^2 by a triangular product (half the GEMM's work)
        W = L  # L^-1 W is orthogonal: the same metric for the change
        d2 = _triangular_d2(Y, L)
    c2 = state.kernel_size2
    state.cutoff = core_radius(d2, p, state.core_support * n_sample, calibrate=calibrate) * c2 / FALL_OFF2
    e = np.minimum(state.cutoff / (2 * c2) - d2 / (2 * c2), 0.0)
    log_scale = e.max()
    g = np.exp(e - log_scale)
    weight = g.sum()
    shift = (g @ Y) / weight
    mean = state.location + shift
    Y -= shift  # centred at the weighted mean, then scaled by sqrt(g): one GEMM gives the covariance
    Y *= np.sqrt(g)[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        cov = Y.T @ Y / weight
    if partial is not None:
        mean, cov, weight, log_scale = _with_partial_sample(state, partial, mean, cov, weight, log_scale)
    if not (np.all(np.isfinite(cov)) and np.all(np.isfinite(mean))):
        raise NumericalRangeError(
            "the weighted scatter of the sample is not finite in float64 (rows of magnitude near the "
            "float64 limit carry weight); rescale the data or remove those rows"
        )
    location = mean if fixed_center is None else fixed_center
    factor = flat_top_consistency(p, c2, state.cutoff)  # the dimension the radius is for: the scatter's rank
    scatter = floored(covariance_about(cov, mean, fixed_center) * factor, state.resolution)
    change = change_in_metric(W, state.location, location, scatter) if len(w) else 0.0
    state.location, state.scatter = location, scatter
    state.core_support = float(weight * np.exp(log_scale) / n_sample)
    return change


def _triangular_whitening(W: np.ndarray) -> np.ndarray | None:
    """The lower Cholesky factor ``L`` (Fortran order) of ``W W^T`` for a square whitening ``W``
    of at least ``WIDE_FEATURES`` columns, or None (narrower, not square, or no factor):
    ``|y^T L|`` is ``|y^T W|`` and ``L^T S L`` has the spectrum of ``W^T S W``."""
    p = W.shape[0]
    if p < WIDE_FEATURES or W.shape[1] != p:
        return None
    try:
        L = np.linalg.cholesky(W @ W.T)
    except np.linalg.LinAlgError:
        return None
    return np.asfortranarray(L) if np.all(np.isfinite(L)) else None


def _triangular_d2(Y: np.ndarray, L: np.ndarray) -> np.ndarray:
    """``|y^T L|^2`` of each row of ``Y`` (``L`` lower triangular, Fortran order) by triangular
    products on copies of ``TRIANGULAR_ROWS`` rows at a time (one buffer, reused: a copy of all the
    rows cost 0.1 s of page faults per call at p = 1000, 20,000 rows; a row's result is that of one
    product of all the rows to round-off, BLAS taking a few rows of a run by another kernel); inf for
    rows so far that they overflow."""
    d2 = np.empty(len(Y))
    buffer = np.empty((min(len(Y), TRIANGULAR_ROWS), Y.shape[1]))
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, len(Y), TRIANGULAR_ROWS):
            Z = buffer[: min(TRIANGULAR_ROWS, len(Y) - start)]
            Z[...] = Y[start : start + len(Z)]
            _blas_trmm(1.0, L, Z.T, side=0, lower=1, trans_a=1, overwrite_b=1)  # (Z L)^T in place
            d2[start : start + len(Z)] = np.einsum("ij,ij->i", Z, Z)
    d2[np.isnan(d2)] = np.inf
    return d2


def _whitened_d2(Y: np.ndarray, scatter: np.ndarray) -> np.ndarray | None:
    """:func:`._start._mahalanobis2` of wide rows (full rank, :func:`_triangular_whitening`) by a
    triangular product; None where that does not apply (the caller takes the GEMM)."""
    w, V = spread_directions(scatter)
    if len(w) != len(scatter) or not np.all(w > TINY_EIGENVALUE):
        return None
    L = _triangular_whitening(V / np.sqrt(w))
    return None if L is None else _triangular_d2(Y, L)


def _with_partial_sample(state: RobustState, partial: np.ndarray, mean, cov, weight: float, log_scale: float):
    """The weighted mean and covariance of a sample step, merged with those of the sample's rows
    with missing cells (:func:`._block.block_stats` with a ``partial`` plan, in memory): one EM
    step per sample step, the rows completed under the step's model (the sample's fixed point
    iterates the EM with the re-weighting; a step costs a few ms)."""
    plan = step_plan(state.location, state.scatter, state.kernel_size2, [state.cutoff], excluded=state.repeated,
                     excluded_rows=state.repeated_rows, partial=True)
    whole = BlockStats(n_rows=0, n_nonfinite=0, log_scale=np.array([log_scale]), weight=np.array([weight]),
                       mean=mean[None], scatter=(cov * weight)[None])
    merged = combine(whole, block_stats(partial, plan))
    return merged.mean[0], merged.covariance(0), float(merged.weight[0]), float(merged.log_scale[0])


def gap_patterns(partial: np.ndarray | None, n_sample: int = 0) -> tuple:
    """The patterns of observed cells whose rows a ``"partial"`` pass returns as sums for the client's EM:
    the ``MAX_PATTERNS`` most frequent among the sample's rows with missing cells (ties: by key), of
    those held by at least :data:`GAP_PATTERN_SHARE` of the ``n_sample`` sample rows and
    :func:`._missing.rare_pattern_rows` (a channel offline for a while; at wide p, scattered gaps
    make many small patterns, whose EM on the client costs a p x p inverse per pattern and
    iteration, and whose sums per pattern fill the pass's results)."""
    if partial is None or not len(partial):
        return ()
    keys = [pattern_key(row) for row in ~np.isnan(partial)]
    uniq, counts = np.unique(np.array(keys, dtype=object), return_counts=True)
    # rarer ones are completed in the pass, one EM step per pass
    least = max(rare_pattern_rows(partial.shape[1]), int(np.ceil(GAP_PATTERN_SHARE * n_sample)))
    order = sorted((i for i in range(len(uniq)) if counts[i] >= least), key=lambda i: (-counts[i], uniq[i]))
    return tuple(uniq[i] for i in order[:MAX_PATTERNS])


def iterate_on_sample(
    state: RobustState, sample: np.ndarray, *, fixed_center, tol: float, partial=None, part: bool = False
) -> None:
    """The core fixed point on the in-memory sample; then the radii of the full-data passes.

    It stops where the distance left is below ``tol / SAMPLE_TOL_DIVISOR``, or below ``tol`` for rows of
    at least ``WIDE_FEATURES`` columns where the sample is a ``part`` of the data's rows.

    First with the Gaussian radius (so the start's neighbourhood, not the
    data's tails, decides what is in the core), then with the calibrated one
    (so heavy tails and several regimes widen it).  The radii are then fixed
    for the full-data passes, which thus iterate one smooth map.
    """
    free = _free_rows(sample, state)
    if partial is not None and not len(partial):
        partial = None
    n_sample = len(sample) + (0 if partial is None else len(partial))
    stop = tol if part and sample.shape[1] >= WIDE_FEATURES else tol / SAMPLE_TOL_DIVISOR
    for calibrate in (False, True):
        previous, best, since_best = float("nan"), float("inf"), 0
        for _ in range(MAX_SAMPLE_STEPS):
            change = _sample_step(state, free, n_sample, fixed_center=fixed_center, calibrate=calibrate,
                                  partial=partial)
            if np.isfinite(previous) and previous > 0 and change > 0:
                state.rate = change / previous
            if change == 0 or remaining(change, state.rate) < stop:
                break
            best, since_best = (change, 0) if change < best else (best, since_best + 1)
            if since_best >= STALL_STEPS:
                break
            previous = change
    state.cutoff, state.final_cutoff = pass_radii(state, sample, state.core_support * len(sample))
    state.n_iter = 0
    state.rate = float("nan")


def _pairs(repeated: np.ndarray | None) -> tuple:
    """``(column, value)`` pairs of a state's repeated values, as a plan holds them."""
    return () if repeated is None else tuple((int(c), float(v)) for c, v in repeated)


def cellwise_start(
    rows: np.ndarray, complete: np.ndarray, *, fixed_center, kernel_factor: float, cutoff2: float, tol: float,
    to_stored: np.ndarray | None = None,
) -> RobustState:
    """The robust state of a cellwise fit, from the in-memory row sample ``rows`` (NaN: missing).

    Starts from each channel's median and robust spread (a diagonal model:
    its first cell flags are univariate), then iterates the flat-top
    re-weighting of :func:`_sample_step` on :func:`._cells.judge` and
    :func:`._cells.cell_sums`: each step flags the cells the current model
    cannot explain (``cutoff2``; ``inf`` flags none, a partial fit's start
    from rows with gaps), completes them from the row's good cells and
    weighs each row by its distance on those (first with the Gaussian
    radius, then the calibrated one).  The repeated values come from all of
    ``rows``, the repeated rows and the quantization steps from its
    complete rows ``complete`` (``to_stored``: see :func:`._repeated.find_repeated`).  The radii of
    the full-data passes are then calibrated on the good-cell distances.
    """
    n, p = rows.shape
    if n < p + 2:
        raise ValueError(f"{n} usable rows are too few for {p} features: the robust fit needs at least {p + 2}")
    med, spread = _cells.robust_columns(rows)
    repeated, repeated_rows = find_repeated(rows, to_stored)
    resolution = quantization_steps(complete) ** 2 / 12 if len(complete) else None
    state = RobustState(
        location=med if fixed_center is None else np.asarray(fixed_center, np.float64),
        scatter=floored(np.diag(spread**2), resolution),
        resolution=resolution,
        kernel_size2=kernel_factor**2 * FALL_OFF2,
        core_support=START_FRACTION,
        repeated=repeated,
        repeated_rows=repeated_rows,
    )
    c2, scale = state.kernel_size2, kernel_factor**2
    flags = np.zeros(rows.shape, bool)  # each step starts from the last one's flags, then none
    carried, free = True, 0
    for step in range(CELL_SAMPLE_STEPS + CELL_FREE_STEPS):
        if carried and step >= CELL_SAMPLE_STEPS:
            carried = False
        cells = _cells.CellPlan(_cells.cell_precision(state.scatter), cutoff2, True, held=_pairs(state.repeated))
        judged = _cells.judge(rows, state.location, cells, start=flags if carried else None)
        flags[:] = False
        flags[judged.rows] = judged.flags
        d2 = judged.equivalent_d2()
        calibrate = step >= CELL_SAMPLE_STEPS // 3 or not carried
        state.cutoff = core_radius(d2, p, state.core_support * n, calibrate=calibrate) * scale
        plan = step_plan(state.location, state.scatter, c2, [state.cutoff], excluded=state.repeated,
                         excluded_rows=state.repeated_rows, cells=cutoff2, missing_ok=True)
        res = _cells.cell_sums(judged, plan)
        location = res.mean[0] if fixed_center is None else fixed_center
        scatter = floored(res.covariance(0, about=fixed_center) * flat_top_consistency(p, c2, state.cutoff),
                           state.resolution)
        change = relative_change(state, location, scatter)
        state.location, state.scatter = location, scatter
        state.core_support = float(res.weight[0] * np.exp(res.log_scale[0]) / n)
        if not carried:
            free += 1
            if free >= CELL_FREE_STEPS:
                break
        elif calibrate and step >= 2 and change < tol / 10:
            carried = False  # settled with the flags carried: now as the passes judge cells
    cells = _cells.CellPlan(_cells.cell_precision(state.scatter), cutoff2, True, held=_pairs(state.repeated))
    d2 = _cells.judge(rows, state.location, cells).equivalent_d2()
    n_effective = state.core_support * n
    q_fit = core_radius(d2, p, n_effective)
    q_final = max(calibrated_cutoff(d2[np.isfinite(d2)], FINAL_QUANTILE, p=p, n_effective=n_effective), q_fit)
    state.cutoff, state.final_cutoff = q_fit * scale, q_final * scale
    state.n_iter, state.rate = 0, float("nan")
    return state
