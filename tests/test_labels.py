"""Names and coordinates in and out: DataFrames, DataArrays, scikit-learn feature names, set_output.

Every output of the API keeps the names and coordinates its input had:
``transform``, ``score_samples``, ``mahalanobis``, ``is_outlier`` and
``channel_contributions`` of a DataArray are DataArrays with its time
coordinate (lazy when the input is), ``loadings_`` carries the channel names,
and a DataFrame's columns become ``feature_names_in_``.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from dask_mcpca import MCPCA, load

CHANNELS = ["T1", "T2", "P1", "P2"]
N_ROWS = 1200
#: method -> dims of its output after the row dimension
ROW_METHODS = {
    "transform": ("component",),
    "score_samples": (),
    "mahalanobis": (),
    "is_outlier": (),
    "channel_contributions": ("channel",),
}


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(N_ROWS, 4)) @ rng.normal(size=(4, 4)) + [20.0, 21.0, 101.0, 99.0]


def _times():
    return pd.date_range("2024-03-01", periods=N_ROWS, freq="10s")


def _dataarray(lazy: bool):
    X = _data()
    data = da.from_array(X, chunks=(300, 4)) if lazy else X
    return xr.DataArray(
        data,
        dims=("time", "channel"),
        coords={"time": _times(), "channel": CHANNELS, "station": ("time", np.arange(N_ROWS) % 3)},
        name="sensors",
    )


@pytest.mark.parametrize("method", sorted(ROW_METHODS))
@pytest.mark.parametrize("lazy", [True, False])
def test_dataarray_outputs_keep_time_and_channels(method, lazy):
    A = _dataarray(lazy)
    model = MCPCA(n_components=3).fit(A)
    out = getattr(model, method)(A)
    assert isinstance(out, xr.DataArray)
    assert out.dims == ("time", *ROW_METHODS[method])
    assert isinstance(out.data, da.Array) == lazy  # lazy stays lazy, numpy stays numpy
    np.testing.assert_array_equal(out.time.values, _times().values)
    np.testing.assert_array_equal(out.station.values, np.arange(N_ROWS) % 3)  # non-index row coordinates too
    if method == "transform":
        np.testing.assert_array_equal(out.component.values, [0, 1, 2])
    if method == "channel_contributions":
        assert list(out.channel.values) == CHANNELS
    expected = getattr(model, method)(_data())  # the same numbers as from numpy
    np.testing.assert_allclose(np.asarray(out.values, dtype=float), np.asarray(expected, dtype=float), rtol=1e-10)


def test_loadings_and_feature_names_from_a_dataarray(tmp_path):
    A = _dataarray(lazy=True)
    model = MCPCA(n_components=2).fit(A)
    assert list(model.feature_names_in_) == CHANNELS and model.feature_dim_in_ == "channel"
    L = model.loadings_
    assert L.dims == ("component", "channel") and list(L.channel.values) == CHANNELS
    np.testing.assert_array_equal(L.values, model.components_)
    model.save(tmp_path / "model.json")
    loaded = load(tmp_path / "model.json")
    assert list(loaded.feature_names_in_) == CHANNELS and loaded.feature_dim_in_ == "channel"
    assert list(loaded.loadings_.channel.values) == CHANNELS
    back = loaded.inverse_transform(loaded.transform(A))
    assert back.dims == ("time", "channel") and list(back.channel.values) == CHANNELS


def test_refit_on_numpy_forgets_names():
    model = MCPCA().fit(_dataarray(lazy=False))
    model.fit(_data())
    assert not hasattr(model, "feature_names_in_") and not hasattr(model, "feature_dim_in_")
    assert model.loadings_.dims == ("component", "feature")


def test_dataarray_with_other_channels_is_refused():
    model = MCPCA().fit(_dataarray(lazy=False))
    other = _dataarray(lazy=False).assign_coords(channel=["T1", "T2", "P1", "X9"])
    with pytest.raises(ValueError, match="feature names should match"):
        model.transform(other)


def test_dataarray_without_names_warns_as_an_array_does():
    """A DataArray without a channel coordinate has no feature names: scored by a model fitted
    with names, or the other way round, it gets scikit-learn's warnings, as a numpy array or a
    DataFrame does (its columns' order cannot be checked)."""
    named = MCPCA().fit(_dataarray(lazy=False))
    bare = _dataarray(lazy=False).drop_vars("channel")
    with pytest.warns(UserWarning, match="X does not have valid feature names, but MCPCA was fitted with"):
        named.transform(bare)
    with pytest.warns(UserWarning, match="X does not have valid feature names, but MCPCA was fitted with"):
        named.transform(_data())  # scikit-learn's own check, the reference wording
    unnamed = MCPCA().fit(_data())
    with pytest.warns(UserWarning, match="X has feature names, but MCPCA was fitted without feature names"):
        unnamed.transform(_dataarray(lazy=False))


def test_xarray_written_zarr_store_is_lazy_end_to_end(tmp_path):
    _dataarray(lazy=True).to_dataset().to_zarr(tmp_path / "archive.zarr")
    A = xr.open_zarr(tmp_path / "archive.zarr")["sensors"]
    model = MCPCA().fit(A)
    flags = model.is_outlier(A)
    assert isinstance(flags.data, da.Array) and flags.dims == ("time",)
    assert list(model.feature_names_in_) == CHANNELS


def test_dataframe_feature_names_and_set_output_in_a_pipeline():
    df = pd.DataFrame(_data(), columns=CHANNELS, index=_times())
    pipe = make_pipeline(StandardScaler(), MCPCA(n_components=2)).set_output(transform="pandas")
    out = pipe.fit_transform(df)
    assert isinstance(out, pd.DataFrame)
    assert list(out.columns) == ["mcpca0", "mcpca1"]
    assert out.index.equals(df.index)
    mcpca = pipe[-1]
    assert list(mcpca.feature_names_in_) == CHANNELS
    assert list(pipe.get_feature_names_out()) == ["mcpca0", "mcpca1"]
    assert list(MCPCA().fit(df).get_feature_names_out(CHANNELS)) == [f"mcpca{i}" for i in range(4)]
    contributions = MCPCA().fit(df).channel_contributions(df)
    assert list(contributions.columns) == CHANNELS and contributions.index.equals(df.index)


# ----------------------------------------------------------- which channel
CONTRIBUTION_METHODS = ["reconstruction", "whitened", "product", "residual"]


@pytest.mark.parametrize("method", CONTRIBUTION_METHODS)
def test_channel_contributions_name_the_faulty_channel(method):
    X = _data()
    model = MCPCA().fit(X)
    bad = X[:50].copy()
    bad[:, 2] += 25 * np.sqrt(model.covariance_[2, 2])
    c = model.channel_contributions(bad, method=method)
    assert (c.argmax(axis=1) == 2).all()
    if method in ("whitened", "product"):  # these two decompose d^2
        np.testing.assert_allclose(c.sum(axis=1), model.mahalanobis(bad), rtol=1e-9)
    if method == "whitened":
        assert (c >= 0).all()


def test_channel_contributions_with_discarded_components():
    X = _data()
    model = MCPCA(n_components=2).fit(X)
    c = model.channel_contributions(da.from_array(X, chunks=(400, 4)), method="whitened")
    assert isinstance(c, da.Array)
    np.testing.assert_allclose(c.sum(axis=1).compute(), model.mahalanobis(X), rtol=1e-9)


def test_channel_contributions_refuses_an_unknown_method():
    with pytest.raises(ValueError, match="method='nope'"):
        MCPCA().fit(_data()).channel_contributions(_data(), method="nope")


def test_demo_faults_are_attributed_to_their_channels(tmp_path):
    """The demo's stuck channel is the top contributor (default), its swapped channels the top two (whitened).

    A swap is a fault of two channels at once, which the default (a single
    channel's reconstruction) is not built for: "whitened" names them.
    """
    import zarr

    from dask_mcpca.demo.archive import SWAP, make_archive

    n = 200_000
    sensors, truth, faults = make_archive(tmp_path, n_rows=n, seed=0)
    model = MCPCA(nan_policy="omit").fit(sensors)
    kind = zarr.open_array(truth, mode="r")[:]
    flagged = model.is_outlier(sensors).compute()
    c = model.channel_contributions(sensors).compute()
    order = np.argsort(-np.nan_to_num(c, nan=-1.0), axis=1)[:, :2]
    w = model.channel_contributions(sensors, method="whitened").compute()
    order_w = np.argsort(-np.nan_to_num(w, nan=-1.0), axis=1)[:, :2]
    stuck_channel = np.full(n, -1)
    for start, length, channel, _ in faults.stuck:
        stuck_channel[int(start) : int(start + length)] = int(channel)
    stuck = flagged & (kind == 2)
    swapped = flagged & (kind == 3)
    assert stuck.sum() > 1000 and swapped.sum() > 1000
    stuck_accuracy = np.mean(order[stuck, 0] == stuck_channel[stuck])
    swapped_channels = np.flatnonzero(SWAP != np.arange(len(SWAP)))
    swapped_accuracy = np.mean(np.isin(order_w[swapped], swapped_channels).all(axis=1))
    assert stuck_accuracy >= 0.95, stuck_accuracy
    assert swapped_accuracy >= 0.90, swapped_accuracy


@pytest.mark.slow  # two dask-mcpca processes
def test_command_line_says_in_one_line_when_channels_can_only_be_matched_by_position(tmp_path):
    """Issue 34, point 4: an xarray archive's variables come back sorted; a plain store scored with
    its model had its columns taken by position, 18 % of the rows flagged, exit 0 and no word."""
    import subprocess
    import sys

    import zarr

    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 4)) @ rng.normal(size=(4, 4))
    order = ["temp", "flow", "press", "amp"]
    ds = xr.Dataset({n: ("time", X[:, i]) for i, n in enumerate(order)},
                    coords={"time": pd.date_range("2026-01-01", periods=3000, freq="s")})
    ds.to_zarr(tmp_path / "named.zarr", mode="w")
    z = zarr.open_array(str(tmp_path / "plain.zarr"), mode="w", shape=X.shape, chunks=(1000, 4), dtype="f8")
    z[:] = X
    run = [sys.executable, "-m", "dask_mcpca"]
    model = tmp_path / "m.json"
    done = subprocess.run([*run, "fit", str(tmp_path / "named.zarr"), "-o", str(model), "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert list(load(model).feature_names_in_) == sorted(order)  # the names the model holds, in xarray's order
    done = subprocess.run([*run, "score", str(tmp_path / "plain.zarr"), "--model", str(model), "--output",
                           str(tmp_path / "s.zarr"), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "warning" in lines[0] and "amp, flow, press, temp" in lines[0] and "by position" in lines[0]
    assert str(tmp_path / "plain.zarr") in lines[0]


@pytest.mark.parametrize("attribute", [None, ["temp", "flow", "press", "amp"], ["no", "such"]])
def test_an_xarray_archive_keeps_the_order_its_channels_attribute_gives(attribute, tmp_path, capsys):
    """A Zarr store keeps no order of its arrays (consolidated metadata lists them sorted): the channels
    are the 1-D variables sorted by name, unless the Dataset's ``channels`` attribute lists them (one
    that lists no variables of the store is not a channel list); ``fit`` prints the order it uses."""
    from dask_mcpca import open_archive
    from dask_mcpca.cli import main

    written = ["temp", "flow", "press", "amp"]
    rng = np.random.default_rng(2)
    ds = xr.Dataset({n: ("time", rng.normal(size=2000)) for n in written},
                    coords={"time": pd.date_range("2026-01-01", periods=2000, freq="s")})
    if attribute is not None:
        ds.attrs["channels"] = attribute
    ds.to_zarr(tmp_path / "a.zarr", mode="w")
    expected = written if attribute == written else sorted(written)
    assert list(open_archive(tmp_path / "a.zarr").channel.values) == expected
    assert list(open_archive(tmp_path / "a.zarr", variables=["amp", "temp"]).channel.values) == ["amp", "temp"]
    assert main(["fit", str(tmp_path / "a.zarr"), "-o", str(tmp_path / "m.json"), "--no-progress"]) == 0
    assert f"channels, in this order: {', '.join(expected)}\n" in capsys.readouterr().out
    assert list(load(tmp_path / "m.json").feature_names_in_) == expected


def test_inverse_transform_of_a_dataframe_is_a_dataframe_with_the_fits_names():
    rng = np.random.default_rng(3)
    frame = pd.DataFrame(rng.normal(size=(2000, 3)) * [3.0, 1.0, 0.3], columns=["a", "b", "c"],
                         index=np.arange(2000) + 7)
    model = MCPCA(n_components=2).fit(frame)
    scores = pd.DataFrame(np.asarray(model.transform(frame)), index=frame.index)
    back = model.inverse_transform(scores)
    assert isinstance(back, pd.DataFrame)
    assert list(back.columns) == ["a", "b", "c"] and (back.index == frame.index).all()
    np.testing.assert_allclose(back.to_numpy(), np.asarray(scores) @ model.components_ + model.mean_)
