"""Review 6 of ``dask-mcpca report``: its numbers against the Python API and the construction.

- a sensor stuck after the fit: the report's flagged rows are :meth:`MCPCA.is_outlier`'s, row for row,
  whatever the chunking (the stuck-run rule reads the rows before each block);
- a cellwise model over its own glitched rows calls no window drift (its flagged cells enter the windows at
  their conditional expectation), while a sensor offset still is;
- times out of order are refused by duration windows whatever the chunking (one chunk, several, a block of
  several slices);
- with operating modes, windows.csv counts every complete row and the largest mode's (``watched_rows``);
- the events' ``peak_d2`` is the calibrated distance ``is_outlier`` judges (pins docs/report.md's text).
"""

from __future__ import annotations

import io

import dask.array as da
import numpy as np
import pandas as pd
import pytest

from dask_mcpca import MCPCA
from dask_mcpca import _report as report
from dask_mcpca import _report_block as report_block


def _flagged_rows(events_csv: str, n: int) -> np.ndarray:
    """The rows the events CSV (``max_gap=0``, every event) marks flagged: each event's rows are one run."""
    flags = np.zeros(n, bool)
    for start, stop, rows, flagged in pd.read_csv(io.StringIO(events_csv))[
            ["start_row", "stop_row", "rows", "flagged_rows"]].itertuples(index=False):
        assert rows == flagged == stop - start  # max_gap=0: an event is a run of flagged rows
        flags[start:stop] = True
    return flags


@pytest.fixture(scope="module")
def stuck_after_fit():
    """Rows of 5 correlated channels; a model fitted on the first 5,000; channel 2 held at one value on
    rows 6,000-6,299, after the fit (the review's construction)."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(8_000, 5)) @ rng.normal(size=(5, 5))
    model = MCPCA(n_components=3).fit(X[:5_000])
    Y = X.copy()
    Y[6_000:6_300, 2] = Y[6_000, 2]
    return model, Y


@pytest.mark.parametrize("chunk", [None, 500, 5_000, 1_000])
def test_stuck_sensor_after_the_fit_flags_is_outliers_rows(stuck_after_fit, chunk):
    model, Y = stuck_after_fit
    expected = np.asarray(model.is_outlier(Y))
    assert expected[6_000:6_300].sum() >= 290  # the stuck-run rule flags the stretch from its tenth row on
    X = Y if chunk is None else da.from_array(Y, chunks=(chunk, 5))
    f = io.StringIO()
    s = report.summarize(model, X, events=f, max_events=0)
    got = _flagged_rows(f.getvalue(), len(Y))
    np.testing.assert_array_equal(got, expected)
    assert s.n_flagged == expected.sum()


@pytest.fixture(scope="module")
def glitches():
    """8 channels of 3 factors and noise, 200 single-cell glitches of +-15 (the review's construction), a
    cellwise model fitted on them, and 3,000 later rows whose channel 5 is offset by 1 (3 noise SDs; its
    cells are flagged in about 30 % of them): drift."""
    rng = np.random.default_rng(2)
    n, p = 10_000, 8
    L = rng.normal(size=(3, p))
    X = rng.normal(size=(n, 3)) @ L + 0.3 * rng.normal(size=(n, p))
    i, j = rng.integers(0, n, 200), rng.integers(0, p, 200)
    X[i, j] += rng.choice([-1, 1], 200) * 15
    later = rng.normal(size=(3_000, 3)) @ L + 0.3 * rng.normal(size=(3_000, p))
    later[:, 5] += 1.0
    return MCPCA(cellwise=True).fit(X), X, later


def test_a_cellwise_model_over_its_own_glitched_rows_calls_no_drift(glitches):
    """A glitched row keeps a weight near 1 under a cellwise model (its good cells' distance): its glitch
    enters the window sums at its conditional expectation, not as read, so no window of the fitted rows is
    drift (ratios 5-11 before); a window of rows with a sensor offset still is."""
    model, X, later = glitches
    s = report.summarize(model, np.vstack([X, later]), window="1000", reference_rows=(0, len(X)))
    w = s.windows
    assert (w["monitored"] == 1).all()
    fitted = w["first_row"] < len(X)
    assert np.nanmax(w["residual_ratio"][fitted]) < 1.5
    np.testing.assert_array_equal(w["drift"], (~fitted).astype(float))


@pytest.mark.parametrize("chunk, slice_rows", [(4_000, None), (500, None), (4_000, 1_000), (None, None)])
def test_times_out_of_order_are_refused_whatever_the_chunking(chunk, slice_rows, monkeypatch):
    """Rows 2,000-2,099 are timed 10 hours back, into an earlier 3-hour window (the review's construction):
    refused in one chunk (once merged into that window silently), in chunks of 500, and in a block whose
    slices (``SLICE_ROWS`` 1,000) cut at the jump."""
    import xarray as xr

    rng = np.random.default_rng(0)
    X = rng.normal(size=(4_000, 6)) @ rng.normal(size=(6, 6))
    model = MCPCA(n_components=3).fit(X)
    t = pd.date_range("2025-01-01", periods=4_000, freq="1min").values.copy()
    t[2_000:2_100] -= np.timedelta64(600, "m")
    A = xr.DataArray(X, dims=("time", "channel"), coords={"time": t})
    if chunk is not None:
        A = A.chunk({"time": chunk})
    if slice_rows is not None:
        monkeypatch.setattr(report_block, "SLICE_ROWS", slice_rows)
    with pytest.raises(ValueError, match="--window '3h': the row coordinate is not increasing"):
        report.summarize(model, A, window="3h")
    report.summarize(model, A, window="100")  # a row count's windows read no time


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_windows_with_modes_count_complete_and_watched_rows(tmp_path, capsys):
    """With operating modes the windows watch the largest mode's rows: ``complete_rows`` counts every complete
    row (it counted the largest mode's alone), ``watched_rows`` the largest mode's by ``predict_mode``, and a
    window of another mode is not monitored for "too few complete rows of the largest mode"."""
    import xarray as xr

    from dask_mcpca import load
    from dask_mcpca.cli import main

    rng = np.random.default_rng(1)
    n, p = 12_000, 5
    state = ((np.arange(n) // 1_500) % 3 == 2).astype(int)  # state 1 in every third stretch of 1,500 rows
    A, B = rng.normal(size=(p, p)), rng.normal(size=(p, p))
    X = np.where(state[:, None] == 0, rng.normal(size=(n, p)) @ A, rng.normal(size=(n, p)) @ B * 0.5 + 20)
    X[7_000:7_010, 2] = np.nan  # 10 rows with a gap, in a window of the largest mode
    model = MCPCA(nan_policy="omit").fit(X, modes=state)
    model.save(tmp_path / "m.json")
    ds = xr.Dataset({f"c{j}": ("time", X[:, j]) for j in range(p)},
                    coords={"time": pd.date_range("2025-01-01", periods=n, freq="1min")})
    ds.chunk({"time": 2_000}).to_zarr(tmp_path / "s.zarr")
    windows = tmp_path / "w.csv"
    assert main(["report", str(tmp_path / "s.zarr"), "-m", str(tmp_path / "m.json"), "-o", str(tmp_path / "r.png"),
                 "--window", "500", "--windows", str(windows), "--no-progress"]) == 0
    out = capsys.readouterr().out
    table = pd.read_csv(windows)
    complete = np.isfinite(X).all(axis=1)
    largest = int(np.argmax(load(tmp_path / "m.json").mode_weights_))
    mode = np.asarray(load(tmp_path / "m.json").predict_mode(np.where(complete[:, None], X, 0.0)))
    starts = table["first_row"].to_numpy()
    np.testing.assert_array_equal(table["complete_rows"], [complete[r : r + 500].sum() for r in starts])
    np.testing.assert_array_equal(table["watched_rows"],
                                  [(complete & (mode == largest))[r : r + 500].sum() for r in starts])
    other = state[starts] != largest
    assert other.sum() == 6 and (table["monitored"][other] == 0).all() and (table["monitored"][~other] == 1).all()
    assert "6 not monitored (too few complete rows of the largest mode)" in out


def test_peak_d2_is_the_calibrated_distance_is_outlier_judges(glitches):
    """The events' ``peak_d2``, as docs/report.md says: the largest over the event's flagged rows of the distance
    ``is_outlier`` compares with ``outlier_cutoff_``, which ``score_rows``' weight carries
    (``-2 kernel_scale_² log(weight)``): on a row with a gap, not ``score_rows``' ``d2`` (the observed cells'),
    and for a cellwise model the good cells' distance."""
    _, X, _ = glitches
    X = X.copy()
    X[5_000] += 3.0  # an event of one row, with a gap
    X[5_000, 4] = np.nan
    for cellwise in (False, True):
        model = MCPCA(cellwise=cellwise, nan_policy="partial").fit(X)
        r = model.score_rows(X, outputs=("d2", "weight", "outlier"))
        calibrated = -2 * model.kernel_scale_**2 * np.log(np.asarray(r["weight"]))
        flagged = np.asarray(r["outlier"])
        f = io.StringIO()
        report.summarize(model, X, events=f, max_events=0)
        events = pd.read_csv(io.StringIO(f.getvalue()))
        runs = zip(events["start_row"], events["stop_row"], strict=True)
        expected = [calibrated[a:b][flagged[a:b]].max() for a, b in runs]
        np.testing.assert_allclose(events["peak_d2"], expected, rtol=1e-5)
        gap = events[events["start_row"] == 5_000]
        if not cellwise:
            assert len(gap) == 1 and not np.isclose(gap["peak_d2"].iloc[0], np.asarray(r["d2"])[5_000], rtol=1e-3)
