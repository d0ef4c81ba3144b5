"""An adversarial list over the command line (issue 35): bad or strange input to fit, update, score, report.

Each case runs one command in process (:func:`dask_mcpca.cli.main`) on small stores made here and
asserts what a user must see: exit status 2 for input that cannot be used (0 where the input is
legitimate), exactly one line on stderr naming the problem (a key word of it; nothing at all after a
success), no traceback, no output left behind after a refusal, and every input file unchanged (the
SHA-256 of every file under the inputs' folder, before and after).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field

import h5py
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from conftest import cli_status

from dask_mcpca import MCPCA

pytestmark = pytest.mark.slow

N, P, CHUNK = 600, 4, 100
NAMES = ["c0", "c1", "c2", "c3"]
#: A folder whose name holds a space and letters outside ASCII.
ODD = "dir with spaces ü ß 数据"


def _rows(seed=0, n=N):
    return np.random.default_rng(seed).normal(size=(n, P)) * np.array([3.0, 1.0, 0.5, 0.2])


def _plain(path, X):
    zarr.create_array(str(path), shape=X.shape, chunks=(CHUNK, X.shape[1]), dtype=X.dtype)[:] = X


def _labelled(path, X, times):
    xr.Dataset({c: ("time", X[:, j]) for j, c in enumerate(NAMES)}, coords={"time": times}).to_zarr(
        path, mode="w", consolidated=False)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Every input of the list, in one folder (checked unchanged after each case)."""
    root = tmp_path_factory.mktemp("inputs")
    X = _rows()
    times = pd.date_range("2024-01-01", periods=N, freq="min")
    _plain(root / "plain.zarr", X)
    _labelled(root / "labelled.zarr", X, times)
    _labelled(root / "unsorted.zarr", X, times[np.random.default_rng(1).permutation(N)])
    _plain(root / "empty.zarr", np.empty((0, P)))
    nan_channel = X.copy()
    nan_channel[:, 2] = np.nan
    _plain(root / "nan_channel.zarr", nan_channel)
    infinite = X.copy()
    infinite[[3, 50, 400], [0, 1, 3]] = np.inf
    _plain(root / "inf.zarr", infinite)
    _plain(root / "narrow.zarr", X[:, :3])
    ragged = xr.Dataset({"c0": ("time", X[:, 0]), "c1": ("t2", X[: N // 2, 1])},
                        coords={"time": times, "t2": times[: N // 2]})
    ragged.to_zarr(root / "ragged.zarr", mode="w", consolidated=False)
    with h5py.File(root / "file.h5", "w") as f:
        f.create_dataset("data", data=X, chunks=(CHUNK, P))
        f.create_dataset("vector", data=X[:, 0])
    (root / ODD).mkdir()
    _plain(root / ODD / "plain ü.zarr", X)
    MCPCA().fit(X).save(root / "model.json")
    MCPCA().fit(pd.DataFrame(X, columns=NAMES)).save(root / "named.json")
    text = (root / "model.json").read_text()
    (root / "truncated.json").write_text(text[: len(text) // 2])
    (root / "not_json.json").write_text("model: yes\nthis is YAML, not JSON\n")
    (root / "list.json").write_text(json.dumps([1, 2, 3]))
    (root / "folder.json").mkdir()
    return root


def _digests(root) -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


@dataclass(frozen=True)
class Case:
    """``argv`` with ``{in}`` for the inputs' folder and ``{out}`` for an empty output folder."""

    argv: tuple[str, ...]
    keyword: str | None = None  # in the one stderr line; None: a success, stderr empty
    status: int = 2
    writes: tuple[str, ...] = field(default=())  # what a success leaves in {out}


def fail(*argv, keyword):
    return Case(tuple(argv), keyword)


def ok(*argv, writes=()):
    return Case(tuple(argv), None, 0, tuple(writes))


CASES = {
    # ------------------------------------------------------------ fit: the store
    "fit-empty-store": fail("fit", "{in}/empty.zarr", "-o", "{out}/m.json", keyword="empty"),
    "fit-zero-row-selection": fail("fit", "{in}/plain.zarr", "--rows", "5:5", "-o", "{out}/m.json",
                                   keyword="selects no rows"),
    "fit-one-row-selection": fail("fit", "{in}/plain.zarr", "--rows", "7:8", "-o", "{out}/m.json",
                                  keyword="1 sample(s) (shape=(1, 4)) while a minimum of 2"),
    "fit-all-nan-channel": fail("fit", "{in}/nan_channel.zarr", "-o", "{out}/m.json", keyword="NaN"),
    "fit-all-nan-channel-omit": fail("fit", "{in}/nan_channel.zarr", "--nan-policy", "omit", "-o", "{out}/m.json",
                                     keyword="no rows left to fit"),
    "fit-all-nan-channel-partial": fail("fit", "{in}/nan_channel.zarr", "--nan-policy", "partial", "-o",
                                        "{out}/m.json", keyword="a channel missing in every row cannot be fitted"),
    "fit-inf-values": fail("fit", "{in}/inf.zarr", "-o", "{out}/m.json", keyword="3 of 600 rows hold NaN or inf"),
    "fit-wrong-dataset-plain": fail("fit", "{in}/plain.zarr", "--dataset", "nope", "-o", "{out}/m.json",
                                    keyword="nope"),
    "fit-wrong-dataset-xarray": fail("fit", "{in}/labelled.zarr", "--dataset", "nope", "-o", "{out}/m.json",
                                     keyword="no variable 'nope'"),
    "fit-wrong-dataset-hdf5": fail("fit", "{in}/file.h5:/nope", "-o", "{out}/m.json", keyword="no dataset"),
    "fit-hdf5-1d-dataset": fail("fit", "{in}/file.h5:/vector", "-o", "{out}/m.json", keyword="2-D"),
    "fit-missing-store": fail("fit", "{in}/nothing.zarr", "-o", "{out}/m.json", keyword="no such store"),
    "fit-model-as-store": fail("fit", "{in}/model.json", "-o", "{out}/m.json", keyword="neither"),
    "fit-paths-with-spaces-and-unicode": ok("fit", f"{{in}}/{ODD}/plain ü.zarr", "-o", "{out}/módel ü.json",
                                            writes=["módel ü.json"]),
    "fit-output-inside-the-input": fail("fit", "{in}/plain.zarr", "-o", "{in}/plain.zarr/m.json",
                                        keyword="would overlap the input store"),
    "fit-output-is-the-input": fail("fit", "{in}/plain.zarr", "-o", "{in}/plain.zarr", keyword="plain.zarr"),
    "fit-output-is-a-folder": fail("fit", "{in}/plain.zarr", "-o", "{in}/folder.json", keyword="is a directory"),
    # ------------------------------------------------------------ fit: selections
    "fit-rows-with-a-step": fail("fit", "{in}/plain.zarr", "--rows", "0:100:2", "-o", "{out}/m.json",
                                 keyword="--rows"),
    "fit-rows-reversed": fail("fit", "{in}/plain.zarr", "--rows", "100:10", "-o", "{out}/m.json",
                              keyword="selects no rows"),
    "fit-rows-not-numbers": fail("fit", "{in}/plain.zarr", "--rows", "a:b", "-o", "{out}/m.json", keyword="--rows"),
    "fit-time-reversed": fail("fit", "{in}/labelled.zarr", "--time", "2024-01-01T05:00/2024-01-01T01:00", "-o",
                              "{out}/m.json", keyword="selects no rows"),
    "fit-time-unsorted": fail("fit", "{in}/unsorted.zarr", "--time", "2024-01-01:2024-01-02", "-o", "{out}/m.json",
                              keyword="not sorted"),
    "fit-time-on-a-plain-store": fail("fit", "{in}/plain.zarr", "--time", "2024-01-01:2024-01-02", "-o",
                                      "{out}/m.json", keyword="no time coordinate"),
    "fit-time-not-a-time": fail("fit", "{in}/labelled.zarr", "--time", "soon:later", "-o", "{out}/m.json",
                                keyword="'soon' is not a time"),
    "fit-variables-duplicated": fail("fit", "{in}/labelled.zarr", "--variables", "c0,c1,c0", "-o", "{out}/m.json",
                                     keyword="more than once"),
    "fit-variables-unknown": fail("fit", "{in}/labelled.zarr", "--variables", "c0,zz", "-o", "{out}/m.json",
                                  keyword="'zz'"),
    "fit-variables-on-a-plain-store": fail("fit", "{in}/plain.zarr", "--variables", "c0,c1", "-o", "{out}/m.json",
                                           keyword="xarray"),
    "fit-variables-of-different-lengths": fail(
        "fit", "{in}/ragged.zarr", "--variables", "c0,c1", "-o", "{out}/m.json",
        keyword="--variables c0,c1 are not all 1-D along one row dimension: c0 along time (600 values), c1 along t2"),
    "fit-ragged-store-without-variables": fail("fit", "{in}/ragged.zarr", "-o", "{out}/m.json",
                                               keyword="--variables"),
    "fit-too-many-components": fail("fit", "{in}/plain.zarr", "--n-components", "9", "-o", "{out}/m.json",
                                    keyword="--n-components"),
    "fit-zero-components": fail("fit", "{in}/plain.zarr", "--n-components", "0", "-o", "{out}/m.json",
                                keyword="--n-components"),
    # ------------------------------------------------------------ update
    "update-model-not-json": fail("update", "{in}/plain.zarr", "-m", "{in}/not_json.json", "-o", "{out}/m.json",
                                  keyword="not_json.json"),
    "update-model-truncated": fail("update", "{in}/plain.zarr", "-m", "{in}/truncated.json", "-o",
                                   "{out}/m.json", keyword="truncated.json"),
    "update-model-a-json-list": fail("update", "{in}/plain.zarr", "-m", "{in}/list.json", "-o", "{out}/m.json",
                                     keyword="model file"),
    "update-model-a-directory": fail("update", "{in}/plain.zarr", "-m", "{in}/folder.json", "-o", "{out}/m.json",
                                     keyword="folder.json"),
    "update-model-missing": fail("update", "{in}/plain.zarr", "-m", "{in}/none.json", "-o", "{out}/m.json",
                                 keyword="none.json"),
    "update-without-recorded-rows": fail("update", "{in}/plain.zarr", "-m", "{in}/model.json", "-o",
                                         "{out}/m.json", keyword="--rows START:STOP"),
    "update-other-width": fail("update", "{in}/narrow.zarr", "-m", "{in}/model.json", "--rows", "0:600", "-o",
                               "{out}/m.json", keyword="X has 3 features, but MCPCA is expecting 4"),
    "update-zero-rows": fail("update", "{in}/plain.zarr", "-m", "{in}/model.json", "--rows", "9:9", "-o",
                             "{out}/m.json", keyword="no rows"),
    "update-inf-values": fail("update", "{in}/inf.zarr", "-m", "{in}/model.json", "--rows", "0:600", "-o",
                              "{out}/m.json", keyword="NaN or inf"),
    # ------------------------------------------------------------ score
    "score-model-not-json": fail("score", "{in}/plain.zarr", "-m", "{in}/not_json.json", "-o", "{out}/s.zarr",
                                 keyword="not_json.json"),
    "score-model-a-directory": fail("score", "{in}/plain.zarr", "-m", "{in}/folder.json", "-o", "{out}/s.zarr",
                                    keyword="folder.json"),
    "score-unknown-output-name": fail("score", "{in}/plain.zarr", "-m", "{in}/model.json", "-o", "{out}/s.zarr",
                                      "--outputs", "d2,bogus", keyword="bogus"),
    "score-empty-store": fail("score", "{in}/empty.zarr", "-m", "{in}/model.json", "-o", "{out}/s.zarr",
                              keyword="empty"),
    "score-output-inside-the-input": fail("score", "{in}/plain.zarr", "-m", "{in}/model.json", "-o",
                                          "{in}/plain.zarr/s.zarr", keyword="would overlap the input store"),
    "score-other-width": fail("score", "{in}/narrow.zarr", "-m", "{in}/model.json", "-o", "{out}/s.zarr",
                              keyword="X has 3 features, but MCPCA is expecting 4"),
    "score-append-with-rows": fail("score", "{in}/plain.zarr", "-m", "{in}/model.json", "-o", "{out}/s.zarr",
                                   "--append", "--rows", "0:10", keyword="--rows"),
    "score-inf-values": fail("score", "{in}/inf.zarr", "-m", "{in}/model.json", "-o", "{out}/s.zarr",
                             keyword="NaN or inf"),
    "score-paths-with-spaces-and-unicode": ok("score", f"{{in}}/{ODD}/plain ü.zarr", "-m", "{in}/model.json", "-o",
                                              "{out}/scores ü.zarr", writes=["scores ü.zarr"]),
    # ------------------------------------------------------------ report
    "report-window-zero": fail("report", "{in}/labelled.zarr", "-m", "{in}/named.json", "-o", "{out}/r.png",
                               "--window", "0", keyword="--window"),
    "report-window-bad-units": fail("report", "{in}/labelled.zarr", "-m", "{in}/named.json", "-o", "{out}/r.png",
                                    "--window", "3furlongs", keyword="--window"),
    "report-window-negative": fail("report", "{in}/labelled.zarr", "-m", "{in}/named.json", "-o", "{out}/r.png",
                                   "--window", "-2h", keyword="--window"),
    "report-max-events-negative": fail("report", "{in}/plain.zarr", "-m", "{in}/model.json", "-o", "{out}/r.png",
                                       "--max-events", "-1", keyword="--max-events"),
    "report-model-truncated": fail("report", "{in}/plain.zarr", "-m", "{in}/truncated.json", "-o", "{out}/r.png",
                                   keyword="truncated.json"),
    "report-output-inside-the-input": fail("report", "{in}/plain.zarr", "-m", "{in}/model.json", "-o",
                                           "{in}/plain.zarr/r.png", keyword="would overlap the input store"),
    "report-output-is-the-model": fail("report", "{in}/plain.zarr", "-m", "{in}/model.json", "-o",
                                       "{in}/model.json", keyword="model"),
    "report-zero-row-selection": fail("report", "{in}/plain.zarr", "-m", "{in}/model.json", "-o", "{out}/r.png",
                                      "--rows", "3:3", keyword="selects no rows"),
}


def _run(argv) -> int:
    return cli_status(*argv, "--no-progress")


@pytest.mark.parametrize("name", list(CASES))
def test_adversarial_input(name, inputs, tmp_path, capsys):
    case = CASES[name]
    out = tmp_path / "out"
    out.mkdir()
    argv = [a.replace("{in}", str(inputs)).replace("{out}", str(out)) for a in case.argv]
    before = _digests(inputs)
    status = _run(argv)
    stdout, stderr = capsys.readouterr()
    assert "Traceback" not in stderr + stdout, stderr
    lines = stderr.strip().splitlines()
    if case.keyword is None:
        assert status == 0 and lines == [], stderr
        assert sorted(os.listdir(out)) == sorted(case.writes)
    else:
        assert status == case.status and len(lines) == 1, (status, stderr)
        assert case.keyword in lines[0], lines[0]
        assert os.listdir(out) == [], os.listdir(out)  # nothing left behind
    assert _digests(inputs) == before  # every input unchanged


def test_an_append_to_a_store_holding_a_stray_file_warns_nothing(inputs, tmp_path, capsys):
    """A note left in a score store is kept; zarr's warning about it (its source path) is not shown."""
    store, out = tmp_path / "archive.zarr", tmp_path / "scores.zarr"
    X = _rows(seed=3, n=2 * N)
    _plain(store, X[:N])
    assert _run(["score", str(store), "-m", str(inputs / "model.json"), "-o", str(out)]) == 0
    (out / "notes.txt").write_text("scored by the night shift\n")
    z = zarr.open_array(str(store), mode="r+")
    z.resize(X.shape)
    z[N:] = X[N:]
    capsys.readouterr()
    assert _run(["score", str(store), "-m", str(inputs / "model.json"), "-o", str(out), "--append"]) == 0
    stdout, stderr = capsys.readouterr()
    assert stderr == "" and "now holds rows 0:1,200" in stdout
    assert (out / "notes.txt").read_text() == "scored by the night shift\n"
    shutil.rmtree(out)
