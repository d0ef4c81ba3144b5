"""The monitoring loop of docs/monitoring.md, end to end from the command line (issue 34, point 1).

Fit once; then, each period, the archive grows, ``update`` reads the new rows,
``score --append`` scores them with the updated model into the same store, and
``report --window`` looks at them.  Run in process through
:func:`dask_mcpca.cli.main` on a real Zarr archive that grows on disk.  The
expected values come from the Python API on rows the test selects itself:
each period's rows scored by that period's model, and a sensor that sticks in
the second period, across its append, found as the generated truth says.
"""

from __future__ import annotations

import csv

import numpy as np
import pytest
import xarray as xr
import zarr

from dask_mcpca import load
from dask_mcpca._stuck import STUCK_RUN
from dask_mcpca.cli import main

P, CHUNK = 5, 1_500
PERIODS = (0, 12_000, 15_000, 18_000)  # fitted rows, then two periods of new rows
STUCK = (14_600, 15_900, 3)  # rows start:stop of a sensor stuck across the second append, on channel 3


def _archive(seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    loadings = rng.normal(size=(2, P)) * [[3.0], [1.5]]
    X = (rng.normal(size=(PERIODS[-1], 2)) @ loadings + 0.3 * rng.normal(size=(PERIODS[-1], P))).astype(np.float32)
    start, stop, channel = STUCK
    X[start:stop, channel] = X[start - 1, channel]
    return X


def _cli(capsys, *args) -> str:
    rc = main([*map(str, args), "--no-progress"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


@pytest.mark.slow  # a whole monitoring loop of five commands: the CI tier
def test_fit_then_update_and_append_each_period(tmp_path, capsys):
    X = _archive()
    store, model, scores = tmp_path / "archive.zarr", tmp_path / "model.json", tmp_path / "scores.zarr"
    z = zarr.create_array(str(store), shape=(PERIODS[1], P), chunks=(CHUNK, P), dtype=X.dtype)
    z[:] = X[: PERIODS[1]]
    _cli(capsys, "fit", store, "-o", model)
    _cli(capsys, "score", store, "-m", model, "-o", scores)
    models = [load(model)]
    for a, b in zip(PERIODS[1:-1], PERIODS[2:], strict=True):  # the archive grows; the loop runs
        z = zarr.open_array(str(store), mode="r+")
        z.resize((b, P))
        z[a:b] = X[a:b]
        _cli(capsys, "update", store, "-m", model)
        out = _cli(capsys, "score", store, "-m", model, "-o", scores, "--append")
        assert f"({a:,}:{b:,})" in out
        models.append(load(model))
        report = tmp_path / f"report_{b}.png"
        text = _cli(capsys, "report", store, "-m", model, "--rows", f"{a}:{b}", "--window", "1000", "-o", report)
        digest = zarr.open_group(str(scores), mode="r").attrs["segments"][-1]["model_sha256"]
        assert f"(SHA-256 {digest[:12]})" in text  # the report names the model of the segment it looks at
        with open(tmp_path / f"report_{b}_windows.csv") as f:
            windows = list(csv.DictReader(f))
        assert [int(w["rows"]) for w in windows] == [1000] * ((b - a) // 1000)  # the new rows only

    ds = xr.open_zarr(str(scores))
    assert ds.sizes[next(iter(ds["d2"].dims))] == PERIODS[-1]
    segments = ds.attrs["segments"]
    assert [s["rows"] for s in segments] == [[PERIODS[i], PERIODS[i + 1]] for i in range(3)]
    assert len({s["model_sha256"] for s in segments}) == 3  # each period scored by its own model
    assert ds.attrs["model_sha256"] == segments[-1]["model_sha256"]
    # each period's rows hold what its model gives them, read with the rows before them
    for (a, b), m in zip(zip(PERIODS[:-1], PERIODS[1:], strict=True), models, strict=True):
        want = m.score_rows(X[:b], outputs=("d2", "outlier", "top_channel"))
        np.testing.assert_allclose(ds["d2"].values[a:b], want["d2"][a:b].astype(np.float32), rtol=1e-6)
        np.testing.assert_array_equal(ds["outlier"].values[a:b], want["outlier"][a:b])
        np.testing.assert_array_equal(ds["top_channel"].values[a:b], want["top_channel"][a:b])
    # the stuck sensor, across the second append (row 15,000): found from its tenth row on, named
    start, stop, channel = STUCK
    found = np.arange(start + STUCK_RUN - 1, stop)
    assert ds["outlier"].values[found].all()
    assert (ds["top_channel"].values[found] == channel).mean() > 0.99


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_open_scores_gives_each_row_its_segment(tmp_path, capsys):
    from dask_mcpca import open_scores

    X = _archive(1)
    store, model, scores = tmp_path / "archive.zarr", tmp_path / "model.json", tmp_path / "scores.zarr"
    z = zarr.create_array(str(store), shape=(PERIODS[1], P), chunks=(CHUNK, P), dtype=X.dtype)
    z[:] = X[: PERIODS[1]]
    _cli(capsys, "fit", store, "-o", model)
    _cli(capsys, "score", store, "-m", model, "-o", scores)
    z.resize((PERIODS[2], P))
    z[PERIODS[1] :] = X[PERIODS[1] : PERIODS[2]]
    _cli(capsys, "update", store, "-m", model)
    _cli(capsys, "score", store, "-m", model, "-o", scores, "--append")
    ds = open_scores(scores)
    want = np.repeat([0, 1], [PERIODS[1], PERIODS[2] - PERIODS[1]])
    np.testing.assert_array_equal(ds["segment"].values, want)
    shas = [s["model_sha256"] for s in ds.attrs["segments"]]
    assert shas[0] != shas[1] and len(shas) == 2
