"""Repeated rows and values, and quantized channels: the rules for what a sensor archive repeats.

Real archives repeat: a stuck sensor holds one value, a frozen logger replays
one record, an ADC's channel takes only the points of its lattice.  The first
two are faults, whose rows the robust fit (:mod:`._robust`) gives no weight
and ``MCPCA.is_outlier`` flags; the third is the data's nature, which the fit
must not take for a fault.  From the first pass's row sample:

- :func:`repeated_rows`: whole rows repeated far more often than the rows
  next to them on the data's lattice (a frozen record), set points excluded;
- :func:`repeated_values`: a value one column holds far more often than its
  neighbouring values and than a robust Gaussian marginal predicts for its
  lattice cell (a stuck sensor), in at most 10 % of the rows, or in less than
  half of them where the column is continuous apart from it and the value is
  a measurement, neither 0 nor round (a stretch stuck over 25-50 % of a
  smaller operating mode's rows);
- :func:`find_repeated`: both, the values looked for among the rows the
  records leave (rows at a saturation limit are no record);
- :func:`quantization_steps`: each channel's quantization step (0 for a
  continuous channel), whose rounding error floors its variance;
- :func:`saturation_limits`: where a continuous channel is clipped;
- :func:`held_out`: the rows a fit gives no weight to.

A sensor stuck after the fit, which the row sample of a fit never saw, is
found from rows in order (:func:`._stuck.stuck_runs`).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from ._tied import column_ties

__all__ = [
    "repeated_rows", "repeated_values", "find_repeated", "in_repeated", "value_matches", "in_repeated_rows",
    "held_out", "quantization_steps", "saturation_limits", "significant_digits",
    "SATURATION_SHARE", "TIGHT_MIN_ROWS", "TIGHT_SHARE", "MAX_REPEATED_SHARE", "MAX_HELD_SHARE",
    "CONTINUOUS_REPEATS", "MAX_REPEATED_ROWS",
]

#: A repeat (and a tight group of sample rows, :mod:`._robust`) holds at least
#: ``max(TIGHT_MIN_ROWS, TIGHT_SHARE * n)`` of the sample's n rows.
TIGHT_MIN_ROWS = 5
TIGHT_SHARE = 0.001

#: A value that one column of the sample holds exactly in at least
#: ``max(TIGHT_MIN_ROWS, TIGHT_SHARE * n)`` and at most
#: ``MAX_REPEATED_SHARE * n`` of the n rows, and ``REPEAT_SPIKE`` times as often
#: as any of the ``REPEAT_WINDOW`` nearest distinct values on either side in
#: that column, is a repeated value: a stuck sensor's, or a channel of a
#: frozen logger's record.  Rows holding one get no weight in the fit and
#: ``is_outlier`` flags them.  The neighbour rule keeps the natural modes of
#: quantized channels out (a lattice of integer counts with rare values between
#: its points: the window reaches past them); a value held by more rows is taken
#: for a regime of the data (an idle sensor's exact zeros), unless it is a measured
#: value on a column continuous apart from it (``MAX_HELD_SHARE``).  A value must also
#: hold ``REPEAT_SPIKE`` times the rows the model predicts for its lattice cell
#: (:func:`repeated_values`, Notes).
MAX_REPEATED_SHARE = 0.1

#: A value held by more than ``MAX_REPEATED_SHARE`` and less than this share of a column's rows is
#: still a stuck sensor's where the column is otherwise continuous and the value is a measurement
#: (:func:`_held_by_fault`): a stuck stretch of 10-20 % of an archive is 25-50 % of a smaller
#: operating mode's rows.  A value held by half the rows or more is the column's normal.
MAX_HELD_SHARE = 0.5

#: ... continuous: of the column's other non-zero cells, at most this share hold a value that another
#: cell holds too (a quantized channel at rest, whose resting level is a regime, repeats its other
#: levels as well).
CONTINUOUS_REPEATS = 0.05

#: ... a measured value: spelled in more than the median significant digits of up to this many of the
#: column's other values less ``SET_POINT_DIGITS`` (a round value is a set point).
DIGITS_VALUES = 256

#: A continuous channel whose largest (smallest) value is held exactly by at least this share of the
#: rows where it is observed (and ``TIGHT_MIN_ROWS``) saturates there: a reading at the limit says only
#: that the quantity lay at or beyond it (:func:`saturation_limits`).
SATURATION_SHARE = 0.002

#: ... and at most this share: a channel that mostly reads one value (a constant, an idle device's
#: zeros) is not saturating there.
MAX_SATURATED_SHARE = 0.5

#: ... and with at most this share of its values beyond it (glitches, which a clipped sensor's
#: electronics can still produce past its range).
BEYOND_LIMIT_SHARE = 0.05
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
    if _quantized(counts):
        return counts >= 2
    return np.ones(len(values), bool)


def _quantized(counts: np.ndarray) -> bool:
    """At least half of the rows hold values held by 2 rows or more (``counts``: per distinct value)."""
    return counts[counts >= 2].sum() >= 0.5 * counts.sum()


#: On a quantized column, the stuck-value rules (:func:`repeated_values`) compare a value with the
#: levels around it: lattice points held by at least this share of the rows of a typical level (the
#: median, over the rows on the lattice, of their value's count).  Values of another channel swapped
#: in land between the levels and some repeat by chance (2-7 rows where a NYC temperature level holds
#: 300-450); taken for levels, they made a busy level look like a spike among them (1.7 % of the clean
#: rows flagged in 3 of 10 draws of ``benchmarks/robustness.py``).
LEVEL_SHARE = 0.05
#: ... between busy levels at most this many times their median gap apart (:func:`_levels`).
BUSY_GAP = 3.0


def _levels(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The points of :func:`_lattice`, less the sparse ones between busy levels the usual gap apart.

    A busy level holds at least ``LEVEL_SHARE`` of a typical level's rows.  A sparse point between
    two busy levels at most ``BUSY_GAP`` times the median gap between busy levels apart is a chance
    repeat of values swapped in between the levels, not a level.  Where busy levels lie farther
    apart (the tails, past a stuck value's lone spike), every lattice point stays: a column's sparse
    tail levels are the neighbours against which a value stuck in the tail is a spike.
    """
    on = _lattice(values, counts)
    if not _quantized(counts):
        return on  # continuous: every distinct value
    held = np.sort(counts[on])
    typical = held[np.searchsorted(np.cumsum(held), held.sum() / 2)]  # the count of the median row's level
    busy = on & (counts >= LEVEL_SHARE * typical)
    at = values[busy]
    if len(at) < 3:
        return on
    gaps = np.diff(at)
    usual = gaps <= BUSY_GAP * np.median(gaps)  # between busy levels i and i + 1
    slot = np.searchsorted(at, values) - 1  # the busy level below each value (-1: none)
    inside = (slot >= 0) & (slot < len(gaps))
    chance = ~busy & inside
    chance[inside] &= usual[slot[inside]]
    return on & ~chance


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
    taken as continuous.  So is a column with fewer than two levels each
    held by ``TIGHT_SHARE`` of the rows (and by 2): a constant channel with a few
    glitches at one value would otherwise get the glitch for its step, and
    its variance floor and nearest-point rule would hide every deviation up
    to half of it (5 rows at 85 of 20,000 at 20: a step of 65).
    """
    steps = np.zeros(sample.shape[1])
    ties = column_ties(sample)  # a lattice has half its finite cells tied (_quantized); none else has a step
    for column in np.flatnonzero((ties.tied_finite > 0) & (2 * ties.tied_finite >= ties.n_finite)):
        values, counts = np.unique(sample[:, column], return_counts=True)
        finite = np.isfinite(values)
        values, counts = values[finite], counts[finite]
        if len(values) < 2:
            continue
        on = _lattice(values, counts)
        if on.all() and not (counts >= 2).all():
            continue  # continuous: every distinct value is a lattice point
        if np.count_nonzero(on & (counts >= max(2, TIGHT_SHARE * counts.sum()))) < 2:
            continue  # one level and rare values (a dead channel's glitches): no step between levels to read
        gaps = np.diff(values)
        # a float32 recording's gaps are off by up to a float32 spacing (1000.1 - 1000.0 is 0.1000366)
        slack = 2.0 * float(np.spacing(np.float32(np.abs(values).max()))) if _stored_as_float32(values) else 0.0
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            for divisor in range(1, MAX_STEP_DIVISOR + 1):
                step = gaps.min() / divisor
                ratio = gaps / step  # inf where the gaps span more than float64 (no common step)
                if step > 0 and slack < MAX_SLACK * step and np.all(np.isfinite(ratio)) and np.all(
                        np.abs(ratio - np.rint(ratio)) <= STEP_RTOL * np.maximum(ratio, 1.0) + slack / step):
                    steps[column] = step
                    break
    return steps


#: :func:`quantization_steps` looks for a common step among the smallest gap divided by 1 to this.
MAX_STEP_DIVISOR = 10
#: Relative tolerance of "a whole multiple of the step" (values rounded to decimals are not exact in binary).
STEP_RTOL = 1e-6
#: ... plus, for a column every value of which is a float32 value, two float32 spacings of its largest magnitude
#: (a float32 copy of values rounded to 0.1 near 1000 missed its step: the gaps are 0.0999756 or 0.1000366),
#: where that is under this share of the step (else float32 cannot tell the step).
MAX_SLACK = 0.1


def _stored_as_float32(values: np.ndarray) -> bool:
    """Whether every value is a finite float32 value (a float32 recording, read as float64)."""
    values = np.asarray(values, np.float64)
    if not np.all(np.abs(values) <= np.finfo(np.float32).max):
        return False  # beyond float32 (hypothesis found 3.40282357e38, just past its largest)
    return bool(np.array_equal(values.astype(np.float32).astype(np.float64), values))


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


def significant_digits(values: np.ndarray) -> np.ndarray:
    """Significant decimal digits of each value's shortest round-trip spelling in its dtype (0 for 0)."""
    out = np.zeros(np.shape(values), int)
    for i, v in enumerate(np.asarray(values).ravel()):
        if v != 0 and np.isfinite(v):
            mantissa = np.format_float_scientific(v, unique=True, trim="-").split("e")[0]
            out.flat[i] = len(mantissa.lstrip("-").replace(".", "").lstrip("0"))
    return out


def _held_by_fault(values: np.ndarray, counts: np.ndarray, value: float, to_stored: float | None = None) -> bool:
    """Whether ``value``, held by more than ``MAX_REPEATED_SHARE`` of a column's rows (its distinct
    ``values`` and their ``counts``), is a stuck sensor's rather than a regime of the data.

    A regime value on a channel (an idle device's zeros, a set point, the resting level of a quantized
    channel) is 0, or round: spelled in ``SET_POINT_DIGITS`` fewer significant digits than the median
    of up to ``DIGITS_VALUES`` of the column's other distinct values (a set point 20.5 among readings
    like 20.417; spelled in float32 where every value is a float32 value, so that a float32 20.3 reads
    20.3), or on a channel that repeats its other values too.  A continuous measurement repeats no
    value by chance: where at most ``CONTINUOUS_REPEATS`` of the column's other non-zero cells share a
    value, one measured value held exactly in many rows is a sensor that stopped.  ``to_stored``: the
    factor back to the values as stored, whose spelling is read (``scale="robust"``; see
    :func:`_as_stored`).
    """
    if value == 0:
        return False
    others = (values != value) & (values != 0) & (counts <= MAX_REPEATED_SHARE * counts.sum())
    rest = counts[others]
    if not rest.sum() or rest[rest >= 2].sum() > CONTINUOUS_REPEATS * rest.sum():
        return False
    spelled = _as_stored(np.append(values[others][:: max(1, -(-int(others.sum()) // DIGITS_VALUES))], value),
                         to_stored)
    if np.array_equal(as_float32(spelled), spelled):  # a float32 recording: spelled as it was written
        spelled = spelled.astype(np.float32)
    digits = significant_digits(spelled)
    return bool(digits[-1] > np.median(digits[:-1]) - SET_POINT_DIGITS)


def _as_stored(values: np.ndarray, to_stored: float | None) -> np.ndarray:
    """``values`` times ``to_stored``, the division by a channel's scale undone: the product is off
    by a rounding or two, so it is taken to the float32 value within ``1e-13`` of it where every value
    has one (a float32 recording), else spelled in 15 significant digits."""
    if to_stored is None:
        return values
    back = values * to_stored
    near = as_float32(back).astype(np.float64)
    if np.all(np.abs(near - back) <= 1e-13 * np.abs(back)):
        return near
    return np.array([float(f"{v:.15g}") for v in back])


def repeated_values(sample: np.ndarray, to_stored: np.ndarray | None = None) -> np.ndarray:
    """``(column, value)`` rows of the sample's repeated values (see above).

    Notes
    -----
    A value is a stuck sensor's when one column holds it exactly in at least
    ``max(TIGHT_MIN_ROWS, TIGHT_SHARE * n)`` and at most
    ``MAX_REPEATED_SHARE * n`` of the n rows (less than ``MAX_HELD_SHARE * n``
    on a column continuous apart from it, for a measured value,
    :func:`_held_by_fault`), and both:

    1. it is a spike on the column's levels (:func:`_levels`): held
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

    Above ``MAX_REPEATED_SHARE``: a value held by more rows is a regime of the
    data (an idle sensor's zeros, a set point, a quantized channel's resting
    level) unless the column is continuous apart from it and the value is a
    measurement, neither 0 nor round (:func:`_held_by_fault`).  Trade-off: a
    device that parks a continuous channel at one measured value over more
    than 10 % of the rows is taken for a stuck sensor; a sensor stuck at 0 or
    at a round value over that share is taken for a regime.
    """
    found = []
    w = REPEAT_WINDOW
    gappy = np.isnan(sample).any(axis=0)
    ties = column_ties(sample)  # a stuck value is held by k cells or more
    held_enough = ties.most >= np.maximum(TIGHT_MIN_ROWS, (TIGHT_SHARE * ties.n_values).astype(np.int64))
    for column in np.flatnonzero(held_enough):
        cells = sample[:, column]
        if gappy[column]:
            cells = cells[~np.isnan(cells)]  # a channel's missing cells say nothing of its values
        n = len(cells)
        k = max(TIGHT_MIN_ROWS, int(TIGHT_SHARE * n))
        values, counts = np.unique(cells, return_counts=True)
        if not n or not ((counts >= k) & (counts < MAX_HELD_SHARE * n)).any():
            continue
        on = _levels(values, counts)
        level = counts[on]
        padded = np.concatenate([np.zeros(w, level.dtype), level, np.zeros(w, level.dtype)])
        neighbours = np.max([padded[w + s : w + s + len(level)] for s in (*range(-w, 0), *range(1, w + 1))], axis=0)
        q1, centre, q3 = np.quantile(cells, [0.25, 0.5, 0.75])
        expected = _expected_counts(values, on, n, centre, (q3 - q1) / (2 * stats.norm.ppf(0.75)))
        spike = ((level >= k) & (level < MAX_HELD_SHARE * n) & (level >= REPEAT_SPIKE * neighbours)
                 & (level >= REPEAT_SPIKE * expected))
        found += [(column, v) for v, held in zip(values[on][spike], level[spike], strict=True)
                  if held <= MAX_REPEATED_SHARE * n
                  or _held_by_fault(values, counts, v, None if to_stored is None else to_stored[column])]
    return np.array(found, dtype=np.float64).reshape(-1, 2)


def as_float32(values: np.ndarray) -> np.ndarray:
    """``values`` rounded to float32 and back (where float32 holds them; unchanged elsewhere).

    A value learned from float64 rows is met in a float32 copy of the same recording as its
    float32 rounding: :func:`in_repeated` and :func:`in_repeated_rows` match either.
    """
    values = np.asarray(values, np.float64)
    with np.errstate(over="ignore"):
        rounded = values.astype(np.float32).astype(np.float64)
    return np.where(np.isfinite(rounded) | ~np.isfinite(values), rounded, values)


def value_matches(column: np.ndarray, value: float) -> np.ndarray:
    """``column == value``, or its float32 rounding (:func:`as_float32`)."""
    return (column == value) | (column == as_float32(value))


def in_repeated(rows: np.ndarray, repeated: np.ndarray | None) -> np.ndarray:
    """True for the rows holding one of the ``(column, value)`` pairs of ``repeated`` (or its float32 rounding)."""
    hit = np.zeros(len(rows), bool)
    for column, value in () if repeated is None else repeated:
        hit |= value_matches(rows[:, int(column)], value)
    return hit


def in_repeated_rows(rows: np.ndarray, repeated_rows: np.ndarray | None) -> np.ndarray:
    """True for the rows equal (exactly) to one of ``repeated_rows``, or to its float32 rounding.

    The first column picks the rows that may match; only those are compared
    whole (as :func:`._block.block_stats` does in a pass).
    """
    hit = np.zeros(len(rows), bool)
    for row in () if repeated_rows is None else repeated_rows:
        row32 = as_float32(row)
        maybe = np.flatnonzero(value_matches(rows[:, 0], row[0]))
        hit[maybe[(rows[maybe] == row).all(axis=1) | (rows[maybe] == row32).all(axis=1)]] = True
    return hit


def find_repeated(sample: np.ndarray, to_stored: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The sample's repeated rows, then the repeated values of its other rows.

    A frozen record's values inflate their columns' counts; once its rows are
    set aside, what is left of a value's count is the data's own, so the
    per-channel rule sees stuck sensors, not the record's channels (whose
    rows would be left out and flagged wholesale, clean ones included).  The
    rows of set points (an idle device's record) are set aside likewise: their
    values are the record's, not stuck channels.  Rows with missing (NaN)
    cells count for the values of their observed cells (a sensor stuck while
    another channel is offline), not for repeated rows.  ``to_stored``: per column, the factor back
    to the values as stored (:meth:`._passes.PassRunner.stored_units`).
    """
    gaps = np.isnan(sample).any(axis=1)
    complete = sample[~gaps] if gaps.any() else sample  # a record is a whole row (no copy: 160 MB at p = 1000)
    rows = _not_at_limits(repeated_rows(complete), complete)
    records = np.concatenate([rows, repeated_rows(complete, set_points=True)])
    held = in_repeated_rows(sample, records)
    return repeated_values(sample[~held] if held.any() else sample, to_stored), rows


def _not_at_limits(rows: np.ndarray, complete: np.ndarray) -> np.ndarray:
    """The repeated ``rows`` less those whose every cell on a continuous channel is at a saturation limit of
    ``complete`` (the others quantized): a clipped flow beside a valve's state repeats whole rows (the limit,
    each state), a saturation, not a frozen record (its 600 rows were all flagged); a frozen record repeats
    its continuous values too, and not all of them lie at limits."""
    if not len(rows):
        return rows
    steps = quantization_steps(complete)
    limits = saturation_limits(complete, steps)  # the channel's extreme: a record may sit in its last 5 %
    with np.errstate(invalid="ignore"):
        limits[(complete < limits[:, 0]).mean(axis=0) > TIGHT_SHARE, 0] = np.nan
        limits[(complete > limits[:, 1]).mean(axis=0) > TIGHT_SHARE, 1] = np.nan
    with np.errstate(invalid="ignore"):  # NaN: no limit
        at = (rows[:, :, None] == limits[None]).any(axis=2)
    return rows[~(at.any(axis=1) & (at | (steps > 0)).all(axis=1))]


def held_out(rows: np.ndarray, repeated: np.ndarray | None, repeated_rows: np.ndarray | None) -> np.ndarray:
    """True for the rows the fit gives no weight: holding one of the ``repeated`` values, or equal to
    one of the ``repeated_rows`` (both in the units of ``rows``)."""
    return in_repeated(rows, repeated) | in_repeated_rows(rows, repeated_rows)


def saturation_limits(sample: np.ndarray, steps: np.ndarray, repeated: np.ndarray | None = None) -> np.ndarray:
    """Each channel's lower and upper saturation limits, NaN where it has none: shape (p, 2).

    A channel that is continuous at the fit (``steps`` 0: values seldom repeat)
    saturates at a value that it holds exactly in many rows and that at most
    ``BEYOND_LIMIT_SHARE`` of its values lie beyond (the most extreme such
    value on either side): at least
    ``max(TIGHT_MIN_ROWS, SATURATION_SHARE * n)`` and at most
    ``MAX_SATURATED_SHARE * n`` of the n rows where it is observed hold
    exactly that value: a clipped sensor, an ADC at its range limit.  A value
    already taken for a stuck sensor's (``repeated``, ``(column, value)``
    pairs) is not a limit.  Quantized channels have none: their extreme
    levels are levels like the others.
    """
    p = sample.shape[1]
    limits = np.full((p, 2), np.nan)
    stuck = {(int(c), float(v)) for c, v in (() if repeated is None else repeated)}
    finite = np.isfinite(sample).all(axis=0)
    ties = column_ties(sample)  # a limit is held by many cells
    busy = ties.most_finite >= np.maximum(TIGHT_MIN_ROWS, SATURATION_SHARE * ties.n_finite)
    for column in np.flatnonzero((np.asarray(steps) == 0) & busy):
        cells = sample[:, column]
        if not finite[column]:
            cells = cells[np.isfinite(cells)]
        if not len(cells):
            continue
        n = len(cells)
        values, counts = np.unique(cells, return_counts=True)
        busy = (counts >= max(TIGHT_MIN_ROWS, SATURATION_SHARE * n)) & (counts <= MAX_SATURATED_SHARE * n)
        candidates = [v for v in values[busy] if (int(column), float(v)) not in stuck]
        if not candidates:
            continue
        low, high = min(candidates), max(candidates)
        if np.mean(cells < low) <= BEYOND_LIMIT_SHARE:  # only glitches lie beyond a limit
            limits[column, 0] = low
        if np.mean(cells > high) <= BEYOND_LIMIT_SHARE:
            limits[column, 1] = high
    return limits
