"""The command-line monitoring loop, second review of 2026-11-28.

Each test writes a real Zarr or HDF5 archive under ``tmp_path`` and runs the
commands as a user does; the expected values come from an independent source
(a fresh ``score`` of the same rows, the Python API on the numpy array), never
from the output of the code under test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from dask_mcpca import MCPCA
from dask_mcpca.cli import main

P = 6


def _data(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 3)) @ rng.normal(size=(3, P)) + 0.3 * rng.normal(size=(n, P)) + 50


def _cli(capsys, *args) -> tuple[int, str, str]:
    rc = main([*map(str, args), "--no-progress"])
    out, err = capsys.readouterr()
    return rc, out, err


def test_an_archive_written_in_zarr_format_2_is_scored(tmp_path, capsys):
    """Finding 1: the archive's v2 compressor on its time coordinate was written into the v3 score store
    ("Expected a BytesBytesCodec. Got Blosc")."""
    X = _data(2_000)
    names = [f"ch{j}" for j in range(P)]
    ds = xr.Dataset({n: ("time", X[:, j]) for j, n in enumerate(names)},
                    coords={"time": pd.date_range("2024-01-01", periods=len(X), freq="1min")})
    ds.to_zarr(tmp_path / "a.zarr", zarr_format=2)
    model = MCPCA().fit(xr.DataArray(X, dims=("time", "channel"), coords={"channel": names}))
    model.save(tmp_path / "m.json")
    rc, _, err = _cli(capsys, "score", tmp_path / "a.zarr", "-m", tmp_path / "m.json", "-o", tmp_path / "s.zarr")
    assert rc == 0, err
    got = xr.open_zarr(tmp_path / "s.zarr")
    np.testing.assert_array_equal(got.time.values, ds.time.values)
    np.testing.assert_allclose(got.d2.values, model.mahalanobis(X), rtol=1e-5)


def _zarr(path, X, chunk: int = 500) -> str:
    import zarr

    zarr.create_array(str(path), shape=X.shape, chunks=(chunk, X.shape[1]), dtype=X.dtype)[:] = X
    return str(path)


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_outputs_monitoring_is_the_default_for_a_cellwise_model(tmp_path, capsys):
    """Finding 6: ``--outputs monitoring`` (documented as the default) left out ``cells`` of a cellwise model,
    and ``score --append --outputs monitoring`` to a store scored by default was refused."""
    import zarr

    X = _data(3_000)
    store = _zarr(tmp_path / "a.zarr", X[:2_000])
    MCPCA(cellwise=True).fit(X[:2_000]).save(tmp_path / "m.json")
    model = ("-m", tmp_path / "m.json")
    assert _cli(capsys, "score", store, *model, "-o", tmp_path / "d.zarr")[0] == 0
    assert _cli(capsys, "score", store, *model, "--outputs", "monitoring", "-o", tmp_path / "n.zarr")[0] == 0
    default, named = xr.open_zarr(tmp_path / "d.zarr"), xr.open_zarr(tmp_path / "n.zarr")
    assert set(named.data_vars) == set(default.data_vars) >= {"d2", "outlier", "top_channel", "n_observed", "cells"}
    z = zarr.open_array(store, mode="r+")
    z.resize(X.shape)
    z[2_000:] = X[2_000:]
    rc, out, err = _cli(capsys, "score", store, *model, "--outputs", "monitoring", "-o", tmp_path / "d.zarr",
                        "--append")
    assert rc == 0, err
    assert xr.open_zarr(tmp_path / "d.zarr").sizes["row"] == len(X)


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_a_new_channel_in_the_archive_appends_with_variables_naming_the_models(tmp_path, capsys):
    """Finding 3: after a sensor was added to an xarray archive, ``score --append --variables`` naming the
    model's channels (as the refusal without it advises) was refused: the store recorded --variables None."""
    X = _data(3_000)
    names = [f"c{j}" for j in range(P)]
    times = pd.date_range("2024-01-01", periods=len(X), freq="1min")
    whole = xr.Dataset({n: ("time", X[:, j]) for j, n in enumerate(names)}, coords={"time": times})
    path = tmp_path / "a.zarr"
    whole.isel(time=slice(0, 2_000)).chunk(time=500).to_zarr(path)
    MCPCA().fit(xr.DataArray(X[:2_000], dims=("time", "channel"), coords={"channel": names})).save(tmp_path / "m.json")
    model = ("-m", tmp_path / "m.json")
    assert _cli(capsys, "score", path, *model, "-o", tmp_path / "s.zarr")[0] == 0
    whole.isel(time=slice(2_000, None)).chunk(time=500).to_zarr(path, append_dim="time")
    extra = np.r_[np.full(2_000, np.nan), np.random.default_rng(1).normal(size=1_000)]
    xr.Dataset({"new": ("time", extra)}).to_zarr(path, mode="a")
    rc, _, err = _cli(capsys, "score", path, *model, "-o", tmp_path / "s.zarr", "--append")
    assert rc == 2 and "--variables" in err  # the new sensor: the refusal says how to leave it out
    rc, _, err = _cli(capsys, "score", path, *model, "-o", tmp_path / "s.zarr", "--append",
                      "--variables", ",".join(names))
    assert rc == 0, err
    assert _cli(capsys, "score", path, *model, "--variables", ",".join(names), "-o", tmp_path / "f.zarr")[0] == 0
    appended, fresh = xr.open_zarr(tmp_path / "s.zarr"), xr.open_zarr(tmp_path / "f.zarr")
    np.testing.assert_array_equal(appended.outlier.values, fresh.outlier.values)
    np.testing.assert_array_equal(appended.d2.values, fresh.d2.values)


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_one_hdf5_dataset_however_spelled_is_the_same_input_for_append(tmp_path, capsys):
    """Finding 4: ``--dataset g/x``, ``--dataset /g/x``, ``a.h5:/g/x`` and the file through a symlink were
    "other data" for ``score --append``."""
    import h5py

    X = _data(4_000)
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("g/x", data=X[:1_000], maxshape=(None, P), chunks=(500, P))
    (tmp_path / "link.h5").symlink_to(tmp_path / "a.h5")
    MCPCA().fit(X[:1_000]).save(tmp_path / "m.json")
    model, out = ("-m", tmp_path / "m.json"), ("-o", tmp_path / "s.zarr")
    assert _cli(capsys, "score", tmp_path / "a.h5", "--dataset", "g/x", *model, *out)[0] == 0
    for i, spelling in enumerate(([f"{tmp_path / 'a.h5'}:/g/x"], [tmp_path / "a.h5", "--dataset", "/g/x"],
                                  [tmp_path / "link.h5", "--dataset", "g/x"])):
        with h5py.File(tmp_path / "a.h5", "a") as f:
            f["g/x"].resize((2_000 + 1_000 * i, P))
            f["g/x"][1_000 + 1_000 * i:] = X[1_000 + 1_000 * i: 2_000 + 1_000 * i]
        rc, _, err = _cli(capsys, "score", *spelling, *model, *out, "--append")
        assert rc == 0, (spelling, err)
    assert _cli(capsys, "score", tmp_path / "a.h5", "--dataset", "g/x", *model, "-o", tmp_path / "f.zarr")[0] == 0
    appended, fresh = xr.open_zarr(tmp_path / "s.zarr"), xr.open_zarr(tmp_path / "f.zarr")
    np.testing.assert_array_equal(appended.d2.values, fresh.d2.values)
    np.testing.assert_array_equal(appended.outlier.values, fresh.outlier.values)


def test_update_on_rows_with_nan_gives_advice_update_can_follow(tmp_path, capsys):
    """Finding 7: ``update`` on new rows with NaN said "pass --nan-policy omit", an option update does not have."""
    X = _data(2_000)
    X[1_500, 2] = np.nan
    store = _zarr(tmp_path / "a.zarr", X)
    assert _cli(capsys, "fit", store, "--rows", ":1000", "-o", tmp_path / "m.json")[0] == 0
    before = (tmp_path / "m.json").read_bytes()
    rc, _, err = _cli(capsys, "update", store, "-m", tmp_path / "m.json")
    assert rc == 2
    assert "rows 1,000:2,000" in err and "pass --nan-policy" not in err and "dask-mcpca fit" in err
    assert (tmp_path / "m.json").read_bytes() == before  # left as it was
    rc, _, err = _cli(capsys, "update", store, "-m", tmp_path / "m.json", "--rows", "1000:1500")  # as advised
    assert rc == 0, err


def _two_modes(n: int, seed: int = 3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4)) @ rng.normal(size=(4, 4))
    X[rng.random(n) < 0.4] += [12.0, -9.0, 7.0, 0.0]  # a second operating mode
    return xr.DataArray(X, dims=("time", "channel"), coords={"channel": ["a", "b", "c", "d"]})


def test_partial_fit_of_a_modes_model_on_named_rows_warns_only_of_real_name_mismatches():
    """Finding 8: ``partial_fit`` of a ``modes`` model fitted on a named DataArray warned "X does not have valid
    feature names" for rows with the same names (the rows were sent to modes from unnamed blocks)."""
    import warnings

    A = _two_modes(3_000)
    model = MCPCA(modes="auto").fit(A[:2_000])
    assert model.n_modes_ == 2
    seen = np.array([m.n_samples_seen_ for m in model.mode_models_])
    expected = np.bincount(model.predict_mode(A[2_000:]), minlength=2)  # the public rule, on the named rows
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.partial_fit(A[2_000:])
    assert not [w for w in caught if "feature names" in str(w.message)]
    np.testing.assert_array_equal([m.n_samples_seen_ for m in model.mode_models_] - seen, expected)
    with warnings.catch_warnings(record=True) as caught:  # a real mismatch still warns
        warnings.simplefilter("always")
        model.partial_fit(A[2_000:].values)
    assert [w for w in caught if "does not have valid feature names" in str(w.message)]


def _stuck_across(tmp_path, capsys, n: int = 4_000, cut: int = 3_000):
    """An xarray archive whose channel 2 sticks across row ``cut``, a model fitted on the rows before, and the
    flags of a full score of the archive from row ``cut`` on: the archive, ``-m`` and the model, the times,
    ``cut`` and the flags."""
    X = _data(n)
    X[cut - 5 : cut + 40, 2] = X[cut - 6, 2]
    names = [f"c{j}" for j in range(P)]
    times = pd.date_range("2024-01-01", periods=n, freq="1min")
    path = tmp_path / "a.zarr"
    ds = xr.Dataset({c: ("time", X[:, j]) for j, c in enumerate(names)}, coords={"time": times})
    ds.chunk(time=500).to_zarr(path)
    MCPCA().fit(xr.DataArray(X[:cut], dims=("time", "channel"), coords={"channel": names})).save(tmp_path / "m.json")
    model = ("-m", tmp_path / "m.json")
    assert _cli(capsys, "score", path, *model, "-o", tmp_path / "full.zarr")[0] == 0
    expected = xr.open_zarr(tmp_path / "full.zarr").outlier.values[cut:]
    assert expected[:40].sum() >= 30  # the stuck run is flagged in a full score
    return path, model, times, cut, expected


def test_score_rows_n_flags_a_stuck_run_across_row_n_as_a_full_score(tmp_path, capsys):
    """Finding 2, the fast tier: ``score --rows N:`` against a full score of the archive, cut at row N."""
    path, model, _, cut, expected = _stuck_across(tmp_path, capsys)
    rc, _, err = _cli(capsys, "score", path, *model, "--rows", f"{cut}:", "-o", tmp_path / "s.zarr")
    assert rc == 0, err
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "s.zarr").outlier.values, expected)


@pytest.mark.slow  # five commands (about 5 s)
def test_a_selection_after_row_0_is_judged_with_the_rows_before_it(tmp_path, capsys):
    """Finding 2: ``score --rows N:``/``--time`` and ``report --rows N:`` judged their first rows without the rows
    before them, so a channel stuck across row N was flagged on other rows than by ``score --append`` (40 against
    34).  The expected flags: a full score of the whole archive, cut at row N."""
    import re

    path, model, times, cut, expected = _stuck_across(tmp_path, capsys)
    for selection in (["--rows", f"{cut}:"], ["--time", f"{times[cut]}/"]):
        rc, _, err = _cli(capsys, "score", path, *model, *selection, "-o", tmp_path / "s.zarr", "--overwrite")
        assert rc == 0, err
        np.testing.assert_array_equal(xr.open_zarr(tmp_path / "s.zarr").outlier.values, expected)
    assert _cli(capsys, "score", path, *model, "--rows", f":{cut}", "-o", tmp_path / "a2.zarr")[0] == 0
    assert _cli(capsys, "score", path, *model, "-o", tmp_path / "a2.zarr", "--append")[0] == 0
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "a2.zarr").outlier.values[cut:], expected)
    rc, out, err = _cli(capsys, "report", path, *model, "--rows", f"{cut}:", "-o", tmp_path / "r.png")
    assert rc == 0, err
    assert int(re.search(r"([\d,]+) flagged", out).group(1).replace(",", "")) == expected.sum()


def test_a_nan_row_before_a_selection_does_not_refuse_its_score(tmp_path, capsys):
    """Reading the rows before ``--rows N:`` (finding 2) must not refuse the rows selected for a NaN row the
    selection leaves out, under ``nan_policy='raise'``."""
    X = _data(2_000)
    X[1_500, 1] = np.nan
    store = _zarr(tmp_path / "a.zarr", X)
    model = MCPCA().fit(X[:1_000])
    model.save(tmp_path / "m.json")
    rc, _, err = _cli(capsys, "score", store, "-m", tmp_path / "m.json", "--rows", "1501:", "-o", tmp_path / "s.zarr")
    assert rc == 0, err
    np.testing.assert_allclose(xr.open_zarr(tmp_path / "s.zarr").d2.values, model.mahalanobis(X[1_501:]), rtol=1e-5)


def test_cell_outliers_flags_a_stuck_sensors_cells_as_score_rows_cells_does(tmp_path):
    """Finding 5: ``score_rows``' ``cells`` (and ``score``'s) held a stuck sensor's cells, ``cell_outliers`` did not
    (37 against 14 cells of a stuck stretch).  Both flag them now: a stuck sensor's cells cannot be trusted.  The
    expected cells: the stuck channel's from the STUCK_RUN-th row holding the value (the documented rule, by which
    :meth:`is_outlier` flags those rows too)."""
    import zarr

    from dask_mcpca._stuck import STUCK_RUN

    X = _data(5_000, seed=1)
    model = MCPCA(cellwise=True).fit(X[:3_000])
    Y = X[3_000:].copy()
    Y[1_000:1_040, 3] = Y[999, 3]  # channel 3 sticks for 40 rows
    path = tmp_path / "y.zarr"
    zarr.create_array(str(path), shape=Y.shape, chunks=(1_020, P), dtype=Y.dtype)[:] = Y  # a block ends in the run
    stuck = slice(999 + STUCK_RUN - 1, 1_040)  # the value held from row 999 on
    assert model.is_outlier(Y)[stuck].all()
    for rows in (Y, str(path)):
        cells = np.asarray(model.cell_outliers(rows))
        assert cells[stuck, 3].all()
        np.testing.assert_array_equal(cells, np.asarray(model.score_rows(rows, outputs=("cells",))["cells"]))
    np.testing.assert_array_equal(np.asarray(model.cell_outliers(str(path))), model.cell_outliers(Y))
