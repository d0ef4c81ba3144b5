"""What ``update`` and ``score --append`` rely on: the archive rows read, as runs, and their fingerprint.

A model written by ``dask-mcpca fit``/``update`` records the archive rows its
sums hold as a set of runs, ``[[start, stop), ...]`` by position, sorted and
disjoint, gaps kept (:func:`add_run`): ``update --rows 25000:30000`` after a
fit of ``0:20000`` records two runs, and a later ``update --rows 20000:25000``
fills the gap.

A fingerprint is a few rows' digests (:func:`row_digest`: 63 bits of
BLAKE2b over the row's float64 bytes), kept as ``[position, digest]`` pairs:

- a score store samples its rows every :data:`EVERY` rows and its last row,
  read in the pass that scores them (the sampled rows share the pass's
  reads: no chunk is read twice); ``score --append`` checks the last row
  before the new ones (inside the rows it reads anyway for context) and one
  older sample, chosen by the store's row count so that successive appends
  visit every sample (:func:`checked`): one input chunk more than the append
  reads anyway;
- a model samples the rows ``fit`` reads at :data:`RUN_SAMPLES` positions,
  first and last row included (read after the fit's passes: at most that
  many chunks), and the last row of each run ``update`` reads (one chunk,
  the last it read); at most :data:`MAX_SAMPLES` in all (older ones thinned
  evenly).  ``update`` checks the newest sample and one older one before it
  reads the new rows, in the same small read: at most three chunks more than
  the new rows' one pass.

A changed row among those checked is refused in one line
(:func:`changed_rows`): a store or model computed from rows the archive no
longer holds would otherwise be carried on silently.  A fingerprint sees a
rewrite of the archive or of a stretch holding a sampled row, not one changed
cell between samples.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = ["EVERY", "RUN_SAMPLES", "MAX_SAMPLES", "RunsError", "as_runs", "add_run", "overlap", "runs_text",
           "store_positions", "run_positions", "row_digest", "digests", "checked", "changed_rows", "thin"]

#: A score store's fingerprint samples one row in this many (and its last row).
EVERY = 2**16
#: Rows a model samples in each run it reads: the first, the last, and evenly spaced ones between.
RUN_SAMPLES = 8
#: Samples a model keeps at most (older ones thinned evenly, the newest last row always kept).
MAX_SAMPLES = 256


class RunsError(ValueError):
    """Recorded runs or samples are malformed; the message says how, in one line."""


def as_runs(value) -> list[tuple[int, int]]:
    """The runs ``[(start, stop), ...]`` of a recorded ``archive_rows_``: ``[start, stop)`` (a model
    written before runs were kept) or ``[[start, stop], ...]``, sorted, disjoint and not touching."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu" or arr.size == 0 or arr.shape[-1:] != (2,) or arr.ndim not in (1, 2):
        raise RunsError(f"archive_rows_ must be [start, stop) or a list of such runs of whole numbers, got {value!r}")
    runs = [(int(a), int(b)) for a, b in arr.reshape(-1, 2)]
    prev = -1
    for a, b in runs:
        if not (0 <= a < b) or a <= prev:
            raise RunsError(f"archive_rows_ must hold runs 0 <= start < stop, sorted and apart, got {runs!r}")
        prev = b
    return runs


def add_run(runs: list[tuple[int, int]], run: tuple[int, int]) -> list[tuple[int, int]]:
    """``runs`` with ``run`` added (it must not overlap them): runs that touch are joined, gaps kept."""
    out: list[list[int]] = []
    for a, b in sorted([*runs, run]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def overlap(runs: list[tuple[int, int]], run: tuple[int, int]) -> list[tuple[int, int]]:
    """The parts of ``run`` that lie in ``runs``."""
    return [(max(a, run[0]), min(b, run[1])) for a, b in runs if a < run[1] and run[0] < b]


def runs_text(runs) -> str:
    """``0:20,000 and 25,000:30,000``."""
    parts = [f"{a:,}:{b:,}" for a, b in runs]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def store_positions(start: int, stop: int) -> list[int]:
    """A score store's sampled rows in ``[start, stop)``: every :data:`EVERY`-th position, and ``stop - 1``."""
    first = -(-start // EVERY) * EVERY
    return sorted({*range(first, stop, EVERY), stop - 1}) if stop > start else []


def run_positions(start: int, stop: int, n: int = RUN_SAMPLES) -> list[int]:
    """A model's sampled rows of the run ``[start, stop)``: ``n`` evenly spaced, the last row first, the
    first row too where ``n > 1``."""
    return sorted({int(round(x)) for x in np.linspace(stop - 1, start, n)}) if stop > start else []


def row_digest(row) -> int:
    """63 bits of BLAKE2b over the row's values as float64 (the same for float32 input as stored)."""
    data = np.ascontiguousarray(np.asarray(row, dtype=np.float64)).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def digests(rows) -> list[int]:
    """:func:`row_digest` of each row of ``rows`` (m x p)."""
    return [row_digest(r) for r in np.asarray(rows)]


def checked(samples: list[tuple[int, int]], salt: int) -> list[tuple[int, int]]:
    """The samples an append or update checks: the last (the newest row read) and one older one, picked
    by ``salt`` (the rows held), so that successive checks visit them all."""
    if len(samples) <= 2:
        return list(samples)
    older = samples[:-1]
    return [older[salt % len(older)], samples[-1]]


def changed_rows(samples: list[tuple[int, int]], got: list[int]) -> list[int]:
    """The positions of ``samples`` whose digest is not the one in ``got`` (in the same order)."""
    return [pos for (pos, want), have in zip(samples, got, strict=True) if int(want) != int(have)]


def thin(samples: list[tuple[int, int]], cap: int = MAX_SAMPLES) -> list[tuple[int, int]]:
    """At most ``cap`` of ``samples`` (by position), evenly spaced, the first and the last kept."""
    if len(samples) <= cap:
        return samples
    keep = sorted({int(round(x)) for x in np.linspace(0, len(samples) - 1, cap)})
    return [samples[i] for i in keep]
