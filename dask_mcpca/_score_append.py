"""Appending rows to a score store (``score --append``): the checks, the new version, the segments.

:func:`open_for_append` reads what an existing store holds and refuses one
rows cannot be appended to; :func:`append_rows` writes the new version.

A score store is put in place whole (:func:`._atomic.atomic_path`), and so is
a store with appended rows: the new version is a temporary sibling that
starts as a copy of the old one, gets the new rows, and is renamed over it.
The copy costs no reading or writing of the old rows: every chunk file that
holds only old rows is a hard link to the old one (:func:`clone_for_append`).
Nothing writes a linked file: the new rows are written into chunks from the
first one that holds a new row on, and those chunks, and every metadata file,
are copied, not linked.  An interruption leaves the old store as it was.

What a store was scored with is kept in its attributes (:func:`._score_store.provenance`):
the input (path, dataset, variables), the archive rows by position, the
number of channels and the segments: which model file (its path and SHA-256)
scored which rows.  Rows are appended only to a store written from the same
input with the same channels (:func:`check_appendable`: the resolved store path and
dataset, and the channels' names, however ``--variables`` spelled them); they may be scored by
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

import itertools
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

from . import _rowprints
from ._exceptions import AppendError
from ._score_store import (
    CHANNELS_ATTR,
    MODEL_ATTR,
    ROW_DIGESTS_ATTR,
    ROWS_ATTR,
    SEGMENTS_ATTR,
    as_dataset,
    count_true,
    dimension_names,
    quiet_consolidated,
    rows_at,
    segments_of,
)
from ._urls import is_url

__all__ = ["AppendTarget", "open_for_append", "append_rows", "check_appendable", "clone_for_append",
           "aligned_chunks", "segments_after", "stored_digests", "digests_after", "old_rows_changed"]

#: What must be the same for rows to be appended: attribute -> what it is, in words.  The input store is
#: compared as a resolved path (symlinks followed), the dataset without its leading '/', the channels by their
#: resolved names (:data:`._score_store.CHANNELS_ATTR`), not by how ``--variables`` spelled them.
_SAME = {"source": "input store", "dataset": "--dataset", "n_features": "number of channels",
         CHANNELS_ATTR: "channels"}
#: Metadata files of a Zarr node (v2 and v3): always copied, never linked (zarr rewrites them in place).
_METADATA = {"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"}


@dataclass(frozen=True)
class AppendTarget:
    """An existing score store that rows may be appended to, as :func:`open_for_append` read it.

    ``path`` is the store on a local disk, ``name`` as the user named it; ``rows`` the archive rows
    ``[start, stop)`` it holds; ``names`` and ``dtype`` the outputs it holds (a store written before
    they were recorded holds ``all`` in float64: ``default_names``); ``samples`` its rows' fingerprint.
    """

    path: str
    name: str
    attrs: dict
    rows: tuple[int, int]
    names: tuple[str, ...]
    dtype: str
    samples: list[tuple[int, int]]

    def check_arrays(self, known) -> None:
        """Refuse a store that does not hold the arrays its attributes name (or names ones not in ``known``)."""
        import zarr

        held = set(zarr.open_group(self.path, mode="r").array_keys())
        if not set(self.names) <= set(known) or not set(self.names) <= held:
            raise AppendError(f"--output {self.name!r} does not hold the arrays its attributes name "
                              f"({', '.join(map(str, self.names))}); score it again with --overwrite")


def open_for_append(path: str, name: str, expected: dict, default_names: tuple[str, ...]) -> AppendTarget:
    """The score store at ``path`` (a local Zarr store; ``name`` as the user named it), if rows scored as
    ``expected`` (:func:`._score_store.provenance`) may be appended to it (:func:`check_appendable`).

    Raises
    ------
    AppendError
        Rows cannot be appended to it (see :func:`check_appendable`, :func:`stored_digests`).
    """
    import zarr

    quiet_consolidated()  # before the store is first listed
    attrs = dict(zarr.open_group(path, mode="r").attrs)
    rows = check_appendable(attrs, expected, name)
    return AppendTarget(path, name, attrs, rows, tuple(attrs.get("outputs", default_names)),
                        attrs.get("dtype", "float64"), stored_digests(attrs, name))


def append_rows(target: AppendTarget, outputs: dict, *, model, X, whole, digest: str, model_name: str,
                descriptions: dict, compute: Callable) -> tuple[int | None, list[dict]]:
    """Append the per-row ``outputs`` (lazy, of the archive rows after those ``target`` holds) to it, as a
    new version put in place whole; return the number of outliers among them (None where the store
    holds no flags) and the store's segments once they are appended.

    ``X`` holds the rows the outputs were scored from (the new rows, after rows of context),
    ``whole`` the whole archive (its old rows' fingerprint is checked, its new rows' taken, in the pass
    that writes); ``digest`` and ``model_name`` name the model file that scored them; ``compute(*tasks)``
    computes the pass (the command's progress line and scheduler).

    Raises
    ------
    AppendError
        The old rows changed in the input since they were scored (the store is left as it was).
    """
    import zarr

    from ._atomic import atomic_path, is_zarr_store

    start, stop = target.rows
    n_all = whole.shape[0]
    n_old, n_new = stop - start, n_all - stop
    old = zarr.open_group(target.path, mode="r")
    names = target.names
    # A store that names its arrays' dimensions (every store score writes) is appended to by xarray; one
    # written array by array from a plain input (before score named them) is appended to array by array.
    named = dimension_names(old[names[0]]) is not None
    if named:
        ds = as_dataset(outputs, model=model, X=X, attrs=target.attrs, descriptions=descriptions)  # attrs: rewritten
        row_dim = ds[names[0]].dims[0]
    row_arrays = [name for name, arr in old.arrays() if arr.shape and arr.shape[0] == n_old and (
        not named or (dimension_names(arr) or [None])[0] == row_dim)]
    with atomic_path(target.path, replace=is_zarr_store) as tmp:
        clone_for_append(target.path, tmp, n_old, row_arrays)
        if named:
            ds = ds.chunk({row_dim: aligned_chunks(n_old, n_new, old[names[0]].chunks[0])})
            writes = [ds.to_zarr(tmp, append_dim=row_dim, compute=False, consolidated=True)]
            flags = ds["outlier"].data if "outlier" in ds else None
        else:
            writes = []
            plain = {n: getattr(a, "data", a) for n, a in outputs.items()}
            for name, arr in plain.items():
                z = zarr.open_array(tmp, path=name, mode="r+")
                z.resize((n_old + n_new, *z.shape[1:]))
                arr = arr.rechunk({0: aligned_chunks(n_old, n_new, z.chunks[0])})
                region = (slice(n_old, n_old + n_new),) + (slice(None),) * (arr.ndim - 1)
                writes.append(arr.store(z, regions=[region], lock=False, compute=False))
            flags = plain.get("outlier")
        counted = [count_true(flags)] if flags is not None else []  # the blocks written
        # In the same pass: the old rows' fingerprint checked (the last row, read anyway for context, and
        # one older sample: one chunk more) and the new rows' taken (their chunks are read anyway).
        checked = _rowprints.checked(target.samples, salt=stop)
        positions = _rowprints.store_positions(stop, n_all)
        sampled = rows_at(whole, [pos for pos, _ in checked] + positions)
        results = compute(*writes, *counted, sampled)
        n_out = int(results[len(writes)]) if counted else None
        got = _rowprints.digests(results[-1])
        if refusal := old_rows_changed(checked, got[: len(checked)], (start, stop), target.name):
            raise AppendError(refusal)  # the temporary is removed, the store left as it was
        group = zarr.open_group(tmp, mode="r+")
        segments = segments_after(target.attrs, (stop, n_all), digest, model_name)
        group.attrs.update({ROWS_ATTR: [start, n_all], "complete": True, SEGMENTS_ATTR: segments,
                            MODEL_ATTR: digest, "model": model_name,
                            ROW_DIGESTS_ATTR: digests_after(
                                target.samples, list(zip(positions, got[len(checked):], strict=True)))})
        if named:
            zarr.consolidate_metadata(tmp)
    return n_out, segments


def check_appendable(attrs: dict, expected: dict, output: str) -> tuple[int, int]:
    """The archive rows ``[start, stop)`` held by the score store ``output`` whose attributes are
    ``attrs``, if rows scored as ``expected`` (:func:`._score_store.provenance`, without ``rows``) may be appended.

    The model may differ from the one that scored the rows there (an updated model): the new rows
    start a segment of their own (:func:`segments_after`).

    Raises
    ------
    AppendError
        The store is incomplete, was written before stores recorded their rows, or from other data
        (another input store or dataset, other channels; see :data:`_SAME`).
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
        if key == CHANNELS_ATTR and (attrs.get(key) is None or expected.get(key) is None):
            continue  # a store written before it recorded its channels' names: their number is compared
        have, want = (_comparable(key, value) for value in (attrs.get(key), expected.get(key)))
        if have != want:
            raise AppendError(f"--output {output!r} was scored from other data: its {what} is {attrs.get(key)!r}, "
                              f"this command's {expected.get(key)!r}")
    return rows[0], rows[1]


def _comparable(key: str, value):
    """``value`` of the provenance attribute ``key`` as compared for an append: a local input store as its
    resolved path (``os.path.realpath``: the same store through a symlink), a dataset without its leading
    '/' (``g/x``, ``/g/x`` and ``file.h5:/g/x`` name one dataset), channel names as text."""
    if key == "source" and isinstance(value, str) and not is_url(value):
        return os.path.realpath(value)
    if key == "dataset" and isinstance(value, str):
        return value.strip("/") or None
    if key == CHANNELS_ATTR and isinstance(value, list | tuple):
        return [str(v) for v in value]
    return value


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
