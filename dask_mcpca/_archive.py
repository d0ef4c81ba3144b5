"""Archives written by xarray, opened once and selected: :func:`open_archive` and :class:`OpenedArchive`.

A Zarr store whose arrays name their dimensions (``Dataset.to_zarr``) is
opened through xarray: its channels are a 2-D variable or 1-D variables
stacked (read a row block at a time by :mod:`._stacked`), its rows can be
selected by position (``rows``) or by the label of their coordinate
(``time``).  Any other store (plain Zarr, HDF5) is opened as
:func:`._io.as_row_blocks` opens it, and selected by position.

:class:`OpenedArchive` is one opening: the store's metadata read, the
Dataset opened.  Its :meth:`~OpenedArchive.select` gives a :class:`Selection`
(the rows, lazy, in full-row blocks, and their positions in the whole
archive) as often as a caller needs one, without opening the store again: a
command of the command line opens its archive once.
"""

from __future__ import annotations

import inspect
import os
import warnings
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np

from ._exceptions import SelectionError
from ._io import as_row_blocks, channel_first, is_hdf5_path, open_store, row_chunk, split_store_path, url_node
from ._stacked import stacked_rows
from ._urls import is_url, with_timeouts

__all__ = ["open_archive", "OpenedArchive", "Selection", "is_xarray_store", "CHANNELS_ATTR"]


def is_xarray_store(path: str, *, storage_options: dict | None = None) -> bool:
    """Whether ``path`` is a Zarr group whose arrays name their dimensions (as ``Dataset.to_zarr`` writes).

    Zarr v3 keeps the names in ``dimension_names``, xarray's Zarr v2 layout
    in the ``_ARRAY_DIMENSIONS`` attribute.
    """
    return _xarray_group(path, storage_options) is not None


def _xarray_group(path: str, storage_options: dict | None):
    """The Zarr group at ``path`` when its arrays name their dimensions (:func:`is_xarray_store`), else None."""
    import zarr

    if is_url(path):  # what cannot be opened here cannot be read as a plain store either: said now, once
        node = url_node(path, storage_options)
    else:
        try:
            node = zarr.open(path, mode="r")
        except Exception:
            return None
    if isinstance(node, zarr.Array):
        return None
    for _, arr in node.arrays():
        if getattr(arr.metadata, "dimension_names", None) or "_ARRAY_DIMENSIONS" in arr.attrs:
            return node
    return None


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


def _time_label(value, index):
    """A bound for an unsorted time coordinate: text becomes a time of the index's kind.

    pandas reads text on a datetime index as a period (``"2024-01-21T21:00"`` is that whole minute) and,
    where the index is not sorted, wants each period's ends among the labels, which a stop bound's end
    (21:00:59.999999999) never is; a time is looked up as itself, the label of one row."""
    import pandas as pd

    if not isinstance(value, str):
        return value
    stamp = pd.Timestamp(value)
    tz = getattr(index, "tz", None)
    return stamp.tz_localize(tz) if tz is not None and stamp.tz is None else stamp


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


@dataclass(frozen=True)
class Selection:
    """Rows selected from an opened archive.

    Attributes
    ----------
    X : xarray.DataArray or dask.array.Array
        The rows, lazy, in full-row blocks (:func:`._io.row_chunk`).
    span : tuple of int or None
        ``(start, stop)``: their positions in the whole archive; None where
        they are not one run of rows (labels repeated out of order).
    n_all : int
        The rows of the whole archive.
    """

    X: Any
    span: tuple[int, int] | None
    n_all: int


class OpenedArchive:
    """An archive opened once; :meth:`select` gives its rows without opening it again.

    Parameters are :func:`open_archive`'s; ``row_index`` must be True for a
    selection by ``time``.  A store that xarray did not write is opened on
    the first :meth:`select` (so that a ``time`` selection of it is refused
    before the store is read), then kept.

    Attributes
    ----------
    path : str
        The store as named (a path or a URL), the array inside it split off.
    labelled : bool
        Whether xarray wrote it (rows and channels named, a row coordinate).
    """

    def __init__(self, path: str | os.PathLike, *, dataset: str | None = None, variables: list[str] | None = None,
                 channel_dim: str = "channel", storage_options: dict | None = None, row_index: bool = True):
        path = os.fspath(path)
        if variables:
            _refuse_duplicates(variables)
        url = is_url(path)
        if not url and dataset is None and not os.path.isfile(split_store_path(path)[0]):
            path_only, inner = split_store_path(path)
            if inner is not None and os.path.isdir(path_only):
                path, dataset = path_only, inner
        group = None
        if not is_hdf5_path(path) and (url or os.path.isdir(path)):
            group = _xarray_group(path if url else os.path.abspath(path), storage_options)
        self.path, self.labelled = path, group is not None
        self._dataset, self._options, self._blocks = dataset, storage_options, {}
        if not self.labelled:
            if variables:
                open_store(path, dataset, storage_options=storage_options)  # not there: "no such store"
                raise ValueError(f"{path!r} was not written by xarray (its arrays name no dimensions); "
                                 "variables need an xarray archive")
            return
        import xarray as xr

        # storage options serve URLs only (the command line hands one set to every path it names)
        options = {"chunks": {}, "storage_options": with_timeouts(path, storage_options) if url else None}
        if not row_index and "create_default_indexes" in inspect.signature(xr.open_zarr).parameters:
            options["create_default_indexes"] = False  # xarray >= 2025.07; older ones always build the index
        with warnings.catch_warnings():  # a store written with consolidated=False is as good as any
            warnings.filterwarnings("ignore", message="Failed to open Zarr store with consolidated metadata",
                                    category=RuntimeWarning)
            ds = xr.open_zarr(path if url else os.path.abspath(path), **options)
        X, stacked = _data_variable(ds, dataset, variables, channel_dim)
        if channel_first(X, channel_dim):  # stored (channel, time): the rows are the second dimension
            X = X.transpose()
        if stacked is not None:  # one read per row block instead of xarray's per variable (see _stacked)
            stacked = stacked_rows(ds, stacked, group, path)
        self._X, self._stacked = X, stacked

    def select(self, rows: slice | None = None, time: slice | None = None, *,
               block_values: int | None = None) -> Selection:
        """The rows ``rows`` (by position), then ``time`` (by label) of them; all rows without either.

        ``block_values``: the values (rows x columns) of one dask block (whole store chunks);
        default ``DEFAULT_BLOCK_VALUES``.

        Raises
        ------
        SelectionError
            The selection selects no rows, or ``time`` labels the archive cannot select by.
        """
        if not self.labelled:
            return self._select_plain(rows, time, block_values)
        X, stacked = self._X, self._stacked
        row = X.dims[0]
        n_all = X.shape[0]
        if stacked is not None:  # positions ride along the selections below, to read the rows they keep
            X = X.assign_coords({_POSITION: (row, da.arange(n_all, chunks=X.chunks[0]))})
        base, span = 0, (0, n_all)
        if rows is not None:
            X = X.isel({row: rows})
            base, last, _ = rows.indices(n_all)
            span = (base, last) if last - base == X.shape[0] else None
        if time is not None:
            X, span = _select_time(X, time, row, base)
        if rows is not None or time is not None:
            _refuse_empty(X.shape[0], n_all, rows, time)
        n, p = X.shape
        store_rows = X.chunks[0][0] if X.chunks and X.chunks[0] else None
        block_rows = row_chunk(n, p, store_rows, block_values)
        if stacked is not None:
            positions = _span(X[_POSITION].data) if n else None
            X = X.drop_vars(_POSITION)
            if positions is not None:
                return Selection(X.copy(data=_stacked_blocks(stacked, *positions, block_rows)), span, n_all)
        return Selection(X.chunk({row: block_rows, X.dims[1]: -1}), span, n_all)

    def _select_plain(self, rows: slice | None, time: slice | None, block_values: int | None) -> Selection:
        if time is not None:
            raise SelectionError(
                f"{self.path!r} has no time coordinate (it was not written by xarray); select rows by position",
                ("time",))
        if block_values not in self._blocks:  # opened once; its blocks laid out once per block size
            self._blocks[block_values] = as_row_blocks(
                open_store(self.path, self._dataset, storage_options=self._options), block_values=block_values)
        X = self._blocks[block_values]
        n_all = X.shape[0]
        if rows is None:
            return Selection(X, (0, n_all), n_all)
        X = X[rows]
        _refuse_empty(X.shape[0], n_all, rows, None)
        start, stop, _ = rows.indices(n_all)
        return Selection(X, (start, stop) if stop - start == X.shape[0] else None, n_all)


def _select_time(X, time: slice, row: str, base: int):
    """``X`` (rows already selected by position from ``base`` on) selected by the labels ``time`` of its row
    coordinate, and the span of the rows kept in the whole archive (see :class:`Selection`).

    The span is found as xarray selects labels: from the first row holding the first label selected to
    the last holding the last, so a label repeated across rows (a sorted coordinate with repeats) counts
    all of them; None only where the labels repeat out of order."""
    if row not in X.indexes:
        raise SelectionError(f"the archive's row dimension {row!r} has no coordinate to select by label", ("time",))
    index = X.indexes[row]
    if index.dtype.kind in "iuf":  # labels given as text ("10", from the command line) are numbers here:
        time = slice(*(_numeric_label(v, index.dtype, row) for v in (time.start, time.stop)))
    sorted_ = index.is_monotonic_increasing or index.is_monotonic_decreasing
    given = time
    if index.dtype.kind == "M":
        _refuse_non_times(time, row)
        if not sorted_:  # text on a sorted index keeps pandas' meaning: "2024-01-02" as a stop is that whole day
            time = slice(*(_time_label(v, index) for v in (time.start, time.stop)))
    unsorted = (f"the row coordinate {row!r} is not sorted, so a range of labels is no range of rows "
                "(only bounds that are each the label of exactly one row can be used: they select the rows "
                f"from the one to the other as stored); sort the archive by {row!r} (xarray: "
                f"ds.sortby({row!r}).to_zarr(...)) or select rows by position with ")
    try:
        X = X.sel({row: time})
    except (TypeError, ValueError, KeyError) as err:  # pandas: a label its index cannot compare
        if not sorted_:
            raise SelectionError(f"time={given.start!r}:{given.stop!r}: {unsorted}rows=", ("time",),
                                 f"{unsorted}--rows START:STOP") from None
        text = " ".join(str(err.args[0] if isinstance(err, KeyError) and err.args else err).split())
        raise SelectionError(
            f"{time.start!r}:{time.stop!r} are not labels of the row coordinate {row!r}, which holds "
            f"{index.dtype} values ({type(err).__name__}: {text})", ("time",)
        ) from None
    n = X.shape[0]
    if not n and not sorted_ and time.start is not None and time.stop is not None:
        first, last = index.get_loc(time.start), index.get_loc(time.stop)  # one row each: .sel found them
        backwards = (f"the row labelled {given.stop!r} (row {base + last:,}) comes before the row labelled "
                     f"{given.start!r} (row {base + first:,}); {unsorted}")
        raise SelectionError(f"time={given.start!r}:{given.stop!r}: {backwards}rows=", ("time",),
                             f"{backwards}--rows START:STOP")
    if not n:
        return X, None
    chosen = X.indexes[row]
    try:  # a slice of positions: by get_loc on unique labels, by binary search on sorted ones (repeats too)
        start, stop, step = index.slice_indexer(chosen[0], chosen[-1]).indices(len(index))
    except (KeyError, ValueError, TypeError):
        return X, None  # labels repeated out of order: their positions are not one run
    return X, ((base + start, base + stop) if step == 1 and stop - start == n else None)


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
        "2024-03")``); xarray stores with a row index only. On a sorted
        time coordinate text is a period ("2024-03" as a stop keeps all of
        March); on one that is not sorted each bound must be the label of
        exactly one row (text is read as that time), and the rows kept run
        from the one to the other as stored, as xarray's ``sel`` does.
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
    opened = OpenedArchive(path, dataset=dataset, variables=variables, channel_dim=channel_dim,
                           storage_options=storage_options, row_index=row_index or time is not None)
    return opened.select(rows, time, block_values=block_values).X


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
