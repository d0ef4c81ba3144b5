"""Appending rows to a store written by ``dask-mcpca score`` (``score --append``).

A score store is put in place whole (:func:`._atomic.atomic_path`), and so is
a store with appended rows: the new version is a temporary sibling that
starts as a copy of the old one, gets the new rows, and is renamed over it.
The copy costs no reading or writing of the old rows: every chunk file that
holds only old rows is a hard link to the old one (:func:`clone_for_append`).
Nothing writes a linked file: the new rows are written into chunks from the
first one that holds a new row on, and those chunks, and every metadata file,
are copied, not linked.  An interruption leaves the old store as it was.

What a store was scored with is kept in its attributes (:func:`provenance`):
the input (path, dataset, variables), the archive rows by position, the
number of channels and the segments: which model file (its path and SHA-256)
scored which rows.  Rows are appended only to a store written from the same
input with as many channels (:func:`check_appendable`); they may be scored by
another model, the model ``dask-mcpca update`` made of the one before, as the
monitoring loop does (fit once, then each period ``update`` and
``score --append``).  The new rows then start a segment of their own
(:func:`segments_after`), and ``model_sha256`` names the model of the last.

The input rows scored are fingerprinted (:data:`ROW_DIGESTS_ATTR`, see
:mod:`._rowprints`): a row every 65,536 and the last one, read in the pass
that scores them.  ``score --append`` reads, in its own pass, the last row
before the new ones and one older sample (:func:`old_rows_changed`), and
refuses when either changed: the old rows' scores would no longer be those
of the input.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil

from . import _rowprints
from ._exceptions import AppendError
from ._urls import read_bytes

__all__ = ["model_digest", "provenance", "check_appendable", "clone_for_append", "aligned_chunks",
           "segments_of", "segments_after", "stored_digests", "digests_after", "old_rows_changed", "ROWS_ATTR",
           "MODEL_ATTR", "SEGMENTS_ATTR", "ROW_DIGESTS_ATTR"]

#: Attribute of a score store: ``[start, stop)``, the archive rows it holds, by position.
ROWS_ATTR = "rows"
#: Attribute of a score store: the SHA-256 of the model file that scored its last rows.
MODEL_ATTR = "model_sha256"
#: Attribute of a score store: which model scored which rows, in row order, one dict a segment:
#: ``{"rows": [start, stop], "model": path or URL, "model_sha256": hex}``.
SEGMENTS_ATTR = "segments"
#: Attribute of a score store: the fingerprint of the input rows scored, ``[[position, digest], ...]``
#: (:func:`._rowprints.store_positions`, :func:`._rowprints.row_digest`); absent in older stores.
ROW_DIGESTS_ATTR = "row_digests"
#: What must be the same for rows to be appended: attribute -> what it is, in words.
_SAME = {"source": "input store", "dataset": "--dataset", "variables": "--variables", "n_features": "channels"}
#: Metadata files of a Zarr node (v2 and v3): always copied, never linked (zarr rewrites them in place).
_METADATA = {"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"}


def model_digest(path: str, storage_options: dict | None = None) -> str:
    """The SHA-256 of the model file at ``path`` (hex): scores of one model are appended to scores of the same."""
    return hashlib.sha256(read_bytes(path, storage_options=storage_options)).hexdigest()


def provenance(*, source: str, dataset, variables, n_features: int, rows: tuple[int, int], digest: str,
               model: str | None = None) -> dict:
    """The attributes that say what a score store holds (see the module docstring); ``model``: the
    model file's path or URL, as the segments name it."""
    span = [int(rows[0]), int(rows[1])]
    return {"source": source, "dataset": dataset, "variables": variables, "n_features": int(n_features),
            ROWS_ATTR: span, MODEL_ATTR: digest,
            SEGMENTS_ATTR: [{"rows": span, "model": model, MODEL_ATTR: digest}]}


def segments_of(attrs: dict) -> list[dict]:
    """The segments of a score store whose attributes are ``attrs`` (:data:`SEGMENTS_ATTR`); a store
    written before stores kept them was scored by one model, ``model_sha256``, over its ``rows``."""
    segments = attrs.get(SEGMENTS_ATTR)
    if isinstance(segments, list) and segments:
        return [dict(s) for s in segments]
    return [{"rows": list(attrs[ROWS_ATTR]), "model": attrs.get("model"), MODEL_ATTR: attrs[MODEL_ATTR]}]


def segments_after(attrs: dict, rows: tuple[int, int], digest: str, model: str | None) -> list[dict]:
    """The segments once the rows ``[start, stop)`` scored by the model file ``model`` (SHA-256 ``digest``)
    are appended: the last segment grows where it was scored by the same file, else a segment begins."""
    segments = segments_of(attrs)
    last = segments[-1]
    if last[MODEL_ATTR] == digest and last["rows"][1] == rows[0]:
        last["rows"] = [last["rows"][0], int(rows[1])]
    else:
        segments.append({"rows": [int(rows[0]), int(rows[1])], "model": model, MODEL_ATTR: digest})
    return segments


def check_appendable(attrs: dict, expected: dict, output: str) -> tuple[int, int]:
    """The archive rows ``[start, stop)`` held by the score store ``output`` whose attributes are
    ``attrs``, if rows scored as ``expected`` (:func:`provenance`, without ``rows``) may be appended.

    The model may differ from the one that scored the rows there (an updated model): the new rows
    start a segment of their own (:func:`segments_after`).

    Raises
    ------
    AppendError
        The store is incomplete, was written before stores recorded their rows, or from other data
        (another input, selection or number of channels).
    """
    if attrs.get("complete") is not True:
        raise AppendError(f"--output {output!r} is not a complete score store (no complete: true); score it again "
                          "with --overwrite")
    rows = attrs.get(ROWS_ATTR)
    if not (isinstance(rows, list) and len(rows) == 2 and all(isinstance(r, int) for r in rows)
            and 0 <= rows[0] <= rows[1]) or MODEL_ATTR not in attrs:
        raise AppendError(f"--output {output!r} does not record the archive rows and model it was scored with "
                          "(written by an older dask-mcpca); score it again with --overwrite")
    for key, what in _SAME.items():
        if attrs.get(key) != expected[key]:
            raise AppendError(f"--output {output!r} was scored from other data: its {what} is {attrs.get(key)!r}, "
                              f"this command's {expected[key]!r}")
    return rows[0], rows[1]


def stored_digests(attrs: dict, output: str) -> list[tuple[int, int]]:
    """The fingerprint a score store records (:data:`ROW_DIGESTS_ATTR`): ``[(position, digest), ...]``
    inside its rows; empty for a store written before stores kept one."""
    pairs = attrs.get(ROW_DIGESTS_ATTR)
    if pairs is None:
        return []
    start, stop = attrs[ROWS_ATTR]
    if not (isinstance(pairs, list) and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(v, int) and v >= 0 for v in p)
            and start <= p[0] < stop for p in pairs)):
        raise AppendError(f"--output {output!r} has a damaged {ROW_DIGESTS_ATTR!r} attribute; score it again with "
                          "--overwrite")
    return sorted((p[0], p[1]) for p in pairs)


def old_rows_changed(samples: list[tuple[int, int]], got: list[int], rows: tuple[int, int], output: str) -> str | None:
    """One line refusing an append whose checked ``samples`` of the old rows ``[start, stop)`` now read as
    ``got`` (their digests); None when they are unchanged."""
    changed = _rowprints.changed_rows(samples, got)
    if not changed:
        return None
    return (f"the input's rows {rows[0]:,}:{rows[1]:,} changed since they were scored into --output {output!r} "
            f"(row {changed[0]:,} differs from the store's fingerprint); score again with --overwrite")


def digests_after(old: list[tuple[int, int]], new: list[tuple[int, int]]) -> list[list[int]]:
    """The fingerprint once rows with the samples ``new`` are appended: the old regular samples (a row every
    :data:`._rowprints.EVERY`; the old last row is a last row no more) and the new rows'."""
    kept = [pair for pair in old if pair[0] % _rowprints.EVERY == 0]
    return [[int(a), int(b)] for a, b in sorted({*kept, *new})]


def aligned_chunks(n_old: int, n_new: int, chunk: int) -> tuple[int, ...]:
    """Row chunks of ``n_new`` rows written after ``n_old`` into an array of ``chunk``-row chunks,
    so that each dask chunk fills whole store chunks (the first completes the old last one)."""
    first = min(n_new, (-n_old) % chunk or chunk)
    rest = n_new - first
    return (first,) + (chunk,) * (rest // chunk) + ((rest % chunk,) if rest % chunk else ())


def clone_for_append(old: str, new: str, n_old: int, row_arrays: list[str]) -> int:
    """Make ``new`` a copy of the Zarr store ``old`` whose ``n_old`` rows stay untouched by an append.

    The chunk files of the arrays in ``row_arrays`` (paths inside the store, rows along their first
    dimension) that hold only rows below the last full chunk of ``n_old`` rows are hard links;
    every other file is copied (where the file system has no hard links, every file).  Returns
    the number of files linked.
    """
    import zarr

    linked_keys: set[str] = set()
    for name in row_arrays:
        arr = zarr.open_array(old, path=name, mode="r")
        grid = [range(-(-s // c)) for s, c in zip(arr.shape[1:], arr.chunks[1:], strict=True)]
        for i in range(n_old // arr.chunks[0]):
            for rest in itertools.product(*grid):
                key = arr.metadata.encode_chunk_key((i, *rest))
                linked_keys.add(f"{name}/{key}" if name else key)
    linked = 0
    for folder, _, files in os.walk(old):
        rel_folder = os.path.relpath(folder, old)
        os.makedirs(os.path.join(new, rel_folder), exist_ok=True)
        for f in files:
            rel = os.path.normpath(os.path.join(rel_folder, f)).replace(os.sep, "/")
            source, target = os.path.join(folder, f), os.path.join(new, rel)
            if rel in linked_keys and f not in _METADATA:
                try:
                    os.link(source, target)
                    linked += 1
                    continue
                except OSError:
                    pass  # no hard links here (another file system, FAT, some network shares): a copy
            shutil.copy2(source, target)
    return linked
