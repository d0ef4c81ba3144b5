"""The score store: ``dask-mcpca score``'s arrays written, labelled for xarray, and read back.

:func:`write_new` writes a new store (the command says what: the Dataset
:func:`as_dataset` makes of the outputs, and its attributes); appending rows
to one is :mod:`._score_append`'s.  What a store was scored with is kept in
its attributes (:func:`provenance`): the input (path, dataset, variables),
the archive rows by position (:data:`ROWS_ATTR`), the number of channels and
the segments (:data:`SEGMENTS_ATTR`: which model file, its path and SHA-256,
scored which rows), and the fingerprint of the input rows scored
(:data:`ROW_DIGESTS_ATTR`: a row every 65,536 and the last one, read in the
pass that scores them, see :mod:`._rowprints`).

Whatever the input, every array of a score store names its dimensions (the
input's row dimension, ``row`` for a plain array; ``component``; the channel
dimension, the input's, ``channel`` for a plain array), so
``xarray.open_zarr`` opens it.  The channels are named three ways: the
group attribute ``channels``, the channel coordinate of ``contributions``
and ``cells``, and ``top_channel``'s CF ``flag_values``/``flag_meanings``.
:func:`open_scores` adds ``top_channel_name``.

The names are the model's (``feature_names_in_``), else the input's channel
coordinate, else the column positions as text (``"0"``, ``"1"``, ...), as
``dask-mcpca report`` names the channels of its events.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _rowprints
from ._labels import COMPONENT_DIM, is_dataarray
from ._urls import is_url, with_timeouts

__all__ = ["ROW_DIM", "CHANNEL_DIM", "CHANNELS_ATTR", "NO_CHANNEL", "ROWS_ATTR", "MODEL_ATTR", "SEGMENTS_ATTR",
           "ROW_DIGESTS_ATTR", "quiet_consolidated", "count_true", "rows_at", "model_name", "provenance",
           "segments_of", "Pending", "write_new", "channel_names", "dimension_names", "as_dataset",
           "top_channel_flags", "top_channel_names", "mode_flags", "open_scores"]

#: Row dimension of the arrays scored from a plain (unlabelled) input.
ROW_DIM = "row"
#: Channel dimension of the arrays scored from a plain input (an xarray input keeps its own).
CHANNEL_DIM = "channel"
#: Group attribute of a score store: the channel names, in the model's column order.
CHANNELS_ATTR = "channels"
#: ``top_channel``'s flag meaning for -1 (no channel observed), and ``top_channel_name``'s value there.
NO_CHANNEL = "none"
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


def quiet_consolidated() -> None:
    """Silence zarr's warning that consolidated metadata is not in the Zarr v3 specification: a score
    store is written consolidated (xarray opens it in one read) and the command line says one line.
    Also its warning, naming its source file, for a file in the store that is no Zarr node (a note, a
    ``.DS_Store``): such a file is kept as it is."""
    import warnings

    warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part", category=UserWarning)
    warnings.filterwarnings("ignore", message="Object at .* is not recognized as a component of a Zarr hierarchy",
                            category=UserWarning)


def count_true(flags):
    """The number of True in the dask array ``flags``, as a Delayed to compute with a Delayed write of
    the same blocks: beside a Delayed, an Array is optimized apart, under other keys, and the blocks
    it is computed from would be made twice (the scoring twice)."""
    return flags.sum().to_delayed(optimize_graph=False).item()

def rows_at(X, positions: list[int]):
    """The rows of the archive ``X`` at ``positions``, as a Delayed to compute with the pass that reads
    ``X``: they share its reads (a Delayed, not an Array, for :func:`count_true`'s reason)."""
    return getattr(X, "data", X)[list(positions)].rechunk(-1).to_delayed(optimize_graph=False).item()


def model_name(path: str) -> str:
    """How a score store names the model file that scored it: its URL, or its absolute path."""
    return path if is_url(path) else os.path.abspath(path)


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


@dataclass(frozen=True)
class Pending:
    """A store write not yet done: ``tasks``, Delayed to compute in one pass (the writes, the outlier
    flags counted, the input rows fingerprinted: the blocks are made once), then :meth:`finish` with
    their results, which stores what the pass found and returns the number of outliers (None where
    the store holds no flags)."""

    tasks: list
    finish: Callable[[list], int | None]


def write_new(path: str, ds, *, X, span: tuple[int, int] | None, storage_options: dict | None = None) -> Pending:
    """The writes of a new score store at ``path`` (a temporary the caller publishes whole): the Dataset
    ``ds`` (:func:`as_dataset`), consolidated, and the fingerprint of the input ``X``'s rows, whose
    positions in the archive are ``span`` (none where None)."""
    import zarr

    so = {"storage_options": with_timeouts(path, storage_options)} if is_url(path) else {}
    writes = [ds.to_zarr(path, mode="w", compute=False, consolidated=True, **so)]
    flags = ds.get("outlier")
    # counted in the same computation as the writes (the blocks are made once), not by reading the store back
    counted = [count_true(flags.data)] if flags is not None else []
    # the input's fingerprint (a row every 65,536 and the last): read in this pass, no chunk twice
    positions = _rowprints.store_positions(*span) if span is not None else []
    sampled = [rows_at(X, [pos - span[0] for pos in positions])] if positions else []

    def finish(results: list) -> int | None:
        if sampled:
            zarr.open_group(path, mode="r+", **so).attrs[ROW_DIGESTS_ATTR] = [
                [pos, d] for pos, d in zip(positions, _rowprints.digests(results[-1]), strict=True)]
        return int(results[len(writes)]) if counted else None

    return Pending([*writes, *counted, *sampled], finish)


def channel_names(model, X: Any) -> list[str]:
    """The channels' names, in the model's column order: ``feature_names_in_``, else the channel
    coordinate of a DataArray ``X``, else ``"0"``, ``"1"``, ... (the column positions)."""
    names = getattr(model, "feature_names_in_", None)
    if names is None and is_dataarray(X) and X.ndim == 2 and X.dims[1] in X.coords:
        names = X.coords[X.dims[1]].values
    if names is None:
        return [str(j) for j in range(model.n_features_in_)]
    return [str(n) for n in names]


def dimension_names(arr) -> list | None:
    """The dimension names of a Zarr array (v3 metadata, or xarray's v2 attribute); None without them
    (an array that ``score`` wrote from a plain input before it named them)."""
    return getattr(arr.metadata, "dimension_names", None) or arr.attrs.get("_ARRAY_DIMENSIONS")


def _uniform_rows(a):
    """Dask array ``a`` with row chunks Zarr can take (all one size but a smaller last one)."""
    rows = a.chunks[0]
    if len(rows) < 2 or (len(set(rows[:-1])) == 1 and rows[-1] <= rows[0]):
        return a
    return a.rechunk({0: max(rows)})


def as_dataset(outputs: dict, *, model, X: Any, attrs: dict, descriptions: dict):
    """The per-row ``outputs`` of ``model.score_rows(X)`` as the Dataset a score store holds.

    ``outputs`` of a plain input (dask or numpy arrays) get the dimensions
    :data:`ROW_DIM`, ``component`` (with its coordinate, as for a DataArray
    input) and :data:`CHANNEL_DIM`; the channel dimension, where an array
    has it, gets the names (:func:`channel_names`) as its coordinate, the group the attribute
    :data:`CHANNELS_ATTR`, ``top_channel`` its CF flag attributes, each array
    its ``descriptions[name]``.  None-valued ``attrs`` are left out.
    """
    import xarray as xr

    names = channel_names(model, X)
    channel_dim = X.dims[1] if is_dataarray(X) else CHANNEL_DIM
    arrays = {}
    for name, a in outputs.items():
        if not isinstance(a, xr.DataArray):
            dims = (ROW_DIM,) if a.ndim == 1 else (ROW_DIM, COMPONENT_DIM if name == "scores" else channel_dim)
            coords = {COMPONENT_DIM: np.arange(a.shape[1])} if name == "scores" else {}
            a = xr.DataArray(a, dims=dims, coords=coords)
        if hasattr(a.data, "rechunk"):
            a = a.copy(data=_uniform_rows(a.data))
        arrays[name] = a
    ds = xr.Dataset(arrays, attrs={k: v for k, v in attrs.items() if v is not None})
    for var in ds.variables.values():  # the archive's encoding (a Zarr v2 compressor on its time
        var.encoding = {}  # coordinate, its chunks) is not the score store's: a v3 store takes no v2 codec
    if channel_dim in ds.dims:  # object: written as Zarr v3 variable-length text
        ds = ds.assign_coords({channel_dim: np.asarray(names, dtype=object)})
    ds.attrs[CHANNELS_ATTR] = names
    for name in outputs:
        ds[name].attrs["description"] = descriptions[name]
    if "top_channel" in ds:
        ds["top_channel"].attrs.update(top_channel_flags(names))
    if "mode" in ds:
        ds["mode"].attrs.update(mode_flags(model))
    return ds


def mode_flags(model) -> dict:
    """CF flag attributes of ``mode``: ``m`` is the label ``modes_[m]`` (-1: no mode judged the row; a model
    without modes has the one mode 0), and the modes' shares of the fitted rows (``mode_weights``)."""
    labels = [str(v) for v in getattr(model, "modes_", ["all"])]
    weights = [float(w) for w in getattr(model, "mode_weights_", [1.0])]
    return {"flag_values": [-1, *range(len(labels))], "flag_meanings": " ".join(
        ["no_mode", *(label.replace(" ", "_") for label in labels)]), "modes": labels, "mode_weights": weights}


def top_channel_flags(names: list[str]) -> dict:
    """CF flag attributes of ``top_channel``: -1 is :data:`NO_CHANNEL`, ``j`` the ``j``-th name
    (blanks within a name written as ``_``: CF separates the meanings by blanks)."""
    return {"flag_values": list(range(-1, len(names))),
            "flag_meanings": " ".join("_".join(str(n).split()) or "_" for n in [NO_CHANNEL, *names])}


def top_channel_names(ds):
    """``top_channel`` of a score store's Dataset as the channels' names (lazy where it is):
    :data:`NO_CHANNEL` where no channel was observed (-1).

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> ds = xr.Dataset({"top_channel": ("row", np.array([1, -1, 0], np.int16))}, attrs={"channels": ["T1", "P1"]})
    >>> top_channel_names(ds).values.tolist()
    ['P1', 'none', 'T1']
    """
    import xarray as xr

    names = ds.attrs.get(CHANNELS_ATTR)
    if not isinstance(names, list) or not names:
        raise ValueError("the score store records no channel names (scored before dask-mcpca stored them); "
                         "score it again with --overwrite")
    lookup = np.asarray([*map(str, names), NO_CHANNEL])  # -1 reads the last entry
    named = xr.apply_ufunc(lookup.__getitem__, ds["top_channel"], dask="parallelized", output_dtypes=[lookup.dtype])
    return named.rename("top_channel_name").assign_attrs(description="top_channel as the channel's name")


def open_scores(path: str | os.PathLike, **kwargs):
    """Open a store written by ``dask-mcpca score`` as an ``xarray.Dataset``, lazily.

    Parameters
    ----------
    path : str or path-like
        The score store (a directory or a URL).
    **kwargs
        Passed to ``xarray.open_zarr`` (``storage_options`` for a URL).

    Returns
    -------
    xarray.Dataset
        The store's arrays, with ``top_channel_name`` (:func:`top_channel_names`)
        beside ``top_channel`` where the store holds it, and ``segment``: for
        each row, its index in ``attrs["segments"]``, the list of which model
        file (path and SHA-256) scored which rows (``score --append`` with an
        updated model starts a segment).

    Examples
    --------
    A tiny store of the layout ``score`` writes (three rows, two flagged), in a temporary folder:

    >>> import tempfile, numpy as np, xarray as xr
    >>> from dask_mcpca import open_scores
    >>> path = tempfile.mkdtemp() + "/scores.zarr"
    >>> xr.Dataset({"outlier": ("time", [False, True, True]), "top_channel": ("time", np.int16([-1, 2, 0]))},
    ...            attrs={"channels": ["temp", "flow", "press"]}).to_zarr(path)  # doctest: +ELLIPSIS
    <xarray.backends.zarr.ZarrStore object at 0x...>
    >>> ds = open_scores(path)
    >>> ds.top_channel_name.where(ds.outlier.compute(), drop=True).values.tolist()  # the flagged rows' channels
    ['press', 'temp']

    The flags are computed first (``ds.outlier.compute()``): ``where(..., drop=True)`` takes no lazy mask.
    """
    import xarray as xr

    ds = xr.open_zarr(os.fspath(path) if isinstance(path, os.PathLike) else path, **kwargs)
    if "top_channel" in ds:
        ds["top_channel_name"] = top_channel_names(ds)
    segments = _row_segments(ds)
    if segments is not None:
        ds["segment"] = segments
    return ds


def _row_segments(ds):
    """Each row's segment (its index in the store's segments), lazily; None where the store records none."""
    import dask.array as da

    first = next((ds[name] for name in ds.data_vars if ds[name].ndim >= 1), None)
    if first is None or ROWS_ATTR not in ds.attrs:
        return None
    row_dim = first.dims[0]
    starts = np.array([s["rows"][0] for s in segments_of(ds.attrs)]) - ds.attrs[ROWS_ATTR][0]
    chunks = first.chunks[0] if first.chunks else (ds.sizes[row_dim],)
    rows = da.arange(ds.sizes[row_dim], chunks=(chunks,))
    index = rows.map_blocks(lambda r: (np.searchsorted(starts, r, side="right") - 1).astype(np.int16),
                            dtype=np.int16)
    return (row_dim,), index
