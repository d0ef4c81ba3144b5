"""``dask-mcpca report`` writes its files as one set, and numbers rows as the archive does.

The PNG, the events CSV and the drift windows' CSV are written to temporaries and put in place
together once the PNG is drawn: an error or a Ctrl-C before leaves the previous set whole, and a
Ctrl-C while they are put in place is acted on after the last.  With ``--rows`` the row numbers
the report writes are the archive's positions, as ``score`` records them.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import zarr

from dask_mcpca import MCPCA, _report_plot
from dask_mcpca.cli import main

N_ROWS, P, CHUNK = 2_000, 5, 500
#: Rows shifted far from the model: an outlying run at archive rows [OUTLIER[0], OUTLIER[1]).
OUTLIER = (100, 110)
#: The files of a report with ``--window``, in the order they are put in place (the events last).
FILES = ("r.png", "r_windows.csv", "r.csv")


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    """A plain Zarr store (no time column) with an outlying run, and two models of its clean rows."""
    rng = np.random.default_rng(0)
    clean = rng.normal(size=(N_ROWS, 2)) @ rng.normal(size=(2, P)) + 0.1 * rng.normal(size=(N_ROWS, P))
    X = clean.copy()
    X[OUTLIER[0] : OUTLIER[1]] += 20.0
    root = tmp_path_factory.mktemp("archive")
    store = root / "plain.zarr"
    zarr.create_array(store, shape=X.shape, chunks=(CHUNK, P), dtype="f8")[:] = X
    models = []
    for name, rows in (("a.json", slice(0, N_ROWS)), ("b.json", slice(0, N_ROWS // 2))):
        MCPCA().fit(clean[rows]).save(root / name)
        models.append(str(root / name))
    return str(store), models


def _report(store, model, folder, *extra) -> int:
    return main(["report", store, "--model", model, "--output", str(folder / "r.png"), "--window", "200",
                 "--no-progress", *map(str, extra)])


def _contents(folder) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


@pytest.mark.parametrize("failure", [RuntimeError, KeyboardInterrupt])
def test_a_report_stopped_while_drawing_leaves_the_previous_set(failure, archive, tmp_path, monkeypatch):
    """The drawing fails (an error, Ctrl-C) after both CSVs are written: no new file appears, the
    previous run's three files are left byte for byte, and no temporary is left beside them."""
    store, (model_a, model_b) = archive
    assert _report(store, model_a, tmp_path) == 0
    before = _contents(tmp_path)
    assert sorted(before) == sorted(FILES)

    def fail(summary, *, title=""):
        raise failure("stopped while drawing")

    monkeypatch.setattr(_report_plot, "render", fail)
    assert _report(store, model_b, tmp_path) == (130 if failure is KeyboardInterrupt else 2)
    assert _contents(tmp_path) == before  # no temporary either: os.listdir lists hidden files


def test_a_report_stopped_before_the_first_run_leaves_no_file(archive, tmp_path, monkeypatch):
    store, (model_a, _) = archive
    monkeypatch.setattr(_report_plot, "render", lambda summary, *, title="": 1 / 0)
    assert _report(store, model_a, tmp_path) == 2
    assert os.listdir(tmp_path) == []


def test_a_ctrl_c_while_the_set_is_put_in_place_comes_after_the_last_file(archive, tmp_path, monkeypatch):
    """The files are put in place in a fixed order, the PNG first, the events CSV last; a Ctrl-C
    arriving at the first rename is acted on only once all three are the new run's."""
    store, (model_a, model_b) = archive
    assert _report(store, model_a, tmp_path) == 0
    before = _contents(tmp_path)
    rename = os.replace
    order = []

    def replace_and_interrupt(src, dst):
        if not order:
            os.kill(os.getpid(), signal.SIGINT)
        order.append(os.path.basename(dst))
        rename(src, dst)

    monkeypatch.setattr(os, "replace", replace_and_interrupt)
    assert _report(store, model_b, tmp_path) == 130  # interrupted: after the set was put in place
    monkeypatch.undo()
    assert order == list(FILES)
    after = _contents(tmp_path)
    assert sorted(after) == sorted(FILES)
    assert all(after[name] != before[name] for name in FILES)  # the other model's set, whole
    assert _report(store, model_b, tmp_path) == 0  # the same set again from a run not interrupted
    assert _contents(tmp_path) == after
