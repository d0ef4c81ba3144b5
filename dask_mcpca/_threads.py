"""The client's own cores, for its in-memory work between passes.

Between two reads of the data the client works on the row sample alone: at
p = 1000, 20,000 rows, each step is a second or so of numpy or compiled
work per column or per direction.  Where that work releases the GIL (numpy's
partial sorts, the compiled loops) and splits into independent pieces, the
pieces run at once on the cores the process may use (:func:`map_on_cores`).
Each piece's result is the same whichever thread runs it and whenever, and
they are returned in order: the threads change the time, never the bits.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

__all__ = ["usable_cores", "map_on_cores", "MAX_THREADS"]

#: Threads of the client's work between passes (its BLAS products have their own threads).
MAX_THREADS = 4


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this OS
        return os.cpu_count() or 1


def map_on_cores(fn, pieces: list, *args) -> list:
    """``[fn(piece, *args) for piece in pieces]``, the pieces on up to :data:`MAX_THREADS` threads."""
    threads = min(len(pieces), usable_cores(), MAX_THREADS)
    if threads <= 1:
        return [fn(piece, *args) for piece in pieces]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(fn, pieces, *([a] * len(pieces) for a in args)))
