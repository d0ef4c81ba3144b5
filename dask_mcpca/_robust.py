"""``solver="auto"``: the robust default, all components in a handful of passes.

Real archives are multi-regime and heavy-tailed, and their contamination
includes tight groups of rows (a stuck sensor, a frozen logger) near the bulk.
A robust estimator for them must neither call most rows outliers nor let a
tight minority capture it.  The default works on a row sample drawn during the
first pass, in memory, and then on the full data, one pass per step:

1. **Start** (:func:`robust_start`): the Stahel-Donoho outlyingness of every
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
   frozen logger's record; :func:`repeated_rows`), and a value one column
   holds exactly in many of the other rows, far more often than its
   neighbouring values (a stuck sensor; :func:`repeated_values`), exclude
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
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy import stats
from scipy.spatial import cKDTree

from ._block import block_stats
from ._kernels import _top_exponent
from ._missing import MAX_PATTERNS, em_moments, pattern_key, radius_for_count
from ._passes import NumericalRangeError, PassResult, PassRunner
from ._power import spread_directions
from ._schedule import CUTOFF_QUANTILE, FINAL_QUANTILE, calibrated_cutoff, flat_top_consistency, hotelling_quantile
from ._stats import BlockStats, PartialPlan, PassPlan, combine

__all__ = [
    "RobustState",
    "robust_start",
    "fit_robust",
    "warm_step",
    "update_robust",
    "state_in_units",
    "step_plan",
    "precision",
    "outlyingness",
    "working_exponent",
    "repeated_values",
    "quantization_steps",
    "repeated_rows",
    "find_repeated",
    "in_repeated",
    "held_out",
    "in_repeated_rows",
    "held_out",
    "SAMPLE_SIZE",
]

#: Rows drawn during the first pass for the in-memory robust start.
SAMPLE_SIZE = 20_000

#: Directions (through pairs of sample rows) of the outlyingness start.
N_DIRECTIONS = 250

#: Fixed-point steps on the in-memory sample.
MAX_SAMPLE_STEPS = 200

#: Share of the sample, by outlyingness, that gives the start.
START_FRACTION = 0.5

#: Sample rows with a coordinate beyond this, in working units (the bulk's
#: spread is near 1), are left out of the in-memory work: their squares and
#: sums would overflow, and a full pass gives them weight 0 anyway.
FAR_ROW = 2.0**400


def working_exponent(sample: np.ndarray | None, col_min: np.ndarray, col_max: np.ndarray) -> int:
    """Exponent k of the fit's working unit ``2**k``: the power of two nearest the bulk's spread.

    The spread is the largest column MAD of the first pass's row sample (a
    robust scale: a single row of 1e160 does not move it), or, for a sample
    with no MAD (most rows equal), its smallest positive deviation from the
    column medians (not the largest: a far row would set a unit in which the
    bulk's variances underflow), or the columns' largest magnitude.  Measured after dividing by the power of two
    above the sample's largest magnitude, so nothing overflows; ``c * X``
    for a power of two c gives k + log2(c), exactly.  Why one unit, not one
    per column: ``components_`` are eigenvectors in the data's units, which
    a common factor keeps and a per-column one does not.
    """
    if sample is not None and len(sample):
        top = _top_exponent(sample)
        Z = np.ldexp(sample, -top)  # |Z| <= 1
        dev = np.abs(Z - np.median(Z, axis=0))
        spread = float(np.max(np.median(dev, axis=0)))
        if not spread > 0 and dev.any():  # most rows equal: the nearest other rows set the scale
            spread = float(dev[dev > 0].min())
        if spread > 0:
            return top + int(np.frexp(spread)[1])
        return top
    ranges = np.concatenate([col_min, col_max])
    return _top_exponent(ranges[np.isfinite(ranges)])


@dataclass
class RobustState:
    """Location, scatter and bookkeeping of the robust fit (checkpointable).

    ``kernel_size2`` is ``c^2`` of the kernels' fall-off, ``cutoff`` and
    ``final_cutoff`` the flat-top radii of the core and the final kernel,
    ``core_support`` and ``support`` their weighted shares of the rows (the
    effective number of rows over n) in the last step.
    """

    location: np.ndarray
    scatter: np.ndarray
    kernel_size2: float
    cutoff: float = float("nan")
    support: float = float("nan")
    core_support: float = float("nan")
    n_iter: int = 0
    converged: bool = False
    last_change: float = float("nan")  # change made by the last full-data step
    rate: float = float("nan")  # contraction rate of the fixed point, from the sample
    # (column, value) pairs repeated in the sample (stuck sensors, a frozen
    # logger), in working units: their rows get no weight in the fit.
    repeated: np.ndarray | None = None
    # Whole rows repeated in the sample (a frozen logger's records), shape
    # (m, p), in working units: rows equal to one get no weight in the fit.
    repeated_rows: np.ndarray | None = None
    # The final, inclusive step of the last full-data pass (None until one ran).
    final_cutoff: float = float("nan")
    final_location: np.ndarray | None = None
    final_scatter: np.ndarray | None = None
    # The variance of each channel's rounding error, step^2 / 12 for a
    # quantized channel (:func:`quantization_steps`), 0 for a continuous one,
    # in working units: the floor of each channel's variance (:func:`_floored`).
    resolution: np.ndarray | None = None


def _floored(scatter: np.ndarray, resolution: np.ndarray | None) -> np.ndarray:
    """``scatter`` with each channel's variance raised to at least its rounding error's (``resolution``).

    A quantized reading carries at least the variance of its rounding error,
    ``step^2 / 12``; without the floor, a channel that sits on one level in
    most rows (an ADC at rest) gets a variance of 0 from the rows that carry
    weight, and every row one step off an infinite distance.  Adding a
    non-negative diagonal keeps the scatter positive semi-definite.
    """
    if resolution is None or not np.any(resolution):
        return scatter
    lift = np.maximum(resolution - np.diag(scatter), 0.0)
    return scatter + np.diag(lift) if np.any(lift) else scatter


#: Eigenvalues of a scatter below this (in working units, where the bulk's
#: spread is near 1) count as zero, so that no inverse overflows.
TINY_EIGENVALUE = 2.0**-1000


def precision(scatter: np.ndarray) -> np.ndarray:
    """Pseudo-inverse of a scatter matrix; directions without spread get 0."""
    w, V = spread_directions(scatter)
    keep = w > TINY_EIGENVALUE
    return (V[:, keep] / w[keep]) @ V[:, keep].T


def _rank(scatter: np.ndarray) -> int:
    return len(spread_directions(scatter)[0])


def _mahalanobis2(Y: np.ndarray, scatter: np.ndarray) -> np.ndarray:
    """Squared distances under ``scatter``; inf for rows so far that they overflow."""
    with np.errstate(over="ignore", invalid="ignore"):
        d2 = np.einsum("ij,ij->i", Y @ precision(scatter), Y)
    d2[np.isnan(d2)] = np.inf
    return d2


def outlyingness(sample: np.ndarray, *, n_directions: int = N_DIRECTIONS, seed: int = 0) -> np.ndarray:
    """Stahel-Donoho outlyingness of each row over directions through pairs of rows.

    For a direction ``a`` the robust z-score of row ``x`` is
    ``|a^T x - median(a^T X)| / MAD(a^T X)``; the outlyingness is the largest
    over the directions ``x_i - x_j`` of ``n_directions`` pairs.  The pairs are
    drawn after ordering the rows by their distance to the mean, so the result
    depends on the set of rows, not on their order, and it is equivariant
    under rotation, translation and scaling.
    """
    n, p = sample.shape
    centred = sample - sample.mean(axis=0)
    norm2 = np.einsum("ij,ij->i", centred, centred)
    order = np.argsort(norm2, kind="stable")
    if np.any(np.diff(norm2[order]) == 0):  # ties (repeated rows): broken by the columns, in order
        order = np.lexsort((*centred.T[::-1], norm2))
    rows = centred[order]
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, n, n_directions), rng.integers(0, n, n_directions)
    directions = rows[i] - rows[j]
    norms = np.linalg.norm(directions, axis=1)
    directions = directions[norms > 0] / norms[norms > 0, None]
    if not len(directions):
        return np.zeros(n)
    runs = (directions[k : k + DIRECTION_RUN] for k in range(0, len(directions), DIRECTION_RUN))
    scores = [s for s in (_largest_z_score(run, centred) for run in runs) if s is not None]
    return np.maximum.reduce(scores) if scores else np.zeros(n)


#: Directions of the outlyingness start scored at once: their projections of a
#: 20,000-row sample (5 MB) stay in cache through the medians, deviations and
#: ratios; all 250 at once (40 MB) took 0.14 s instead of 0.115 s.
DIRECTION_RUN = 32


def _largest_z_score(directions: np.ndarray, centred: np.ndarray) -> np.ndarray | None:
    """Each row's largest robust z-score over ``directions`` (unit vectors), or None when no
    direction has a spread (a MAD above 0)."""
    deviation = directions @ centred.T  # one direction per (contiguous) row: the projections, then
    deviation -= _row_medians(deviation)[:, None]  # their deviations from the median, in place
    np.abs(deviation, out=deviation)
    spread = _row_medians(deviation) * _MAD_TO_SD
    keep = spread > 0
    if not keep.any():
        return None
    if not keep.all():
        deviation, spread = deviation[keep], spread[keep]
    deviation /= spread[:, None]
    return deviation.max(axis=0)


#: MAD times this is the standard deviation of a normal law.
_MAD_TO_SD = 1.0 / stats.norm.ppf(0.75)


def _row_medians(A: np.ndarray) -> np.ndarray:
    """The median of each row, by one partial sort (``np.median`` copies and checks for NaN).

    One selection, of the upper middle value; for an even length the lower one is the
    largest value below it (numpy's partition at two positions took 5x as long).
    """
    n = A.shape[1]
    k = n // 2
    part = np.partition(A, k, axis=1)
    return part[:, k] if n % 2 else (part[:, :k].max(axis=1) + part[:, k]) / 2


def _median_scaled(Y: np.ndarray, scatter: np.ndarray) -> np.ndarray:
    """``scatter`` scaled so the median ``d^2`` of the rows ``Y`` is the chi-square median."""
    d2 = _mahalanobis2(Y, scatter)
    med = np.median(d2)
    return scatter * (med / stats.chi2.ppf(0.5, max(_rank(scatter), 1))) if med > 0 else scatter


def robust_start(sample: np.ndarray, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Location and scatter of the least outlying half of an in-memory row sample.

    See :func:`outlyingness`.  The half holds at least ``p + 2`` rows; its
    scatter is scaled so that the median squared Mahalanobis distance of the
    whole sample is the chi-square median, as it is for Gaussian rows.
    """
    n, p = sample.shape
    h = min(n, max(int(np.ceil(START_FRACTION * n)), p + 2))
    subset = np.argsort(outlyingness(sample, seed=seed), kind="stable")[:h]
    location = sample[subset].mean(axis=0)
    scatter = np.atleast_2d(np.cov(sample[subset], rowvar=False, bias=True))
    return location, _median_scaled(sample - location, scatter)


def step_plan(
    location, scatter, kernel_size2: float, cutoffs, *, excluded=None, excluded_rows=None, partial: bool = False,
    patterns: tuple = (),
) -> PassPlan:
    """The plan of one re-weighting pass: flat-top Mahalanobis kernels.

    Kernel ``j`` gives ``exp(min(q_j / (2 c^2) - d^2 / (2 c^2), 0))`` with
    ``d^2`` under ``scatter``: one matrix ``A = Sigma^-1 / c^2`` (its
    quadratic form is computed once) with offsets ``q_j / (2 c^2)``.  Rows
    holding one of the ``excluded`` (column, value) pairs, or equal to one of
    the ``excluded_rows``, enter no sums.  With ``partial``, rows with some
    cells missing enter by their observed cells (:class:`._stats.PartialPlan`):
    the radius ``q_j`` (less the kernel factor's widening) is mapped to k
    observed channels at the same chi-square probability; rows of the
    ``patterns`` of observed cells come back as sums for the client's EM.
    """
    cutoffs = np.atleast_1d(np.asarray(cutoffs, dtype=np.float64))
    kernels = np.repeat((precision(scatter) / kernel_size2)[None], len(cutoffs), axis=0)
    pairs = () if excluded is None else tuple(map(tuple, excluded))
    rows = () if excluded_rows is None else tuple(map(tuple, excluded_rows))
    part = None
    if partial:
        p, widen = len(location), kernel_size2 / FALL_OFF2
        counts = np.arange(p + 1)
        radii = np.array([radius_for_count(q / widen, p, counts) * widen for q in cutoffs])
        part = PartialPlan(scatter=np.asarray(scatter, np.float64), kernel_size2=float(kernel_size2),
                           offsets=np.nan_to_num(radii / (2 * kernel_size2), nan=0.0, posinf=np.inf),
                           patterns=tuple(patterns))
    return PassPlan(center=location, kernels=kernels, offsets=cutoffs / (2 * kernel_size2), excluded=pairs,
                    excluded_rows=rows, partial=part)


#: ``c^2`` of the fall-off beyond the flat top, in units of ``d^2`` (at
#: ``kernel_factor=1``): steep, so that a row just beyond the radius, such
#: as a tight cluster at a moderate distance, cannot pull the fit towards it
#: (a fall-off of ``c^2 = 1`` let 10-20 % clusters at Mahalanobis distance 6
#: in; benchmarks/robustness.py).
FALL_OFF2 = 0.25

#: A sample row with this many sample rows (itself included) within
#: ``TIGHT_RADIUS`` in the whitened metric belongs to a tight group.
TIGHT_MIN_ROWS = 5
TIGHT_SHARE = 0.001
TIGHT_RADIUS = 0.05


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


#: A value that one column of the sample holds exactly in at least
#: ``max(TIGHT_MIN_ROWS, TIGHT_SHARE * n)`` and at most
#: ``MAX_REPEATED_SHARE * n`` of the n rows, and ``REPEAT_SPIKE`` times as often
#: as any of the ``REPEAT_WINDOW`` nearest distinct values on either side in
#: that column, is a repeated value: a stuck sensor's, or a channel of a
#: frozen logger's record.  Rows holding one get no weight in the fit and
#: ``is_outlier`` flags them.  The neighbour rule keeps the natural modes of
#: quantized channels out (a lattice of integer counts with rare values between
#: its points: the window reaches past them); a value held by more rows is taken
#: for a regime of the data (an idle sensor's exact zeros).  A value must also
#: hold ``REPEAT_SPIKE`` times the rows the model predicts for its lattice cell
#: (:func:`repeated_values`, Notes).
MAX_REPEATED_SHARE = 0.1
REPEAT_SPIKE = 5.0
REPEAT_WINDOW = 4

#: At most this many repeated rows (:func:`repeated_rows`) are kept, those
#: holding the most sample rows: each costs every full-data pass one
#: comparison of a column per data row (and of the whole row where that
#: column matches), and the model and the pass plan carry them.
MAX_REPEATED_ROWS = 16


#: A repeated record every value of which is 0 or a multiple of
#: ``10**SET_POINT_DIGITS`` times its channel's resolution is a set point
#: (:func:`_set_points`), not a frozen record.
SET_POINT_DIGITS = 2


def _decimal_exponents(values: np.ndarray) -> np.ndarray:
    """The largest e (-30 <= e <= 30) with each value an integer multiple of ``10**e`` (to ~50 ulp); inf for 0."""
    values = np.abs(np.asarray(values, np.float64))
    out = np.full(values.shape, -31.0)
    with np.errstate(over="ignore", invalid="ignore"):
        for e in range(-30, 31):
            q = values / 10.0**e
            whole = (np.abs(q - np.rint(q)) <= 1e-14 * q) & (q >= 0.5)
            out[whole] = e
    out[values == 0] = np.inf
    return out


def _set_points(records: np.ndarray, sample: np.ndarray) -> np.ndarray:
    """True for the repeated ``records`` that are set points (an idle state), not replayed measurements.

    A channel's resolution is the finest decimal step its sample values keep
    (the 10th percentile of their decimal exponents, :func:`_decimal_exponents`).
    A frozen logger replays one measurement: each of its values lies on a
    lattice ``10**SET_POINT_DIGITS`` times coarser than the channel's
    resolution by chance only (about 1 in 100 per channel, 1 in 100**p for
    the record).  A device idle at one point writes a set state: zeros, or
    round values.  A record all of whose values are 0 or that round is taken
    for a set point.
    """
    if not len(records):
        return np.zeros(0, bool)
    resolution = np.array([np.quantile(_decimal_exponents(c[c != 0]), 0.1) if np.any(c != 0) else 0.0
                           for c in sample.T])
    return np.all(_decimal_exponents(records) >= resolution + SET_POINT_DIGITS, axis=1)


def repeated_rows(sample: np.ndarray, *, set_points: bool = False) -> np.ndarray:
    """Whole rows that the sample repeats exactly, far more often than the rows next to them: frozen records.

    A frozen logger repeats one record, all p values.  :func:`repeated_values`
    finds it only when one of the record's values stands out in its own
    column; on quantized recordings every value of a record can lie in a
    busy mode of its channel (Daphnet: 100-580 rows per value) and the record
    is missed.  The whole row is the better witness: a row held exactly by
    at least ``max(TIGHT_MIN_ROWS, TIGHT_SHARE * n)`` and at most
    ``MAX_REPEATED_SHARE * n`` of the n rows (the per-channel rule's bounds),
    and ``REPEAT_SPIKE`` times as often as each of its lattice neighbours,
    is a repeated row.  The neighbours are the rows equal to it except in
    one column, which holds one of the ``REPEAT_WINDOW`` nearest distinct
    values of that column (in the sample) on either side: the per-channel
    rule's window, moved along each column in turn.

    Why the neighbours: exact duplicate rows are natural in quantized data
    whose spread is a few quantization steps (a sensor at rest repeats its
    resting record).  Such a density is smooth on the scale of one step, so
    a record's count is within a small factor of its neighbours' (Gaussian
    noise of s steps, rounded: the most common value is 1.6 times as common
    as the next at s = 1, 4.3 times at s = 0.5, and the largest neighbour
    is that of the noisiest channel); a record repeated by a fault stands
    out from neighbours that hold only the data's own rows.  Where a
    sensor's noise is below 0.47 steps in every channel, its resting
    record is itself such a spike and, if it holds 0.1-10 % of the rows,
    it is taken for a frozen record: the data cannot tell them apart
    (``tests/test_robust_real.py`` measures both sides of that line).

    Set points: a repeated record every value of which is 0 or a multiple of
    ``10**SET_POINT_DIGITS`` times its channel's resolution (:func:`_set_points`)
    is an idle device's state, not a replayed measurement, and is not returned
    (``set_points=True`` returns those instead; :func:`find_repeated` leaves
    their rows out of the per-channel counts, as a frozen record's).  The
    trade-off: a logger frozen on a record of zeros is taken for an idle one.

    Two guards: if the rows found hold together more than
    ``MAX_REPEATED_SHARE`` of the sample, duplication is the nature of these
    data (a data set of a few distinct points, each repeated), not a fault,
    and none is returned; of more than ``MAX_REPEATED_SHARE`` rows, the
    ``MAX_REPEATED_ROWS`` holding most rows are kept.

    Neighbours are looked up by a hash of the rows' codes (each value's rank
    among its column's distinct values): moving one column changes the hash
    by a known term, so the 2 * ``REPEAT_WINDOW`` * p neighbours of a
    candidate cost no pass over the sample.  A hash collision can only add
    rows to a neighbour's count (a missed row, never a false one).

    Returns
    -------
    rows : ndarray of shape (m, p)
        The repeated rows, the most repeated first (m <= ``MAX_REPEATED_ROWS``).
    """
    n, p = sample.shape
    none = np.empty((0, p))
    k = max(TIGHT_MIN_ROWS, int(TIGHT_SHARE * n))
    if n < k or p == 0 or np.unique(sample[:, 0], return_counts=True)[1].max() < k:  # no row can repeat
        return none
    rows, counts = np.unique(sample, axis=0, return_counts=True)  # exact (-0.0 and 0.0 are one value)
    candidates = np.flatnonzero((counts >= k) & (counts <= MAX_REPEATED_SHARE * n))
    if not len(candidates):
        return none
    codes = np.empty(rows.shape, np.int64)
    sizes = np.empty(p, np.int64)
    for column in range(p):
        distinct, codes[:, column] = np.unique(rows[:, column], return_inverse=True)
        sizes[column] = len(distinct)
    mult = np.random.default_rng(0).integers(1, 2**63, size=p, dtype=np.uint64) | np.uint64(1)  # odd
    keys = (codes.astype(np.uint64) * mult).sum(axis=1, dtype=np.uint64)  # wraps modulo 2**64, as meant
    order = np.argsort(keys, kind="stable")
    sorted_keys, sorted_counts = keys[order], counts[order]
    w = REPEAT_WINDOW
    steps = np.array([*range(-w, 0), *range(1, w + 1)], np.int64)
    code = codes[candidates][:, :, None]  # (c, p, 1)
    moved = code + steps  # (c, p, 2w): the neighbours' codes
    valid = (moved >= 0) & (moved < sizes[:, None])
    delta = (moved - code).astype(np.uint64) * mult[:, None]  # two's complement: wraps as keys do
    neighbour_keys = keys[candidates][:, None, None] + delta
    at = np.minimum(np.searchsorted(sorted_keys, neighbour_keys), len(keys) - 1)
    held = np.where(valid & (sorted_keys[at] == neighbour_keys), sorted_counts[at], 0)
    largest = held.reshape(len(candidates), -1).max(axis=1)
    found = candidates[counts[candidates] >= REPEAT_SPIKE * largest]
    if counts[found].sum() > MAX_REPEATED_SHARE * n:
        return none
    found = found[np.argsort(-counts[found], kind="stable")]
    if set_points:
        return rows[found[_set_points(rows[found], sample)]]
    return rows[found[~_set_points(rows[found], sample)]][:MAX_REPEATED_ROWS]


def _lattice(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Which of a column's distinct ``values`` (sorted, with their ``counts``) are points of its lattice.

    A quantized channel (at least half of the rows on values held by 2 rows
    or more) has for lattice its repeated values: a value held once lies
    between its levels (another channel's value swapped in, a rare reading
    off the grid) and is no level.  A continuous channel's lattice is every
    distinct value.
    """
    repeated = counts >= 2
    if counts[repeated].sum() >= 0.5 * counts.sum():
        return repeated
    return np.ones(len(values), bool)


def quantization_steps(sample: np.ndarray) -> np.ndarray:
    """Each column's quantization step: 0 for a continuous column, else the step of its lattice.

    A column is quantized when at least half of the rows hold values held by
    two rows or more (:func:`_lattice`).  Its step is the largest ``s`` of
    which every gap between its distinct values is a whole multiple (to
    ``STEP_RTOL``), ``s`` being the smallest gap divided by 1 to
    ``MAX_STEP_DIVISOR``: an ADC's step, 1 for integer counts and one-hot
    columns, 0.1 for values rounded to one decimal, whatever levels a small
    sample happens to hold.  A reading of such a column says only that the
    value lies within half a step of it (``MCPCA.is_outlier`` uses the
    nearest point of that cell); a column whose gaps share no such step is
    taken as continuous.
    """
    n, p = sample.shape
    steps = np.zeros(p)
    for column in range(p):
        values, counts = np.unique(sample[:, column], return_counts=True)
        finite = np.isfinite(values)
        values, counts = values[finite], counts[finite]
        if len(values) < 2:
            continue
        on = _lattice(values, counts)
        if on.all() and not (counts >= 2).all():
            continue  # continuous: every distinct value is a lattice point
        gaps = np.diff(values)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            for divisor in range(1, MAX_STEP_DIVISOR + 1):
                step = gaps.min() / divisor
                ratio = gaps / step  # inf where the gaps span more than float64 (no common step)
                if step > 0 and np.all(np.isfinite(ratio)) and np.all(
                        np.abs(ratio - np.rint(ratio)) <= STEP_RTOL * np.maximum(ratio, 1.0)):
                    steps[column] = step
                    break
    return steps


#: :func:`quantization_steps` looks for a common step among the smallest gap divided by 1 to this.
MAX_STEP_DIVISOR = 10
#: Relative tolerance of "a whole multiple of the step" (values rounded to decimals are not exact in binary).
STEP_RTOL = 1e-6


def _expected_counts(values: np.ndarray, on: np.ndarray, n: int, centre: float, scale: float) -> np.ndarray:
    """The rows a Gaussian marginal ``N(centre, scale**2)`` puts in each lattice cell ``values[on]``.

    The cell of a lattice point reaches half-way to the next lattice point on
    either side; the first and last cells reach to -inf and +inf, so that a
    value at the column's extreme (a range limit, a saturation) is expected to
    hold the model's whole tail mass beyond it.
    """
    points = values[on]
    edges = np.concatenate([[-np.inf], (points[1:] + points[:-1]) / 2, [np.inf]])
    cdf = stats.norm.cdf((edges - centre) / scale) if scale > 0 else (edges >= centre).astype(float)
    return n * np.diff(cdf)


def repeated_values(sample: np.ndarray) -> np.ndarray:
    """``(column, value)`` rows of the sample's repeated values (see above).

    Notes
    -----
    A value is a stuck sensor's when one column holds it exactly in at least
    ``max(TIGHT_MIN_ROWS, TIGHT_SHARE * n)`` and at most
    ``MAX_REPEATED_SHARE * n`` of the n rows, and both:

    1. it is a spike on the column's lattice (:func:`_lattice`): held
       ``REPEAT_SPIKE`` times as often as any of the ``REPEAT_WINDOW``
       nearest lattice points on either side (a quantized channel's natural
       modes are smooth on the scale of a step);
    2. the model cannot explain it: it holds ``REPEAT_SPIKE`` times the rows
       that a Gaussian marginal of the column, fitted robustly (median, and
       interquartile range / 1.349), puts in its lattice cell
       (:func:`_expected_counts`): on a continuous column the cell of a value
       is the tiny gap to its neighbours and a repeat is impossible; on a
       quantized one it is the step; at the column's extreme it is the tail
       beyond, so a range limit or a saturation that the model's tail
       predicts is no fault.

    The first rule alone took range limits (nothing beyond the limit, single
    values below it) and, once another channel's values landed between a
    quantized channel's levels, every busy level for stuck values; the second
    clears those.  Trade-off: a sensor stuck at a value the model predicts
    that many rows for (a level in the busy middle of a coarse quantized
    channel, a stuck value at the column's extreme no farther out than the
    model's tail mass there) is no longer found per channel.
    """
    n, p = sample.shape
    found = []
    k = max(TIGHT_MIN_ROWS, int(TIGHT_SHARE * n))
    w = REPEAT_WINDOW
    for column in range(p):
        values, counts = np.unique(sample[:, column], return_counts=True)
        if not ((counts >= k) & (counts <= MAX_REPEATED_SHARE * n)).any():
            continue
        on = _lattice(values, counts)
        level = counts[on]
        padded = np.concatenate([np.zeros(w, level.dtype), level, np.zeros(w, level.dtype)])
        neighbours = np.max([padded[w + s : w + s + len(level)] for s in (*range(-w, 0), *range(1, w + 1))], axis=0)
        q1, centre, q3 = np.quantile(sample[:, column], [0.25, 0.5, 0.75])
        expected = _expected_counts(values, on, n, centre, (q3 - q1) / (2 * stats.norm.ppf(0.75)))
        spike = ((level >= k) & (level <= MAX_REPEATED_SHARE * n) & (level >= REPEAT_SPIKE * neighbours)
                 & (level >= REPEAT_SPIKE * expected))
        found += [(column, v) for v in values[on][spike]]
    return np.array(found, dtype=np.float64).reshape(-1, 2)


def in_repeated(rows: np.ndarray, repeated: np.ndarray | None) -> np.ndarray:
    """True for the rows holding one of the ``(column, value)`` pairs of ``repeated``."""
    hit = np.zeros(len(rows), bool)
    for column, value in () if repeated is None else repeated:
        hit |= rows[:, int(column)] == value
    return hit


def in_repeated_rows(rows: np.ndarray, repeated_rows: np.ndarray | None) -> np.ndarray:
    """True for the rows equal (exactly) to one of ``repeated_rows``.

    The first column picks the rows that may match; only those are compared
    whole (as :func:`._block.block_stats` does in a pass).
    """
    hit = np.zeros(len(rows), bool)
    for row in () if repeated_rows is None else repeated_rows:
        maybe = np.flatnonzero(rows[:, 0] == row[0])
        hit[maybe[(rows[maybe] == row).all(axis=1)]] = True
    return hit


def find_repeated(sample: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sample's repeated rows, then the repeated values of its other rows.

    A frozen record's values inflate their columns' counts; once its rows are
    set aside, what is left of a value's count is the data's own, so the
    per-channel rule sees stuck sensors, not the record's channels (whose
    rows would be left out and flagged wholesale, clean ones included).  The
    rows of set points (an idle device's record) are set aside likewise: their
    values are the record's, not stuck channels.
    """
    rows = repeated_rows(sample)
    records = np.concatenate([rows, repeated_rows(sample, set_points=True)])
    return repeated_values(sample[~in_repeated_rows(sample, records)]), rows


def held_out(rows: np.ndarray, repeated: np.ndarray | None, repeated_rows: np.ndarray | None) -> np.ndarray:
    """True for the rows the fit gives no weight: holding one of the ``repeated`` values, or equal to
    one of the ``repeated_rows`` (both in the units of ``rows``)."""
    return in_repeated(rows, repeated) | in_repeated_rows(rows, repeated_rows)


def _core_radius(d2: np.ndarray, p: int, n_effective: float, *, calibrate: bool = True) -> float:
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


def _cutoffs(state: RobustState, sample: np.ndarray, n_effective: float):
    """Radii ``(q_fit, q_final)`` of the next pass, from the sample's distances now.

    ``q_fit`` keeps the fixed point robust (:func:`_core_radius`, calibrated).
    ``q_final`` lets in all the bulk, heavy tails and regimes included
    (untrimmed, ``FINAL_QUANTILE``), except a tight group of rows: if one lies
    between the two radii, ``q_final`` stops short of it.
    """
    p = max(_rank(state.scatter), 1)
    Y = sample[~held_out(sample, state.repeated, state.repeated_rows)] - state.location
    d2 = _mahalanobis2(Y, state.scatter)
    q_fit = _core_radius(d2, p, n_effective)
    scale = state.kernel_size2 / FALL_OFF2  # kernel_factor ** 2
    q_final = max(calibrated_cutoff(d2, FINAL_QUANTILE, p=p, n_effective=n_effective), q_fit)
    shell = (d2 > q_fit) & (d2 <= q_final)
    if shell.sum() > 1:
        tight = _tight_rows(_whiten(Y[shell], state.scatter), len(sample))
        if tight.any():
            q_final = max(q_fit, 0.9 * d2[shell][tight].min())
    return q_fit * scale, q_final * scale


def _step(
    runner: PassRunner,
    state: RobustState,
    *,
    fixed_center: np.ndarray | None,
    label: str,
    final: bool = False,
    sample_rate: float = 0.0,
    seed: int = 0,
) -> tuple[PassResult, float]:
    """One re-weighting step (one pass); updates ``state`` and returns the change.

    With ``final``, the same pass also evaluates the final kernel (radius
    ``state.final_cutoff``) from the current state and stores its location
    and consistent scatter in ``state.final_*``.  ``sample_rate`` also draws
    a row sample in the pass (a warm start's).
    """
    c2, p = state.kernel_size2, len(state.location)
    cutoffs = [state.cutoff, state.final_cutoff] if final else [state.cutoff]
    plan = step_plan(state.location, state.scatter, c2, cutoffs, excluded=state.repeated,
                     excluded_rows=state.repeated_rows, partial=runner.nan_policy == "partial",
                     patterns=getattr(runner, "gap_patterns", ()))
    if sample_rate > 0:
        plan = replace(plan, sample_rate=sample_rate, seed=seed)
    res = runner.run(plan, label=label)
    if res.gaps:
        res = _em_completed(res, plan, [flat_top_consistency(p, c2, q) for q in cutoffs], fixed_center,
                            [(state.location, state.scatter)] * len(cutoffs))
    if final:
        runner.last_sums = res  # the kernels' weighted sums of all rows, kept by MCPCA for partial_fit
        state.final_location = res.mean[1] if fixed_center is None else fixed_center
        state.final_scatter = _floored(res.covariance(1, about=fixed_center) * flat_top_consistency(p, c2, cutoffs[1]),
                                       state.resolution)
        state.support = float(res.weight[1] * np.exp(res.log_scale[1]) / res.n_rows)
    location = res.mean[0] if fixed_center is None else fixed_center
    scatter = _floored(res.covariance(0, about=fixed_center) * flat_top_consistency(p, c2, cutoffs[0]),
                       state.resolution)
    change = _relative_change(state, location, scatter)
    state.location, state.scatter = location, scatter
    state.core_support = float(res.weight[0] * np.exp(res.log_scale[0]) / res.n_rows)
    state.n_iter += 1
    return res, change


def _about(cov: np.ndarray, mean: np.ndarray, center: np.ndarray | None) -> np.ndarray:
    """A covariance about its mean, moved to ``center`` if given."""
    if center is None:
        return cov
    d = mean - center
    return cov + np.outer(d, d)


def _spectral_norm(M: np.ndarray) -> float:
    """``||M||_2`` of a symmetric matrix: its largest absolute eigenvalue (no SVD)."""
    return float(np.abs(np.linalg.eigvalsh((M + M.T) / 2)).max())


def _relative_change(state: RobustState, location, scatter) -> float:
    """Largest change of the fit, measured in the metric of the old scatter."""
    w, V = spread_directions(state.scatter)
    if not len(w):
        return 0.0
    W = V / np.sqrt(w)
    return _change_in_metric(W, state.location, location, scatter)


def _change_in_metric(W: np.ndarray, old_location, location, scatter) -> float:
    """``||W^T S W - I||_2 + ||W^T (m - m_old)||``: the change in the whitening ``W`` of the old scatter."""
    with np.errstate(over="ignore", invalid="ignore"):
        shape = W.T @ scatter @ W - np.eye(W.shape[1])
        shift = W.T @ (location - old_location)
    if not (np.all(np.isfinite(shape)) and np.all(np.isfinite(shift))):
        return BIG_CHANGE  # the scatter moved by more than float64 holds: far from converged
    return float(_spectral_norm(shape) + np.linalg.norm(shift))


#: The change reported when it overflows (finite, so that rates stay numbers).
BIG_CHANGE = 1e300


#: Default tolerance of the fixed point, and the share of the scatter's own
#: sampling error (``sqrt(p / n)`` in the metric of :func:`_relative_change`)
#: below which the default stops too: at p = 200 the core's shape converges
#: slowly (rate 0.6-0.9 per pass), far below the noise of the estimate.
DEFAULT_TOL = 1e-3
STATISTICAL_TOL = 0.1

#: Cap on the estimated contraction rate of the fixed point.
MAX_RATE = 0.95


def _remaining(change: float, rate: float) -> float:
    """Estimated distance to the fixed point after a step that moved by ``change``.

    The fixed point converges linearly with some rate ``rho``, so what is left
    is at most about ``change * rho / (1 - rho)``; ``rho`` is the ratio of
    the last two changes (on the sample, then on the full data).
    """
    rho = min(rate, MAX_RATE) if np.isfinite(rate) else 0.5
    return change * rho / (1.0 - rho)


#: Sample steps without a new smallest change after which the calibrated
#: phase stops: its radius is a step function of the state (a median of the
#: sample's distances), so the iteration can settle into a jitter of the size
#: of one row's weight rather than converge.
STALL_STEPS = 10


def _sample_step(
    state: RobustState, free: np.ndarray, n_sample: int, *, fixed_center, calibrate: bool, partial=None
) -> float:
    """One core step on the sample's rows ``free`` (the repeated rows and values left out); the change.

    The core radius (:func:`_core_radius`), then the re-weighting of
    :func:`_step`, from one eigendecomposition and one quadratic form of the
    rows, in memory: at p = 500 a step costs a third of the two passes, three
    eigendecompositions and the shell search that those functions make.
    Same numerics as those functions: eigenvalues below ``TINY_EIGENVALUE``
    do not enter the distances (:func:`precision`), distances that overflow
    are inf (weight 0), and a median distance that overflows raises
    :class:`NumericalRangeError`.  Sample rows with missing cells
    (``partial``) enter as a ``"partial"`` pass weighs them (EM; the radius
    comes from the complete rows).
    """
    w, V = spread_directions(state.scatter)
    p = max(len(w), 1)
    Y = free - state.location
    W = V / np.sqrt(w)  # whitening: the metric of _relative_change
    keep = w > TINY_EIGENVALUE
    with np.errstate(over="ignore", invalid="ignore"):
        Z = Y @ W[:, keep]  # d^2 = |Z|^2, as _mahalanobis2 under precision(scatter)
        d2 = np.einsum("ij,ij->i", Z, Z)
    del Z
    d2[np.isnan(d2)] = np.inf
    c2 = state.kernel_size2
    state.cutoff = _core_radius(d2, p, state.core_support * n_sample, calibrate=calibrate) * c2 / FALL_OFF2
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
    scatter = _floored(_about(cov, mean, fixed_center) * flat_top_consistency(len(state.location), c2, state.cutoff),
                       state.resolution)
    change = _change_in_metric(W, state.location, location, scatter) if len(w) else 0.0
    state.location, state.scatter = location, scatter
    state.core_support = float(weight * np.exp(log_scale) / n_sample)
    return change


def _em_completed(res: BlockStats, plan: PassPlan, factors, fixed_center, starts) -> BlockStats:
    """``res`` with the rows it returned as pattern sums (``res.gaps``) completed by EM to
    convergence under each kernel's fixed weights (:func:`._missing.em_moments`), in its sums.
    The patterns are taken in the plan's order, so the sums do not depend on the blocks' order."""
    sums = [res.gaps[k] for k in plan.partial.patterns if k in res.gaps]
    res = replace(res, weight=res.weight.copy(), mean=res.mean.copy(), scatter=res.scatter.copy(), gaps=None)
    for j, (factor, (location, scatter)) in enumerate(zip(factors, starts, strict=True)):
        gaps = [(g.observed, float(g.weight[j]), g.wsum[j], g.second[j]) for g in sums]
        mean, cov = em_moments(res.weight[j], res.mean[j], res.scatter[j], gaps, plan.center, location=location,
                               covariance=scatter, factor=factor, fixed_center=fixed_center)
        res.weight[j] += sum(g[1] for g in gaps)
        res.mean[j], res.scatter[j] = mean, cov * res.weight[j]
    return res


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


def gap_patterns(partial: np.ndarray | None) -> tuple:
    """The patterns of observed cells whose rows a ``"partial"`` pass returns as sums for the client's EM:
    the ``MAX_PATTERNS`` most frequent among the sample's rows with missing cells (ties: by key)."""
    if partial is None or not len(partial):
        return ()
    keys = [pattern_key(row) for row in ~np.isnan(partial)]
    uniq, counts = np.unique(np.array(keys, dtype=object), return_counts=True)
    order = sorted(range(len(uniq)), key=lambda i: (-counts[i], uniq[i]))
    return tuple(uniq[i] for i in order[:MAX_PATTERNS])


def _iterate_on_sample(state: RobustState, sample: np.ndarray, *, fixed_center, tol: float, partial=None) -> None:
    """The core fixed point on the in-memory sample; then the radii of the full-data passes.

    First with the Gaussian radius (so the start's neighbourhood, not the
    data's tails, decides what is in the core), then with the calibrated one
    (so heavy tails and several regimes widen it).  The radii are then fixed
    for the full-data passes, which thus iterate one smooth map.
    """
    free = sample[~held_out(sample, state.repeated, state.repeated_rows)]
    if partial is not None and not len(partial):
        partial = None
    n_sample = len(sample) + (0 if partial is None else len(partial))
    for calibrate in (False, True):
        previous, best, since_best = float("nan"), float("inf"), 0
        for _ in range(MAX_SAMPLE_STEPS):
            change = _sample_step(state, free, n_sample, fixed_center=fixed_center, calibrate=calibrate,
                                  partial=partial)
            if np.isfinite(previous) and previous > 0 and change > 0:
                state.rate = change / previous
            if change == 0 or _remaining(change, state.rate) < tol / 10:
                break
            best, since_best = (change, 0) if change < best else (best, since_best + 1)
            if since_best >= STALL_STEPS:
                break
            previous = change
    state.cutoff, state.final_cutoff = _cutoffs(state, sample, state.core_support * len(sample))
    state.n_iter = 0
    state.rate = float("nan")


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
    stage, and :func:`fit_robust` continues from the returned state (the
    pass's result is returned too, with the sample).  A
    refit of an archive grown by rows like the old ones typically stops
    after one more pass (``tests/test_mcpca.py``).
    """
    state = replace(state, n_iter=0, converged=False, last_change=float("nan"), rate=float("nan"))
    res, change = _step(
        runner,
        state,
        fixed_center=fixed_center,
        label="warm step 1",
        final=True,
        sample_rate=sample_rate,
        seed=seed,
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
    # The pass's sample is as stored: mapped as the estimator maps a cold
    # fit's, far rows left out.
    with np.errstate(over="ignore"):
        sample = np.ldexp(res.sample, -runner.unit_exp)
    with np.errstate(invalid="ignore"):
        sample = sample[np.all(np.abs(sample) <= FAR_ROW, axis=1)]
    state.repeated, state.repeated_rows = find_repeated(sample)
    state.cutoff, state.final_cutoff = _cutoffs(state, sample, state.core_support * len(sample))
    return res, state


def update_robust(
    runner: PassRunner, state: RobustState, sums: BlockStats, *, fixed_center: np.ndarray | None
) -> tuple[RobustState, BlockStats, BlockStats]:
    """One update of a fitted robust state by new rows (``MCPCA.partial_fit``): one pass over them only.

    ``sums`` are the core and the final kernel's weighted sums of every row
    seen so far (``n_rows``, total weight with its log-scale, weighted mean
    and scatter, in the runner's working unit), as the last full-data pass
    of the fit (:func:`_step`) and the previous updates left them.  The new
    rows are weighted by the plan of the current state (:func:`step_plan`:
    its location and scatter, its core and final radii, its repeated values
    and rows), exactly as the next full-data step of a fit would weigh them;
    their sums are merged with ``sums`` by the pairwise formula
    (:func:`._block.combine`), and the state's location, scatter, final
    location and final scatter are set from the merged sums as :func:`_step`
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
    c2, p = state.kernel_size2, len(state.location)
    cutoffs = [state.cutoff, state.final_cutoff]
    plan = step_plan(state.location, state.scatter, c2, cutoffs, excluded=state.repeated,
                     excluded_rows=state.repeated_rows, partial=runner.nan_policy == "partial")
    new = runner.run(plan, label="update")
    if new.gaps:
        new = _em_completed(new, plan, [flat_top_consistency(p, c2, q) for q in cutoffs], fixed_center,
                            [(state.location, state.scatter)] * len(cutoffs))
    merged = combine(sums, new)
    factors = [flat_top_consistency(p, c2, q) for q in cutoffs]
    covs = [_floored(merged.covariance(j, about=fixed_center) * factors[j], state.resolution) for j in (0, 1)]
    means = [merged.mean[j] if fixed_center is None else fixed_center for j in (0, 1)]
    if not all(np.all(np.isfinite(a)) for a in (*covs, *means)):
        raise NumericalRangeError(
            "the merged weighted scatter of the model's rows and the new rows is not finite in float64 "
            "(new rows of magnitude near the float64 limit carry weight); remove those rows"
        )
    shares = merged.weight * np.exp(merged.log_scale) / max(merged.n_rows, 1)
    updated = replace(state, location=means[0], scatter=covs[0], final_location=means[1], final_scatter=covs[1],
                      core_support=float(shares[0]), support=float(shares[1]), n_iter=1, rate=float("nan"))
    updated.last_change = _relative_change(state, updated.location, updated.scatter)
    return updated, merged, new


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
) -> RobustState:
    """Robust location and scatter by the calibrated re-weighting fixed point.

    Parameters
    ----------
    runner : PassRunner
        Passes over the full data (counted), in working units.
    moments : PassResult
        The first pass, with its row sample, in the runner's working units
        (the estimator maps it; see :func:`working_exponent`).  Sample rows
        beyond ``FAR_ROW`` are left out of the in-memory work.
    fixed_center : ndarray or None
        Keep the location fixed (``center="mean"`` or ``False``); None
        estimates it robustly.
    kernel_factor : float
        Multiplies the kernel: the flat-top radius and the fall-off grow with
        its square; a huge value gives every row weight 1 (ordinary PCA).
    tol : float or None
        Stop when the estimated distance to the fixed point (relative, in the
        metric of the scatter; see :func:`_remaining`) is below ``tol``.
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
    """
    p = runner.n_features
    sample = moments.sample
    runner.gap_patterns = gap_patterns(partial_sample) if runner.nan_policy == "partial" else ()
    if tol is None:
        tol = max(DEFAULT_TOL, STATISTICAL_TOL * np.sqrt(p / max(moments.n_rows, 1)))
    with np.errstate(invalid="ignore"):
        sample = sample[np.all(np.abs(sample) <= FAR_ROW, axis=1)]
    if state is None:
        if len(sample) < p + 2:
            raise ValueError(
                f"{moments.n_rows} usable rows are too few for {p} features: "
                f"the robust fit needs at least {p + 2}"
            )
        location, scatter = robust_start(sample, seed=seed)
        if fixed_center is not None:
            location = fixed_center
        repeated, rows = find_repeated(sample)
        resolution = quantization_steps(sample) ** 2 / 12
        state = RobustState(
            location=location,
            scatter=_floored(scatter, resolution),
            resolution=resolution,
            kernel_size2=kernel_factor**2 * FALL_OFF2,
            core_support=min(1.0, max(START_FRACTION, (p + 2) / len(sample))),
            repeated=repeated,
            repeated_rows=rows,
        )
        _iterate_on_sample(state, sample, fixed_center=fixed_center, tol=tol, partial=partial_sample)
        if on_step is not None:
            on_step(state)
    while not state.converged and state.n_iter < max_passes:  # a resumed state continues its count
        res, change = _step(
            runner, state, fixed_center=fixed_center, label=f"robust step {state.n_iter + 1}", final=final_step
        )
        if np.isfinite(state.last_change) and state.last_change > 0:
            state.rate = change / state.last_change
        state.converged = _remaining(change, state.rate) < tol
        state.last_change = change
        if on_step is not None:
            on_step(state)
    return state
