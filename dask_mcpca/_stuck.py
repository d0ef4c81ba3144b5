"""A fitted model's rules for cells a stuck sensor holds, read from rows in order.

A cell holds a stuck value when it is one the fit learned
(``repeated_values_``), or, on a channel continuous at the fit, exactly the
value of the row before where that value needs near its dtype's full
precision (:func:`held_cells`); a sensor stuck since the fit holds one value
in :data:`STUCK_RUN` consecutive rows (:func:`stuck_runs`) of a channel that moves by
far more than it is written to (:func:`stuck_cells`); and a flagged row's
channel at fault is the stuck cell that explains the flag
(:func:`isolated_top`).  These functions read rows as stored, in order (a
run and its digits are judged on the stored values), and divide only what
they compare with the learned values by ``scale_``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _missing
from ._distances import limit_tolerances, observed_counts
from ._precision import channel_variances, contributor, model_rows
from ._repeated import significant_digits, value_matches

__all__ = [
    "FULL_DIGITS",
    "HOLD_WINDOW",
    "RESOLUTION_RATIO",
    "SET_POINT_RATIO",
    "STUCK_RUN",
    "WRITTEN_VALUES",
    "held_cells",
    "isolated_top",
    "stuck_cells",
    "stuck_runs",
]

#: A channel that holds one exact value in this many consecutive rows is stuck from the last of them on
#: (:func:`stuck_runs`): a continuous measurement repeats its exact value about once in 1e6 rows (float32),
#: so nine repeats in a row do not happen by chance, and a stuck stretch of s rows is found in s - 9 of them.
#: The rule reads rows in order and looks only back: a row's verdict never changes when rows are appended.
STUCK_RUN = 10

#: ... unless, in the ``HOLD_WINDOW`` rows before the cell, the channel repeated a value before the run
#: began: then it holds values by nature (a slow sensor logged faster than it updates), and its runs are
#: not faults.  A run longer than the window is stuck whatever came before it.  Each verdict reads a fixed
#: window of rows before its own, so it does not depend on how the rows are cut into blocks.
HOLD_WINDOW = 1024

#: Shortest decimal digits (round-trip, :func:`._repeated.significant_digits`) of a value whose exact
#: repeat from one row to the next is taken as a stuck sensor's, by the dtype the rows are stored in:
#: near the dtype's full precision, which a measurement on a coarser grid (integers, a fixed number of
#: decimals, an ADC's steps written in decimal) does not need, and which a continuous value repeats by
#: chance about once in 1e12 (float64) or 1e6 (float32) rows.
FULL_DIGITS = {np.dtype(np.float64): 13, np.dtype(np.float32): 7}


#: Values of a channel before a run that say how it moves and how finely it is written (:func:`_moving_channels`).
WRITTEN_VALUES = 32

#: A channel whose typical change from one row to the next is at least this many times the resolution it is
#: written at (the last digit of its values' shortest spelling) repeats a value exactly with probability
#: about 1 / (this ratio) a row, so nine repeats in a row (:data:`STUCK_RUN`) are not chance.
RESOLUTION_RATIO = 10.0


#: A run whose value is written this many times more coarsely than the channel's values before it is a set
#: point (an idle device's 20.5), not a reading that stuck (:func:`_moving_channels`).  A run longer than
#: :data:`HOLD_WINDOW`, whose window holds no value from before it, is a reading that stuck when its value is
#: written this many times more finely than the channel's spread under the model (0.43159 against a spread of
#: 1; a set point, 20.5 against 2, is coarser).  That rule once asked for the dtype's near-full precision (12
#: digits in float64), so a float64 recording logged to six decimals stopped being flagged once its run
#: outgrew the window, while its float32 copy went on.
SET_POINT_RATIO = 1000.0


def _model_cells(model: Any, values: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """Cells ``values`` (as stored) of the channels ``columns`` in the model's units."""
    scale = getattr(model, "scale_", None)
    return values if scale is None else np.asarray(values, np.float64) / scale[columns]


def held_cells(model: Any, rows: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Cells of ``rows`` (data units, as stored) that hold a stuck value: one of ``repeated_values_``,
    or, on a channel continuous at the fit (``quantization_steps_`` 0), exactly the value of the row
    before (``before``, the same shape; NaN where there is none), where that value needs near its
    dtype's full precision (:data:`FULL_DIGITS`).

    A continuous measurement repeats its exact value with probability near 0; a quantized channel,
    or one written on a coarser grid (integers, rounded decimals, the values of a real recording
    logged to 6 decimals), often, so there only the values the fit learned count.
    """
    steps = getattr(model, "quantization_steps_", None)
    continuous = np.ones(rows.shape[1], bool) if steps is None else np.asarray(steps) == 0
    held = (rows == before) & continuous
    if held.any():  # spelled once per distinct value: a stuck stretch holds one value in many rows
        at = np.nonzero(held)
        values, which = np.unique(rows[at], return_inverse=True)
        held[at] = _full_precision(values, rows.dtype)[which.ravel()]
    learned = getattr(model, "repeated_values_", None)
    for column, value in () if learned is None else learned:  # learned in the model's units
        j = int(column)
        held[:, j] |= value_matches(_model_cells(model, rows[:, j], j), value)
    return held


def _full_precision(values: np.ndarray, dtype) -> np.ndarray:
    """True for the ``values`` whose shortest spelling in ``dtype`` needs near its full precision
    (:data:`FULL_DIGITS`)."""
    return significant_digits(values) >= FULL_DIGITS.get(np.dtype(dtype), FULL_DIGITS[np.dtype(np.float64)])


def stuck_cells(model: Any, block, before) -> np.ndarray:
    """Cells of ``block`` (rows in order, as stored) that a sensor stuck since the fit holds.

    A channel continuous at the fit (``quantization_steps_`` 0), that moved by far more than it is
    written to before (:func:`_moving_channels`), holding one value, not at a saturation limit
    (``saturation_limits_``), in :data:`STUCK_RUN` consecutive rows, having repeated no
    other value in the :data:`HOLD_WINDOW` rows before (:func:`stuck_runs`).
    The fit's row sample learns a value stuck in the fitted rows (``repeated_values_``); this
    rule finds one that sticks later, for monitoring.  Quantized channels, values on a coarser grid
    (an idle device's zeros, a set point) and a saturated reading are not judged by it.

    ``before``: the :data:`._model.CONTEXT_ROWS` rows before the block (NaN where there are none), or None.
    """
    block = np.asarray(block)
    steps = getattr(model, "quantization_steps_", None)
    if steps is None or block.dtype.kind != "f":
        return np.zeros(block.shape, bool)
    cells, began = stuck_runs(block, before, np.asarray(steps) == 0, starts=True)
    if cells.any():
        at = np.nonzero(cells)
        keep = _moving_channels(block, before, at, began[at], _channel_spreads(model))
        limits = getattr(model, "saturation_limits_", None)
        if limits is not None:
            values = _model_cells(model, block[at], at[1])  # limits are in the model's units
            tolerances = limit_tolerances(model)[at[1]]
            with np.errstate(invalid="ignore"):  # NaN: no limit, never near
                keep &= ~np.any(np.abs(values[:, None] - limits[at[1]]) <= tolerances, axis=1)
        cells[at[0][~keep], at[1][~keep]] = False
    return cells


def _resolution(values: np.ndarray, dtype) -> np.ndarray:
    """The power of ten of each value's last significant digit in its shortest spelling in ``dtype``."""
    values = np.asarray(values, dtype)
    with np.errstate(divide="ignore"):
        return 10.0 ** (np.floor(np.log10(np.abs(values.astype(np.float64)))) - significant_digits(values) + 1)


def _channel_spreads(model: Any) -> np.ndarray:
    """Each channel's standard deviation under the model, in the data's units (as stored): from its
    fitted variances as they are, not floored (a channel that never moved has none, whatever its runs)."""
    spread = np.sqrt(channel_variances(model))
    scale = getattr(model, "scale_", None)
    return spread if scale is None else spread * scale


def _moving_channels(block: np.ndarray, before, at: tuple[np.ndarray, np.ndarray], began: np.ndarray,
                     spreads: np.ndarray) -> np.ndarray:
    """Whether each run of the cells ``at`` (rows, columns of ``block``; its run began at row ``began``)
    is on a channel that moves by much more than it is written to: the median change between
    consecutive rows of its last :data:`WRITTEN_VALUES` values before the run is at least
    :data:`RESOLUTION_RATIO` times their median resolution (:func:`_resolution`), those values taken
    within the cell's window of :data:`HOLD_WINDOW` rows (so that no verdict depends on the
    chunking).  Where fewer than two lie there (a run longer than the window), the run's own value
    must be written :data:`SET_POINT_RATIO` times more finely than the channel's spread under the model
    (``spreads``, data units).  A channel written on a grid as
    coarse as its movement (a slow temperature in tenths of a degree) is left to the fit's rules;
    a recording logged to six decimals whose values move by far more is judged.  A run of a value
    written :data:`SET_POINT_RATIO` times more coarsely than the values before it is a set point.
    """
    rows, cols = at
    head = np.full((0, block.shape[1]), np.nan, block.dtype) if before is None else np.asarray(before, block.dtype)
    X = np.concatenate([head[-HOLD_WINDOW:], block])
    offset = len(X) - len(block)
    start = began + offset  # in X
    lowest = np.maximum(rows + offset - HOLD_WINDOW, 0)  # the cell's window
    first = np.maximum(start - WRITTEN_VALUES, lowest)
    keep = np.zeros(len(rows), bool)
    groups, which = np.unique(np.stack([cols, first, start]), axis=1, return_inverse=True)
    for g, (col, a, b) in enumerate(groups.T):
        values = X[a:b, col]
        steps = np.abs(np.diff(values.astype(np.float64)))
        steps = steps[np.isfinite(steps)]
        written = values[np.isfinite(values) & (values != 0)]
        if len(steps) and len(written):
            resolution = np.median(_resolution(written, block.dtype))
            moving = (np.median(steps) >= RESOLUTION_RATIO * resolution
                      and _resolution(X[b : b + 1, col], block.dtype)[0] < SET_POINT_RATIO * resolution)
        else:  # the run began before the window: its own value
            moving = _resolution(X[b : b + 1, col], block.dtype)[0] * SET_POINT_RATIO <= spreads[col]
        keep[which.ravel() == g] = moving
    return keep


def isolated_top(model: Any, block, before, d2, calibrated, flags, top, contributions=None) -> np.ndarray:
    """The channel at fault of each row: ``top`` (its largest reconstruction-based contribution),
    except in a flagged row holding a stuck cell (:func:`held_cells`) that explains the flag (in a
    row with missing cells, judged on its observed ones).

    A cell explains the flag when reconstructing it alone brings the row's ``d2`` under
    ``outlier_cutoff_`` (``d2`` minus its contribution, which is the row's ``d^2`` with that cell
    at its best value), or when the row is flagged by a repeated value or row only (its
    ``calibrated`` distance under the cutoff).  Of such cells, the one with the largest
    contribution is named.  The contributions are a likelihood ratio per row; the held value
    is evidence across rows: a sensor stuck beside a near-copy of itself is told from the copy
    by its repeats, where a single row cannot tell them apart.

    ``before``: the row before the block's first (NaN, or None: none); ``contributions``: the
    block's, if already computed.  ``top`` is changed in place and returned.
    """
    idx = np.flatnonzero(flags)
    if not len(idx):
        return top
    block = np.asarray(block)
    if block.dtype not in FULL_DIGITS:
        block = block.astype(np.float64)
    rows = block[idx]
    previous = block[np.maximum(idx - 1, 0)]  # one gather; the block's first row has the row before it
    if idx[0] == 0:
        previous[0] = np.nan if before is None else np.asarray(before, block.dtype).reshape(-1)
    held = held_cells(model, rows, previous)
    if len(_missing.nonfinite_rows(rows)):  # a held cell is a value; a row with inf names none
        held &= np.isfinite(rows) & ~np.isinf(rows).any(axis=1)[:, None]
    rows = model_rows(model, np.asarray(rows, np.float64))
    some = np.flatnonzero(held.any(axis=1))
    if not len(some):
        return top
    at = idx[some]
    c = contributions[at] if contributions is not None else contributor(model, "reconstruction")(rows[some])
    cutoff = model.outlier_cutoff_
    rest = d2[at, None] - c  # the row's d^2 with the cell at its best value (on its observed cells)
    counts = observed_counts(rows[some])
    if (counts < rows.shape[1]).any():  # on the p-channel scale of the cutoff, as calibrated_d2 maps it
        shape = rest.shape
        rest = _missing.equivalent_d2(rest.ravel(), np.repeat(counts, shape[1]), rows.shape[1]).reshape(shape)
    with np.errstate(invalid="ignore"):
        explains = held[some] & ((rest <= cutoff) | (calibrated[at] <= cutoff)[:, None])
    named = explains.any(axis=1)
    top[at[named]] = np.argmax(np.where(explains[named], c[named], -np.inf), axis=1)
    return top


def stuck_runs(rows: np.ndarray, before: np.ndarray | None, watched: np.ndarray, *, run: int = STUCK_RUN,
               window: int = HOLD_WINDOW, starts: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Cells of ``rows`` in a run of one exact value at least ``run`` rows long up to them (rows in
    order), on the ``watched`` channels, where, of the ``window`` rows before the cell, those before
    the run began hold no repeat (a run longer than ``window`` counts whatever came before it).

    Parameters
    ----------
    rows : ndarray of shape (n, p)
        The rows, in order, as stored.  NaN, inf and 0 never count as a repeat (0 is an idle
        device's state, and what a row-block method puts in rows it does not judge).
    before : ndarray of shape (m, p) or None
        The rows just before ``rows`` (NaN where there are none; ``m >= window`` gives every
        cell its whole window); None: none.
    watched : ndarray of bool, shape (p,)
        The channels the rule applies to.
    run, window : int
        :data:`STUCK_RUN` and :data:`HOLD_WINDOW`.
    starts : bool
        Also return, for each cell, the row its run began at, counted from the first of ``rows``
        (negative: in ``before``).

    Returns
    -------
    ndarray of bool, shape (n, p)
        NaN never repeats; which values may be stuck (their precision, a saturation limit) is
        the caller's to decide.
    ndarray of int, shape (n, p)
        With ``starts``.
    """
    n, p = rows.shape
    out = np.zeros((n, p), bool)
    began_at = np.zeros((n, p), np.int64)
    cols = np.flatnonzero(watched)
    if not n or not len(cols):
        return (out, began_at) if starts else out
    rows = np.asarray(rows)
    sub = rows if len(cols) == p else rows[:, cols]
    head = np.full((0, len(cols)), np.nan) if before is None else np.asarray(before)[-window:, cols]
    with np.errstate(invalid="ignore"):  # the usual block: no value repeats, and no copy of it is made
        if not (sub[1:] == sub[:-1]).any() and not (len(head) and (sub[0] == head[-1]).any()):
            return (out, began_at) if starts else out
    X = np.concatenate([head, sub]) if len(head) else sub
    same = np.zeros(X.shape, bool)
    with np.errstate(invalid="ignore"):  # zeros are a set state (and the rows a method masks), not a held value
        same[1:] = (X[1:] == X[:-1]) & (X[1:] != 0) & np.isfinite(X[1:])
    if not same[len(head) :].any():  # the usual block: no value repeats
        return (out, began_at) if starts else out
    m = len(X)
    index = np.arange(m)[:, None]
    began = np.maximum.accumulate(np.where(same, 0, index), axis=0)  # the first row of each cell's run
    length = index - began + 1
    pairs = np.cumsum(same, axis=0)  # repeats up to each row: those before a run are pairs[began - 1] - ...
    first = np.maximum(index - window, 0)  # the window: rows first .. began - 1 (repeats at rows first+1 ..)
    earlier = np.take_along_axis(pairs, np.maximum(began - 1, 0), axis=0) - np.take_along_axis(pairs, first, axis=0)
    stuck = (length >= run) & ((length > window) | (earlier == 0))
    out[:, cols] = stuck[len(head) :]
    began_at[:, cols] = began[len(head) :] - len(head)
    return (out, began_at) if starts else out
