"""Which columns of a sample hold some value twice: a screen for the rules of :mod:`._repeated`.

Every rule there (a quantization step, a stuck value, a saturation limit)
reads a column's distinct values and their counts, and needs a value held by
two rows or more; a column whose values are all distinct (a continuous
channel: most channels of a wide archive) has none, step 0 and no limit.
``np.unique`` sorts each column to find that out, five times a fit per
column: 3.7 s of the client's work at p = 1000 on a 20,000-row sample.
:func:`tied_columns` answers the question in one pass of a hash table per
column (0.3 s there), and the rules sort only the columns it names.  The
answer is exact, so the rules' results are the same bits.
"""

from __future__ import annotations

import numpy as np

from ._compiled import AVAILABLE, compiled
from ._threads import map_on_cores, usable_cores

__all__ = ["tied_columns"]

#: Fibonacci hashing's multiplier (2^64 over the golden ratio, odd).
_GOLDEN = 0x9E3779B97F4A7C15


def tied_columns(sample: np.ndarray) -> np.ndarray:
    """True for each column of ``sample`` (n x p) in which some value other than NaN occurs twice or more.

    Values compare as ``np.unique`` compares them: ``0.0`` and ``-0.0`` are one value, NaN is none, and
    infinities count like any value."""
    X = np.ascontiguousarray(sample, dtype=np.float64)
    if X.ndim != 2 or not X.size:
        return np.zeros(X.shape[1] if X.ndim == 2 else 0, bool)
    if not AVAILABLE:  # pragma: no cover - numba is a dependency
        return np.array([_holds_twice(column[~np.isnan(column)]) for column in X.T], bool)
    p = X.shape[1]
    width = max(MIN_PIECE_COLUMNS, -(-p // usable_cores()))  # a run of columns a thread (the loop holds no GIL)
    runs = [(first, min(first + width, p)) for first in range(0, p, width)]
    return np.concatenate(map_on_cores(lambda run: _tied(X, *run), runs))


#: Columns that one thread screens at least (a thread's start costs more than a few columns).
MIN_PIECE_COLUMNS = 32


def _holds_twice(values: np.ndarray) -> bool:
    return bool(len(values) and (np.unique(values, return_counts=True)[1] >= 2).any())


@compiled(fastmath=False)  # exact comparisons; -0.0 + 0.0 must stay 0.0
def _tied(X, first, last):  # pragma: no cover - compiled; tests/test_repeated.py checks it against np.unique
    n = X.shape[0]
    bits = 4
    while (1 << bits) < n + n // 2:  # load factor under 2/3: short probes
        bits += 1
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    keys = np.empty(mask + 1, np.float64)
    stamp = np.zeros(mask + 1, np.int64)  # a slot is taken in column j when its stamp is j + 1 (no clearing)
    column = np.empty(n, np.float64)
    column_bits = column.view(np.uint64)
    out = np.zeros(last - first, np.bool_)
    for j in range(last - first):
        for i in range(n):
            column[i] = X[i, first + j] + 0.0  # -0.0 becomes 0.0: one key for the two zeros
        for i in range(n):
            v = column[i]
            if v != v:
                continue  # NaN: no value
            h = np.int64((column_bits[i] * np.uint64(_GOLDEN)) >> shift)
            while stamp[h] == j + 1:
                if keys[h] == v:
                    out[j] = True
                    break
                h = (h + 1) & mask
            if out[j]:
                break
            stamp[h] = j + 1
            keys[h] = v
    return out
