"""How a sample's columns repeat their values: a screen for the rules of :mod:`._repeated`.

Every rule there (a quantization step, a stuck value, a saturation limit)
reads a column's distinct values and their counts from ``np.unique``, which
sorts the column, and each needs more than a value held twice: a stuck value
or a saturation limit is held by at least ``TIGHT_MIN_ROWS`` cells, a lattice
has half its cells on values held twice.  A continuous channel (most channels
of a wide archive) has none of these, though a float32 one holds some value
twice by chance (2 or 3 cells of 50,000).  :func:`column_ties` counts, in one
pass of a hash table per column, what each rule asks for, and the rules sort
only the columns that can pass: 3.6 s of a p = 1000 float32 fit's client work
went to sorting 4,700 columns.  The counts are exact, so the rules' results
are the same bits.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._compiled import AVAILABLE, compiled
from ._threads import map_on_cores, usable_cores

__all__ = ["ColumnTies", "column_ties"]

#: Fibonacci hashing's multiplier (2^64 over the golden ratio, odd).
_GOLDEN = 0x9E3779B97F4A7C15


class ColumnTies(NamedTuple):
    """Per column of a sample, what the rules of :mod:`._repeated` need to know before they sort it: the
    cells that hold a value (not NaN; infinities count), the most cells holding one such value, the
    finite cells, the most cells holding one finite value, and the finite cells on a finite value that
    two or more cells hold.  Counted as ``np.unique`` counts (``0.0`` and ``-0.0`` one value)."""

    n_values: np.ndarray
    most: np.ndarray
    n_finite: np.ndarray
    most_finite: np.ndarray
    tied_finite: np.ndarray


def column_ties(sample: np.ndarray) -> ColumnTies:
    """:class:`ColumnTies` of each column of ``sample`` (n x p), one pass of a hash table per column
    (runs of columns on the client's cores; the loop holds no GIL)."""
    X = np.ascontiguousarray(sample, dtype=np.float64)
    p = X.shape[1] if X.ndim == 2 else 0
    if not X.size:
        return ColumnTies(*np.zeros((5, p), np.int64))
    if not AVAILABLE:  # pragma: no cover - numba is a dependency
        return ColumnTies(*_ties_by_sorting(X))
    width = max(MIN_PIECE_COLUMNS, -(-p // usable_cores()))
    runs = [(first, min(first + width, p)) for first in range(0, p, width)]
    return ColumnTies(*np.concatenate(map_on_cores(lambda run: _tie_counts(X, *run), runs), axis=1))


#: Columns that one thread screens at least (a thread's start costs more than a few columns).
MIN_PIECE_COLUMNS = 32


def _ties_by_sorting(X: np.ndarray) -> np.ndarray:
    """:func:`column_ties`' counts from ``np.unique`` (without numba), one row of the result per count."""
    out = np.zeros((5, X.shape[1]), np.int64)
    for j, column in enumerate(X.T):
        values, counts = np.unique(column[~np.isnan(column)], return_counts=True)
        finite = counts[np.isfinite(values)]
        out[:, j] = (counts.sum(), counts.max(initial=0), finite.sum(), finite.max(initial=0),
                     finite[finite >= 2].sum())
    return out


@compiled(fastmath=False)  # exact comparisons; -0.0 + 0.0 must stay 0.0
def _tie_counts(X, first, last):  # pragma: no cover - compiled; tests/test_repeated.py checks it against np.unique
    """:func:`column_ties`' counts of columns ``first`` to ``last``: open addressing, one table reused
    for every column (a slot belongs to column j while its stamp is j + 1: no clearing)."""
    n = X.shape[0]
    bits = 4
    while (1 << bits) < n + n // 2:  # load factor under 2/3: short probes
        bits += 1
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    keys = np.empty(mask + 1, np.float64)
    held = np.zeros(mask + 1, np.int64)
    stamp = np.zeros(mask + 1, np.int64)
    column = np.empty(n, np.float64)
    column_bits = column.view(np.uint64)
    out = np.zeros((5, last - first), np.int64)
    for j in range(last - first):
        for i in range(n):
            column[i] = X[i, first + j] + 0.0  # -0.0 becomes 0.0: one key for the two zeros
        for i in range(n):
            v = column[i]
            if v != v:
                continue  # NaN: no value
            h = np.int64((column_bits[i] * np.uint64(_GOLDEN)) >> shift)
            while stamp[h] == j + 1 and keys[h] != v:
                h = (h + 1) & mask
            if stamp[h] != j + 1:
                stamp[h] = j + 1
                keys[h] = v
                held[h] = 0
            held[h] += 1  # the cells of this column holding v so far
            c = held[h]
            out[0, j] += 1
            out[1, j] = max(out[1, j], c)
            if abs(v) < np.inf:
                out[2, j] += 1
                out[3, j] = max(out[3, j], c)
                out[4, j] += 2 if c == 2 else (1 if c > 2 else 0)  # a second cell brings the first in
    return out
