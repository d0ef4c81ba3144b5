"""A channel that has shifted: a bias or a drift held for many rows, read from rows in order.

A bias of a few conditional SDs on one channel is, row by row, inside the noise: on NYC weather's
wind speed a +4.9 SD bias over 3 % of the rows was flagged in 0.38 of its rows by the row distance,
and no row distance of that model finds more than 0.63 of them at 5 % false alarms
(``benchmarks/ROBUSTNESS.md``).  Held for a run of rows, it stands out of the average of the
channel's residual over those rows, where the noise averages away.  The rule, per channel ``a``:

1. ``r_a = (P y)_a / sqrt(P_aa)``, the row's residual on channel ``a`` given the others, in
   conditional SDs (``P`` the model's precision, ``y`` the centred row:
   :func:`._precision.contribution_matrix`), clipped at ``+-RESIDUAL_CLIP``;
2. its mean over the last :data:`SHIFT_WINDOW` rows up to the row that the row rule does not flag
   (:func:`trailing_means`): a burst of ten gross rows is the row distance's to find, and does not
   make the 54 rows after it look shifted, and a bias whose larger residuals the row rule flags is
   still averaged over 64 of its rows.  The rule looks only back, over at most :data:`PRIOR_ROWS`
   rows, so a row's verdict never changes when rows are appended, and the sums are exact integers,
   so it does not depend on how the rows are cut into blocks.  Where fewer than 64 of those rows
   are counted (at least :data:`MIN_ROWS`), the mean is put on a full window's scale, times
   ``sqrt(n / 64)`` (:func:`standard_means`): a mean over fewer rows spreads wider;
3. the row is shifted where some channel's mean is more than :data:`SHIFT_CUTOFF` times its
   ``shift_scale_`` from 0, and the cell named is, of the channels beyond their cutoff, the one
   whose mean is largest (:func:`shifted_cells`; a channel whose residual wanders at the fit, and
   whose scale is wide, is not named for a mean inside its own cutoff): a bias ``d`` on channel
   ``a`` moves channel ``b``'s residual too, by ``d P_ab / sqrt(P_bb)``, less than channel ``a``'s
   own ``d sqrt(P_aa)`` (a partial correlation below 1), so the channel with the bias is the one
   named, even beside a near-copy of itself whose ``shift_scale_`` is smaller.  ``score``'s
   ``top_channel`` stays the largest contribution of the row
   (:func:`._stuck.isolated_top`): naming the shifted cell there instead lowered it on the attribution
   benchmark's real recordings (Daphnet's bias rows 0.99 -> 0.88, its near-copy pairs' drift 0.96 -> 0.95),
   where the biases are large enough for a row's contributions to name them.

``shift_scale_`` is learned at the fit (:func:`shift_scales`): the 90th percentile of the same means'
sizes over contiguous runs of the fitted rows (full windows of 64 counted rows), under the fitted model,
divided by 1.645 (their standard deviation, were they Gaussian about 0).  A percentile, not the median:
the fitted rows' normal states are in it, so that an archive that moves between states (four regimes a
quarter of the rows each, whose residuals' means differ by state) is not flagged state by state, while a
fault over a few % of the fitted rows leaves it nearly as it was (NYC weather's wind speed with a bias
over 3 % of the rows, all of them in the runs: 0.46-0.48, against 0.47 for the clean recording; with the
runs at the first rows, the 95th percentile gave 0.75-0.80, and 0.63-0.71 of the bias found).  Residuals
that wander in the normal state (weather persists for hours: on NYC weather the residuals' lag-1
autocorrelation is 0.65-0.95, and their 64-row means spread 3-6 times as wide as independent rows'
would) raise their own cutoff the same way.

The runs are :data:`SHIFT_SEGMENTS` stretches of consecutive rows (more where the blocks are shorter
than a run), evenly spread over the rows the fit's first read reads anyway (a ``warm_start`` refit: its
first pass), each inside one block (:func:`run_plan`), so learning costs no read.  A fit with too few rows
in them for :data:`MIN_WINDOWS` means or :data:`MIN_COUNTED_ROWS` counted rows (fewer than about 2,100 rows
in all, or of a mode's rows; or blocks under about 40 rows) has no ``shift_scale_`` and no shift rule; its
rows are judged one by one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._compiled import AVAILABLE, compiled
from ._distances import at_limits, calibrated_d2, limit_tolerances
from ._precision import contribution_matrix, model_rows, precision_power
from ._repeated import held_out
from ._stuck import stuck_cells

__all__ = [
    "FIXED_POINT",
    "GAUSS_QUANTILE",
    "MIN_ROWS",
    "MIN_COUNTED_ROWS",
    "MIN_WINDOWS",
    "PRIOR_ROWS",
    "RESIDUAL_CLIP",
    "SCALE_FLOOR",
    "SCALE_PERCENTILE",
    "SEGMENT_BYTES",
    "SHIFT_CUTOFF",
    "SHIFT_SEGMENTS",
    "SHIFT_WINDOW",
    "context_rows",
    "fault_cells",
    "residual_product",
    "run_plan",
    "segment_rows",
    "shared_product",
    "shift_scales",
    "shifted_cells",
    "standard_means",
    "trailing_means",
]

#: Rows whose mean residual a cell is judged by: the row and the 63 before it.  At 64 a bias of the
#: conditional SD's size on a channel with independent rows is 8 spreads of its mean from 0; shorter
#: windows find a stretch sooner, longer ones a smaller shift.
SHIFT_WINDOW = 64

#: Residuals are clipped at this many conditional SDs before they are averaged.
RESIDUAL_CLIP = 4.0

#: A channel's mean residual this many ``shift_scale_`` from 0 is a shift.  For a mean that is
#: Gaussian about 0 that happens once in 1.7 million rows per channel.
SHIFT_CUTOFF = 5.0

#: ``shift_scale_`` is this percentile of the fitted means' sizes divided by :data:`GAUSS_QUANTILE`, the
#: same percentile of a standard Gaussian's size (``scipy.stats.norm.ppf(0.95)``).
SCALE_PERCENTILE = 90.0
GAUSS_QUANTILE = 1.6448536269514722

#: The rows before a row that its mean may reach back over, past rows the row rule flags: a verdict reads a
#: fixed span of rows, whatever the blocks.
PRIOR_ROWS = 4 * SHIFT_WINDOW

#: Means over fewer rows (in those ``PRIOR_ROWS``, the rest flagged, NaN or inf, or before the first row) are
#: not judged.
MIN_ROWS = SHIFT_WINDOW // 2

#: ``shift_scale_`` is at least this share of the spread of a mean of independent residuals
#: (``1 / sqrt(SHIFT_WINDOW)``): a channel whose residual barely moved at the fit (a held or
#: quantized one) is not flagged for the least movement after it.
SCALE_FLOOR = 0.5

#: Fewest means (over all runs) ``shift_scale_`` is learned from ...
MIN_WINDOWS = 4 * SHIFT_WINDOW

#: ... and fewest rows they count, 32 windows' worth: the means of one stretch of 300 rows, 240 windows that
#: overlap, are about 5 independent ones, and a mode learned from them flagged up to 4 % of its clean rows.
MIN_COUNTED_ROWS = 32 * SHIFT_WINDOW

#: Runs of consecutive rows the first read keeps to learn ``shift_scale_`` (:func:`run_plan`) ...
SHIFT_SEGMENTS = 8

#: ... of about this many bytes each (float64), between ``MIN_WINDOWS`` and 16384 rows.
SEGMENT_BYTES = 4 * 2**20

#: Residuals are summed in units of ``2**-FIXED_POINT`` conditional SDs, as integers: the sum of any
#: run of them is exact (a window's sum, at most ``RESIDUAL_CLIP * 2**32 * SHIFT_WINDOW``, is far inside
#: int64, and a difference of two cumulative sums is exact modulo 2**64 even where they wrap).
FIXED_POINT = 32
_CLIP_FIXED = float(np.ldexp(RESIDUAL_CLIP, FIXED_POINT))


def segment_rows(n_features: int) -> int:
    """The longest run of rows kept (:func:`run_plan`): about :data:`SEGMENT_BYTES` of float64 rows."""
    return int(np.clip(SEGMENT_BYTES // (8 * max(n_features, 1)), MIN_WINDOWS, 16384))


def run_plan(block_rows, chosen, n_features: int) -> dict[int, tuple[tuple[int, int], ...]]:
    """The runs of consecutive rows a read of the row blocks ``chosen`` (indices, in order; ``block_rows``:
    every block's rows) keeps to learn ``shift_scale_``: :data:`SHIFT_SEGMENTS` runs of
    :func:`segment_rows` rows, or an eighth of the rows read where that is fewer, centred at evenly spread
    rows of those read and each inside one block (cut to it): block -> ``((start, stop), ...)`` within it.
    Where the blocks (their median) are shorter than a run, as many times more runs as a run is longer, so
    that the runs hold about as many rows.
    An archive in one block (an in-memory array, a store of one chunk) is learned from across its rows,
    not from its first ones: four states one after another, learned from the first 16,384 of 60,000 rows,
    had two of them flagged in 11 % of their rows."""
    chosen = [int(b) for b in chosen]
    sizes = np.asarray(block_rows, int)[chosen]
    total = int(sizes.sum())
    length = max(min(segment_rows(n_features), total // SHIFT_SEGMENTS), 1)
    # a run is cut to its block: where blocks are shorter than a run, take as many more runs as keep the rows
    # (8 runs of 100-row blocks hold a dozen independent 64-row means, and their percentile fell 40 % low)
    count = SHIFT_SEGMENTS * max(1, -(-length // max(int(np.median(sizes)), 1)))
    ends = np.cumsum(sizes)
    plan: dict[int, tuple[tuple[int, int], ...]] = {}
    for centre in ((np.arange(count) + 0.5) * total / count).astype(int):
        k = int(np.searchsorted(ends, centre, side="right"))
        first, size = int(ends[k] - sizes[k]), int(sizes[k])
        start = int(np.clip(centre - first - length // 2, 0, max(size - length, 0)))
        run = (start, min(start + length, size))
        if run not in plan.get(chosen[k], ()):
            plan[chosen[k]] = plan.get(chosen[k], ()) + (run,)
    return plan


def _residuals(model: Any, rows: np.ndarray, n_prior: int = 0, d2: np.ndarray | None = None,
               own=None, M: np.ndarray | None = None,
               product: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rows as stored -> their clipped residuals in fixed point (int64), and a mask of the rows the means
    count: not those with a non-finite cell, nor those with a cell at a saturation limit (its residual is
    censored: a channel pinned at its limit for hours sits below what the others predict, and was a shift
    in 1.1-1.6 % of a clean plant archive's rows), nor those the row rule flags (``d^2`` above
    ``outlier_cutoff_``, a value or record ``repeated_*`` learned as stuck; for a cellwise model, a cell's
    residual beyond ``sqrt(cell_cutoff_)``, which its cell rule flags), whose fault is found already.
    ``d2``: the calibrated distances of the rows after the first ``n_prior``, where the caller has them;
    ``own``: the mask of the rows (as stored, complete) that are ``model``'s, the others left out (a mode's
    model: its mode's rows); ``M``: the model's :func:`._precision.contribution_matrix`, where the caller has it;
    ``product``: :func:`residual_product` of ``rows``, where the caller has it (overwritten)."""
    stored = np.asarray(rows, np.float64)
    rows = model_rows(model, stored)
    bad = ~np.isfinite(rows).all(axis=1)
    if own is not None:
        bad |= ~own(np.where(bad[:, None], 0.0, stored))
    limits = getattr(model, "saturation_limits_", None)
    if limits is not None and not np.isnan(limits).all():  # a reading at its limit: the quantity there or beyond
        with np.errstate(invalid="ignore"):
            bad |= np.logical_or(*at_limits(rows, limits, limit_tolerances(model))).any(axis=1)
    # a row holding a learned stuck value or frozen record is the fault rules' (its stretch would shift the means)
    bad |= held_out(_at_centre(model, rows, bad), getattr(model, "repeated_values_", None),
                    getattr(model, "repeated_rows_", None))
    n_prior = len(rows) if d2 is None else n_prior  # the rows whose distances are computed here
    with np.errstate(invalid="ignore"):  # NaN distances: rows already left out
        far = calibrated_d2(model, _at_centre(model, rows[:n_prior], bad[:n_prior]))  # as the callers'
        bad[:n_prior] |= far > model.outlier_cutoff_
        if d2 is not None:
            bad[n_prior:] |= np.asarray(d2) > model.outlier_cutoff_
    # in units of 2**-FIXED_POINT (a power of two: exact), clipped, rounded to integers; a row left out is 0
    if product is None:  # a row left out enters the product as zeros (its centre): no NaN reaches the GEMM
        r = residual_product(model, _at_centre(model, rows, bad), M, in_model_units=True)
    else:  # made over every row: a row's product does not depend on the others, so zeroed after is the same
        r = product
        r[bad] = 0.0
    with np.errstate(over="ignore", invalid="ignore"):  # a row near the float64 limit: clipped, as any far one
        cell_cutoff = getattr(model, "cell_cutoff_", None)
        if cell_cutoff is not None:  # a cellwise model's row with a cell beyond its cutoff: that cell's fault
            far = (np.abs(r) > np.ldexp(np.sqrt(cell_cutoff), FIXED_POINT)).any(axis=1)
            bad |= far
            r[far] = 0.0
    if AVAILABLE:  # one sweep, the same integers
        fixed = np.empty(r.shape, np.int64)
        _fixed_point(r, _CLIP_FIXED, fixed)
        return fixed, ~bad
    with np.errstate(invalid="ignore"):
        np.clip(r, -_CLIP_FIXED, _CLIP_FIXED, out=r)
    r[np.isnan(r)] = 0.0  # inf - inf in a row near the float64 limit
    return np.rint(r, out=r).astype(np.int64), ~bad


@compiled(fastmath=False)
def _fixed_point(r, clip, out):  # pragma: no cover - compiled
    """``out = rint(clip(r, -clip, clip))`` as int64, 0 where ``r`` is NaN: :func:`_residuals`'s numpy spelling
    in one sweep (NaN, inf and -0.0 as there; ties rounded to even)."""
    n, p = r.shape
    for i in range(n):
        for a in range(p):
            v = r[i, a]
            out[i, a] = 0 if v != v else np.int64(np.rint(min(max(v, -clip), clip)))


def context_rows(block, before) -> tuple[np.ndarray, int]:
    """The rows the shift rule reads for ``block`` (as stored): the last :data:`PRIOR_ROWS` of ``before`` (None:
    none) and the block's, in order; and how many of them come before the block."""
    block = np.asarray(block)
    prior = np.empty((0, block.shape[1])) if before is None else np.asarray(before)
    prior = prior[max(len(prior) - PRIOR_ROWS, 0):]
    return np.concatenate([prior, block]), len(prior)


def _at_centre(model: Any, rows: np.ndarray, left_out: np.ndarray) -> np.ndarray:
    """``rows`` (model units) with the rows ``left_out`` put at the centre, ``mean_``: a copy where any is left
    out, ``rows`` itself where none is."""
    return np.where(left_out[:, None], model.mean_, rows) if left_out.any() else rows


def residual_product(model: Any, rows: np.ndarray, M: np.ndarray | None = None, *,
                     in_model_units: bool = False) -> np.ndarray:
    """``(y M) 2^FIXED_POINT`` in float64 for ``rows`` as stored (``in_model_units``: already in the model's
    units, float64), ``y`` the row about ``mean_`` and ``M`` the model's
    :func:`._precision.contribution_matrix` (computed here where not given): each row's residuals given the
    other channels, before the rule clips and rounds them; up to that power of two, also the product whose
    squares are a row's reconstruction-based contributions (:func:`._distances.distances_and_top` ranks a
    block's channels by it, where the shift rule has made it).  A row's product depends on that row alone."""
    rows = rows if in_model_units else model_rows(model, np.asarray(rows, np.float64))
    with np.errstate(over="ignore", invalid="ignore"):  # rows near the float64 limit, NaN rows: left out later
        return (rows - model.mean_) @ np.ldexp(contribution_matrix(model) if M is None else M, FIXED_POINT)


def shared_product(model: Any, block, before, M: np.ndarray | None = None) -> tuple[np.ndarray | None, int]:
    """:func:`residual_product` of :func:`context_rows` ``(block, before)`` and how many of those rows come
    before the block, where :func:`shifted_cells` would make that product (a model with ``shift_scale_``, the
    compiled loops, a block with rows): for a caller that reads it first (the channels' ranking,
    :func:`._ranking.top_from_product`; the report's contributions) and then hands it to :func:`fault_cells`.
    ``(None, 0)`` elsewhere.  ``M``: as :func:`residual_product` takes it."""
    if getattr(model, "shift_scale_", None) is None or not AVAILABLE or not len(block):
        return None, 0
    rows, n_prior = context_rows(block, before)
    return residual_product(model, rows, M), n_prior


def _window_ranks(counted: np.ndarray, n_before: int) -> tuple[np.ndarray, np.ndarray]:
    """For each row after the first ``n_before``: the counted rows up to and with it (``rank``), and up to
    the first of its window (``first``): the last :data:`SHIFT_WINDOW` counted rows, within its
    :data:`PRIOR_ROWS` (the row and those before it)."""
    cum = np.concatenate([[0], np.cumsum(counted)])
    end = np.arange(n_before, len(counted)) + 1
    rank = cum[end]
    return rank, np.maximum(rank - SHIFT_WINDOW, cum[np.maximum(end - PRIOR_ROWS, 0)])


def trailing_means(model: Any, rows: np.ndarray, n_before: int, d2: np.ndarray | None = None,
                   own=None, M: np.ndarray | None = None, *,
                   counted_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Each row's mean clipped residual per channel over its window (:func:`_window_ranks`) of the rows
    the means count (:func:`_residuals`), for the rows of ``rows`` after its first ``n_before`` (the rows
    before, NaN where none were); and how many rows each mean is over.  NaN where fewer than
    :data:`MIN_ROWS`.  ``d2``: the calibrated distances of those rows after the first ``n_before``,
    where the caller has them; ``own``, ``M``: as :func:`_residuals`.  ``counted_only``: NaN (over 0 rows)
    at the rows the means do not count, whose window is the last counted row's again (another mode's rows,
    where a few of a mode's rows would give hundreds of copies of one window).  The numpy spelling of
    :func:`_shifted_sweep`'s means."""
    fixed, counted = _residuals(model, rows, n_before, d2, own, M)
    sums = np.concatenate([np.zeros((1, fixed.shape[1]), np.int64), np.cumsum(fixed[counted], axis=0)])
    rank, first = _window_ranks(counted, n_before)
    n = rank - first
    if counted_only:
        n = np.where(counted[n_before:], n, 0)
    total = sums[rank] - sums[first]  # integers: exact, wherever the block begins
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.ldexp(total.astype(np.float64), -FIXED_POINT) / n[:, None]
    means[n < MIN_ROWS] = np.nan
    return means, n


def standard_means(model: Any, rows: np.ndarray, n_before: int, d2: np.ndarray | None = None,
                   own=None, M: np.ndarray | None = None, *,
                   counted_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """:func:`trailing_means` put on the scale of a full window: each mean times ``sqrt(n / SHIFT_WINDOW)``,
    ``n`` the rows it is over, so that a mean over fewer rows (most rows left out: a cellwise model's rows
    with a gross cell, another mode's) is held to a cutoff as far out as its wider spread, and a scale
    learned from full windows applies to it.  A shift ``d`` held over the whole window is still found
    where ``d sqrt(n)`` stands out."""
    means, n = trailing_means(model, rows, n_before, d2, own, M, counted_only=counted_only)
    with np.errstate(invalid="ignore"):
        return means * np.sqrt(n / SHIFT_WINDOW)[:, None], n


@compiled(fastmath=False)  # the same roundings as the numpy spelling: the same verdicts
def _shifted_sweep(fixed, counted, n_before, window, prior, min_rows, unit, scale, cutoff, out):  # pragma: no cover
    """:func:`shifted_cells`'s verdicts in one sweep over the rows (compiled): a ring of the window's
    counted rows and their running integer sums; where a channel's mean (``sum * unit / count``) of row
    ``i``, on a full window's scale (times ``sqrt(count / window)``: :func:`standard_means`), is more than
    ``cutoff * scale[a]`` from 0, ``out[i - n_before, a]`` for the channel ``a`` whose
    mean is largest of those beyond their cutoff (an infinite ``scale``: never)."""
    n, p = fixed.shape
    sums = np.zeros(p, np.int64)
    ring = np.empty(window, np.int64)
    head = 0
    size = 0
    for i in range(n):
        while size > 0 and (ring[head] <= i - prior or (counted[i] and size == window)):
            old = ring[head]
            for a in range(p):
                sums[a] -= fixed[old, a]
            head = (head + 1) % window
            size -= 1
        if counted[i]:
            ring[(head + size) % window] = i
            size += 1
            for a in range(p):
                sums[a] += fixed[i, a]
        if i >= n_before and size >= min_rows:
            top = -1
            size_top = -1.0
            weight = np.sqrt(size / window)
            for a in range(p):
                mean = abs(sums[a] * unit / size) * weight
                if mean / scale[a] > cutoff and mean > size_top:
                    top, size_top = a, mean
            if top >= 0:
                out[i - n_before, top] = True


def shift_scales(model: Any, segments) -> np.ndarray | None:
    """``shift_scale_``: per channel, the :data:`SCALE_PERCENTILE` percentile of the sizes of the mean residuals
    of :func:`standard_means` over full windows, each at the counted row it ends at, of the fitted rows
    ``segments`` (runs of rows as stored, each in order) divided by :data:`GAUSS_QUANTILE`, floored at
    ``SCALE_FLOOR / sqrt(SHIFT_WINDOW)``.  Where fewer than :data:`MIN_WINDOWS` windows are full (most rows left
    out: a channel logged one row in five, so four rows in five have a gap; a cellwise model's rows with a gross
    cell; a mode interleaved with others), every window the rule judges (at least :data:`MIN_ROWS` rows), on the
    full window's scale; None with fewer than that many of those, or with fewer than :data:`MIN_COUNTED_ROWS`
    rows counted.  Full windows first: the partial windows about a drift in the fitted rows, whose larger
    residuals the row rule leaves out, widened the scale (a drift over 20 % of a state's rows found in 0.78 of
    its rows, not 0.85)."""
    runs = [standard_means(model, s, 0, counted_only=True) for s in segments]  # a window once, at its own row
    p = len(model.mean_)
    full = np.concatenate([m[n == SHIFT_WINDOW] for m, n in runs]) if runs else np.empty((0, p))
    judged = np.concatenate([m[n >= MIN_ROWS] for m, n in runs]) if runs else np.empty((0, p))
    means = full if len(full) >= MIN_WINDOWS else judged
    if len(means) < MIN_WINDOWS or sum(int(np.count_nonzero(n > 0)) for _, n in runs) < MIN_COUNTED_ROWS:
        return None
    scale = np.percentile(np.abs(means), SCALE_PERCENTILE, axis=0) / GAUSS_QUANTILE
    return np.maximum(scale, SCALE_FLOOR / np.sqrt(SHIFT_WINDOW))


def shifted_cells(model: Any, block, before, d2: np.ndarray | None = None, own=None,
                  product: np.ndarray | None = None) -> np.ndarray:
    """Cells of ``block`` (rows in order, as stored) on a channel shifted for the last rows: the mean of its
    clipped residual over the last :data:`SHIFT_WINDOW` counted rows up to the row, on a full window's scale
    (:func:`standard_means`), more than :data:`SHIFT_CUTOFF` times ``shift_scale_`` from 0; the cell named is,
    of the row's channels beyond that cutoff, the one whose mean is largest (at most one cell a row; never a
    missing one).  None of them without ``shift_scale_``, nor on a channel written more coarsely than its noise
    (a ``quantization_steps_`` step above its SD given the other channels: an ADC at rest, one-hot columns): the
    means of such readings, a level off now and then, have a tail far longer than their 90th percentile says
    (0.2-0.5 % of a recording's rows beside an ADC at rest were flagged).  A channel recorded to a finer
    resolution than its noise (NYC weather's steps are 0.005-0.25 of it) is judged.

    ``before``: rows before the block (the last :data:`PRIOR_ROWS` are read; NaN where there are
    none), or None.  ``d2``: the block's :func:`._distances.calibrated_d2`, where the caller has it
    (computed here otherwise).  ``own``: for a mode's model, the mask of the rows (as stored) of its mode,
    ``own(rows)``; the means are over its mode's rows only (:func:`._modes.mode_rows`).  ``product``:
    :func:`residual_product` of :func:`context_rows` ``(block, before)``, where the caller has it (overwritten).
    """
    block = np.asarray(block)
    scale = getattr(model, "shift_scale_", None)
    if scale is None or not len(block):
        return np.zeros(block.shape, bool)
    rows, n_prior = context_rows(block, before)
    cells = np.zeros(block.shape, bool)
    P = precision_power(model, 1.0)  # once a block: for the residuals and the channels' noise
    steps = getattr(model, "quantization_steps_", None)
    if steps is not None:  # a channel coarser than its noise is left to the row and stuck rules (scale inf)
        with np.errstate(divide="ignore"):
            noise = 1.0 / np.sqrt(np.diag(P))  # its SD given the other channels
        scale = np.where(np.asarray(steps) > noise, np.inf, scale)
    M = contribution_matrix(model, P)
    if AVAILABLE:
        fixed, counted = _residuals(model, rows, n_prior, d2, own, M, product)
        _shifted_sweep(fixed, counted, n_prior, SHIFT_WINDOW, PRIOR_ROWS, MIN_ROWS, 2.0**-FIXED_POINT,
                       np.asarray(scale, np.float64), SHIFT_CUTOFF, cells)
    else:
        means = np.abs(standard_means(model, rows, n_prior, d2, own, M)[0])
        judged = np.flatnonzero(np.isfinite(means).all(axis=1))
        over = means[judged] / np.asarray(scale) > SHIFT_CUTOFF
        top = np.argmax(np.where(over, means[judged], -1.0), axis=1)
        shifted = over.any(axis=1)
        cells[judged[shifted], top[shifted]] = True
    return cells & ~np.isnan(block)  # a missing reading is no shifted cell


def fault_cells(model: Any, block, before, d2: np.ndarray | None = None, own=None,
                product: np.ndarray | None = None) -> np.ndarray:
    """Cells of ``block`` (rows in order, as stored) at fault by a rule that reads rows in order: held by a
    sensor stuck since the fit (:func:`._stuck.stuck_cells`) or on a shifted channel (:func:`shifted_cells`;
    ``d2``: the block's calibrated distances, where the caller has them; ``own``: a mode's rows).  The outlier flags,
    ``cell_outliers``, ``impute`` and a cellwise model's scores read these; ``partial_fit`` holds out only
    the stuck ones (a lasting change is its to learn).  ``product``: as :func:`shifted_cells` takes it."""
    return stuck_cells(model, block, before) | shifted_cells(model, block, before, d2, own, product)
