"""Opening data: numpy, dask, Zarr, HDF5 and xarray, as row blocks.

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
"""

from __future__ import annotations

import inspect
import os
import warnings
from typing import Any

import dask.array as da
import numpy as np

from ._exceptions import SelectionError
from ._stacked import local_root as _local_root
from ._stacked import stacked_rows
from ._urls import is_url, with_timeouts

__all__ = [
    "as_row_blocks",
    "open_store",
    "open_archive",
    "is_xarray_store",
    "split_store_path",
    "H5Dataset",
    "DEFAULT_BLOCK_VALUES",
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


def _is_hdf5_path(path: str) -> bool:
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
        if _is_hdf5_path(head) or os.path.exists(head):
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
        store holds a single array.

    Returns
    -------
    zarr.Array or H5Dataset
    """
    path = os.fspath(path)
    if is_url(path):
        return _open_url(path, dataset, storage_options)
    if dataset is None:
        path, dataset = split_store_path(path)
    path = os.path.abspath(path)  # the workers of a cluster run in other directories
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such store: {path!r}")
    _refuse_special(path)
    if os.path.isfile(path):
        import h5py

        if not h5py.is_hdf5(path):
            raise ValueError(f"{path!r} is neither a Zarr store (a directory) nor an HDF5 file")
        if dataset is None:
            dataset = _single_hdf5_dataset(path)
        return H5Dataset(path, dataset)
    import zarr

    try:
        node = zarr.open(path, mode="r")
    except Exception as err:  # zarr raises several types for "not a store"
        raise ValueError(f"{path!r} is neither a Zarr store nor an HDF5 file: {err}") from None
    return _array_in(node, path, dataset)


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
    return _array_in(_url_node(url, storage_options), url, dataset)


def _url_node(url: str, storage_options: dict | None):
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


def _array_in(node, path: str, dataset: str | None):
    """The 2-D array ``dataset`` of the Zarr group ``node`` (or ``node`` itself, an array)."""
    import zarr

    if isinstance(node, zarr.Array):
        if dataset not in (None, "", "/"):
            raise KeyError(f"Zarr store {path!r} is a single array; it has no dataset {dataset!r}")
        return node
    names = sorted(name for name, _ in node.arrays())
    if dataset is None:
        if len(names) != 1:
            raise KeyError(
                f"Zarr group {path!r} holds {len(names)} arrays {names}; name one with dataset="
            )
        dataset = names[0]
    try:
        arr = node[dataset.strip("/")]
    except KeyError:
        raise KeyError(f"Zarr store {path!r} has no dataset {dataset!r}; it has {names}") from None
    if not isinstance(arr, zarr.Array):
        raise KeyError(f"{dataset!r} in Zarr store {path!r} is a group, not an array")
    return arr


def _single_hdf5_dataset(path: str) -> str:
    import h5py

    names = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    if len(names) != 1:
        raise KeyError(
            f"HDF5 file {path!r} holds {len(names)} datasets {names}; name one as 'file.h5:/name'"
        )
    return names[0]


def _row_chunk(n_rows: int, n_cols: int, store_rows: int | None, block_values: int | None = None) -> int:
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
                f"{self.arr.fill_value!r}. Complete the store, or pass dask.array.from_zarr(...) "
                "to accept fill values"
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
    rows = _row_chunk(n, p, store_rows, block_values)
    if isinstance(arr, zarr.Array):
        rows_reader = _ZarrRows(arr)
        name = "from-zarr-" + tokenize(rows_reader.arr, rows)
        return da.from_array(rows_reader, chunks=(rows, p), asarray=True, lock=False, name=name)
    return da.from_array(arr, chunks=(rows, p), asarray=True, lock=False, name=f"h5-{arr.path}-{arr.name}-{rows}")


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
    _refuse_unsupported(X)
    if type(X).__module__.startswith("xarray"):
        if X.ndim == 2 and _channel_first(X):
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


# ------------------------------------------------------- archives written by xarray
def is_xarray_store(path: str, *, storage_options: dict | None = None) -> bool:
    """Whether ``path`` is a Zarr group whose arrays name their dimensions (as ``Dataset.to_zarr`` writes).

    Zarr v3 keeps the names in ``dimension_names``, xarray's Zarr v2 layout
    in the ``_ARRAY_DIMENSIONS`` attribute.
    """
    import zarr

    if is_url(path):  # what cannot be opened here cannot be read as a plain store either: said now, once
        node = _url_node(path, storage_options)
    else:
        try:
            node = zarr.open(path, mode="r")
        except Exception:
            return False
    if isinstance(node, zarr.Array):
        return False
    for _, arr in node.arrays():
        if getattr(arr.metadata, "dimension_names", None) or "_ARRAY_DIMENSIONS" in arr.attrs:
            return True
    return False


def _numeric_label(value, dtype, row: str):
    """A row label for a numeric coordinate: text is converted (a string compared with numbers
    selects nothing sensible, pandas silently ignored the stop); None stays None."""
    if not isinstance(value, str):
        return value
    try:
        return np.asarray(value).astype(dtype)[()]
    except ValueError:
        raise SelectionError(
            f"{value!r} is not a label of the row coordinate {row!r}, which holds {dtype} numbers", ("time",)
        ) from None


def _refuse_non_times(time: slice, row: str) -> None:
    """Refuse bounds of a time coordinate that are no times (pandas' error names its own indexers)."""
    import pandas as pd

    for value in (time.start, time.stop):
        if isinstance(value, str):
            try:
                pd.Timestamp(value)
            except ValueError:
                raise SelectionError(
                    f"{value!r} is not a time, and the row coordinate {row!r} holds times; write them as "
                    "2024-01-31 or 2024-01-31T12:00", ("time",)) from None


def _refuse_empty(n: int, n_all: int, rows: slice | None, time: slice | None) -> None:
    """A selection of no rows is the selection's error, not the estimator's (``X is empty``)."""
    if n:
        return
    chosen = [f"{name}=slice({s.start!r}, {s.stop!r})" for name, s in (("rows", rows), ("time", time))
              if s is not None]
    raise SelectionError(
        f"{' with '.join(chosen)} select{'s' * (len(chosen) == 1)} no rows of the archive's {n_all:,}",
        tuple(name for name, s in (("rows", rows), ("time", time)) if s is not None),
        f"select{'s' * (len(chosen) == 1)} no rows of the archive's {n_all:,}",
    )


def _channel_first(X, channel_dim: str = "channel") -> bool:
    """Whether 2-D DataArray ``X`` holds its channels along its first dimension: that dimension is
    named ``channel_dim``, or only the second one has a datetime coordinate (the rows are times)."""

    def timed(dim) -> bool:
        return dim in X.coords and np.issubdtype(X.coords[dim].dtype, np.datetime64)

    first, second = X.dims
    return first == channel_dim or (timed(second) and not timed(first))


#: A Dataset attribute that lists its channels, in order: 1-D data variables along one dimension.  A Zarr
#: store keeps no order of its arrays (consolidated metadata lists them sorted, a directory in the file
#: system's order), so without it the channels are the 1-D variables sorted by name.
CHANNELS_ATTR = "channels"


def _written_order(ds) -> list[str] | None:
    """The variables ``ds.attrs["channels"]`` lists, in its order, when it lists distinct 1-D data
    variables of ``ds``; None otherwise (an attribute that names something else is not the channels)."""
    order = ds.attrs.get(CHANNELS_ATTR)
    if not isinstance(order, list | tuple) or not order:
        return None
    if not all(isinstance(n, str) and n in ds.data_vars and ds[n].ndim == 1 for n in order):
        return None
    return list(order) if len(set(order)) == len(order) else None


def _data_variable(ds, dataset: str | None, variables: list[str] | None, channel_dim: str):
    """The 2-D (row, channel) DataArray named by ``dataset`` or ``variables`` in Dataset ``ds``, and the
    names of the 1-D variables stacked as its channels (None for a 2-D variable)."""
    # Sorted: a Zarr store without consolidated metadata lists its arrays in the file system's order,
    # which can change between openings (and so would the channels); --variables, or the Dataset's
    # ``channels`` attribute (CHANNELS_ATTR), gives the order.
    names = sorted(str(n) for n in ds.data_vars)
    if dataset is not None and variables:
        raise ValueError("name either a dataset (a 2-D variable) or variables (1-D ones), not both")
    if dataset is not None:
        name = dataset.strip("/")
        if name not in ds.data_vars:
            raise KeyError(f"the archive has no variable {dataset!r}; it has [{_few(names, quote=True)}]")
        X = ds[name]
        if X.ndim != 2:
            raise ValueError(f"variable {name!r} has dims {X.dims}; name a 2-D (row, channel) variable, or "
                             "1-D variables along the same row dimension as variables")
        return X, None
    if not variables:
        variables = _written_order(ds)
    if not variables:
        two_d = [n for n in names if ds[n].ndim == 2]
        if len(two_d) == 1:
            return ds[two_d[0]], None
        one_d = [n for n in names if ds[n].ndim == 1]
        if two_d or len({ds[n].dims for n in one_d}) != 1:
            raise KeyError(
                f"the archive holds variables [{_few(names, quote=True)}] with dims "
                f"{sorted({str(ds[n].dims) for n in names})}; name the channels with variables (--variables a,b,c) "
                "or a 2-D variable with dataset (--dataset NAME)"
            )
        variables = one_d  # in sorted order
    missing = [v for v in variables if v not in ds.data_vars]
    if missing:
        raise KeyError(f"the archive has no variable(s) [{_few(missing, quote=True)}]; it has "
                       f"[{_few(names, quote=True)}]")
    dims = {ds[v].dims for v in variables}
    if len(dims) != 1 or len(next(iter(dims))) != 1:
        along = ", ".join(f"{v} along {', '.join(map(str, ds[v].dims)) or 'no dimension'} ({ds[v].size:,} values)"
                          for v in variables[:_LISTED])
        raise ValueError(f"variables={_few(variables, ',')} are not all 1-D along one row dimension: {along}; "
                         "name variables that share their rows")
    row = next(iter(dims))[0]
    return ds[list(variables)].to_dataarray(dim=channel_dim).transpose(row, channel_dim), list(variables)


#: Names an error message lists before it says how many there are in all.
_LISTED = 8


def _few(names, sep: str = ", ", quote: bool = False) -> str:
    """The first :data:`_LISTED` of ``names`` joined by ``sep``, then how many there are in all: an error
    naming 50,000 variables stays one short line."""
    names = list(names)
    shown = sep.join(repr(n) if quote else str(n) for n in names[:_LISTED])
    return shown + (f"{sep}... ({len(names):,} in all)" if len(names) > _LISTED else "")


def _refuse_duplicates(variables: list[str]) -> None:
    """Refuse ``variables`` that name a variable twice: it would be fitted as two channels."""
    seen, twice = set(), {}
    for name in variables:
        if name in seen:
            twice[name] = None
        seen.add(name)
    if twice:
        raise ValueError(f"variables={_few(variables, ',')} name {_few(twice, quote=True)} more than once; "
                         "name each variable once")


def open_archive(
    path: str | os.PathLike,
    *,
    dataset: str | None = None,
    variables: list[str] | None = None,
    rows: slice | None = None,
    time: slice | None = None,
    channel_dim: str = "channel",
    storage_options: dict | None = None,
    block_values: int | None = None,
    row_index: bool = True,
):
    """Open an archive lazily: a DataArray for a store written by xarray, else a dask array.

    Parameters
    ----------
    path : str or path-like
        A Zarr store, an HDF5 file, or a Zarr URL (``s3://...``).
    dataset : str, optional
        The array (or, for an xarray store, the 2-D data variable) to read.
    variables : list of str, optional
        For an xarray store: 1-D data variables along one row dimension,
        stacked as the channels (their names become the channel coordinate
        along ``channel_dim``).  Without ``dataset`` and ``variables``, the
        1-D variables the store's ``channels`` attribute lists, in its order
        (:data:`CHANNELS_ATTR`; a Zarr store keeps no order of its arrays), else
        the store's only 2-D variable, or all its 1-D variables, sorted by
        name, if they share their dimension.  A name given twice is refused.
    rows : slice, optional
        Rows to keep, by position (cheap: nothing is read).
    time : slice, optional
        Rows to keep by the label of the row coordinate (``slice("2024-01",
        "2024-03")``); xarray stores with a row index only.
    storage_options : dict, optional
        fsspec options for a URL.
    block_values : int, optional
        Values (rows x columns) of one dask block (whole store chunks, at
        least one); default ``DEFAULT_BLOCK_VALUES``.
    row_index : bool, default=True
        For an xarray store: build the in-memory index of the row coordinate
        (8 bytes a row; needed by ``time``).  False leaves the coordinate
        lazy, read with the rows it labels (xarray >= 2025.07; older
        versions always build it).

    Returns
    -------
    xarray.DataArray or dask.array.Array
        Lazy; rows chunked as for :func:`as_row_blocks`.
    """
    path = os.fspath(path)
    if variables:
        _refuse_duplicates(variables)
    url = is_url(path)
    if not url and dataset is None and not os.path.isfile(split_store_path(path)[0]):
        path_only, inner = split_store_path(path)
        if inner is not None and os.path.isdir(path_only):
            path, dataset = path_only, inner
    labelled = not _is_hdf5_path(path) and (url or os.path.isdir(path)) and is_xarray_store(
        path if url else os.path.abspath(path), storage_options=storage_options
    )
    if not labelled:
        if variables:
            raise ValueError(f"{path!r} was not written by xarray (its arrays name no dimensions); "
                             "variables need an xarray archive")
        if time is not None:
            raise SelectionError(
                f"{path!r} has no time coordinate (it was not written by xarray); select rows by position", ("time",)
            )
        X = as_row_blocks(open_store(path, dataset, storage_options=storage_options), block_values=block_values)
        if rows is None:
            return X
        n = X.shape[0]
        X = X[rows]
        _refuse_empty(X.shape[0], n, rows, None)
        return X
    import xarray as xr

    # storage options serve URLs only (the command line hands one set to every path it names)
    options = {"chunks": {}, "storage_options": with_timeouts(path, storage_options) if url else None}
    if not row_index and time is None and "create_default_indexes" in inspect.signature(xr.open_zarr).parameters:
        options["create_default_indexes"] = False  # xarray >= 2025.07; older ones always build the index
    with warnings.catch_warnings():  # a store written with consolidated=False is as good as any
        warnings.filterwarnings("ignore", message="Failed to open Zarr store with consolidated metadata",
                                category=RuntimeWarning)
        ds = xr.open_zarr(path if url else os.path.abspath(path), **options)
    X, stacked = _data_variable(ds, dataset, variables, channel_dim)
    if _channel_first(X, channel_dim):  # stored (channel, time): the rows are the second dimension
        X = X.transpose()
    row = X.dims[0]
    n_all = X.shape[0]
    if stacked is not None:  # one read per row block instead of xarray's per variable (see _stacked)
        stacked = stacked_rows(ds, stacked, _zarr_group(path, storage_options), path)
    if stacked is not None:  # positions ride along the selections below, to read the rows they keep
        X = X.assign_coords({_POSITION: (row, da.arange(n_all, chunks=X.chunks[0]))})
    if rows is not None:
        X = X.isel({row: rows})
    if time is not None:
        if row not in X.indexes:
            raise SelectionError(f"the archive's row dimension {row!r} has no coordinate to select by label", ("time",))
        index = X.indexes[row]
        if index.dtype.kind in "iuf":  # labels given as text ("10", from the command line) are numbers here:
            time = slice(*(_numeric_label(v, index.dtype, row) for v in (time.start, time.stop)))
        elif index.dtype.kind == "M":
            _refuse_non_times(time, row)
        try:
            X = X.sel({row: time})
        except (TypeError, ValueError, KeyError) as err:  # pandas: a label its index cannot compare
            if not (index.is_monotonic_increasing or index.is_monotonic_decreasing):
                unsorted = (f"the row coordinate {row!r} is not sorted, so a range of labels is no range of rows "
                            "(only bounds that are each the label of exactly one row could be used); sort the "
                            f"archive by {row!r} (xarray: ds.sortby({row!r}).to_zarr(...)) or select rows by "
                            "position with ")
                raise SelectionError(f"time={time.start!r}:{time.stop!r}: {unsorted}rows=", ("time",),
                                     f"{unsorted}--rows START:STOP") from None
            text = " ".join(str(err.args[0] if isinstance(err, KeyError) and err.args else err).split())
            raise SelectionError(
                f"{time.start!r}:{time.stop!r} are not labels of the row coordinate {row!r}, which holds "
                f"{index.dtype} values ({type(err).__name__}: {text})", ("time",)
            ) from None
    if rows is not None or time is not None:
        _refuse_empty(X.shape[0], n_all, rows, time)
    n, p = X.shape
    store_rows = X.chunks[0][0] if X.chunks and X.chunks[0] else None
    block_rows = _row_chunk(n, p, store_rows, block_values)
    if stacked is not None:
        span = _span(X[_POSITION].data) if n else None
        X = X.drop_vars(_POSITION)
        if span is not None:
            return X.copy(data=_stacked_blocks(stacked, *span, block_rows))
    return X.chunk({row: block_rows, X.dims[1]: -1})


def _zarr_group(path: str, storage_options: dict | None):
    """The Zarr group xarray opened at ``path`` (a directory or a URL), or None where Zarr cannot open it."""
    import zarr

    try:
        return _url_node(path, storage_options) if is_url(path) else zarr.open_group(os.path.abspath(path), mode="r")
    except Exception:  # a layout zarr does not open alone: xarray's stack reads it
        return None


#: A temporary coordinate of the stacked rows: each row's position in the archive.
_POSITION = "_dask_mcpca_position"


def _span(positions: da.Array) -> tuple[int, int] | None:
    """``(start, stop)`` when the selected ``positions`` are one run of rows, else None."""
    n = positions.shape[0]
    first, last = (int(v) for v in da.compute(positions[0], positions[-1], scheduler="synchronous"))
    return (first, last + 1) if last + 1 - first == n else None


def _stacked_blocks(stacked, start: int, stop: int, block_rows: int) -> da.Array:
    """Rows ``start:stop`` of :class:`._stacked.StackedRows` ``stacked`` in blocks of ``block_rows`` rows."""
    from dask.base import tokenize

    part = stacked.rows(start, stop)
    name = "xarray-stacked-" + tokenize(part.arrays, part.where, part.names, start, stop, block_rows)
    return da.from_array(part, chunks=(block_rows, part.shape[1]), asarray=False, lock=False, name=name)
