"""``dask-mcpca report`` streams: its events and curves against a computation from the public API.

The report reads an archive once, block by block, and never holds a per-row
array; runs of flagged rows are joined across slice and block borders on
the client.  Every figure it writes is recomputed here the plain way, from
``is_outlier``, ``mahalanobis`` and ``channel_contributions`` on the whole
array in memory and a Python loop over the rows: the events CSV (rows,
peaks, the channels most responsible, the time at both ends), the binned
distance curve, the share flagged per block and the classical spectrum.
Runs are planted across a block border, a slice border, at both ends of the
archive, and two runs a gap apart on either side of a block border, on the
local threads and on a real scheduler with two workers.
"""

from __future__ import annotations

import csv
import tracemalloc

import dask
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from _cluster import ProcessCluster

from dask_mcpca import MCPCA
from dask_mcpca import _report as report
from dask_mcpca import _report_block as report_block
from dask_mcpca.cli import main

N_ROWS, P, CHUNK = 24_000, 4, 1_000
#: Rows per slice inside a block in these tests (blocks are one store chunk: BLOCK_VALUES = 1).
SLICE = 300
#: Planted runs: (first row, stop row, channel, added value).
RUNS = [
    (0, 3, 3, 40.0),  # the first rows of the archive
    (2_995, 3_012, 2, 40.0),  # across the border of blocks 2 and 3
    (5_290, 5_310, 0, 50.0),  # across a slice border inside block 5
    (9_000, 9_005, 1, 40.0),  # two runs two rows apart: one event when max_gap >= 2
    (9_007, 9_010, 1, 40.0),
    (11_998, 12_000, 2, 45.0),  # two runs one row apart, on either side of a block border
    (12_001, 12_004, 2, 45.0),
    (N_ROWS - 4, N_ROWS, 3, 40.0),  # the last rows
]
START = pd.Timestamp("2025-03-01")
#: The channels of the xarray archive (its variables; the plain store's are 0..3).
NAMES = [f"c{j}" for j in range(P)]
KINDS = ["zarr", "xarray"]
MAX_GAPS = [0, 2]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    mixing = rng.normal(size=(P, P))
    clean = rng.normal(size=(N_ROWS, P)) @ mixing
    X = clean.copy()
    for a, b, j, v in RUNS:
        X[a:b, j] += v
    return clean, X


@pytest.fixture(scope="module")
def model(data, tmp_path_factory):
    m = MCPCA().fit(data[0])
    path = tmp_path_factory.mktemp("model") / "model.json"
    m.save(path)
    return m, str(path)


@pytest.fixture(scope="module")
def stores(data, tmp_path_factory):
    root = tmp_path_factory.mktemp("stores")
    X = data[1]
    plain = root / "plain.zarr"
    zarr.create_array(plain, shape=X.shape, chunks=(CHUNK, P), dtype="f8")[:] = X
    labelled = root / "plant.zarr"
    time = pd.date_range(START, periods=N_ROWS, freq="1s")
    ds = xr.Dataset({c: ("time", X[:, j]) for j, c in enumerate(NAMES)}, coords={"time": time})
    ds.chunk({"time": CHUNK}).to_zarr(labelled)
    return {"zarr": str(plain), "xarray": str(labelled)}


@pytest.fixture()
def small_blocks(monkeypatch):
    """Blocks of one store chunk and short slices, so that runs cross both kinds of border."""
    monkeypatch.setattr(report, "BLOCK_VALUES", 1)
    monkeypatch.setattr(report_block, "SLICE_ROWS", SLICE)


def expected_events(model, X: np.ndarray, max_gap: int) -> list[dict]:
    """The events, the plain way: flags from is_outlier, joined in a loop over the rows."""
    flags = model.is_outlier(X)
    d2 = model.mahalanobis(X)
    contributions = model.channel_contributions(X)
    events, current, last_flagged = [], None, None
    for row in np.flatnonzero(flags):
        if current is not None and row - last_flagged - 1 <= max_gap:
            current["rows_flagged"].append(row)
        else:
            current = {"rows_flagged": [row]}
            events.append(current)
        last_flagged = row
    out = []
    for e in events:
        rows = np.array(e["rows_flagged"])
        summed = contributions[rows].sum(axis=0)
        shares = summed / summed.sum()
        top = sorted(range(P), key=lambda j: -shares[j])[:3]
        severity = sum(max(np.log10(d2[r] / model.outlier_cutoff_), 0.0) for r in rows)
        out.append({
            "start_row": rows[0], "stop_row": rows[-1] + 1, "flagged_rows": len(rows), "peak_d2": d2[rows].max(),
            "severity": severity,
            "channels": [str(j) for j in top], "shares": [shares[j] for j in top],
        })
    return out


def _read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def assert_events(csv_path, expected, *, names=None, time=False, max_events=report.MAX_EVENTS):
    """The CSV lists the ``max_events`` most severe of ``expected`` (row order), worst first, or with
    0 every one in row order; each row matches its expected event, numbered in row order."""
    got = _read_csv(csv_path)
    number = {e["start_row"]: i + 1 for i, e in enumerate(expected)}
    by_start = {e["start_row"]: e for e in expected}
    listed = [int(g["start_row"]) for g in got]
    if max_events == 0:
        assert listed == [e["start_row"] for e in expected]
    else:
        assert len(got) == min(max_events, len(expected)) and len(set(listed)) == len(listed)
        severity = [float(g["severity"]) for g in got]
        assert severity == sorted(severity, reverse=True)  # the worst first
        left_out = [e["severity"] for e in expected if e["start_row"] not in set(listed)]
        if left_out:  # none left out is more severe than one listed
            assert max(left_out) <= min(severity) * (1 + 1e-5)
    for g in got:
        e = by_start[int(g["start_row"])]
        assert int(g["event"]) == number[e["start_row"]]
        assert (int(g["start_row"]), int(g["stop_row"]), int(g["flagged_rows"])) == (
            e["start_row"], e["stop_row"], e["flagged_rows"]
        )
        assert int(g["rows"]) == e["stop_row"] - e["start_row"]
        np.testing.assert_allclose(float(g["peak_d2"]), e["peak_d2"], rtol=1e-5)
        np.testing.assert_allclose(float(g["severity"]), e["severity"], rtol=1e-5)
        channels = [names[int(c)] for c in e["channels"]] if names else e["channels"]
        assert [g["channel_1"], g["channel_2"], g["channel_3"]] == channels
        np.testing.assert_allclose([float(g[f"share_{k}"]) for k in (1, 2, 3)], e["shares"], atol=5.1e-5)
        if time:
            assert pd.Timestamp(g["first_time"]) == START + pd.Timedelta(seconds=e["start_row"])
            assert pd.Timestamp(g["last_time"]) == START + pd.Timedelta(seconds=e["stop_row"] - 1)


def _report_cli(store, model_path, png, *extra) -> int:
    return main(["report", str(store), "--model", model_path, "--output", str(png), *map(str, extra), "--no-progress"])


@pytest.mark.parametrize("max_gap", MAX_GAPS)
@pytest.mark.parametrize("kind", KINDS)
def test_events_match_the_rows_flagged_by_is_outlier(kind, max_gap, stores, data, model, small_blocks, tmp_path):
    m, model_path = model
    assert _report_cli(stores[kind], model_path, tmp_path / "r.png", "--max-gap", max_gap) == 0
    names = NAMES if kind == "xarray" else None  # the archive's variables name the channels
    assert_events(tmp_path / "r.csv", expected_events(m, data[1], max_gap), names=names, time=kind == "xarray")


@pytest.mark.parametrize("max_events", [0, 10, report.MAX_EVENTS])
def test_an_archive_without_flagged_rows_gives_an_empty_events_list(max_events, model, tmp_path):
    """Rows near the centre flag nothing: the CSV is its header alone, whatever ``max_events``.  (Rows
    all at the centre would: each channel holds one value, a stuck sensor, as ``is_outlier`` says.)"""
    m = model[0]
    near = m.mean_ + 0.01 * np.random.default_rng(0).normal(size=(500, len(m.mean_)))
    assert not np.asarray(m.is_outlier(near)).any()
    with open(tmp_path / "e.csv", "w", newline="") as f:
        s = report.summarize(m, near, events=f, max_events=max_events)
    assert (s.n_flagged, s.n_events, s.worst_events) == (0, 0, [])
    assert _read_csv(tmp_path / "e.csv") == []


@pytest.mark.parametrize("max_events", [0, 10])
def test_every_event_in_row_order_or_the_most_severe(max_events, stores, data, model, small_blocks, tmp_path):
    """``--max-events 0``: every event, in row order, as each closes; ``--max-events 10``: the 10
    most severe of the 60-odd, worst first, the others counted in the summary line."""
    m, model_path = model
    assert _report_cli(stores["zarr"], model_path, tmp_path / "r.png", "--max-events", max_events) == 0
    expected = expected_events(m, data[1], 0)
    assert len(expected) > 20
    assert_events(tmp_path / "r.csv", expected, max_events=max_events)


def test_a_run_across_a_block_border_is_one_event(stores, model, small_blocks, tmp_path):
    model_path = model[1]
    assert _report_cli(stores["zarr"], model_path, tmp_path / "r.png") == 0
    events = _read_csv(tmp_path / "r.csv")
    across = [e for e in events if int(e["start_row"]) < 3_000 < int(e["stop_row"])]
    assert len(across) == 1
    assert int(across[0]["start_row"]) <= 2_995 and int(across[0]["stop_row"]) >= 3_012
    assert across[0]["channel_1"] == "2"
    sliced = [e for e in events if int(e["start_row"]) < 5_300 < int(e["stop_row"])]
    assert len(sliced) == 1 and sliced[0]["channel_1"] == "0"
    # one row apart across the block border at 12,000: two events at max_gap 0, one at max_gap 1
    assert len([e for e in events if 11_990 <= int(e["start_row"]) < 12_010]) == 2
    assert _report_cli(stores["zarr"], model_path, tmp_path / "g.png", "--max-gap", 1) == 0
    joined = [e for e in _read_csv(tmp_path / "g.csv") if 11_990 <= int(e["start_row"]) < 12_010]
    assert len(joined) == 1 and int(joined[0]["flagged_rows"]) == int(joined[0]["rows"]) - 1


@pytest.mark.parametrize("source", ["numpy", "zarr", "xarray"])
def test_curve_shares_and_spectrum_match_a_numpy_computation(source, stores, data, model, small_blocks):
    m = model[0]
    X = data[1]
    if source == "numpy":
        archive = X
    elif source == "zarr":
        archive = stores["zarr"]
    else:
        ds = xr.open_zarr(stores["xarray"])
        archive = ds.to_dataarray("channel").transpose("time", "channel").chunk({"time": CHUNK})
    s = report.summarize(m, archive)
    d2 = m.mahalanobis(X)
    flags = m.is_outlier(X)
    bins = np.arange(N_ROWS) * report.N_BINS // N_ROWS
    heads = np.flatnonzero(np.diff(bins, prepend=-1))
    np.testing.assert_array_equal(s.bin_rows, heads)
    np.testing.assert_allclose(s.bin_max, np.maximum.reduceat(d2, heads), rtol=1e-12)
    np.testing.assert_allclose(s.bin_mean, np.add.reduceat(d2, heads) / np.diff(heads, append=N_ROWS), rtol=1e-10)
    assert (s.n_rows, s.n_scored, s.n_flagged) == (N_ROWS, N_ROWS, int(flags.sum()))
    if source != "numpy":  # blocks of one store chunk
        np.testing.assert_allclose(s.block_share, flags.reshape(-1, CHUNK).mean(axis=1), rtol=1e-12)
    classical = np.linalg.eigvalsh(np.cov(X.T, bias=True))[::-1]
    np.testing.assert_allclose(s.classical_ratio, classical / classical.sum(), rtol=1e-9)
    assert s.n_events == len(expected_events(m, X, 0))
    worst = sorted(expected_events(m, X, 0), key=lambda e: (-e["severity"], -e["flagged_rows"], e["start_row"]))
    shown = worst[: report.EVENTS_SHOWN]
    assert [(e.start, e.stop) for e in s.worst_events] == [(e["start_row"], e["stop_row"]) for e in shown]
    if source == "xarray":
        assert s.has_row_coordinate
        np.testing.assert_array_equal(s.row_values, pd.date_range(START, periods=N_ROWS, freq="1s")[heads].values)


@pytest.mark.slow
def test_memory_of_the_pass_does_not_grow_with_the_rows(model, tmp_path, monkeypatch):
    """Python's own count of allocated bytes (numpy included): the same peak for 4x the rows.

    5 % of the rows are far outliers, most of them alone: 5,000 events per
    100,000 rows, of which the report keeps the 100 most severe it lists
    (``max_events``; at most twice that at once), not all (kept, 15,000 more
    events would add about 4 MB).  Blocks are one 20,000-row
    chunk (640 kB) at both sizes, read one at a time; the peak moves by up to
    two chunks' read buffers from run to run (Zarr frees them a little
    later or sooner), hence the allowance of four chunks.
    """
    monkeypatch.setattr(report, "BLOCK_VALUES", 1)  # one store chunk per block, at both sizes
    m = model[0]
    rng = np.random.default_rng(11)
    chunk = 20_000
    peaks, kept = {}, {}
    for n in (100_000, 100_000, 400_000):  # the first run pays for imports and caches: not counted
        X = rng.normal(size=(n, P)) @ np.diag([3.0, 2.0, 1.0, 0.5])
        X[rng.random(n) < 0.05] += 30.0
        path = tmp_path / f"x{n}.zarr"
        zarr.create_array(path, shape=X.shape, chunks=(chunk, P), dtype="f8", overwrite=True)[:] = X
        del X
        with dask.config.set(scheduler="sync"), open(tmp_path / f"e{n}.csv", "w", newline="") as f:
            tracemalloc.start()
            try:
                s = report.summarize(m, str(path), events=f, max_events=100)
                peaks[n] = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        assert s.n_events > n / 40
        kept[n] = s.worst_events
    assert peaks[400_000] < peaks[100_000] + 4 * chunk * P * 8, peaks
    # the events kept for the picture own their shares (a view would keep a block's whole array)
    assert all(e.shares.base is None for e in kept[400_000])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(tmp_path_factory.mktemp("cluster"), n_workers=2, nthreads=1, memory_limit="1GiB") as c:
        yield c


@pytest.mark.slow
def test_events_on_a_cluster_match_the_rows_flagged_by_is_outlier(stores, data, model, cluster, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setattr(report, "BLOCK_VALUES", 1)  # 24 blocks, 4 in flight: the window slides
    m, model_path = model
    for kind in KINDS:
        png = tmp_path / f"{kind}.png"
        assert _report_cli(stores[kind], model_path, png, "--max-gap", 2, "--scheduler", cluster.address) == 0
        names = NAMES if kind == "xarray" else None
        assert_events(tmp_path / f"{kind}.csv", expected_events(m, data[1], 2), names=names, time=kind == "xarray")


def test_the_contribution_colours_keep_moderate_events_visible_beside_one_huge_one():
    """300 columns x 24 channels of normal cells (about 1), one huge event (1e6, 6 columns x 2 channels) and
    five moderate ones (20-300 times a normal cell): the huge one takes the darkest colour, each moderate
    one at least a quarter of the colour scale and in their order, nine normal cells in ten the lightest
    tenth.  (A scale set by the cells' 99.9 % quantile over 3 decades, the former rule, ran from 1e3 to 1e6
    here: every moderate event at the lightest colour.)"""
    from dask_mcpca._report_plot import contribution_norm

    rng = np.random.default_rng(0)
    cells = np.exp(rng.normal(0.0, 0.3, size=(300, 24)))
    cells[100:106, [3, 7]] = 1.0e6
    moderate = {(20, 1): 20.0, (60, 5): 50.0, (150, 9): 100.0, (200, 12): 200.0, (250, 20): 300.0}
    for (col, ch), v in moderate.items():
        cells[col : col + 2, ch] = v
    cells[40, 0] = np.nan  # a group without rows
    norm = contribution_norm(cells)
    assert norm(1.0e6) == 1.0
    for v in moderate.values():
        assert norm(v) >= 0.25, (v, float(norm(v)), norm.vmin, norm.vmax)
    assert float(np.quantile(norm(cells[np.isfinite(cells) & (cells < 3)]), 0.9)) <= 0.1
    assert norm(300.0) > norm(20.0)  # the moderate events stay ranked


def test_a_report_of_selected_rows_names_the_selection_in_its_title(stores, model, tmp_path, monkeypatch):
    """``--time`` and ``--rows``: the title says which rows the report covers."""
    from dask_mcpca import _report_plot

    seen = []
    monkeypatch.setattr(_report_plot, "render", lambda summary, *, title="": seen.append(
        _report_plot.figure_title(summary, title)) or b"")
    hour = "2025-03-01T01:00/2025-03-01T02:00"
    assert _report_cli(stores["xarray"], model[1], tmp_path / "t.png", "--time", hour) == 0
    assert _report_cli(stores["zarr"], model[1], tmp_path / "r.png", "--rows", "1000:5000") == 0
    assert _report_cli(stores["zarr"], model[1], tmp_path / "a.png") == 0
    assert seen[0].startswith(f"plant.zarr (--time {hour}): ")
    assert seen[1].startswith("plain.zarr (--rows 1000:5000): 4,000 rows")
    assert seen[2].startswith("plain.zarr: 24,000 rows")
