"""1-D variables of a store xarray wrote, read as one (rows, channels) block per task.

``xarray.open_zarr`` gives each variable a dask array of its own; stacking
them (``Dataset.to_dataarray``) and chunking the stack into row blocks makes,
for every block, a read task per variable and store chunk, a stack, a
transpose and a rechunk.  Where the variables' stored values are their data
(one float dtype; no CF packing, no finite fill value: nothing for xarray to
decode), :func:`stacked_rows` reads them here instead: one task per row
block reads that block's rows of every variable at once (Zarr's concurrent
reads) into one C-ordered array.  The values, the blocks and the DataArray's
coordinates are those of xarray's stack; any other store is left to it.
Figures: ``benchmarks/XARRAY_PATH.md``.
"""

from __future__ import annotations

import asyncio
import copy
import os

import numpy as np

__all__ = ["ROUTES", "StackedRows", "stacked_rows", "local_root"]

#: What xarray's CF decoding changes (``value * scale_factor + add_offset``; a sentinel read as NaN).
_PACKING = ("scale_factor", "add_offset")
_SENTINELS = ("_FillValue", "missing_value")


#: How :class:`StackedRows` reads: ``files``, each chunk file read and decoded in the task (a local
#: store whose chunks are plain bytes, compressed or not, with a codec numcodecs decodes alone: what
#: xarray writes); ``zarr``, Zarr's own reads of every variable at once (any other store).
ROUTES = ("files", "zarr")


class StackedRows:
    """Rows ``start:stop`` of equally long 1-D Zarr arrays, as a read-only (rows, arrays) array.

    Indexed by dask's getter with a (rows, columns) tuple of slices, it reads
    only the variables of the columns asked for and returns a C-ordered numpy
    array.  ``route`` (:data:`ROUTES`) is ``files`` where every array allows it,
    else ``zarr``.  Picklable (Zarr arrays and numcodecs codecs are), for
    distributed workers.
    """

    def __init__(self, arrays: list, names: list[str], where: str, start: int = 0, stop: int | None = None,
                 route: str | None = None):
        self.arrays, self.names, self.where = list(arrays), list(names), where
        n = self.arrays[0].shape[0]
        self.start, self.stop = start, n if stop is None else stop
        self.dtype = self.arrays[0].dtype.newbyteorder("=")  # as xarray gives it
        self.shape = (self.stop - self.start, len(self.arrays))
        self.ndim = 2
        files = [_ChunkFiles.of(a) for a in self.arrays] if route in (None, "files") else None
        if route is None:
            route = "files" if all(f is not None for f in files) else "zarr"
        if route == "files" and not all(f is not None for f in files):
            raise ValueError(f"{where}: its chunks cannot be read as files (a remote store, sharding or a filter)")
        self.route, self.files = route, files if route == "files" else None

    def rows(self, start: int, stop: int) -> StackedRows:
        """Rows ``start:stop`` of this one (positions in the arrays), read the same way."""
        part = copy.copy(self)
        part.start, part.stop = start, stop
        part.shape = (stop - start, self.shape[1])
        return part

    def __getitem__(self, key):
        rows, cols = (tuple(key) + (slice(None),))[:2] if isinstance(key, tuple) else (key, slice(None))
        if not isinstance(rows, slice) or not isinstance(cols, slice) or rows.step not in (None, 1):
            return self[:, :][rows, cols]  # not a getter's block: read, then index
        start, stop, _ = rows.indices(self.shape[0])
        columns = range(self.shape[1])[cols]
        out = np.empty((max(0, stop - start), len(columns)), dtype=self.dtype)
        if out.size == 0:
            return out
        start, stop = start + self.start, stop + self.start
        try:
            if self.files is not None:
                for i, j in enumerate(columns):
                    self.files[j].read(start, stop, out[:, i])
            else:
                for i, values in enumerate(_read_all([self.arrays[j] for j in columns], slice(start, stop))):
                    out[:, i] = values
        except Exception as err:
            raise OSError(f"cannot read rows {start}:{stop} of {self.where}: {type(err).__name__}: {err}") from err
        return out

    def __repr__(self):
        return f"StackedRows({self.where}, rows {self.start}:{self.stop}, {len(self.names)} variables, {self.route})"


class _ChunkFiles:
    """The chunk files of a 1-D Zarr array on a local disk, read and decoded without Zarr's machinery.

    A chunk file holds the chunk's values as bytes (Zarr v3: a ``bytes`` codec, then at most one
    compressor; v2: no filter, at most one compressor); a missing file is the fill value, as Zarr
    reads it.
    """

    def __init__(self, root: str, encode_key, stored: np.dtype, decoder, chunk: int, n: int, fill):
        self.root, self.encode_key, self.stored, self.decoder = root, encode_key, stored, decoder
        self.chunk, self.n, self.fill = chunk, n, fill

    @classmethod
    def of(cls, arr) -> _ChunkFiles | None:
        """The reader of ``arr``, or None where its chunks are not plain files this class can decode."""
        root = local_root(arr)
        if root is None or arr.ndim != 1 or getattr(arr, "shards", None):
            return None
        meta = arr.metadata
        if meta.zarr_format == 3:
            stored, decoder = _v3_layout(meta.codecs, arr.dtype)
        elif not getattr(meta, "filters", None):
            stored, decoder = arr.dtype, None if meta.compressor is None else _known(meta.compressor)
            if meta.compressor is not None and decoder is None:
                return None
        else:
            return None
        if stored is None:
            return None
        return cls(root, meta.encode_chunk_key, np.dtype(stored), decoder, arr.chunks[0], arr.shape[0],
                   arr.fill_value)

    def read(self, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``start:stop`` into ``out`` (a column of the block)."""
        c = self.chunk
        for i in range(start // c, -(-stop // c)):
            lo, hi = max(start, i * c), min(stop, (i + 1) * c)
            path = os.path.join(self.root, self.encode_key((i,)))
            try:
                with open(path, "rb") as f:
                    raw = f.read()
            except FileNotFoundError:
                out[lo - start : hi - start] = self.fill
                continue
            values = np.frombuffer(self.decoder.decode(raw) if self.decoder is not None else raw, dtype=self.stored)
            if values.shape[0] < min(c, self.n - i * c):
                raise ValueError(f"chunk file {path!r} holds {values.shape[0]} values, not {c}")
            out[lo - start : hi - start] = values[lo - i * c : hi - i * c]


def _known(codec):
    """A numcodecs compressor whose frames decode alone (no array metadata needed), else None."""
    import numcodecs

    return codec if isinstance(codec, numcodecs.Zstd | numcodecs.Blosc | numcodecs.GZip | numcodecs.Zlib) else None


def _v3_layout(codecs, dtype):
    """``(stored dtype, numcodecs decoder or None)`` of Zarr v3 ``codecs``; ``(None, None)`` when they are
    not a ``bytes`` codec followed by at most one compressor this module decodes."""
    import numcodecs
    from zarr.codecs import BloscCodec, BytesCodec, GzipCodec, ZstdCodec

    if not codecs or not isinstance(codecs[0], BytesCodec) or len(codecs) > 2:
        return None, None
    endian = getattr(codecs[0].endian, "value", codecs[0].endian)
    stored = np.dtype(dtype).newbyteorder("<" if endian == "little" else ">") if endian else np.dtype(dtype)
    if len(codecs) == 1:
        return stored, None
    kinds = {ZstdCodec: numcodecs.Zstd, GzipCodec: numcodecs.GZip, BloscCodec: numcodecs.Blosc}
    decoder = next((make() for kind, make in kinds.items() if isinstance(codecs[1], kind)), None)
    return (stored, decoder) if decoder is not None else (None, None)


def _read_all(arrays: list, selection: slice) -> list[np.ndarray]:
    """``selection`` of each array, read concurrently on Zarr's event loop."""
    from zarr.core.sync import sync

    async def read():
        return await asyncio.gather(*(a.async_array.getitem(selection) for a in arrays))

    return sync(read())


def local_root(arr) -> str | None:
    """Absolute directory of a Zarr array on a local disk, or None for other stores."""
    root = getattr(arr.store, "root", None)
    if root is None or type(arr.store).__name__ != "LocalStore":
        return None
    return os.path.join(os.path.abspath(os.fspath(root)), arr.path)


def _is_plain(arr, variable) -> bool:
    """Whether xarray reads Zarr array ``arr`` as it is stored: the same float dtype, no packing, no sentinel."""
    if arr.ndim != 1 or arr.dtype.kind != "f" or variable.dtype != arr.dtype.newbyteorder("="):
        return False
    attrs = arr.attrs
    if any(a in attrs for a in _PACKING) or any(a in variable.encoding for a in _PACKING):
        return False
    for a in _SENTINELS:
        value = variable.encoding.get(a, attrs.get(a) if a == "missing_value" else None)
        if value is not None and np.isfinite(np.atleast_1d(np.asarray(value, dtype=float))).any():
            return False
    return True


def stacked_rows(ds, names: list[str], group, where: str) -> StackedRows | None:
    """The 1-D variables ``names`` of Dataset ``ds``, opened by ``xarray.open_zarr`` from Zarr group ``group``
    (at ``where``), as a :class:`StackedRows` over all their rows; None when xarray's decoding would change
    a value, or the group is not at hand (then the stack is xarray's)."""
    import zarr

    try:
        arrays = [group[name] for name in names]
    except Exception:  # no group, or a layout this reader does not know: xarray's stack reads it
        return None
    if not all(isinstance(a, zarr.Array) for a in arrays) or len({a.dtype for a in arrays}) != 1:
        return None
    if len({a.shape for a in arrays}) != 1 or not all(
        _is_plain(a, ds[n].variable) for a, n in zip(arrays, names, strict=True)
    ):
        return None
    return StackedRows(arrays, names, f"Zarr store {where!r}")
