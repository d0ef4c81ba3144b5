"""``dask-mcpca report`` writes its files as one set, and numbers rows as the archive does.

The PNG, the events CSV and the drift windows' CSV are written to temporaries and put in place
together once the PNG is drawn: an error or a Ctrl-C before leaves the previous set whole, and a
Ctrl-C while they are put in place is acted on after the last.  With ``--rows`` the row numbers
the report writes are the archive's positions, as ``score`` records them.
"""

from __future__ import annotations

import csv
import os
import signal

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

from dask_mcpca import MCPCA, _report_plot, load
from dask_mcpca.cli import main

N_ROWS, P, CHUNK = 2_000, 5, 500
#: The rows reported, ``--rows FIRST:N_ROWS``, and the drift windows' row count.
FIRST, WINDOW = 50, 200
#: The archive row holding a NaN, and the first row selected around it.
NAN_ROW, NAN_FIRST = 70, 40
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
    time = pd.date_range("2024-01-01", periods=N_ROWS, freq="1h")
    ds = xr.Dataset({f"c{j}": ("time", X[:, j]) for j in range(P)}, coords={"time": time})
    ds.chunk({"time": CHUNK}).to_zarr(root / "labelled.zarr")
    gaps = X.copy()
    gaps[NAN_ROW, 2] = np.nan
    zarr.create_array(root / "gaps.zarr", shape=X.shape, chunks=(CHUNK, P), dtype="f8")[:] = gaps
    models = []
    for name, rows in (("a.json", slice(0, N_ROWS)), ("b.json", slice(0, N_ROWS // 2))):
        MCPCA().fit(clean[rows]).save(root / name)
        models.append(str(root / name))
    return str(store), models, X, root


def _report(store, model, folder, *extra) -> int:
    return main(["report", store, "--model", model, "--output", str(folder / "r.png"), "--window", "200",
                 "--no-progress", *map(str, extra)])


def _contents(folder) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


@pytest.mark.slow  # CI tier: two report runs each (2 s)
@pytest.mark.parametrize("failure", [RuntimeError, KeyboardInterrupt])
def test_a_report_stopped_while_drawing_leaves_the_previous_set(failure, archive, tmp_path, monkeypatch):
    """The drawing fails (an error, Ctrl-C) after both CSVs are written: no new file appears, the
    previous run's three files are left byte for byte, and no temporary is left beside them."""
    store, (model_a, model_b), _, _ = archive
    assert _report(store, model_a, tmp_path) == 0
    before = _contents(tmp_path)
    assert sorted(before) == sorted(FILES)

    def fail(summary, *, title=""):
        raise failure("stopped while drawing")

    monkeypatch.setattr(_report_plot, "render", fail)
    assert _report(store, model_b, tmp_path) == (130 if failure is KeyboardInterrupt else 2)
    assert _contents(tmp_path) == before  # no temporary either: os.listdir lists hidden files


def test_a_report_stopped_before_the_first_run_leaves_no_file(archive, tmp_path, monkeypatch):
    store, (model_a, _), _, _ = archive
    monkeypatch.setattr(_report_plot, "render", lambda summary, *, title="": 1 / 0)
    assert _report(store, model_a, tmp_path) == 2
    assert os.listdir(tmp_path) == []


@pytest.fixture
def ctrl_c():
    """Ctrl-C as Python handles it in a fresh process (the command's case), whatever this process
    inherited: a job that a non-interactive shell starts in the background has SIGINT ignored, Python
    keeps it ignored, and the suite run that way saw the report finish with exit 0 after its SIGINT."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.slow  # CI tier: report runs with signals (2.3 s)
def test_a_ctrl_c_while_the_set_is_put_in_place_comes_after_the_last_file(archive, tmp_path, monkeypatch, ctrl_c):
    """The files are put in place in a fixed order, the PNG first, the events CSV last; a Ctrl-C
    arriving at the first rename is acted on only once all three are the new run's."""
    store, (model_a, model_b), _, _ = archive
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


def _read(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of the runs of True in ``flags``, by a loop over the rows."""
    runs, start = [], None
    for i, flag in enumerate([*flags, False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append((start, i))
            start = None
    return runs


@pytest.mark.parametrize("select", ["rows", "time"])
def test_a_report_of_selected_rows_numbers_them_as_the_archive(select, archive, tmp_path, monkeypatch):
    """``--rows 50:2000`` (or ``--time`` from the 50th hour) on a store: the outlier planted at archive rows
    100-109 is the event 100:110, every event is a run of ``is_outlier`` on the archive's rows 50 on (at
    its archive positions), the windows of 200 rows start at the archive's 50, 200, 400, ..., and the
    PNG's row axis starts at 50."""
    store, (model_a, _), X, root = archive
    seen = []
    monkeypatch.setattr(_report_plot, "render", lambda summary, *, title="": seen.append(summary) or b"")
    if select == "rows":
        assert _report(store, model_a, tmp_path, "--rows", f"{FIRST}:{N_ROWS}") == 0
    else:
        start = pd.Timestamp("2024-01-01") + pd.Timedelta(hours=FIRST)
        assert _report(str(root / "labelled.zarr"), model_a, tmp_path, "--time", f"{start.isoformat()}/") == 0
    events = {(int(e["start_row"]), int(e["stop_row"])) for e in _read(tmp_path / "r.csv")}
    assert OUTLIER in events
    flags = load(model_a).is_outlier(X[FIRST:])
    assert events == {(a + FIRST, b + FIRST) for a, b in _runs(flags)}
    windows = _read(tmp_path / "r_windows.csv")
    starts = [FIRST, *range(WINDOW, N_ROWS, WINDOW)]
    assert [int(w["first_row"]) for w in windows] == starts
    assert [int(w["rows"]) for w in windows] == list(np.diff([*starts, N_ROWS]))
    if select == "rows":  # no time: a window starts at its multiple of 200 rows, the first holding rows 50-199
        assert [int(w["window_start"]) for w in windows] == list(range(0, N_ROWS, WINDOW))
    (summary,) = seen
    assert summary.bin_rows[0] == FIRST and summary.block_starts[0] == FIRST
    assert any((e.start, e.stop) == OUTLIER for e in summary.worst_events)


def test_a_nan_row_of_a_selection_is_named_by_its_archive_position(archive, tmp_path, capsys):
    store, (model_a, _), _, root = archive
    assert _report(str(root / "gaps.zarr"), model_a, tmp_path, "--rows", f"{NAN_FIRST}:{N_ROWS}") == 2
    assert f"row {NAN_ROW} holds NaN" in capsys.readouterr().err


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_the_fitted_rows_calibrate_the_windows_at_their_archive_positions(archive, tmp_path):
    """A model fitted with ``--rows 0:1000`` (its ``archive_rows_``), reported with ``--rows 500:2000
    --window 100``: the windows marked as the model's rows are those of the archive's rows 500-999."""
    store, _, _, _ = archive
    model = str(tmp_path / "m.json")
    assert main(["fit", store, "--rows", "0:1000", "--output", model, "--no-progress"]) == 0
    out = tmp_path / "out"
    assert main(["report", store, "--model", model, "--output", str(out / "r.png"), "--window", "100",
                 "--rows", "500:2000", "--no-progress"]) == 0
    windows = _read(out / "r_windows.csv")
    assert [int(w["first_row"]) for w in windows] == list(range(500, N_ROWS, 100))
    assert [int(w["first_row"]) for w in windows if w["reference"] == "1"] == list(range(500, 1000, 100))
