"""Opening data: numpy, dask, Zarr and HDF5, as row blocks.

Whatever the user hands to ``fit``, :func:`as_row_blocks` returns either an
in-memory numpy array (processed without a task graph) or a dask array whose
chunks span full rows.  Stores are opened read-only; the dask chunks follow
the store's row chunks, grouped so one block holds about ``DEFAULT_BLOCK_VALUES`` values.

Paths are made absolute here, before any task graph is built: a worker of a
distributed cluster runs in its own directory.  A Zarr array on a local disk
must have every chunk file when it is opened (Zarr reads a missing chunk as
its fill value, which would be fitted as data), and a task that reads it
checks that the store and the chunks of its rows are still there on the
machine it runs on, so a store a worker cannot see is an error there, never
a block of fill values.

An archive written by xarray (its arrays name their dimensions, its rows may
carry a time coordinate) is opened and selected in :mod:`._archive`, which
builds on the layout here (:func:`row_chunk`).
"""

from __future__ import annotations

import os
from typing import Any

import dask.array as da
import numpy as np

from ._groups import array_in, hdf5_datasets, single_hdf5_dataset
from ._stacked import local_root as _local_root
from ._urls import is_url, with_timeouts

__all__ = [
    "as_row_blocks",
    "open_store",
    "split_store_path",
    "is_hdf5_path",
    "url_node",
    "row_chunk",
    "channel_first",
    "H5Dataset",
    "DEFAULT_BLOCK_VALUES",
    "MIN_BLOCKS",
]


#: Target size of one row block of a store, in values (rows x columns): 128 MiB
#: of float64, 64 MiB of float32.  Counted in values, not bytes, so that a
#: float32 and a float64 store of the same shape and chunks get the same blocks,
#: hence the same passes, the same partial read of a spread of blocks (which
#: needs 16 or more blocks, see ``_passes.spread_blocks``) and the same fit.
DEFAULT_BLOCK_VALUES = 16 * 2**20

#: Smallest number of blocks a store is split into (when its chunks allow).  A constant, not
#: the client's core count: the blocks decide which blocks the row sample reads (a full pass
#: below ``_passes.PARTIAL_MIN_BLOCKS`` blocks, a spread of them from there) and the order in
#: which the sums are merged, so a layout that followed the machine gave the same store
#: another model (and refused its checkpoint) on another machine.  8 blocks give a laptop's
#: or a workstation's cores work on a small store; a larger store has more blocks anyway,
#: one per ``DEFAULT_BLOCK_VALUES`` values.
MIN_BLOCKS = 8


class H5Dataset:
    """A picklable, read-only handle on one HDF5 dataset.

    ``h5py`` objects cannot be sent to distributed workers; this one keeps
    only the path and dataset name and opens the file read-only where it is
    read (``swmr`` is not needed: the file is never written).
    """

    def __init__(self, path: str, name: str):
        import h5py

        self.path, self.name = os.path.abspath(os.fspath(path)), name
        try:
            with h5py.File(self.path, "r") as f:
                if name not in f:
                    raise KeyError(name)
                d = f[name]
                if not isinstance(d, h5py.Dataset):
                    raise KeyError(name)
                self.shape, self.dtype, self.chunks = d.shape, d.dtype, d.chunks
                where = f"HDF5 file {self.path!r}, dataset {name!r}"
                _refuse_packed(d.attrs, where)
                if d.chunks is not None and d.size:
                    expected = int(np.prod([-(-n // c) for n, c in zip(d.shape, d.chunks, strict=True)]))
                    written = d.id.get_num_chunks()
                    if written < expected:
                        raise ValueError(
                            f"{where} has {expected - written} of its {expected} chunks never written; HDF5 "
                            f"would read them as the fill value {d.fillvalue!r}. Complete the dataset"
                        )
        except KeyError:
            raise KeyError(
                f"HDF5 file {self.path!r} has no dataset {name!r}"
            ) from None
        except OSError as err:
            raise FileNotFoundError(f"cannot open HDF5 file {self.path!r}: {err}") from None
        self.ndim = len(self.shape)

    def __getitem__(self, key):
        import h5py

        try:
            with h5py.File(self.path, "r") as f:
                return f[self.name][key]
        except Exception as err:
            raise OSError(f"cannot read {_rows(key)} of HDF5 file {self.path!r}, dataset {self.name!r}: {err}") from err

    def __repr__(self):
        return f"H5Dataset({self.path!r}, {self.name!r}, shape={self.shape}, dtype={self.dtype})"


#: CF attributes that make the stored numbers a code for others (``value * scale_factor + add_offset``,
#: a sentinel for "missing"): xarray decodes them, a raw read does not.
_PACKING = ("scale_factor", "add_offset")
_SENTINELS = ("_FillValue", "missing_value")


def _refuse_packed(attrs, where: str) -> None:
    """Refuse an array whose raw values are not its data (CF packing, or a finite missing-value
    sentinel): read raw, they would be fitted as they are stored."""
    packed = [a for a in _PACKING if a in attrs]
    sentinel = []
    for a in _SENTINELS:
        if a in attrs:
            values = np.atleast_1d(np.asarray(attrs[a]))
            if values.dtype.kind in "biuf" and np.isfinite(values.astype(float)).any():
                sentinel.append(f"{a}={attrs[a]!r}")
    if packed or sentinel:
        raise ValueError(
            f"{where} stores coded values ({', '.join(packed + sentinel)}): read raw they would be fitted as "
            "stored. Open it with xarray (dask_mcpca.open_archive or the command line do, for a store xarray "
            "wrote), or decode it yourself"
        )


def is_hdf5_path(path: str) -> bool:
    """Whether ``path`` names an HDF5 (or netCDF-4) file by its suffix."""
    return path.lower().endswith((".h5", ".hdf5", ".hdf", ".he5", ".nc"))


def split_store_path(path: str | os.PathLike) -> tuple[str, str | None]:
    """Split ``"file.h5:/group/data"`` into the file and the array inside it.

    A path that exists is never split (a colon may be part of a file name);
    otherwise the part after the last colon names the array when the part
    before it exists or looks like an HDF5 file.  Returns ``(path, None)``
    when there is nothing to split.

    Examples
    --------
    >>> split_store_path("archive.h5:/sensors/x")
    ('archive.h5', '/sensors/x')
    >>> split_store_path("no-such-store.zarr")
    ('no-such-store.zarr', None)
    """
    path = os.fspath(path)
    if ":" in path and not os.path.exists(path):
        head, _, tail = path.rpartition(":")
        if is_url(path) and "://" not in head:  # the only colon is the scheme's ("s3://...", with ./s3 present)
            return path, None
        if is_hdf5_path(head) or os.path.exists(head):
            return head, tail
    return path, None


def open_store(path: str | os.PathLike, dataset: str | None = None, *, storage_options: dict | None = None):
    """Open a Zarr store or an HDF5 file read-only and return its 2-D array.

    Parameters
    ----------
    path : str or path-like
        A Zarr store (directory) or an HDF5 file.  ``"file.h5:/group/data"``
        names the dataset inside the file in the path itself.
    dataset : str, optional
        The array inside a Zarr group or HDF5 file; may be omitted when the
        store holds a single array.  A path that names one after ``:`` and
        another ``dataset`` are refused (ValueError naming both).

    Returns
    -------
    zarr.Array or H5Dataset
    """
    path = os.fspath(path)
    if is_url(path):
        return _open_url(path, dataset, storage_options)
    path, inner = split_store_path(path)
    if inner is not None and dataset is not None and inner.strip("/") != dataset.strip("/"):
        raise ValueError(f"{path + ':' + inner!r} names the dataset {inner!r} after its ':', and dataset={dataset!r} "
                         "names another; name the dataset once")
    dataset = dataset if inner is None else inner
    path = os.path.abspath(path)  # the workers of a cluster run in other directories
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such store: {path!r}")
    _refuse_special(path)
    if os.path.isfile(path):
        import h5py

        if not h5py.is_hdf5(path):
            raise ValueError(f"{path!r} is neither a Zarr store (a directory) nor an HDF5 file")
        if dataset is None:
            dataset = single_hdf5_dataset(path)
        return H5Dataset(path, dataset)
    import zarr

    try:
        node = zarr.open(path, mode="r")
    except Exception as err:  # zarr raises several types for "not a store"
        raise ValueError(f"{path!r} is neither a Zarr store nor an HDF5 file: {err}") from None
    return array_in(node, path, dataset)


def _refuse_special(path: str) -> None:
    """Refuse a local store that is neither a directory nor a regular file (a FIFO would block the open)."""
    import stat

    from ._urls import file_kind as _kind

    mode = os.stat(path).st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise ValueError(f"{path!r} is {_kind(mode)}, neither a Zarr store (a directory) nor an HDF5 file")


def _open_url(url: str, dataset: str | None, storage_options: dict | None):
    """A Zarr store at a URL that fsspec understands (``s3://``, ``gs://``, ``https://``, ``file://``);
    an ``s3://`` one with :data:`._urls.S3_TIMEOUTS` unless ``storage_options`` set them."""
    return array_in(url_node(url, storage_options), url, dataset)


def url_node(url: str, storage_options: dict | None):
    """The Zarr group or array at ``url``, or the error that names the URL (read once: on an endpoint
    that never answers, each open costs the whole documented timeout)."""
    import zarr

    storage_options = with_timeouts(url, storage_options)
    try:
        return zarr.open(url, mode="r", storage_options=storage_options or None)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"no Zarr store at {url!r} ({err})") from None
    except ImportError as err:
        from ._urls import missing_backend

        raise ImportError(missing_backend(url, err)) from None
    except Exception as err:
        raise ValueError(f"cannot open {url!r} as a Zarr store: {type(err).__name__}: {err}") from None


def row_chunk(n_rows: int, n_cols: int, store_rows: int | None, block_values: int | None = None) -> int:
    """Rows per dask block: whole store chunks, about ``block_values`` (default ``DEFAULT_BLOCK_VALUES``) values in all.

    A store smaller than ``MIN_BLOCKS`` blocks of that size is still split
    into about ``MIN_BLOCKS`` blocks (of whole store chunks), so that several
    cores have work: a 48 MB store would otherwise be one task on one core.

    The layout depends on the data's shape and store chunks only (and on
    ``block_values``), never on the machine, its core count or the scheduler:
    the blocks decide the row sample (:func:`._passes.spread_blocks`) and the
    order of the sums, so the same store gives the same fit everywhere, and a
    checkpoint written on one machine resumes on another.
    """
    target = max(1, (block_values or DEFAULT_BLOCK_VALUES) // max(1, n_cols))
    target = max(1, min(target, -(-n_rows // MIN_BLOCKS)))
    if not store_rows:
        return int(min(n_rows, target)) or 1
    k = max(1, target // store_rows)
    return int(min(max(n_rows, 1), k * store_rows))


def _rows(key) -> str:
    """``rows 100:200`` for the row slice of a block read (for error messages)."""
    rows = key[0] if isinstance(key, tuple) and key else key
    if isinstance(rows, slice):
        return f"rows {rows.start or 0}:{rows.stop}"
    return f"rows {rows!r}"


def _reopen_absolute(arr):
    """The same array, opened read-only through its absolute path when its store's is relative."""
    import zarr

    root = getattr(arr.store, "root", None)
    if _local_root(arr) is None or os.path.isabs(os.fspath(root)):
        return arr
    return zarr.open_array(os.path.abspath(os.fspath(root)), path=arr.path or None, mode="r")


def _store_name(store) -> str:
    """A store as the user named it: ``s3://bucket/archive.zarr`` for an fsspec store (not its repr)."""
    fs, path = getattr(store, "fs", None), getattr(store, "path", None)
    if fs is None or path is None:
        return str(store)
    protocol = fs.protocol[0] if isinstance(fs.protocol, tuple | list) else fs.protocol
    return f"{protocol}://{str(path).lstrip('/')}"


class _ZarrRows:
    """A Zarr array whose reads fail loudly and name the store, the array and the rows.

    A corrupt or unreadable chunk otherwise surfaces as a bare codec error
    (``Zstd decompression error``) from inside a dask task, and a chunk or
    store that the reading process cannot see reads as the fill value.  For a
    store on a local disk every chunk file must exist when it is opened, and
    each read first checks, on the process that reads, that the store's
    metadata and the chunk files of the rows read are there.
    """

    def __init__(self, arr):
        arr = _reopen_absolute(arr)
        self.arr = arr
        _refuse_packed(arr.attrs, f"Zarr array {arr.path or '/'!r} of {arr.store}")
        self.shape, self.dtype, self.ndim, self.chunks = arr.shape, arr.dtype, arr.ndim, arr.chunks
        self.root = _local_root(arr)
        name = self.root or _store_name(arr.store)
        self.where = f"Zarr store {name!r}" + (f", array {arr.path!r}" if arr.path else "")
        listed = None if self.root is not None else self._listed_keys()
        missing = self._missing_units(0, self.shape[0], None if listed is None else listed.__contains__)
        if missing:
            a, b = self._unit_rows(missing[0])
            raise ValueError(
                f"{self.where} has no chunk file for rows {a}:{b} ({len(missing)} of "
                f"{self._grid()[0]} row chunks missing); Zarr would read them as the fill value "
                f"{self.arr.fill_value!r}. Zarr writes no chunk whose values all equal the fill value "
                "(unless the array's config sets write_empty_chunks=True): if these rows were written so, "
                "pass dask.array.from_zarr(...) to accept fill values; otherwise complete the store"
            )

    def _unit(self) -> tuple[int, int]:
        """Rows and columns of one stored object (a shard, or a chunk if unsharded)."""
        return tuple(getattr(self.arr, "shards", None) or self.arr.chunks)

    def _grid(self) -> tuple[int, int]:
        r, c = self._unit()
        return -(-self.shape[0] // r), -(-self.shape[1] // c)

    def _unit_rows(self, i: int) -> tuple[int, int]:
        r = self._unit()[0]
        return i * r, min(self.shape[0], (i + 1) * r)

    def _missing_units(self, start: int, stop: int, present=None) -> list[int]:
        """Row indices of the stored objects of rows ``start:stop`` that are missing.

        ``present(key)`` says whether a chunk key is stored; by default, whether its
        file exists under the local root.
        """
        if present is None:
            present = lambda key: os.path.exists(os.path.join(self.root, key))  # noqa: E731
        r = self._unit()[0]
        n_cols = self._grid()[1]
        encode = self.arr.metadata.encode_chunk_key
        return [i for i in range(start // r, -(-stop // r)) if not all(present(encode((i, j))) for j in range(n_cols))]

    def _listed_keys(self) -> set[str]:
        """The array's stored keys, for a store that is not a local folder (a URL, in memory, a zip
        file): one listing through the store's own API."""
        from zarr.core.sync import sync

        store, prefix = self.arr.store, f"{self.arr.path}/" if self.arr.path else ""

        async def keys():
            return {key[len(prefix) :] async for key in store.list_prefix(prefix)}

        return sync(keys())

    def _check_visible(self, key) -> None:
        import socket

        meta = ("zarr.json", ".zarray")
        if not any(os.path.exists(os.path.join(self.root, m)) for m in meta):
            raise FileNotFoundError(
                f"{self.where} is not visible to the process reading it (host {socket.gethostname()!r}, "
                f"cwd {os.getcwd()!r}); every dask worker must see the store at the same path"
            )
        rows = key[0] if isinstance(key, tuple) else key
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            return
        start, stop, _ = rows.indices(self.shape[0])
        missing = self._missing_units(start, stop) if stop > start else []
        if missing:
            a, b = self._unit_rows(missing[0])
            raise FileNotFoundError(
                f"{self.where}: the chunk file of rows {a}:{b} is missing on host {socket.gethostname()!r} "
                "(it was there when the store was opened)"
            )

    def __getitem__(self, key):
        if self.root is not None:
            self._check_visible(key)
        try:
            return self.arr[key]
        except Exception as err:
            raise OSError(f"cannot read {_rows(key)} of {self.where}: {type(err).__name__}: {err}") from err

    def __repr__(self):
        return f"_ZarrRows({self.where}, shape={self.shape}, dtype={self.dtype})"


def _from_store(arr, block_values: int | None = None) -> da.Array:
    import zarr
    from dask.base import tokenize

    n, p = arr.shape
    store_rows = arr.chunks[0] if arr.chunks else None
    rows = row_chunk(n, p, store_rows, block_values)
    if isinstance(arr, zarr.Array):
        rows_reader = _ZarrRows(arr)
        name = "from-zarr-" + tokenize(_zarr_identity(rows_reader.arr), rows)
        return da.from_array(rows_reader, chunks=(rows, p), asarray=True, lock=False, name=name)
    return da.from_array(arr, chunks=(rows, p), asarray=True, lock=False, name=f"h5-{arr.path}-{arr.name}-{rows}")


def _zarr_identity(arr) -> tuple:
    """What names a Zarr array in a dask graph: the kind of its store, an fsspec store's filesystem (dask's
    token of it: protocol, host, options; one path on two filesystems is two arrays), where it is in that
    store (an in-memory store's address included), and its metadata less its attributes, which do not change
    what is read and may be large (dask's own token of the array walks them: 0.8 s for a store whose
    attributes hold 22 MB, the benchmarks' generated truth).  Not whether the store was opened read-only."""
    from dask.base import tokenize

    meta = {k: v for k, v in arr.metadata.to_dict().items() if k != "attributes"}
    fs = getattr(arr.store, "fs", None)
    return type(arr.store).__name__, None if fs is None else tokenize(fs), str(arr.store_path), meta


def _check_2d(shape) -> None:
    # The wording of scikit-learn's check_array, which its users grep for.
    if len(shape) != 2:
        hint = (
            " Reshape your data either using array.reshape(-1, 1) if your data has a single feature"
            " or array.reshape(1, -1) if it contains a single sample."
        )
        raise ValueError(
            f"X must be 2-D (rows x features); got an array of shape {tuple(shape)}."
            + (hint if len(shape) == 1 else "")
        )
    for n, what in zip(shape, ("sample", "feature"), strict=True):
        if n == 0:
            raise ValueError(
                f"X is empty: found array with 0 {what}(s) (shape={tuple(shape)}) while a minimum of 1 is required."
            )


def _as_float(x):
    """Integers and booleans become float64; float32 stays float32.

    A numpy array of Python objects is converted to float64 (an error names
    the first value that is not a number); complex data is refused.
    """
    if x.dtype.kind in "biu" or (x.dtype.kind == "O" and isinstance(x, np.ndarray)):
        return x.astype(np.float64)
    if x.dtype.kind == "c":
        raise ValueError(f"Complex data not supported: X must hold real numbers; got dtype {x.dtype}")
    if x.dtype.kind != "f":
        raise ValueError(f"X must hold numbers; got dtype {x.dtype}")
    return x


def _group_array(X):
    """A Zarr or h5py group is read as a path to it is: its single array (at any depth), or a
    KeyError listing its arrays; anything else is returned as it is."""
    module = type(X).__module__
    if module.startswith("zarr"):
        import zarr

        if isinstance(X, zarr.Group):
            where = _store_name(X.store) + (f":/{X.path}" if X.path else "")
            return array_in(X, where, None, how="pass one of them, group[name]")
    elif module.startswith("h5py"):
        import h5py

        if isinstance(X, h5py.Group):
            names = hdf5_datasets(X)
            if len(names) != 1:
                raise KeyError(
                    f"HDF5 group {X.name!r} of {X.file.filename!r} holds {len(names)} datasets {names}; "
                    "pass one of them, group[name]"
                )
            return X[names[0]]
    return X


def _refuse_unsupported(X) -> None:
    """Input kinds that ``np.asarray`` would turn into a wrong array, or fail on deep inside."""
    import scipy.sparse

    kind = f"{type(X).__module__}.{type(X).__name__}"
    if scipy.sparse.issparse(X) or kind.startswith(("scipy.sparse", "sparse.")) or type(X).__module__.startswith(
        "sparse"
    ):
        raise TypeError(
            f"Sparse data was passed ({type(X).__name__}), but dense data is required: MCPCA needs dense rows; "
            "pass X.toarray(), or a dask array of dense blocks"
        )
    if kind.startswith("xarray") and type(X).__name__ == "Dataset":
        names = sorted(map(str, X.data_vars))
        raise TypeError(f"X is an xarray.Dataset; pass one of its variables, ds[name], with name in {names}")
    if isinstance(X, np.ma.MaskedArray) or (isinstance(X, da.Array) and isinstance(X._meta, np.ma.MaskedArray)):
        raise TypeError(
            "X is a masked array; its mask would be ignored. Pass X.filled(np.nan) with "
            "nan_policy='omit' to leave the masked rows out"
        )


def as_row_blocks(
    X: Any, *, storage_options: dict | None = None, block_values: int | None = None
) -> np.ndarray | da.Array:
    """Return ``X`` as a float numpy array or a dask array chunked by full rows.

    Parameters
    ----------
    X : array-like, dask array, zarr.Array, H5Dataset, h5py.Dataset,
        xarray.DataArray, or str / path-like naming a store
        (``"archive.zarr"``, ``"archive.zarr:/group/array"``, ``"file.h5:/data"``),
        or a Zarr URL that fsspec understands (``"s3://bucket/archive.zarr"``).
    storage_options : dict, optional
        Passed to fsspec for a URL (credentials, ``endpoint_url``); without
        them fsspec's backends read credentials from the environment.
    block_values : int, optional
        For a store: the values (rows x columns) of one dask block (whole
        store chunks, at least one); default ``DEFAULT_BLOCK_VALUES``.  Dask arrays
        keep their chunks.

    Returns
    -------
    numpy.ndarray or dask.array.Array
        Two-dimensional, float32 or float64.  A dask array has one chunk
        across the columns and row chunks that are whole store chunks.
    """
    if isinstance(X, (str, os.PathLike)):
        X = open_store(X, storage_options=storage_options)
    X = _group_array(X)
    _refuse_unsupported(X)
    if type(X).__module__.startswith("xarray"):
        if X.ndim == 2 and channel_first(X):
            raise ValueError(
                f"X has dims {X.dims}, channels first: rows (one per time step) must come first; "
                f"pass X.transpose({X.dims[1]!r}, {X.dims[0]!r})"
            )
        X = X.data
    if type(X).__module__.startswith("h5py"):
        X = H5Dataset(X.file.filename, X.name)
    if isinstance(X, da.Array):
        if any(np.isnan(c) for cs in X.chunks for c in cs):
            X = X.compute_chunk_sizes()
        _check_2d(X.shape)
        X = _as_float(X)
        if len(X.chunks[1]) > 1:
            X = X.rechunk({1: -1})  # full rows, once
        return X
    if isinstance(X, H5Dataset) or type(X).__module__.startswith("zarr"):
        _check_2d(X.shape)
        return _as_float(_from_store(X, block_values))
    X = np.asarray(X)
    _check_2d(X.shape)
    return _as_float(X)


def channel_first(X, channel_dim: str = "channel") -> bool:
    """Whether 2-D DataArray ``X`` holds its channels along its first dimension: that dimension is
    named ``channel_dim``, or only the second one has a datetime coordinate (the rows are times)."""

    def timed(dim) -> bool:
        return dim in X.coords and np.issubdtype(X.coords[dim].dtype, np.datetime64)

    first, second = X.dims
    return first == channel_dim or (timed(second) and not timed(first))
