"""An xarray archive's 1-D variables read as one block per task (``_stacked``): the values xarray reads.

The expected values come from xarray itself (``open_zarr``, ``to_dataarray``),
for each store layout the reader may meet: Zarr v3 and v2, compressed or not,
a missing chunk, a partial last chunk, big-endian values; stores whose values
xarray decodes (packed, a finite fill value, integers) are left to xarray's
own stack.  The fit on the xarray store is the fit on the same values as a
plain 2-D Zarr array, block for block.
"""

from __future__ import annotations

import os
import pickle
import warnings

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from conftest import assert_same_fit

from dask_mcpca import MCPCA, open_archive
from dask_mcpca._stacked import ROUTES, StackedRows, stacked_rows

N_ROWS, N_CHANNELS, CHUNK = 1_000, 4, 128
NAMES = [f"c{j}" for j in range(N_CHANNELS)]

#: Store layouts: keyword arguments of ``Dataset.to_zarr`` and the encoding of every variable.
LAYOUTS = {
    "v3 zstd": ({}, {}),
    "v3 uncompressed": ({}, {"compressors": None}),
    "v3 gzip": ({}, {"compressors": zarr.codecs.GzipCodec()}),
    "v3 blosc": ({}, {"compressors": zarr.codecs.BloscCodec()}),
    "v2": ({"zarr_format": 2}, {}),
    "v2 uncompressed": ({"zarr_format": 2}, {"compressors": None}),
}


def _values(dtype="float32", seed=0) -> np.ndarray:
    X = np.random.default_rng(seed).normal(size=(N_ROWS, N_CHANNELS)).astype(dtype)
    X[17, 1] = np.nan  # a gap
    return X


def _write(path, X, *, to_zarr=None, encoding=None, attrs=None, dtypes=None) -> str:
    time = pd.date_range("2025-01-01", periods=len(X), freq="1s")
    ds = xr.Dataset({n: ("time", X[:, j].astype((dtypes or {}).get(n, X.dtype))) for j, n in enumerate(NAMES)},
                    coords={"time": time}, attrs={"channels": NAMES})
    for n in NAMES:
        ds[n].attrs.update(attrs or {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.chunk({"time": CHUNK}).to_zarr(path, mode="w", encoding={n: dict(encoding or {}) for n in NAMES},
                                          **(to_zarr or {}))
    return str(path)


def _xarray_stack(path, **selection) -> xr.DataArray:
    """What xarray reads: its own stack of the variables, selected as asked."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_zarr(path)
    X = ds[NAMES].to_dataarray(dim="channel").transpose("time", "channel")
    if "rows" in selection:
        X = X.isel(time=selection["rows"])
    if "time" in selection:
        X = X.sel(time=selection["time"])
    return X.load()


def _reader(path, route=None) -> StackedRows:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_zarr(path)
    stacked = stacked_rows(ds, NAMES, zarr.open_group(path, mode="r"), path)
    assert stacked is not None
    return stacked if route is None else StackedRows(stacked.arrays, stacked.names, stacked.where, route=route)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("route", ROUTES)
def test_each_route_reads_what_xarray_reads(tmp_path, layout, route):
    to_zarr, encoding = LAYOUTS[layout]
    path = _write(tmp_path / "a.zarr", _values(), to_zarr=to_zarr, encoding=encoding)
    reader = _reader(path, route)
    assert reader.route == route
    expected = _xarray_stack(path).values
    np.testing.assert_array_equal(reader[:, :], expected)
    for rows in (slice(0, 1), slice(100, 300), slice(127, 129), slice(990, 1000), slice(0, N_ROWS)):
        got = reader[rows, slice(1, 3)]
        assert got.flags.c_contiguous and got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected[rows, 1:3])


def test_files_is_the_route_for_a_local_store_xarray_wrote(tmp_path):
    assert _reader(_write(tmp_path / "a.zarr", _values())).route == "files"


def test_a_missing_chunk_reads_as_xarray_reads_it(tmp_path):
    path = _write(tmp_path / "a.zarr", _values())
    os.remove(os.path.join(path, "c1", "c", "2"))  # rows 256:384 of one variable
    expected = _xarray_stack(path).values
    assert np.isnan(expected[256:384, 1]).all()
    for route in ROUTES:
        np.testing.assert_array_equal(_reader(path, route)[:, :], expected)


def test_big_endian_values(tmp_path):
    path = _write(tmp_path / "a.zarr", _values(">f8"), to_zarr={"zarr_format": 2})
    reader = _reader(path, "files")
    np.testing.assert_array_equal(reader[:, :], _xarray_stack(path).values)
    assert reader[:, :].dtype.isnative


def test_a_corrupt_chunk_names_the_store_and_rows(tmp_path):
    path = _write(tmp_path / "a.zarr", _values())
    with open(os.path.join(path, "c2", "c", "1"), "wb") as f:
        f.write(b"not zstd")
    for route in ROUTES:
        with pytest.raises(OSError, match=r"rows 100:300 of Zarr store .*a\.zarr"):
            _reader(path, route)[100:300, :]


def test_the_reader_travels_to_another_process(tmp_path):
    reader = _reader(_write(tmp_path / "a.zarr", _values())).rows(200, 700)
    again = pickle.loads(pickle.dumps(reader))
    assert again.route == "files" and again.shape == (500, N_CHANNELS)
    np.testing.assert_array_equal(again[:, :], _values()[200:700])


@pytest.mark.parametrize("case", ["packed", "fill value", "integers", "mixed dtypes"])
def test_values_xarray_decodes_are_left_to_xarray(tmp_path, case):
    X = _values()
    if case == "packed":
        path = _write(tmp_path / "a.zarr", X, encoding={"dtype": "int16", "scale_factor": 0.01, "_FillValue": -999})
    elif case == "fill value":
        X[5, 2] = -9999.0
        path = _write(tmp_path / "a.zarr", X, encoding={"_FillValue": -9999.0})
    elif case == "integers":
        path = _write(tmp_path / "a.zarr", (100 * np.nan_to_num(X)).astype("int32"))
    else:
        path = _write(tmp_path / "a.zarr", X, dtypes={"c3": "float64"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_zarr(path)
    assert stacked_rows(ds, NAMES, zarr.open_group(path, mode="r"), path) is None
    opened = open_archive(path)
    np.testing.assert_array_equal(opened.values, _xarray_stack(path).values)
    assert "xarray-stacked" not in opened.data.name


SELECTIONS = {
    "all": {},
    "rows": {"rows": slice(150, 850)},
    "rows from the end": {"rows": slice(-300, None)},
    "every other row": {"rows": slice(None, None, 2)},
    "time": {"time": slice("2025-01-01T00:03:00", "2025-01-01T00:10:00")},
    "rows and time": {"rows": slice(100, None), "time": slice(None, "2025-01-01T00:12:00")},
}


@pytest.mark.parametrize("selection", SELECTIONS)
def test_open_archive_gives_xarrays_values_and_coordinates(tmp_path, selection):
    path = _write(tmp_path / "a.zarr", _values())
    opened = open_archive(path, block_values=256 * N_CHANNELS, **SELECTIONS[selection])
    expected = _xarray_stack(path, **SELECTIONS[selection])
    xr.testing.assert_identical(opened.compute(), expected)
    assert len(set(opened.chunks[0][:-1])) <= 1  # even blocks, the last one shorter
    if selection != "every other row":  # one run of rows: read by the stacked reader
        assert opened.data.name.startswith("xarray-stacked-")


def test_the_fit_of_an_xarray_store_is_the_fit_of_a_plain_store(tmp_path):
    X = _values(seed=1)
    X[::50] += 8.0  # outlying rows
    path = _write(tmp_path / "a.zarr", X)
    plain = zarr.create_array(tmp_path / "plain.zarr", shape=X.shape, chunks=(CHUNK, N_CHANNELS), dtype=X.dtype)
    plain[:] = X
    labelled, flat = open_archive(path, row_index=False), open_archive(str(tmp_path / "plain.zarr"))
    assert labelled.chunks == flat.chunks  # the same blocks: the same passes and sums
    assert_same_fit(MCPCA(nan_policy="omit").fit(labelled), MCPCA(nan_policy="omit").fit(flat), rtol=0, atol=0,
                    same_passes=True)
