"""Each command opens its archive once and reads its model file once (issue 38).

Run in process through :func:`dask_mcpca.cli.main` on real Zarr stores on
disk.  An archive opening is counted where the package opens one
(:class:`dask_mcpca._archive.OpenedArchive`) and, for a store written by
xarray, where xarray opens it (``xarray.open_zarr``); a model read is a file
opened at the model's path, seen by the interpreter's audit hook
(:class:`conftest.FileOpens`), not by the package.
"""

from __future__ import annotations

import collections

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from conftest import FileOpens

from dask_mcpca import _archive
from dask_mcpca.cli import main

N, P, CHUNK = 6_000, 4, 500


def _data() -> np.ndarray:
    return np.random.default_rng(7).normal(size=(N, P)).astype(np.float32)


def _xarray_archive(path) -> None:
    X = _data()
    ds = xr.Dataset({f"c{j}": ("time", X[:, j]) for j in range(P)},
                    coords={"time": pd.date_range("2024-01-01", periods=N, freq="min")})
    ds.chunk({"time": CHUNK}).to_zarr(str(path))


def _plain_archive(path) -> None:
    z = zarr.create_array(str(path), shape=(N, P), chunks=(CHUNK, P), dtype="float32")
    z[:] = _data()


@pytest.fixture
def counted(monkeypatch):
    """Counts of archive openings, by the package and by xarray, during one command."""
    counts = collections.Counter()
    init, open_zarr = _archive.OpenedArchive.__init__, xr.open_zarr

    def opened(self, *args, **kwargs):
        counts["archive"] += 1
        return init(self, *args, **kwargs)

    def xarray_opened(*args, **kwargs):
        counts["xarray"] += 1
        return open_zarr(*args, **kwargs)

    monkeypatch.setattr(_archive.OpenedArchive, "__init__", opened)
    monkeypatch.setattr(xr, "open_zarr", xarray_opened)
    return counts


def _run(counts, folder, model, *args) -> dict:
    """``main(args)``'s archive openings and model-file reads."""
    counts.clear()
    with FileOpens(folder) as files:
        rc = main([*map(str, args), "--no-progress"])
    assert rc == 0
    return {"archive": counts["archive"], "xarray": counts["xarray"],
            "model reads": files.opened.count(model.name)}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["xarray", "plain"])
def test_each_command_opens_its_archive_once_and_reads_its_model_once(kind, tmp_path, counted, capsys):
    store, model, scores = tmp_path / "archive.zarr", tmp_path / "model.json", tmp_path / "scores.zarr"
    (_xarray_archive if kind == "xarray" else _plain_archive)(store)
    xarray_opens = 1 if kind == "xarray" else 0
    once = {"archive": 1, "xarray": xarray_opens, "model reads": 1}
    commands = {
        "fit": ("fit", store, "-o", model, "--rows", "0:4000"),
        "score": ("score", store, "-m", model, "-o", scores, "--rows", "0:4000"),
        "score --append": ("score", store, "-m", model, "-o", scores, "--append"),
        "update": ("update", store, "-m", model, "--rows", "4000:5000"),
        "report": ("report", store, "-m", model, "-o", tmp_path / "report.png", "--rows", "1000:5000",
                   "--window", "1000"),
    }
    if kind == "xarray":  # rows selected by their time labels: the span found in the same opening
        commands["score --time"] = ("score", store, "-m", model, "-o", tmp_path / "by_time.zarr",
                                    "--time", "2024-01-01T01:00/2024-01-01T02:00")
    got = {name: _run(counted, tmp_path, model, *args) for name, args in commands.items()}
    capsys.readouterr()
    want = {name: once for name in commands} | {"fit": {**once, "model reads": 0}}
    assert got == want
    if kind == "xarray":  # the span found from the labels is what score records for --append
        attrs = zarr.open_group(str(tmp_path / "by_time.zarr"), mode="r").attrs
        assert attrs["rows"] == [60, 121]  # 01:00 to 02:00, both ends included, one row a minute


#: The modules ``score`` passes through that the command layer owns: the commands, the archive's opening,
#: the model file, the score store.  The estimator's modules (``score_rows``) are left to their own tests.
COMMAND_SIDE = ("dask_mcpca.cli", "dask_mcpca._archive", "dask_mcpca._io", "dask_mcpca._stacked", "dask_mcpca._urls",
                "dask_mcpca._persist", "dask_mcpca._model_file", "dask_mcpca._score_store", "dask_mcpca._score_append",
                "dask_mcpca._rowprints", "dask_mcpca._atomic")


@pytest.mark.slow
def test_score_enters_each_command_side_module_once_per_route(tmp_path, capsys):
    """No module of the command side calls out and is called back (A -> B -> A on one call stack):
    traced with ``sys.setprofile`` on the thread that runs the command."""
    import sys

    store, model = tmp_path / "archive.zarr", tmp_path / "model.json"
    _xarray_archive(store)
    assert main(["fit", str(store), "-o", str(model), "--no-progress"]) == 0
    reentered = collections.Counter()

    def profile(frame, event, arg):
        if event != "call" or not frame.f_globals.get("__name__", "").startswith(COMMAND_SIDE):
            return
        stack, f = [], frame
        while f is not None:  # the modules on the stack, consecutive calls within one module as one
            name = f.f_globals.get("__name__", "")
            if name.startswith("dask_mcpca") and (not stack or stack[-1] != name):
                stack.append(name)
            f = f.f_back
        if stack.count(stack[0]) > 1:
            reentered[" > ".join(reversed(stack))] += 1

    sys.setprofile(profile)
    try:
        rc = main(["score", str(store), "-m", str(model), "-o", str(tmp_path / "scores.zarr"), "--no-progress"])
    finally:
        sys.setprofile(None)
    capsys.readouterr()
    assert rc == 0
    assert not reentered, dict(reentered)
