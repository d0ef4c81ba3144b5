"""Repeated values and rows (issue 21): legitimate repeats are no faults, stuck sensors and frozen loggers are.

Quantization levels, a range limit or a saturation, integer counts, one-hot
columns and a device idle at one point repeat values exactly; the model (a
robust Gaussian marginal per channel, on the channel's lattice) predicts those
counts, or the repeated record is a set point (zeros).  A stuck sensor and a
frozen logger on continuous data hold counts the model cannot explain.
"""

import numpy as np
import pytest

from dask_mcpca import MCPCA
from dask_mcpca._model import repeated
from dask_mcpca._repeated import find_repeated, repeated_rows, repeated_values


def _correlated(rng, n, p, sd):
    """Gaussian channels, correlation 0.5 between each two (no channel predicted by the others with
    R^2 above 0.4: a clipped channel that the others predict within a fraction of its sd is far by d^2)."""
    L = np.linalg.cholesky(np.full((p, p), 0.5) + 0.5 * np.eye(p))
    return rng.normal(size=(n, p)) @ L.T * sd


def _integers(seed, n=10_000):
    return np.round(_correlated(np.random.default_rng(seed), n, 5, np.array([0.8, 1.5, 3.0, 6.0, 12.0])))


def _uint8(seed, n=10_000):
    return np.clip(np.round(128 + _correlated(np.random.default_rng(seed), n, 5, 25.0)), 0, 255)


def _saturating(seed, share, n=10_000):
    """Channel 0 clipped at the (rounded) level it exceeds ``share`` of the time: a range limit."""
    rng = np.random.default_rng(seed)
    X = 50 + _correlated(rng, n, 5, 10.0)
    X[:, 0] = np.minimum(X[:, 0], np.round(np.quantile(X[:, 0], 1 - share)))
    return X


def _idle(seed, share, n=10_000):
    """A device that writes zeros in every channel when idle, ``share`` of the time; 0 inside the bulk."""
    rng = np.random.default_rng(seed)
    X = 0.1 + _correlated(rng, n, 5, 1.0)
    X[rng.choice(n, int(share * n), replace=False)] = 0.0
    return X


def _one_hot(seed, n=10_000):
    rng = np.random.default_rng(seed)
    category = rng.choice(5, n, p=[0.4, 0.25, 0.15, 0.12, 0.08])
    return np.hstack([np.round(_correlated(rng, n, 2, 2.0)), np.eye(5)[category]])


CLEAN = {
    "integer counts": _integers,
    "uint8 sensor": _uint8,
    "range limit 5 %": lambda s: _saturating(s, 0.05),
    "saturating 1 %": lambda s: _saturating(s, 0.01),
    "saturating 8 %": lambda s: _saturating(s, 0.08),
    "idle zeros 1 %": lambda s: _idle(s, 0.01),
    "idle zeros 5 %": lambda s: _idle(s, 0.05),
}


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("case", sorted(CLEAN))
def test_legitimate_repeats_are_no_faults(case, seed):
    X = CLEAN[case](seed)
    model = MCPCA().fit(X)
    assert len(model.repeated_values_) == 0 and len(model.repeated_rows_) == 0
    assert np.mean(model.is_outlier(X)) <= 0.01  # 0.1-0.4 % measured (5.2-100 % of the repeats before)


@pytest.mark.parametrize("seed", range(2))
def test_one_hot_columns_repeat_no_faults(seed):
    """No repeated value or row; the rows flagged here are far by d^2 (rare categories), not repeats."""
    X = _one_hot(seed)
    values, rows = find_repeated(X)
    assert len(values) == 0 and len(rows) == 0
    assert not repeated(MCPCA().fit(X), X).any()


def test_levels_of_a_quantized_channel_with_values_swapped_in_are_no_stuck_values():
    """3 % of the rows carry a continuous channel's values between a quantized channel's levels: the levels
    keep their lattice (values held once lie off it) and the model predicts their counts."""
    rng = np.random.default_rng(0)
    X = _correlated(rng, 20_000, 4, 1.0)
    X[:, 0] = np.round(X[:, 0] * 20) / 20  # 41 busy levels
    swapped = rng.choice(len(X), 600, replace=False)
    Xf = X.copy()
    Xf[swapped, 0], Xf[swapped, 1] = X[swapped, 1], X[swapped, 0]
    assert len(repeated_values(Xf)) == 0
    model = MCPCA().fit(Xf)
    clean = np.ones(len(X), bool)
    clean[swapped] = False
    assert not repeated(model, Xf).any()
    assert np.mean(np.asarray(model.is_outlier(Xf))[clean]) <= 0.05


def test_chance_repeats_between_the_levels_are_no_levels():
    """Between a quantized channel's busy levels (300-800 rows each), values of another channel swapped in
    that repeat by chance (2-3 rows each, five between each two levels, as NYC weather's humidity among its
    temperature levels): the levels are compared with the levels around them, not with those values."""
    rng = np.random.default_rng(7)
    levels = np.round(np.arange(-2.0, 2.05, 0.1), 1)
    counts = np.round(800 * np.exp(-(levels**2) / 2)).astype(int)  # 108-800 rows a level
    between = [lo + 0.1 * (i + 1) / 6 for lo in levels[:-1] for i in range(5)]
    column = np.concatenate([np.repeat(levels, counts), np.repeat(between, rng.integers(2, 4, len(between)))])
    sample = np.column_stack([column, rng.normal(size=len(column))])
    assert len(repeated_values(sample)) == 0
    stuck = sample.copy()
    stuck[rng.choice(len(stuck), 1500, replace=False), 0] = -1.9  # a tail level held by 10x its rows: stuck
    assert repeated_values(stuck).tolist() == [[0.0, -1.9]]


@pytest.mark.parametrize("stuck_at", [3.5, -999.0])
def test_a_value_stuck_in_the_sparse_tail_of_a_fine_lattice_is_found(stuck_at):
    """400 of 100,000 rows at a value past the busy levels of a channel quantized to 0.1: compared with
    the sparse tail levels around it (tens of rows), not with the busy levels of the bulk."""
    rng = np.random.default_rng(1)
    z = rng.normal(size=(100_000, 2))
    column = np.round(z[:, 0] * 10) / 10
    column[rng.choice(len(column), 400, replace=False)] = stuck_at
    assert repeated_values(np.column_stack([column, z[:, 1]])).tolist() == [[0.0, stuck_at]]


@pytest.mark.parametrize("seed", range(3))
def test_stuck_sensor_and_frozen_logger_on_continuous_data_are_found(seed):
    rng = np.random.default_rng(seed)
    X = _correlated(rng, 10_000, 6, 1.0)
    order = rng.permutation(len(X))
    stuck, frozen = order[:300], order[300:500]
    Xf = X.copy()
    Xf[stuck, 2] = np.quantile(X[:, 2], 0.99)
    Xf[frozen] = X[order[600]]  # one measured record, replayed
    model = MCPCA().fit(Xf)
    np.testing.assert_array_equal(model.repeated_values_, [[2.0, Xf[stuck[0], 2]]])
    np.testing.assert_array_equal(model.repeated_rows_, X[order[600]][None])
    flags = np.asarray(model.is_outlier(Xf))
    assert flags[stuck].all() and flags[frozen].all()
    clean = np.ones(len(X), bool)
    clean[order[:500]] = False
    assert flags[clean].mean() <= 0.01


def test_a_float64_model_finds_its_stuck_value_and_frozen_record_in_a_float32_copy():
    """The learned values are matched as stored in float32 too: the same recording in float32 gets the same
    flags (a float64 model missed every stuck and frozen row of a float32 copy)."""
    rng = np.random.default_rng(4)
    X = _correlated(rng, 10_000, 6, 1.0)
    order = rng.permutation(len(X))
    stuck, frozen = order[:300], order[300:500]
    X[stuck, 2] = np.quantile(X[:, 2], 0.7)
    X[frozen] = X[order[600]]
    model = MCPCA().fit(X)
    assert len(model.repeated_values_) == 1 and len(model.repeated_rows_) == 1
    X32 = X.astype(np.float32)
    assert not np.any(X32[stuck, 2] == model.repeated_values_[0, 1])  # float32 holds it rounded
    flags = np.asarray(model.is_outlier(X32))
    assert flags[stuck].all() and flags[frozen].all()
    np.testing.assert_array_equal(flags, np.asarray(model.is_outlier(X)))
    np.testing.assert_array_equal(model.score_rows(X32, outputs=("top_channel",))["top_channel"][stuck], 2)


def test_stuck_on_a_quantized_channel_and_stuck_at_the_extreme_are_found():
    """On integer counts a stuck level holds 3 % where the model predicts 0.3 %; a value stuck at the
    column's maximum holds 3 % where the model's tail beyond it holds about 0.01 %."""
    X = _integers(3)
    rng = np.random.default_rng(3)
    stuck = rng.choice(len(X), 300, replace=False)
    Xf = X.copy()
    Xf[stuck, 4] = np.quantile(X[:, 4], 0.99)
    assert repeated_values(Xf).tolist() == [[4.0, Xf[stuck[0], 4]]]
    Y = _correlated(rng, 10_000, 4, 1.0)
    Y[stuck, 1] = Y[:, 1].max()
    assert repeated_values(Y).tolist() == [[1.0, Y[stuck[0], 1]]]


def test_a_record_of_round_values_is_a_set_point_not_a_frozen_record():
    """The trade-off: a logger frozen on a record of zeros (or of values 100 times coarser than each
    channel's resolution) is taken for an idle device; the same record with measured values is frozen."""
    X = _idle(0, 0.02)
    assert len(repeated_rows(X)) == 0
    np.testing.assert_array_equal(repeated_rows(X, set_points=True), np.zeros((1, 5)))
    Y = X.copy()
    Y[np.all(X == 0, axis=1)] = X[np.all(X != 0, axis=1)][0]
    assert len(repeated_rows(Y)) == 1


@pytest.mark.parametrize("share", [0.15, 0.3, 0.45])
def test_a_measured_value_stuck_over_a_large_share_of_a_continuous_channel_is_found(share):
    """A stretch stuck at the 99th percentile over 15-45 % of the rows (a stretch of 10-20 % of an archive
    is 25-50 % of a smaller mode's rows): the channel repeats no other value, so the held value is a
    sensor's that stopped, not a regime; every stuck row is flagged."""
    rng = np.random.default_rng(11)
    X = _correlated(rng, 10_000, 5, 1.0)
    rows = np.arange(2000, 2000 + int(share * len(X)))
    X[rows, 3] = np.quantile(X[:, 3], 0.99)
    assert repeated_values(X).tolist() == [[3.0, X[rows[0], 3]]]
    model = MCPCA().fit(X)
    flags = np.asarray(model.is_outlier(X))
    assert flags[rows].all()
    assert np.delete(flags, rows).mean() <= 0.01


def _held(value, share, seed=12, n=10_000):
    """Continuous channels, channel 1 holding ``value`` in ``share`` of the rows (scattered)."""
    rng = np.random.default_rng(seed)
    X = 20 + _correlated(rng, n, 4, 1.0)
    X[rng.choice(n, int(share * n), replace=False), 1] = value
    return X


@pytest.mark.parametrize(("case", "X"), [
    ("zeros on one channel, 30 %", _held(0.0, 0.3)),
    ("a set point spelled round, 30 %", _held(20.5, 0.3)),
    ("a measured value, half of the rows", _held(20.123456789012345, 0.5)),
    ("an ADC at rest (one level in ~90 % of the rows) beside it", np.column_stack(
        [_held(20.5, 0.0), np.round(500 + 0.3 * np.random.default_rng(1).normal(size=10_000))])),
    ("a quantized channel (tenths) at a value 30 % of the time", np.round(_held(20.4, 0.3), 1)),
    ("a float32 recording's set point 20.3 (20.299999237060547 in float64), 30 %",
     _held(np.float32(20.3), 0.3).astype(np.float32).astype(np.float64)),
])
def test_a_regime_held_by_many_rows_is_no_stuck_value(case, X):
    """Over 10 % of the rows, a value is a regime when it is 0, round (a set point), held by half of the
    rows or more, or on a channel that repeats its other values too (quantized)."""
    assert len(repeated_values(X)) == 0, case


def test_a_float32_recording_stuck_over_a_large_share_is_found():
    """Spelled as written (float32), a measured value needs the digits of the channel's other values."""
    X = _held(0.0, 0.0).astype(np.float32)
    rows = np.arange(1000, 4000)
    X[rows, 1] = np.quantile(X[:, 1], 0.99)
    X = X.astype(np.float64)
    assert repeated_values(X).tolist() == [[1.0, X[rows[0], 1]]]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_under_robust_scales_a_set_point_stays_a_regime_and_a_stuck_value_a_fault(dtype):
    """``scale="robust"`` divides each channel by a scale that is no power of ten: the fit reads a held
    value's spelling as stored, so a set point 20.5 (20.3 in float32) over 30 % of the rows is not
    flagged, while a measured value held over the same share is."""
    set_point = 20.5 if dtype == np.float64 else float(np.float32(20.3))
    X = _held(set_point, 0.3).astype(dtype).astype(np.float64)
    flags = np.asarray(MCPCA(scale="robust").fit(X).is_outlier(X))
    assert flags.mean() <= 0.01  # the set point's rows are the regime
    Y = _held(0.0, 0.0).astype(dtype).astype(np.float64)
    rows = np.arange(1000, 4000)
    Y[rows, 1] = np.quantile(Y[:, 1], 0.99)
    flags = np.asarray(MCPCA(scale="robust").fit(Y).is_outlier(Y))
    assert flags[rows].all() and np.delete(flags, rows).mean() <= 0.01


def _held_twice_by_sorting(X):
    """Per column: does some value other than NaN occur twice or more (``np.unique``'s counts)."""
    return np.array([(np.unique(c[~np.isnan(c)], return_counts=True)[1] >= 2).any() for c in X.T])


@pytest.mark.parametrize("seed", range(4))
def test_the_tie_screen_names_exactly_the_columns_np_unique_finds_a_value_twice_in(seed):
    from dask_mcpca._tied import column_ties

    def tied_columns(X):
        return column_ties(X).most >= 2

    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 3000))
    X = rng.standard_normal((n, 12)) * rng.uniform(1e-3, 1e3, 12)
    X[:, 1] = np.round(X[:, 1])  # quantized
    X[:, 2] = np.nan  # offline
    if n > 2:
        X[0, 3], X[1, 3] = 0.0, -0.0  # the two zeros are one value
        X[0, 4] = X[1, 4] = np.inf
        X[[0, 1], 5] = np.nan  # two NaN: no value held twice
        X[n - 1, 6] = X[n // 2, 6]  # one tie among continuous values
        X[:, 7] = np.where(rng.random(n) < 0.5, np.nan, np.round(X[:, 7], 1))
    expected = _held_twice_by_sorting(X)
    assert expected[1] and not expected[2]
    np.testing.assert_array_equal(tied_columns(X), expected)
    np.testing.assert_array_equal(tied_columns(X.astype(np.float32)), _held_twice_by_sorting(X.astype(np.float32)))
    np.testing.assert_array_equal(tied_columns(np.asfortranarray(X)), expected)
    assert tied_columns(X[:0]).shape == (12,) and not tied_columns(X[:1]).any()


@pytest.mark.parametrize("seed", range(6))
def test_the_tie_counts_are_np_uniques(seed):
    """Per column: cells holding a value (not NaN), the most cells on one value, the same over finite
    values, and the finite cells on a value held twice or more, as np.unique's counts give them."""
    from dask_mcpca._tied import column_ties

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    X = rng.standard_normal((n, 9))
    X[:, 1] = np.round(X[:, 1])  # a lattice
    X[:, 2] = np.nan  # offline
    X[: n // 3, 3] = np.inf  # inf counts as a value, not as a finite one
    X[:, 4] = np.where(rng.random(n) < 0.3, np.nan, np.round(X[:, 4], 1))
    X[0, 5], X[-1, 5] = -0.0, 0.0  # one value (when n > 1)
    X[: n // 2, 6] = 7.25  # held by half the rows
    for A in (X, X.astype(np.float32)):
        expected = []
        for column in A.T:
            values, counts = np.unique(column[~np.isnan(column)], return_counts=True)
            finite = counts[np.isfinite(values)]
            expected.append([counts.sum(), counts.max(initial=0), finite.sum(), finite.max(initial=0),
                             finite[finite >= 2].sum()])
        np.testing.assert_array_equal(np.array(column_ties(A)), np.array(expected).T)


@pytest.mark.parametrize("cores", [1, 3])
def test_the_tie_screen_splits_wide_samples_by_columns_and_keeps_their_order(cores, monkeypatch):
    import dask_mcpca._tied as tied

    monkeypatch.setattr(tied, "usable_cores", lambda: cores)  # runs of 34, 33 and 33 columns on 3 cores
    X = np.random.default_rng(5).standard_normal((500, 100))
    for column in (0, 33, 34, 66, 67, 99):
        X[7, column] = X[400, column]
    expected = np.isin(np.arange(100), (0, 33, 34, 66, 67, 99))
    np.testing.assert_array_equal(_held_twice_by_sorting(X), expected)
    np.testing.assert_array_equal(tied.column_ties(X).most >= 2, expected)
