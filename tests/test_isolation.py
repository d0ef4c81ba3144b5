"""The channel at fault (``score_rows``' ``top_channel``): a stuck cell that explains the flag is named.

Per row, the reconstruction-based contributions cannot tell a stuck sensor
from a near-copy of itself: both reconstructions explain the row.  A stuck
value repeats exactly, which a continuous channel never does, so
``top_channel`` names the held cell where its reconstruction alone brings
the row under the cutoff (:func:`dask_mcpca._stuck.isolated_top`).  The
expected channels come from the generators (the channel made faulty); the
rule must not fire on the ties of quantized channels or on a clipped
channel that does not explain the flag.
"""

from __future__ import annotations

import copy

import dask.array as da
import numpy as np
import pytest
from scipy import signal

from dask_mcpca import MCPCA, _stuck

P = 8
SOURCE = np.array([0, 0, 1, 1, 2, 2, 3, 4])  # channels 0-1, 2-3 and 4-5: two sensors of one quantity each


def twins(rng, n: int, W: np.ndarray) -> np.ndarray:
    """Five quantities, three of them read by two sensors each (correlation above 0.99)."""
    q = rng.normal(size=(n, 3)) @ W.T + 0.3 * rng.normal(size=(n, 5))
    return q[:, SOURCE] + 0.03 * rng.normal(size=(n, P))


@pytest.fixture(scope="module")
def stuck_twins():
    """A model of the twins, and a stream with each of the 8 sensors stuck in turn for 200 rows."""
    rng = np.random.default_rng(5)
    W = rng.normal(size=(5, 3))
    model = MCPCA().fit(twins(rng, 20_000, W))
    X = twins(rng, 4_000, W)
    faulty = np.full(len(X), -1)
    for j in range(P):
        rows = slice(200 + 450 * j, 400 + 450 * j)
        X[rows, j] = X[rows.start, j]
        faulty[rows] = j
    return model, X, faulty


def test_a_stuck_sensor_is_told_from_its_twin(stuck_twins):
    model, X, faulty = stuck_twins
    out = model.score_rows(X, outputs=("outlier", "top_channel"))
    hit = out["outlier"] & (faulty >= 0)
    assert hit.sum() > 800  # most stuck rows are flagged: the twin disagrees
    assert np.mean(out["top_channel"][hit] == faulty[hit]) >= 0.99
    # per row, the largest contribution often names the twin instead
    per_row = model.channel_contributions(X[hit]).argmax(axis=1)
    assert np.mean(per_row == faulty[hit]) < 0.95
    # where nothing is held, top_channel is the largest contribution
    free = out["outlier"] & (faulty < 0)
    np.testing.assert_array_equal(out["top_channel"][free], model.channel_contributions(X[free]).argmax(axis=1))


@pytest.mark.parametrize("chunk_rows", [333, 450, 1_000])
def test_the_rule_looks_across_row_blocks(stuck_twins, chunk_rows):
    model, X, _ = stuck_twins
    whole = model.score_rows(X, outputs=("outlier", "top_channel"))
    blocks = model.score_rows(da.from_array(X, chunks=(chunk_rows, -1)), outputs=("outlier", "top_channel"))
    np.testing.assert_array_equal(blocks["top_channel"].compute(), whole["top_channel"])
    both = model.score_rows(da.from_array(X, chunks=(chunk_rows, -1)), outputs=("contributions", "top_channel"))
    np.testing.assert_array_equal(both["top_channel"].compute(), whole["top_channel"])


def test_ties_of_an_integer_channel_name_nothing(monkeypatch):
    """An integer channel beside a near-copy of itself repeats its value from row to row (90 % of the rows
    here): a spike on the copy stays with the contributions, by either guard of the rule alone (the
    channel's quantization step, the value's few digits); without both, the integer channel would be named."""
    rng = np.random.default_rng(1)
    n = 40_000
    z = signal.lfilter([np.sqrt(1 - 0.999**2)], [1, -0.999], rng.normal(size=n))  # a slow factor
    X = np.column_stack([np.round(3 * z), 3 * z + 0.1 * rng.normal(size=n), z + 0.3 * rng.normal(size=n),
                         rng.normal(size=n)])
    model = MCPCA().fit(X[:30_000])
    assert model.quantization_steps_[0] == 1 and not model.quantization_steps_[1:].any()
    Y = X[30_000:].copy()
    spikes = np.arange(5, len(Y), 20)
    Y[spikes, 1] += 1.5
    assert np.mean(Y[spikes, 0] == Y[spikes - 1, 0]) > 0.8
    per_row = model.channel_contributions(Y[spikes]).argmax(axis=1)

    def named(m):
        out = m.score_rows(Y, outputs=("outlier", "top_channel"))
        return out["outlier"][spikes], out["top_channel"][spikes]

    flagged, top = named(model)
    assert flagged.sum() > 200
    np.testing.assert_array_equal(top, per_row)
    continuous = copy.deepcopy(model)
    continuous.quantization_steps_ = np.zeros(4)
    np.testing.assert_array_equal(named(continuous)[1], per_row)  # the digits guard alone
    monkeypatch.setattr(_stuck, "FULL_DIGITS", {np.dtype(np.float64): 0, np.dtype(np.float32): 0})
    np.testing.assert_array_equal(named(model)[1], per_row)  # the quantization guard alone
    unguarded = named(continuous)[1]
    assert np.sum(flagged & (unguarded == 0) & (per_row != 0)) > 100


def test_held_cells_by_value_dtype_and_channel():
    """Held: an exact repeat at near full precision on a continuous channel, or a learned stuck value;
    not: a repeat of a short decimal (in its own dtype) or on a quantized channel."""

    class Model:
        quantization_steps_ = np.array([0.0, 0.0, 0.0, 0.5])
        repeated_values_ = np.array([[2.0, 7.25]])

    full, short = 0.1234567890123, 12.3456
    rows = np.array([[full, short, 7.25, full]])
    held = _stuck.held_cells(Model(), rows, rows.copy())
    np.testing.assert_array_equal(held, [[True, False, True, False]])
    rows32 = np.array([[np.float32(full), np.float32(2.3), np.float32(7.25), np.float32(full)]], np.float32)
    held = _stuck.held_cells(Model(), rows32, rows32.copy())
    np.testing.assert_array_equal(held, [[True, False, True, False]])
    other = rows.copy()
    other[0, 0] = np.nextafter(full, 1.0)  # one ulp apart: no repeat
    np.testing.assert_array_equal(_stuck.held_cells(Model(), rows, other), [[False, False, True, False]])


@pytest.mark.parametrize("chunks", [(1_100, 0, 2_900), (0, 1_101, 0, 0, 2_899), (1_101, 0, 0, 2_899, 0)])
def test_blocks_of_no_rows_pass_on_the_row_before(stuck_twins, chunks):
    model, X, _ = stuck_twins
    whole = model.score_rows(X, outputs=("outlier", "top_channel"))
    blocks = da.from_array(X, chunks=(len(X), -1)).rechunk((chunks, (P,)))
    got = model.score_rows(blocks, outputs=("outlier", "top_channel"))["top_channel"].compute()
    np.testing.assert_array_equal(got, whole["top_channel"])


def test_a_clipped_channel_at_its_limit_does_not_take_a_fault_elsewhere():
    """A continuous channel held at its range limit for stretches: held, but its reconstruction does
    not explain a spike on another channel."""
    rng = np.random.default_rng(2)
    n = 30_000
    z = np.cumsum(rng.normal(size=n)) * 0.05
    z = (z - z.mean()) / z.std()  # a slow common factor
    X = z[:, None] + 0.3 * rng.normal(size=(n, 4))
    limit = np.quantile(X[:, 0], 0.95)
    X[:, 0] = np.minimum(X[:, 0], limit)
    model = MCPCA().fit(X[:20_000])
    assert model.quantization_steps_[0] == 0 and not len(model.repeated_values_)
    Y = X[20_000:].copy()
    at_limit = np.flatnonzero((Y[1:, 0] == limit) & (Y[:-1, 0] == limit)) + 1
    assert len(at_limit) > 50
    spikes = at_limit[::5]
    Y[spikes, 3] += 10.0
    out = model.score_rows(Y, outputs=("outlier", "top_channel"))
    assert out["outlier"][spikes].all()
    np.testing.assert_array_equal(out["top_channel"][spikes], 3)


def test_a_learned_stuck_value_names_its_channel():
    """Rows flagged for holding a stuck value the fit learned name that channel, also where the
    value lies in the bulk and the row's distance says nothing of any channel."""
    rng = np.random.default_rng(3)
    n = 20_000
    X = rng.normal(size=(n, 3)) @ np.array([[1.0, 0.8, 0.6], [0.0, 0.6, 0.3], [0.0, 0.0, 0.5]])
    stuck = X[1000, 1]
    X[1000:1600, 1] = stuck  # 3 % of the rows
    model = MCPCA().fit(X)
    np.testing.assert_array_equal(model.repeated_values_, [[1, stuck]])
    out = model.score_rows(X, outputs=("outlier", "top_channel"))
    assert out["outlier"][1000:1600].all()
    np.testing.assert_array_equal(out["top_channel"][1000:1600], 1)
