"""A sensor stuck after the fit: runs of one exact value, read in row order (issue 34, point 2).

The fit's row sample learns a value stuck in the fitted rows (``repeated_values_``,
tests/test_repeated.py); a sensor that sticks later is found by its run: a
channel continuous at the fit holding one value, at its dtype's full precision,
in ``STUCK_RUN`` consecutive rows, where it repeated no other value in the
``HOLD_WINDOW`` rows before (``dask_mcpca._stuck.stuck_runs``).

The rule is written out here row by row, plainly, and compared with the
vectorised one; then the methods that flag rows (``is_outlier``, ``predict``,
``decision_function``, ``score_rows``) are checked to find a stuck stretch in
nearly all its rows, whatever the chunking, and to leave quantized, saturating,
idle, set-point and sample-and-hold channels alone.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from dask_mcpca import MCPCA
from dask_mcpca._stuck import HOLD_WINDOW, STUCK_RUN, stuck_runs

P = 6
CHUNKINGS = (997, 4096, 30_000)


def _plain_rule(X: np.ndarray, run: int, window: int) -> np.ndarray:
    """The rule, one cell at a time: the run up to the cell, and the repeats of the window before it."""
    n, p = X.shape
    out = np.zeros((n, p), bool)

    def repeat(i, j):  # row i repeats row i - 1's value on channel j (NaN, inf and 0 never do)
        return i > 0 and X[i, j] == X[i - 1, j] and np.isfinite(X[i, j]) and X[i, j] != 0

    for j in range(p):
        for i in range(n):
            start = i
            while repeat(start, j):
                start -= 1
            length = i - start + 1
            earlier = sum(repeat(r, j) for r in range(max(i - window, 0) + 1, start))
            out[i, j] = length >= run and (length > window or earlier == 0)
    return out


def test_the_vectorised_rule_is_the_rule_written_cell_by_cell():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(700, 4)).round(1)  # coarse values: runs of every length by chance
    X[100:140, 0] = 2.5
    X[300:305, 1] = 7.0
    X[::50, 2] = np.nan
    X[400:420, 3] = 0.0
    want = _plain_rule(X, run=4, window=30)
    got = stuck_runs(X, None, np.ones(4, bool), run=4, window=30)
    assert want.sum() > 20  # the runs are there to be found
    np.testing.assert_array_equal(got, want)
    # cut into blocks, each given the rows before it: the same verdicts
    parts = [stuck_runs(X[a : a + 77], X[max(a - 30, 0) : a], np.ones(4, bool), run=4, window=30)
             for a in range(0, len(X), 77)]
    np.testing.assert_array_equal(np.concatenate(parts), want)


def _factor_rows(rng, n, loadings):
    return (rng.normal(size=(n, len(loadings))) @ loadings + 0.3 * rng.normal(size=(n, loadings.shape[1])))


@pytest.fixture(scope="module")
def monitored():
    """A model fitted on continuous float32 channels, and later rows where channel 2 sticks for 3,000 rows."""
    rng = np.random.default_rng(0)
    loadings = rng.normal(size=(3, P))
    model = MCPCA().fit(_factor_rows(rng, 40_000, loadings).astype(np.float32))
    later = _factor_rows(rng, 20_000, loadings).astype(np.float32)
    later[5_000:8_000, 2] = later[4_999, 2]
    stuck = np.zeros(len(later), bool)
    stuck[5_000:8_000] = True
    return model, later, stuck


def test_a_sensor_stuck_after_the_fit_is_flagged_in_nearly_all_its_rows(monitored):
    model, later, stuck = monitored
    assert not len(model.repeated_values_)  # the fit never saw it
    flags = model.is_outlier(later)
    # the stretch's first STUCK_RUN - 1 rows (and the row before) cannot be told from a moving sensor
    assert flags[stuck].mean() >= 1 - STUCK_RUN / stuck.sum()
    assert flags[~stuck].mean() < 0.005
    rows = model.score_rows(later, outputs=("outlier", "top_channel", "cells"))
    np.testing.assert_array_equal(rows["outlier"], flags)
    run = np.flatnonzero(stuck)[STUCK_RUN - 1 :]
    # named, but in the odd row that another channel's fault flags as well (the run alone would not explain it)
    assert (rows["top_channel"][run] == 2).mean() > 0.99
    assert rows["cells"][run, 2].all()
    np.testing.assert_array_equal(model.predict(later) == -1, flags)
    np.testing.assert_array_equal(model.decision_function(later) < 0, flags)


@pytest.mark.parametrize("chunk", CHUNKINGS)
def test_the_verdicts_do_not_depend_on_the_chunking(monitored, chunk):
    model, later, _ = monitored
    X = da.from_array(later, chunks=(chunk, P))
    want = model.is_outlier(later)
    np.testing.assert_array_equal(model.is_outlier(X).compute(), want)
    np.testing.assert_array_equal(model.predict(X).compute() == -1, want)
    rows = model.score_rows(X, outputs=("outlier", "top_channel"))
    np.testing.assert_array_equal(rows["outlier"].compute(), want)
    np.testing.assert_array_equal(rows["top_channel"].compute(), model.score_rows(later, outputs=("top_channel",))[
        "top_channel"])


def _copy(model):
    import copy

    return copy.deepcopy(model)


def _natural_repeats(rng, n):
    """Channels whose exact repeats are the data's nature, beside continuous ones."""
    t = rng.normal(size=(n, P))
    t[:, 0] = np.round(t[:, 0] * 4) / 4  # quantized: a lattice of quarter steps
    t[:, 1] = np.minimum(t[:, 1], 1.0)  # saturating at 1.0 in 16 % of the rows (0 steps: continuous)
    t[:, 2] = np.repeat(rng.normal(size=n // 5 + 1), 5)[:n]  # a slow sensor logged 5 times per update
    idle = (np.arange(n) // 2_000) % 10 == 3  # idle at exact 0 one stretch in 10
    t[idle, 3] = 0.0
    t[:, 4] = np.where((np.arange(n) // 3_000) % 7 == 1, 20.5, t[:, 4])  # a set point, held for 3,000 rows
    return t


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_quantized_saturating_held_idle_and_set_point_channels_are_not_flagged_by_runs(dtype):
    rng = np.random.default_rng(1)
    X = _natural_repeats(rng, 30_000).astype(dtype)
    model = MCPCA().fit(X)
    later = _natural_repeats(rng, 30_000).astype(dtype)
    rows = model.score_rows(later, outputs=("outlier", "cells"))
    # what flags the rows with no run rule: d^2 or a learned repeated value, as is_outlier did before it
    from dask_mcpca import _model

    before = _model.outlier_flags(model, later.astype(np.float64), _model.calibrated_d2(model, later))
    np.testing.assert_array_equal(rows["outlier"], before)


def test_a_long_run_is_stuck_once_the_channels_earlier_repeats_leave_its_window():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(3 * HOLD_WINDOW, 1))
    X[:HOLD_WINDOW, 0] = np.repeat(rng.normal(size=HOLD_WINDOW // 4), 4)  # held values, then continuous
    X[HOLD_WINDOW + 10 : HOLD_WINDOW + 20, 0] = 1.2345678901234567  # a run of 10, repeats at rows W+11 .. W+19
    start = 2 * HOLD_WINDOW - 100
    X[start:, 0] = 2.345678901234567  # a run of 1,124 rows
    got = stuck_runs(X, None, np.ones(1, bool))[:, 0]
    assert not got[HOLD_WINDOW + 10 : HOLD_WINDOW + 20].any()  # held values in the window before
    # row i reads rows i - W .. i - 1: the last earlier repeat (row W + 19) leaves its window at i = 2W + 19
    assert not got[start : 2 * HOLD_WINDOW + 19].any()
    assert got[2 * HOLD_WINDOW + 19 :].all()


@pytest.mark.parametrize("chunk", [None, *CHUNKINGS])
def test_an_update_gives_a_sensor_stuck_since_the_fit_no_weight(monitored, chunk):
    """``partial_fit`` weighs the stuck rows (from the run's tenth on) as it would rows it never got."""
    model, later, stuck = monitored
    run = np.flatnonzero(stuck)[STUCK_RUN - 1 :]
    without = np.delete(later, run, axis=0)
    a = _copy(model).partial_fit(later if chunk is None else da.from_array(later, chunks=(chunk, P)))
    b = _copy(model).partial_fit(without)
    np.testing.assert_allclose(a.components_, b.components_, rtol=0, atol=1e-9)
    np.testing.assert_allclose(a.explained_variance_, b.explained_variance_, rtol=1e-9)
    np.testing.assert_allclose(a.mean_, b.mean_, rtol=0, atol=1e-9)
    assert a.n_samples_ == len(later)
    # the held rows are not ones the kernel would have ignored anyway: most lie inside it
    assert np.median(model.score_samples(later[run])) > 0.1


def test_a_recording_written_to_six_decimals_is_judged_by_how_far_it_moves():
    """Values logged to 6 decimals that move by far more (an accelerometer) stick as a float would; a slow
    channel written in tenths, which repeats by nature, does not."""
    rng = np.random.default_rng(5)
    n = 20_000
    X = rng.normal(size=(n, 3))
    X[:, 0] = np.round(X[:, 0], 6)  # moves by ~1, written to 1e-6
    X[:, 1] = np.round(20 + np.cumsum(rng.normal(size=n)) * 0.002, 1)  # drifts by 0.002 a row, written in tenths
    model = MCPCA().fit(X[:10_000])
    assert model.quantization_steps_[0] == 0
    model.quantization_steps_[1] = 0.0  # a fit whose row sample missed the lattice of tenths
    later = X[10_000:].copy()
    later[3_000:3_500, 0] = later[2_999, 0]
    later[6_000:6_500, 1] = later[5_999, 1]  # as its own runs are
    from dask_mcpca import _stuck

    stuck = _stuck.stuck_cells(model, later, None)
    # the run holds row 2,999's value from row 2,999 on: 501 rows, stuck from its tenth
    assert stuck[2_999 + STUCK_RUN - 1 : 3_500, 0].all() and stuck[:, 0].sum() == 501 - STUCK_RUN + 1
    assert not stuck[:, 1].any()


@pytest.mark.parametrize("chunks", [None, 1000])
def test_a_gap_on_another_channel_does_not_restart_a_stuck_run(chunks):
    """Under ``nan_policy="omit"`` a row with a NaN gives no verdict, but the rows around it are read as
    stored: the row-flagging methods once judged runs on the block with such rows zeroed, so every eighth
    row restarted the run and ``is_outlier`` found 699 of the stretch's rows where ``score_rows`` found
    1,747.  Expected: every row of the stretch from its ``STUCK_RUN``-th on, but the rows with the gap."""
    rng = np.random.default_rng(0)
    F = rng.normal(size=(30_000, 2))
    A = F @ rng.normal(size=(2, P)) + 0.3 * rng.normal(size=(30_000, P)) + 10
    model = MCPCA(random_state=0, nan_policy="omit").fit(A[:20_000])
    Z = A[20_000:].copy()
    Z[3000:5000, 1] = Z[2999, 1]  # stuck at its last reading: a run from row 2999
    Z[3000:5000:8, 3] = np.nan
    found = slice(2999 + STUCK_RUN - 1, 5000)  # (its first rows may be flagged by the held-cell rule)
    expected = ~np.isnan(Z[found]).any(axis=1)
    rows = Z if chunks is None else da.from_array(Z, chunks=(chunks, P))
    flags = np.asarray(model.is_outlier(rows))
    np.testing.assert_array_equal(flags[found], expected)
    np.testing.assert_array_equal(np.asarray(model.predict(rows)) == -1, flags)
    np.testing.assert_array_equal(np.asarray(model.decision_function(rows)) < 0, flags & ~np.isnan(Z).any(axis=1))
    np.testing.assert_array_equal(np.asarray(model.score_rows(rows, outputs=("outlier",))["outlier"]), flags)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_run_longer_than_the_window_stays_stuck_and_a_long_set_point_stays_alone(dtype):
    """Past ``HOLD_WINDOW`` rows no value from before the run is left to judge it by: a reading logged to six
    decimals once needed float64's 12 digits there, so it stopped being flagged after about 1,000 rows where
    its float32 copy went on.  Expected: stuck from the run's tenth row to its end, in either dtype; a set
    point (20.5) held as long is no run."""
    rng = np.random.default_rng(5)
    n = 20_000
    X = np.round(rng.normal(size=(n, 3)), 6)
    model = MCPCA().fit(X[:10_000].astype(dtype))
    later = X[10_000:].copy()
    later[2_000:5_000, 0] = later[1_999, 0]  # 3,001 rows holding row 1,999's reading
    later[6_000:9_000, 2] = 20.5  # the device parked at its set point
    from dask_mcpca import _stuck

    stuck = _stuck.stuck_cells(model, later.astype(dtype), None)
    assert stuck[1_999 + STUCK_RUN - 1 : 5_000, 0].all() and stuck[:, 0].sum() == 3_001 - STUCK_RUN + 1
    assert not stuck[:, 2].any()
