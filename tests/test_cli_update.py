"""``dask-mcpca update``: partial_fit on the rows a model has not read, the model file replaced atomically.

Run in process through :func:`dask_mcpca.cli.main`, on real Zarr stores on
disk.  The expected models come from the Python API on the rows the test
selects itself (``fit`` on the first rows, ``partial_fit`` on the rest), the
expected row positions from the generated data.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from conftest import FileOpens, assert_same_fit

from dask_mcpca import MCPCA, load
from dask_mcpca.cli import main

N, P, CHUNK = 24_000, 4, 2_000
SCALES = np.array([3.0, 1.0, 0.5, 0.2])


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(7).normal(size=(N, P)) * SCALES


def _store(path, X, chunk=CHUNK) -> str:
    z = zarr.create_array(str(path), shape=X.shape, chunks=(chunk, X.shape[1]), dtype=X.dtype)
    z[:] = X
    return str(path)


def _cli(capsys, *args) -> tuple[int, str, str]:
    rc = main([*map(str, args), "--no-progress"])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_error(rc, err, *mentions):
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for m in mentions:
        assert m in lines[0], lines[0]


def _bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_update_reads_the_rows_after_those_the_model_has_read(data, tmp_path, capsys):
    store = _store(tmp_path / "a.zarr", data)
    model = tmp_path / "m.json"
    half = N // 2
    rc, out, _ = _cli(capsys, "fit", store, "--rows", f":{half}", "-o", model)
    assert rc == 0
    assert json.loads(model.read_text())["attributes"]["archive_rows_"]["data"] == [0, half]  # [[0, half]], flat

    with FileOpens(store) as reads:
        rc, out, err = _cli(capsys, "update", store, "-m", model)
    assert rc == 0, err
    assert f"rows {half:,}:{N:,}" in out
    expected = MCPCA().fit(data[:half]).partial_fit(data[half:])
    got = load(model)
    assert_same_fit(got, expected, rtol=1e-9)
    assert got.n_samples_seen_ == N and got.n_samples_ == N - half
    assert got.archive_rows_.tolist() == [[0, N]]
    chunks = [int(name.split("/")[1]) for name in reads.opened if name.startswith("c/")]
    new_chunks = list(range(half // CHUNK, N // CHUNK))
    # each new chunk once in the pass, the last once more (its last row: the new fingerprint sample); of
    # the old ones, at most two (the fingerprint check: the newest row read and one older sample)
    assert sorted(c for c in chunks if c in new_chunks) == sorted([*new_chunks, new_chunks[-1]])
    assert len([c for c in chunks if c not in new_chunks]) <= 2

    before = _bytes(model)
    rc, out, _ = _cli(capsys, "update", store, "-m", model)
    assert rc == 0 and "no new rows" in out
    assert _bytes(model) == before


def test_update_to_another_file_leaves_the_model_alone(data, tmp_path, capsys):
    store = _store(tmp_path / "a.zarr", data)
    model, new = tmp_path / "m.json", tmp_path / "sub" / "new.json"
    assert _cli(capsys, "fit", store, "--rows", ":20000", "-o", model)[0] == 0
    before = _bytes(model)
    rc, out, err = _cli(capsys, "update", store, "-m", model, "-o", new)
    assert rc == 0, err
    assert _bytes(model) == before
    assert load(new).archive_rows_.tolist() == [[0, N]]


@pytest.mark.parametrize("rows", ["100:200", "19000:21000"])
def test_rows_already_read_are_refused(data, tmp_path, capsys, rows):
    store = _store(tmp_path / "a.zarr", data)
    model = tmp_path / "m.json"
    assert _cli(capsys, "fit", store, "--rows", ":20000", "-o", model)[0] == 0
    before = _bytes(model)
    rc, _, err = _cli(capsys, "update", store, "-m", model, "--rows", rows)
    _one_line_error(rc, err, f"--rows {rows}", "already read")
    assert _bytes(model) == before


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_explicit_rows_after_a_gap_are_read_and_the_gap_kept(data, tmp_path, capsys):
    """Runs, gaps kept: rows after a gap are recorded as a run of their own, the default goes on after the
    last run, and the gap can be read later (it used to be recorded as read, and could never be)."""
    store = _store(tmp_path / "a.zarr", data)
    model = tmp_path / "m.json"
    assert _cli(capsys, "fit", store, "--rows", ":12000", "-o", model)[0] == 0
    rc, _, err = _cli(capsys, "update", store, "-m", model, "--rows", "16000:20000")
    assert rc == 0, err
    expected = MCPCA().fit(data[:12000]).partial_fit(data[16000:20000])
    got = load(model)
    assert_same_fit(got, expected, rtol=1e-9)
    assert got.archive_rows_.tolist() == [[0, 12000], [16000, 20000]]
    rc, out, _ = _cli(capsys, "update", store, "-m", model)  # the default goes on after the last run
    assert rc == 0 and f"rows 20,000:{N:,}" in out
    assert load(model).archive_rows_.tolist() == [[0, 12000], [16000, N]]
    rc, _, err = _cli(capsys, "update", store, "-m", model, "--rows", "11000:13000")  # half in the gap
    _one_line_error(rc, err, "--rows 11000:13000", "rows 11,000:12,000", "already read")
    rc, out, err = _cli(capsys, "update", store, "-m", model, "--rows", "12000:16000")  # the gap, later
    assert rc == 0, err
    assert load(model).archive_rows_.tolist() == [[0, N]]
    expected.partial_fit(data[20000:]).partial_fit(data[12000:16000])
    assert_same_fit(load(model), expected, rtol=1e-9)
    assert load(model).n_samples_seen_ == N


def test_a_shorter_store_is_refused(data, tmp_path, capsys):
    store = _store(tmp_path / "a.zarr", data)
    short = _store(tmp_path / "short.zarr", data[:10000])
    model = tmp_path / "m.json"
    assert _cli(capsys, "fit", store, "--rows", ":20000", "-o", model)[0] == 0
    before = _bytes(model)
    rc, _, err = _cli(capsys, "update", short, "-m", model)
    _one_line_error(rc, err, "10,000 rows", "fewer than the 20,000")
    assert _bytes(model) == before


def test_a_model_fitted_in_python_needs_rows_then_records_them(data, tmp_path, capsys):
    store = _store(tmp_path / "a.zarr", data)
    model = tmp_path / "m.json"
    MCPCA().fit(data[:12000]).save(model)
    rc, _, err = _cli(capsys, "update", store, "-m", model)
    _one_line_error(rc, err, "--rows START:STOP", "--time START:STOP", "does not record")
    rc, _, err = _cli(capsys, "update", store, "-m", model, "--rows", "12000:18000")
    assert rc == 0, err
    assert load(model).archive_rows_.tolist() == [[12000, 18000]]


def test_a_failed_update_leaves_the_old_model(data, tmp_path, capsys):
    bad = data.copy()
    bad[21_500, 2] = np.nan  # in a new block: the pass fails under nan_policy="raise"
    store = _store(tmp_path / "a.zarr", bad)
    model = tmp_path / "m.json"
    assert _cli(capsys, "fit", store, "--rows", ":20000", "-o", model)[0] == 0
    before = _bytes(model)
    rc, _, err = _cli(capsys, "update", store, "-m", model)
    _one_line_error(rc, err, "NaN")
    assert _bytes(model) == before
    assert sorted(os.listdir(tmp_path)) == ["a.zarr", "m.json"]  # no temporary left

    wide = _store(tmp_path / "wide.zarr", np.hstack([data, data[:, :1]]))
    rc, _, err = _cli(capsys, "update", wide, "-m", model, "--rows", "20000:")
    _one_line_error(rc, err, "5 features", "expecting 4")
    assert _bytes(model) == before


def test_a_paper_model_cannot_be_updated(data, tmp_path, capsys):
    store = _store(tmp_path / "a.zarr", data[:600], chunk=100)
    model = tmp_path / "m.json"
    MCPCA(solver="paper", max_iter=5).fit(data[:300]).save(model)  # keeps no sums to update
    capsys.readouterr()  # the fit's ConvergenceWarning is not the command's
    before = _bytes(model)
    rc, _, err = _cli(capsys, "update", store, "-m", model, "--rows", "300:")
    _one_line_error(rc, err, "--solver paper", "refit")
    assert _bytes(model) == before


def test_update_by_time_records_the_positions(data, tmp_path, capsys):
    times = pd.date_range("2024-01-01", periods=N, freq="min")
    ds = xr.Dataset({f"c{i}": ("time", data[:, i]) for i in range(P)}, coords={"time": times})
    store = str(tmp_path / "x.zarr")
    ds.chunk(time=CHUNK).to_zarr(store, mode="w")
    model = tmp_path / "m.json"
    assert _cli(capsys, "fit", store, "--time", "2024-01-01/2024-01-06", "-o", model)[0] == 0
    first = int(np.searchsorted(times, np.datetime64("2024-01-07")))  # all of Jan 6 included
    assert load(model).archive_rows_.tolist() == [[0, first]]
    rc, _, err = _cli(capsys, "update", store, "-m", model, "--time", "2024-01-05/2024-01-08")
    _one_line_error(rc, err, "--time 2024-01-05:2024-01-08", "already read")
    rc, out, err = _cli(capsys, "update", store, "-m", model, "--time", "2024-01-07/2024-01-09")
    assert rc == 0, err
    stop = int(np.searchsorted(times, np.datetime64("2024-01-10")))
    assert load(model).archive_rows_.tolist() == [[0, stop]]
    expected = MCPCA().fit(data[:first]).partial_fit(data[first:stop])
    assert_same_fit(load(model), expected, rtol=1e-9)


def _times_repeating(start: int, stop: int) -> pd.DatetimeIndex:
    """A minute per row, rows ``start:stop`` sharing the label of row ``start`` (a logger that stalled)."""
    times = pd.date_range("2024-01-01", periods=N, freq="min").to_numpy().copy()
    times[start:stop] = times[start]
    return pd.DatetimeIndex(times)


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_update_by_time_on_repeated_labels_checks_positions(data, tmp_path, capsys):
    """A label repeated across the rows a fit read and rows after: ``--time`` from it reaches rows the model
    holds, refused by position (it used to count them twice and drop archive_rows_)."""
    times = _times_repeating(19_990, 20_010)
    ds = xr.Dataset({f"c{i}": ("time", data[:, i]) for i in range(P)}, coords={"time": times})
    store = str(tmp_path / "x.zarr")
    ds.chunk(time=CHUNK).to_zarr(store, mode="w")
    model = tmp_path / "m.json"
    assert _cli(capsys, "fit", store, "--rows", ":20000", "-o", model)[0] == 0
    before = _bytes(model)
    label = str(times[19_990])
    rc, _, err = _cli(capsys, "update", store, "-m", model, "--time", f"{label}/{times[21_000]}")
    _one_line_error(rc, err, "selects rows 19,990:21,001", "rows 19,990:20,000", "already read")
    assert _bytes(model) == before
    rc, _, err = _cli(capsys, "update", store, "-m", model, "--time", f"{times[20_010]}/{times[21_999]}")
    assert rc == 0, err
    got = load(model)
    assert got.archive_rows_.tolist() == [[0, 20_000], [20_010, 22_000]]
    assert got.n_samples_seen_ == 20_000 + 1_990
    assert_same_fit(got, MCPCA().fit(data[:20_000]).partial_fit(data[20_010:22_000]), rtol=1e-9)
    rc, out, err = _cli(capsys, "update", store, "-m", model, "--rows", "20000:20010")  # the gap
    assert rc == 0, err
    assert load(model).archive_rows_.tolist() == [[0, 22_000]]


def test_a_changed_archive_under_the_model_is_refused(data, tmp_path, capsys):
    """Rows the model read rewritten in the archive: its fingerprint (the newest row read and one older
    sample) no longer matches, and update refuses rather than add new rows to a model of other data."""
    store = _store(tmp_path / "a.zarr", data)
    model = tmp_path / "m.json"
    assert _cli(capsys, "fit", store, "--rows", ":20000", "-o", model)[0] == 0
    before = _bytes(model)
    zarr.open_array(store, mode="r+")[:20_000] = data[:20_000][::-1]  # the same values, other rows
    rc, _, err = _cli(capsys, "update", store, "-m", model)
    _one_line_error(rc, err, "rows 0:20,000 changed since the model read them", "fit it again")
    assert _bytes(model) == before
    zarr.open_array(store, mode="r+")[:20_000] = data[:20_000]  # put back: the update goes on
    rc, _, err = _cli(capsys, "update", store, "-m", model)
    assert rc == 0, err


def test_a_model_file_with_one_span_is_read_as_one_run(data, tmp_path, capsys):
    """A model written before runs were kept: ``archive_rows_`` ``[start, stop)``, no fingerprint."""
    store = _store(tmp_path / "a.zarr", data)
    model = tmp_path / "m.json"
    assert _cli(capsys, "fit", store, "--rows", ":20000", "-o", model)[0] == 0
    doc = json.loads(model.read_text())
    doc["attributes"]["archive_rows_"] = {"dtype": "int64", "shape": [2], "data": [0, 20000]}
    del doc["attributes"]["archive_samples_"]
    model.write_text(json.dumps(doc))
    assert load(model).archive_rows_.tolist() == [[0, 20000]]
    rc, out, err = _cli(capsys, "update", store, "-m", model)
    assert rc == 0 and f"rows 20,000:{N:,}" in out, err
    assert load(model).archive_rows_.tolist() == [[0, N]]


@pytest.mark.parametrize("runs", [[[0, 10], [5, 20]], [[10, 20], [0, 5]], [[0, 10], [10, 20]], [[3, 3]]])
def test_malformed_runs_are_refused_on_load(data, tmp_path, runs):
    from dask_mcpca._persist import ModelFormatError

    model = tmp_path / "m.json"
    fitted = MCPCA().fit(data[:2000])
    fitted.archive_rows_ = np.array(runs, dtype=np.int64)
    fitted.save(model)
    with pytest.raises(ModelFormatError, match="archive_rows_"):
        load(model)


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_update_through_a_symlinked_model_writes_its_target(data, tmp_path, capsys):
    """``-m link.json``: the file the link names is updated and the link stays a link (it used to be
    replaced by a file, the model it named left stale); the same for ``-o``."""
    store = _store(tmp_path / "a.zarr", data)
    (tmp_path / "models").mkdir()
    real, link = tmp_path / "models" / "m.json", tmp_path / "link.json"
    assert _cli(capsys, "fit", store, "--rows", ":20000", "-o", real)[0] == 0
    os.symlink(os.path.join("models", "m.json"), link)
    rc, _, err = _cli(capsys, "update", store, "-m", link)
    assert rc == 0, err
    assert os.path.islink(link) and os.readlink(link) == os.path.join("models", "m.json")
    assert load(real).archive_rows_.tolist() == [[0, N]]
    assert sorted(os.listdir(tmp_path / "models")) == ["m.json"]  # no temporary left beside the target
    other, out_link = tmp_path / "models" / "other.json", tmp_path / "out.json"
    other.write_text("stale")
    os.symlink(other, out_link)
    assert _cli(capsys, "fit", store, "--rows", ":20000", "-o", tmp_path / "fresh.json")[0] == 0
    rc, _, err = _cli(capsys, "update", store, "-m", tmp_path / "fresh.json", "-o", out_link, "--overwrite")
    assert rc == 0, err
    assert os.path.islink(out_link) and load(other).archive_rows_.tolist() == [[0, N]]
