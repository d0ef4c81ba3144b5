"""The score store reads back with its names (issue 34, point 4).

Every store ``dask-mcpca score`` writes, and every store it appends to, opens
with ``xarray.open_zarr``, whatever the input (a plain Zarr array, an HDF5
dataset, an archive written by xarray); the channels' names are in the store
(the ``channels`` attribute, the ``channel`` coordinate, ``top_channel``'s CF
flags); a store whose names are not the model's is matched by name or refused
in one line.  The expected values come from the model's own methods on the
numpy array, and the expected names from the archive as the test wrote it.
"""

from __future__ import annotations

import h5py
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

from dask_mcpca import MCPCA, load, open_scores
from dask_mcpca.cli import main

N, FIRST, P, CHUNK = 6_000, 4_500, 4, 500
NAMES = ["temp", "flow", "press", "amp"]  # as written: not sorted
#: The input kinds a score store is written from.
KINDS = ("zarr", "hdf5", "xarray")
FAULT_ROW, FAULT_CHANNEL = 4_000, 2


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(N, P)) @ rng.normal(size=(P, P))
    X[FAULT_ROW, FAULT_CHANNEL] += 40 * X[:, FAULT_CHANNEL].std()
    return X


def _write(kind: str, path, X) -> str:
    """``X`` as an archive of ``kind`` at ``path`` (written whole, or its new rows appended)."""
    if kind == "zarr":
        try:
            z = zarr.open_array(str(path), mode="r+")
            old = z.shape[0]
            z.resize(X.shape)
            z[old:] = X[old:]
        except FileNotFoundError:
            zarr.create_array(str(path), shape=X.shape, chunks=(CHUNK, P), dtype=X.dtype)[:] = X
        return str(path)
    if kind == "hdf5":
        with h5py.File(path, "a") as f:
            if "x" in f:
                old = f["x"].shape[0]
                f["x"].resize(X.shape)
                f["x"][old:] = X[old:]
            else:
                f.create_dataset("x", data=X, chunks=(CHUNK, P), maxshape=(None, P))
        return f"{path}:/x"
    ds = xr.Dataset({n: ("time", X[:, j]) for j, n in enumerate(NAMES)},
                    coords={"time": pd.date_range("2026-01-01", periods=len(X), freq="s")})
    if (path / "zarr.json").exists():
        old = xr.open_zarr(path).sizes["time"]
        ds.isel(time=slice(old, None)).chunk(time=CHUNK).to_zarr(path, append_dim="time", align_chunks=True)
    else:
        ds.chunk(time=CHUNK).to_zarr(path, mode="w")
    return str(path)


def _cli(capsys, *args) -> tuple[int, str, str]:
    rc = main([*map(str, args), "--no-progress"])
    out, err = capsys.readouterr()
    return rc, out, err


def _as_scored(kind, data) -> np.ndarray:
    """``data`` (columns in the order of ``NAMES``) with its columns in the order the archive of ``kind``
    gives them: an xarray archive's variables sorted by name (it has no ``channels`` attribute)."""
    return data[:, [NAMES.index(n) for n in sorted(NAMES)]] if kind == "xarray" else data


def _model(kind, X, tmp_path) -> tuple[str, list[str]]:
    """A model fitted on the first rows of ``X`` (:func:`_as_scored`), with the names the input kind
    gives; and those names."""
    path = tmp_path / "m.json"
    if kind == "xarray":
        MCPCA().fit(xr.DataArray(X[:FIRST], dims=("time", "channel"), coords={"channel": sorted(NAMES)})).save(path)
        return str(path), sorted(NAMES)
    MCPCA().fit(X[:FIRST]).save(path)
    return str(path), [str(j) for j in range(P)]


@pytest.mark.parametrize("kind", KINDS)
def test_every_score_store_opens_with_xarray_and_names_its_channels(kind, data, tmp_path, capsys):
    archive = tmp_path / ("a.h5" if kind == "hdf5" else "a.zarr")
    X = _as_scored(kind, data)
    store = _write(kind, archive, data)
    model_path, names = _model(kind, X, tmp_path)
    model = load(model_path)
    if kind == "xarray":  # the expected values from the same names
        X = xr.DataArray(X, dims=("time", "channel"), coords={"channel": names})
    out = tmp_path / "scores.zarr"
    outputs = "d2,outlier,top_channel,contributions,scores"
    rc, _, err = _cli(capsys, "score", store, "-m", model_path, "-o", out, "--outputs", outputs, "--dtype", "float64")
    assert rc == 0, err
    ds = xr.open_zarr(out)
    row = ds["d2"].dims[0]
    assert row == ("time" if kind == "xarray" else "row")
    assert ds["contributions"].dims == (row, "channel") and ds["scores"].dims == (row, "component")
    assert ds.attrs["channels"] == names and list(ds["channel"].values) == names
    np.testing.assert_allclose(ds["d2"].values, model.mahalanobis(X), rtol=1e-12)
    np.testing.assert_allclose(ds["contributions"].values, model.channel_contributions(X), rtol=1e-12)
    np.testing.assert_array_equal(ds["outlier"].values, model.is_outlier(X))
    flags = ds["top_channel"].attrs
    assert flags["flag_values"] == list(range(-1, P)) and flags["flag_meanings"].split() == ["none", *names]


@pytest.mark.slow  # CI tier: three command-line scores and appends (4.6 s)
@pytest.mark.parametrize("kind", KINDS)
def test_an_appended_score_store_opens_with_xarray_as_a_full_score(kind, data, tmp_path, capsys):
    archive = tmp_path / ("a.h5" if kind == "hdf5" else "a.zarr")
    model_path, _ = _model(kind, _as_scored(kind, data), tmp_path)
    out, full = tmp_path / "scores.zarr", tmp_path / "full.zarr"
    store = _write(kind, archive, data[:FIRST])
    assert _cli(capsys, "score", store, "-m", model_path, "-o", out, "--outputs", "all")[0] == 0
    _write(kind, archive, data)
    rc, _, err = _cli(capsys, "score", store, "-m", model_path, "-o", out, "--append")
    assert rc == 0, err
    assert _cli(capsys, "score", store, "-m", model_path, "-o", full, "--outputs", "all")[0] == 0
    appended, whole = xr.open_zarr(out), xr.open_zarr(full)
    assert appended.attrs["rows"] == [0, N]
    xr.testing.assert_allclose(appended, whole, rtol=1e-6)  # float32: BLAS may round another block's rows
    for key in ("channels", "rows", "outputs", "dtype", "n_features"):
        assert appended.attrs[key] == whole.attrs[key], key


@pytest.mark.parametrize("kind", ("zarr", "xarray"))
def test_a_score_scores_each_block_once(kind, data, tmp_path, capsys, monkeypatch):
    """The store's writes and the outlier count are one computation: each row block is scored once,
    also where xarray writes the store (an Array computed beside xarray's Delayed write was optimized
    apart, and every block of an xarray archive was scored twice).  Counted by wrapping the function
    that scores a block; it still does the work."""
    from dask_mcpca import _model as scoring
    from dask_mcpca import open_archive

    scored = []
    real = scoring.row_outputs

    def counted(*args, **kwargs):
        fused = real(*args, **kwargs)

        def one_block(*blocks, **options):
            scored.append(len(blocks[0]))
            return fused(*blocks, **options)

        return one_block

    monkeypatch.setattr(scoring, "row_outputs", counted)
    store = _write(kind, tmp_path / "a.zarr", data)
    model_path, _ = _model(kind, _as_scored(kind, data), tmp_path)
    rc, _, err = _cli(capsys, "score", store, "-m", model_path, "-o", tmp_path / "s.zarr", "--outputs", "all")
    assert rc == 0, err
    assert len(scored) == len(open_archive(store).chunks[0]) > 1


def test_top_channel_reads_as_names(data, tmp_path, capsys):
    """A fault planted on channel ``press`` (written third, sorted second) is named ``press``."""
    store = _write("xarray", tmp_path / "a.zarr", data)
    path, _ = _model("xarray", _as_scored("xarray", data), tmp_path)
    rc, _, err = _cli(capsys, "score", store, "-m", path, "-o", tmp_path / "s.zarr")
    assert rc == 0, err
    ds = open_scores(tmp_path / "s.zarr")
    named = ds["top_channel_name"].isel(time=FAULT_ROW)
    assert bool(ds["outlier"].isel(time=FAULT_ROW)) and str(named.values) == NAMES[FAULT_CHANNEL] == "press"
    index = int(ds["top_channel"].isel(time=FAULT_ROW))
    assert ds.attrs["channels"][index] == "press"  # the one-liner of docs/monitoring.md
    meanings = ds["top_channel"].attrs["flag_meanings"].split()
    assert meanings[ds["top_channel"].attrs["flag_values"].index(index)] == "press"
    assert (ds["top_channel_name"] == xr.DataArray(np.asarray(ds.attrs["channels"])[ds["top_channel"].values],
                                                   dims="time")).all()


def test_a_store_with_other_names_is_refused_in_one_line(data, tmp_path, capsys):
    path = tmp_path / "m.json"
    fitted_on = xr.DataArray(data[:FIRST, :3], dims=("time", "channel"), coords={"channel": ["a", "b", "c"]})
    MCPCA().fit(fitted_on).save(path)
    ds = xr.Dataset({n: ("time", data[:, j]) for j, n in enumerate(["a", "b", "x"])},
                    coords={"time": pd.date_range("2026-01-01", periods=N, freq="s")})
    ds.to_zarr(tmp_path / "other.zarr", mode="w")
    rc, out, err = _cli(capsys, "score", tmp_path / "other.zarr", "-m", path, "-o", tmp_path / "s.zarr")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "other channels than the model" in err and "lacks: c" in err and "not fitted on: x" in err
    assert not (tmp_path / "s.zarr").exists()


def test_the_same_names_in_another_order_are_matched_by_name(data, tmp_path, capsys):
    """``--variables`` in another order than the fit's: each channel is judged as itself."""
    store = _write("xarray", tmp_path / "a.zarr", data)
    path = tmp_path / "m.json"
    assert _cli(capsys, "fit", store, "--variables", ",".join(NAMES), "-o", path)[0] == 0
    shuffled = ",".join(NAMES[::-1])
    rc, _, err = _cli(capsys, "score", store, "--variables", shuffled, "-m", path, "-o", tmp_path / "s.zarr",
                      "--outputs", "d2,contributions", "--dtype", "float64")
    assert rc == 0 and err == "", err
    ds = xr.open_zarr(tmp_path / "s.zarr")
    model = load(path)
    assert list(ds["channel"].values) == NAMES and ds.attrs["channels"] == NAMES
    named = xr.DataArray(data, dims=("time", "channel"), coords={"channel": NAMES})
    np.testing.assert_allclose(ds["d2"].values, model.mahalanobis(named), rtol=1e-12)
    np.testing.assert_allclose(ds["contributions"].values, model.channel_contributions(named), rtol=1e-12)


def test_a_plain_store_with_a_named_model_warns_in_one_line(data, tmp_path, capsys):
    """In process (``tests/test_labels.py`` runs the same through the console script)."""
    path = tmp_path / "m.json"
    MCPCA().fit(xr.DataArray(data[:FIRST], dims=("time", "channel"), coords={"channel": NAMES})).save(path)
    store = _write("zarr", tmp_path / "plain.zarr", data)
    rc, _, err = _cli(capsys, "score", store, "-m", path, "-o", tmp_path / "s.zarr")
    assert rc == 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "warning" in lines[0] and "temp, flow, press, amp" in lines[0], err
    assert "by position" in lines[0] and store in lines[0]
    assert xr.open_zarr(tmp_path / "s.zarr").attrs["channels"] == NAMES  # the names the columns were judged as


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_a_store_written_before_arrays_named_their_dimensions_still_takes_appends(data, tmp_path, capsys):
    """A plain input's score store of an earlier version (arrays without dimension names, written
    array by array) is appended to array by array, as a full score."""
    model_path, _ = _model("zarr", data, tmp_path)
    archive, out, full = tmp_path / "a.zarr", tmp_path / "scores.zarr", tmp_path / "full.zarr"
    store = _write("zarr", archive, data[:FIRST])
    assert _cli(capsys, "score", store, "-m", model_path, "-o", tmp_path / "new.zarr")[0] == 0
    new = zarr.open_group(str(tmp_path / "new.zarr"), mode="r")
    old = zarr.open_group(str(out), mode="w")  # as score wrote it before: dask's to_zarr, no dimension names
    old.attrs.update({k: v for k, v in new.attrs.items() if k != "channels"})
    for name in new.attrs["outputs"]:
        old.create_array(name, data=new[name][:], chunks=new[name].chunks)
    _write("zarr", archive, data)
    rc, _, err = _cli(capsys, "score", store, "-m", model_path, "-o", out, "--append")
    assert rc == 0, err
    assert _cli(capsys, "score", store, "-m", model_path, "-o", full)[0] == 0
    a, b = zarr.open_group(str(out), mode="r"), zarr.open_group(str(full), mode="r")
    assert a.attrs["rows"] == [0, N]
    for name in b.attrs["outputs"]:
        np.testing.assert_allclose(a[name][:], b[name][:], rtol=1e-6, err_msg=name)
