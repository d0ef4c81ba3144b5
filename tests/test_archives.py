"""Archives written by xarray on the command line: fit, score and report, locally and on a cluster.

The archive is the demo's (faults with a known channel), rewritten as xarray
writes a plant's logger: one 1-D variable per channel along a ``time``
coordinate (``Dataset.to_zarr``).  The command line must keep the names and
the time axis: ``score``'s output opens with ``xarray.open_zarr`` as named,
time-indexed variables, and ``report``'s events name the faulty channels.
"""

from __future__ import annotations

import csv
import os

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from _cluster import ProcessCluster
from conftest import cli_status

from dask_mcpca import load
from dask_mcpca.demo.archive import CHANNELS, make_archive

N_ROWS = 60_000
START = pd.Timestamp("2025-01-01")
PERIOD = "1s"


def _run(*args) -> int:
    return cli_status(*args, "--no-progress")


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    """The demo archive as an xarray store; returns (path, data, truth kinds, faults)."""
    root = tmp_path_factory.mktemp("archive")
    sensors, truth, faults = make_archive(root / "demo", n_rows=N_ROWS, seed=0)
    X = zarr.open_array(sensors, mode="r")[:]
    time = pd.date_range(START, periods=N_ROWS, freq=PERIOD)
    ds = xr.Dataset({c: ("time", X[:, j]) for j, c in enumerate(CHANNELS)}, coords={"time": time})
    path = root / "plant.zarr"
    ds.chunk({"time": 10_000}).to_zarr(path)
    return str(path), X, zarr.open_array(truth, mode="r")[:], faults


@pytest.fixture(scope="module")
def model_file(archive, tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "model.json"
    assert _run("fit", archive[0], "--nan-policy", "omit", "--output", path) == 0
    return str(path)


def test_fit_names_the_channels_of_an_xarray_archive(model_file):
    model = load(model_file)
    assert sorted(model.feature_names_in_) == sorted(CHANNELS)
    assert model.feature_dim_in_ == "channel"
    assert list(model.loadings_.channel.values) == list(model.feature_names_in_)


def test_fit_with_variables_and_time(archive, tmp_path):
    out = tmp_path / "m.json"
    rc = _run("fit", archive[0], "--variables", "T1,T2,P1,P3", "--time", "2025-01-01T00:10/2025-01-01T05:00",
              "--nan-policy", "omit", "--output", out)
    assert rc == 0
    model = load(out)
    assert list(model.feature_names_in_) == ["T1", "T2", "P1", "P3"]
    # partial-string selection, as pandas does it: the whole minute 05:00 is in
    expected_rows = len(pd.date_range("2025-01-01T00:10:00", "2025-01-01T05:00:59", freq=PERIOD))
    assert model.n_samples_ <= expected_rows and model.n_samples_ > 0.99 * expected_rows


def test_rows_slice_a_plain_zarr_store(tmp_path):
    z = zarr.create_array(tmp_path / "x.zarr", shape=(3000, 3), chunks=(500, 3), dtype="f8")
    z[:] = np.random.default_rng(0).normal(size=(3000, 3))
    assert _run("fit", tmp_path / "x.zarr", "--rows", "1000:2500", "--output", tmp_path / "m.json") == 0
    assert load(tmp_path / "m.json").n_samples_ == 1500


@pytest.mark.parametrize(
    "args, message",
    [
        (["--variables", "T1,NOPE"], "no variable(s) ['NOPE']"),
        (["--dataset", "T1"], "name a 2-D (row, channel) variable"),
        (["--time", "2025/2026", "--rows", "0:10", "--variables", "T1,T2"], None),  # valid: both apply
    ],
)
def test_bad_selections_are_one_line_errors(archive, tmp_path, capsys, args, message):
    rc = _run("fit", archive[0], *args, "--nan-policy", "omit", "--output", tmp_path / "m.json")
    err = capsys.readouterr().err
    if message is None:
        assert rc in (0, 2)  # ten rows: the fit may refuse them, in one line
        assert len(err.strip().splitlines()) <= 1
        return
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1


def test_variables_need_an_xarray_archive(tmp_path, capsys):
    zarr.create_array(tmp_path / "x.zarr", shape=(100, 3), chunks=(50, 3), dtype="f8")[:] = 1.0
    assert _run("fit", tmp_path / "x.zarr", "--variables", "a,b", "--output", tmp_path / "m.json") == 2
    assert "not written by xarray" in capsys.readouterr().err


def test_score_writes_named_time_indexed_variables(archive, model_file, tmp_path):
    out = tmp_path / "scores.zarr"
    assert _run("score", archive[0], "--model", model_file, "--output", out, "--outputs", "all",
                "--dtype", "float64") == 0
    ds = xr.open_zarr(out)
    model = load(model_file)
    k, p = model.n_components_, model.n_features_in_
    assert ds["contributions"].shape == (N_ROWS, p)
    assert ds["scores"].dims == ("time", "component") and ds["scores"].shape == (N_ROWS, k)
    for name in ("weight", "outlier", "d2"):
        assert ds[name].dims == ("time",)
    assert ds["contributions"].dims == ("time", "channel")
    assert list(ds.channel.values) == list(model.feature_names_in_)
    assert ds.indexes["time"].equals(pd.date_range(START, periods=N_ROWS, freq=PERIOD))
    X = archive[1][:, [CHANNELS.index(c) for c in model.feature_names_in_]].astype(np.float64)
    ok = np.isfinite(X).all(axis=1)
    np.testing.assert_allclose(ds["d2"].values[ok], model.mahalanobis(X[ok]), rtol=1e-10)
    # the rows in order, the gaps among them (the rules that read rows in order, a stuck run or a shifted
    # channel, see the rows before each one as the archive holds them)
    np.testing.assert_array_equal(ds["outlier"].values[ok], model.set_params(nan_policy="omit").is_outlier(X)[ok])


def _events(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _assert_report(png, events_csv, archive):
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    events = _events(events_csv)
    assert events and {"first_time", "last_time", "channel_1", "share_1"} <= set(events[0])
    faults = archive[3]
    for start, length, channel, _ in faults.stuck:  # each stuck stretch: one event, its channel on top
        inside = [e for e in events if int(e["start_row"]) < start + length and int(e["stop_row"]) > start]
        longest = max(inside, key=lambda e: int(e["rows"]))
        assert longest["channel_1"] == CHANNELS[int(channel)]
        assert int(longest["rows"]) >= 0.9 * length
        first = pd.Timestamp(longest["first_time"])
        assert first == START + pd.Timedelta(seconds=int(longest["start_row"]))
    return events


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_report_writes_a_png_and_the_events(archive, model_file, tmp_path, capsys):
    png = tmp_path / "report.png"
    assert _run("report", archive[0], "--model", model_file, "--output", png, "--max-gap", "2") == 0
    assert "events to" in capsys.readouterr().out
    _assert_report(png, tmp_path / "report.csv", archive)
    assert sorted(os.listdir(tmp_path)) == ["report.csv", "report.png"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(tmp_path_factory.mktemp("cluster"), n_workers=2, nthreads=1, memory_limit="1GiB") as c:
        yield c


@pytest.mark.slow
def test_report_on_a_cluster_matches_the_local_report(archive, model_file, cluster, tmp_path):
    local, remote = tmp_path / "local.png", tmp_path / "remote.png"
    assert _run("report", archive[0], "--model", model_file, "--output", local, "--max-gap", "2") == 0
    rc = _run("report", archive[0], "--model", model_file, "--output", remote, "--max-gap", "2",
              "--scheduler", cluster.address)
    assert rc == 0
    assert _events(tmp_path / "local.csv") == _events(tmp_path / "remote.csv")
    _assert_report(remote, tmp_path / "remote.csv", archive)


# ------------------------------------------------- what a raw read would get wrong, refused or mended
# Each case used to give a fit on the wrong numbers without an error (an audit of the read paths).


def _rows(n=400, p=4, seed=0):
    return np.random.default_rng(seed).normal(size=(n, p)) * [3.0, 2.0, 1.0, 0.5] + [10.0, -5.0, 0.0, 2.0]


def test_packed_values_are_refused_raw_and_decoded_by_open_archive(tmp_path):
    """CF packing (scale_factor, a sentinel _FillValue): the stored integers are not the data."""
    from dask_mcpca import MCPCA, open_archive

    X = np.round(_rows(), 3)
    path = str(tmp_path / "packed.zarr")
    xr.Dataset({"x": (("time", "channel"), X)}).to_zarr(
        path, encoding={"x": {"dtype": "int32", "scale_factor": 0.001, "_FillValue": -(2**31)}}
    )
    with pytest.raises(ValueError, match=r"coded values \(scale_factor, _FillValue=-2147483648\)"):
        MCPCA().fit(path + ":/x")
    model = MCPCA(center="mean").fit(open_archive(path))
    np.testing.assert_allclose(model.mean_, X.mean(axis=0), atol=1e-9)  # decoded: the data's own mean


def test_hdf5_packed_or_with_unwritten_chunks_is_refused(tmp_path):
    import h5py

    from dask_mcpca import MCPCA

    X = _rows()
    path = str(tmp_path / "data.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("packed", data=(X * 100).astype("int16")).attrs["scale_factor"] = 0.01
        gappy = f.create_dataset("gappy", shape=X.shape, chunks=(50, 4), dtype="f8")
        gappy[:200], gappy[300:] = X[:200], X[300:]  # rows 200:300 never written: read as the fill value
    with pytest.raises(ValueError, match="coded values"):
        MCPCA().fit(path + ":/packed")
    with pytest.raises(ValueError, match="2 of its 8 chunks never written"):
        MCPCA().fit(path + ":/gappy")


def test_channels_first_is_refused_in_memory_and_turned_in_a_store(tmp_path):
    """A (channel, time) array is not 4 rows of 400 features: refused as a DataArray, read
    rows-first from a store (open_archive knows the channel dimension)."""
    from dask_mcpca import MCPCA, open_archive

    X = _rows()
    times = pd.date_range(START, periods=len(X), freq=PERIOD)
    A = xr.DataArray(X.T, dims=("sensor", "time"), coords={"time": times})
    with pytest.raises(ValueError, match=r"channels first.*transpose\('time', 'sensor'\)"):
        MCPCA().fit(A)
    path = str(tmp_path / "cf.zarr")
    xr.Dataset({"x": xr.DataArray(X.T, dims=("channel", "row"))}).to_zarr(path)
    opened = open_archive(path)
    assert opened.dims == ("row", "channel") and opened.shape == X.shape
    np.testing.assert_allclose(MCPCA(center="mean").fit(opened).mean_, X.mean(axis=0), atol=1e-12)


def test_time_selection_on_a_numeric_coordinate_keeps_its_stop(tmp_path):
    """--time 10:50 on an integer row coordinate: rows 10..50, not everything from 10 on."""
    from dask_mcpca import open_archive

    path = str(tmp_path / "ticks.zarr")
    xr.Dataset({"x": (("tick", "channel"), _rows())}, coords={"tick": np.arange(0, 4000, 10)}).to_zarr(path)
    assert open_archive(path, time=slice("10", "50")).sizes["tick"] == 5
    with pytest.raises(ValueError, match="not a label of the row coordinate 'tick'"):
        open_archive(path, time=slice("2024-01", None))


def test_channels_of_an_unconsolidated_store_come_in_sorted_order(tmp_path):
    """A Zarr store without consolidated metadata lists its arrays in the file system's order, which
    may differ between openings; the channels (and so a model's columns) must not."""
    from dask_mcpca import open_archive

    # 40 channels: with a handful, zarr happened to list them sorted; with 40 it listed them in another
    # unsorted order at each opening (5 openings, 5 orders, before the channels were sorted)
    names = [f"plant{i % 4}_{kind}_{i}" for i, kind in enumerate(["flow", "temp", "vib", "press", "level"] * 8)]
    rng = np.random.default_rng(0)
    ds = xr.Dataset({n: ("time", rng.normal(size=50) + i) for i, n in enumerate(names)},
                    coords={"time": pd.date_range("2026-01-01", periods=50, freq="h")})
    path = tmp_path / "unconsolidated.zarr"
    ds.to_zarr(path, consolidated=False)
    for _ in range(3):
        X = open_archive(str(path))
        assert [str(c) for c in X.coords[X.dims[1]].values] == sorted(names)
        np.testing.assert_array_equal(np.asarray(X[:, 0]), ds[sorted(names)[0]].values)


# A logger's days written out of order: the second day stored first, then the first (issue: review 3).
_DAY = pd.date_range("2024-01-21", periods=48, freq="h")
_STORED = np.r_[24:48, 0:24]  # the row stored at position i holds hour _STORED[i] from the first midnight


@pytest.fixture
def unsorted_store(tmp_path):
    X = _rows(n=48, seed=5)[:, :3]
    path = str(tmp_path / "unsorted.zarr")
    xr.Dataset({c: ("time", X[:, j]) for j, c in enumerate("abc")},
               coords={"time": _DAY[_STORED]}).to_zarr(path, consolidated=False)
    return path, X


@pytest.mark.parametrize("bounds", [
    ("2024-01-21T20:00:00", "2024-01-21T21:00:00"),
    ("2024-01-21T20:00", "2024-01-21T21:00"),
    (pd.Timestamp("2024-01-21T20:00"), pd.Timestamp("2024-01-21T21:00")),
    (np.datetime64("2024-01-21T20:00"), np.datetime64("2024-01-21T21:00")),
])
def test_time_on_an_unsorted_coordinate_takes_bounds_that_label_one_row_each(unsorted_store, bounds):
    """Text bounds each the time of one row select from the one row to the other, as stored (as
    Timestamps do): 20:00 on the first day is stored at 24 + 20 = 44, 21:00 at 45. Text used to be
    read by pandas as a period, whose end (21:00:59.999...) is no row's label: refused as unsorted."""
    from dask_mcpca import open_archive

    path, X = unsorted_store
    chosen = open_archive(path, time=slice(*bounds))
    np.testing.assert_array_equal(chosen.values, X[44:46])
    assert list(chosen.time.values) == list(_DAY[[20, 21]].values)


def test_time_on_an_unsorted_coordinate_scores_the_rows_between_on_the_command_line(unsorted_store, tmp_path):
    path, X = unsorted_store
    model, out = tmp_path / "m.json", tmp_path / "scores.zarr"
    assert _run("fit", path, "-o", model) == 0
    assert _run("score", path, "-m", model, "-o", out, "--time", "2024-01-22T22:00:00/2024-01-21T01:00:00") == 0
    scored = xr.open_zarr(out)  # 22:00 of the second day (row 22) to its end (23), then the first day's 00, 01
    assert list(scored.time.values) == list(_DAY[[46, 47, 0, 1]].values)


@pytest.mark.parametrize("start, stop, why", [
    ("2024-01-21T20:30", "2024-01-21T21:00", "is not sorted, so a range of labels"),  # 20:30: no row's label
    ("2024-01-21", "2024-01-22", r"the row labelled '2024-01-22' \(row 0\) comes before the row labelled "
                                 r"'2024-01-21' \(row 24\)"),
])
def test_time_on_an_unsorted_coordinate_refuses_other_bounds(unsorted_store, start, stop, why):
    from dask_mcpca import open_archive
    from dask_mcpca._exceptions import SelectionError

    with pytest.raises(SelectionError, match=why + ".*sortby"):
        open_archive(unsorted_store[0], time=slice(start, stop))


def test_time_on_an_unsorted_coordinate_refuses_a_label_of_two_rows(tmp_path):
    from dask_mcpca import open_archive
    from dask_mcpca._exceptions import SelectionError

    times = _DAY[[3, 1, 2, 1, 0]]  # 01:00 labels rows 1 and 3
    path = str(tmp_path / "twice.zarr")
    xr.Dataset({"a": ("time", np.arange(5.0))}, coords={"time": times}).to_zarr(path, consolidated=False)
    with pytest.raises(SelectionError, match="is not sorted"):
        open_archive(path, time=slice("2024-01-21T01:00", "2024-01-21T00:00"))
    assert open_archive(path, time=slice("2024-01-21T02:00", "2024-01-21T00:00")).shape == (3, 1)
