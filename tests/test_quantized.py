"""Quantized channels: a reading says only that the value lies within half a step of it.

Known truth from generated data (the step is the rounding the test applies)
and the rule written out plainly here: the judged distance is the smaller of
the reading's and of the reading with each quantized value moved towards the
centre by up to half a step.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from dask_mcpca import MCPCA, load
from dask_mcpca._repeated import quantization_steps


def _adc_at_rest(seed: int, n: int = 8000, p: int = 5) -> np.ndarray:
    """An ADC at rest at one level per channel, noise 0.3 steps: 90 % of each channel's rows on one level."""
    rng = np.random.default_rng(seed)
    return np.round(rng.integers(100, 900, p) + 0.3 * rng.normal(size=(n, p)))


def test_quantization_steps_are_the_rounding_applied():
    rng = np.random.default_rng(0)
    X = np.column_stack([
        np.round(500 + 0.3 * rng.normal(size=5000)),  # an ADC at rest: step 1
        np.round(10 * rng.normal(size=5000)),  # integer counts: step 1
        np.round(rng.normal(size=5000), 1),  # rounded to 0.1
        4 * np.round(rng.normal(size=5000) * 3),  # step 4
        rng.normal(size=5000),  # continuous
    ])
    np.testing.assert_allclose(quantization_steps(X), [1.0, 1.0, 0.1, 4.0, 0.0], rtol=1e-9)


def test_an_adc_at_rest_is_not_flagged_and_its_spikes_are():
    for seed in range(3):
        X = _adc_at_rest(seed)
        model = MCPCA().fit(X)
        np.testing.assert_allclose(model.quantization_steps_, 1.0)
        assert np.mean(model.is_outlier(X)) <= 0.01
        spiked = X[:50].copy()
        spiked[:, 2] += 6  # six steps: 20 resting spreads
        assert model.is_outlier(spiked).all()


def test_continuous_data_are_judged_as_before():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(4000, 4)) @ rng.normal(size=(4, 4))
    model = MCPCA().fit(X)
    np.testing.assert_array_equal(model.quantization_steps_, 0.0)
    w = np.exp(-model.mahalanobis(X) / (2 * model.kernel_scale_**2))
    np.testing.assert_allclose(model.score_samples(X), w, rtol=1e-12)


def test_the_judged_distance_is_the_nearer_point_of_the_cells():
    rng = np.random.default_rng(2)
    X = np.round(rng.normal(size=(6000, 3)) @ np.array([[2.0, 1.0, 0.0], [0.0, 1.5, 0.5], [0.0, 0.0, 1.0]]))
    model = MCPCA().fit(X)
    steps = model.quantization_steps_
    assert np.all(steps == 1.0)
    P, mu = model.get_precision(), model.mean_
    rows = X[:200]
    Y = rows - mu
    moved = np.sign(Y) * np.maximum(np.abs(Y) - steps / 2, 0.0)
    d_raw = np.einsum("ij,jk,ik->i", Y, P, Y)
    d_moved = np.einsum("ij,jk,ik->i", moved, P, moved)
    judged = np.minimum(d_raw, d_moved)
    expected_flags = judged > model.outlier_cutoff_
    np.testing.assert_array_equal(model.is_outlier(rows), expected_flags)
    np.testing.assert_allclose(model.score_samples(rows), np.exp(-judged / (2 * model.kernel_scale_**2)), rtol=1e-9)
    np.testing.assert_allclose(model.mahalanobis(rows), d_raw, rtol=1e-9)  # the distance itself is the reading's


def test_quantization_steps_survive_save_and_load(tmp_path):
    model = MCPCA().fit(_adc_at_rest(0))
    path = tmp_path / "m.json"
    model.save(path)
    np.testing.assert_array_equal(load(path).quantization_steps_, model.quantization_steps_)
    document = json.loads(path.read_text())
    del document["attributes"]["quantization_steps_"]  # a file written before the steps were found,
    for name in [n for n in document["attributes"] if n.startswith("update_") or n == "n_samples_seen_"]:
        del document["attributes"][name]  # and so before partial_fit's sums, which came after them
    path.write_text(json.dumps(document))
    np.testing.assert_array_equal(load(path).quantization_steps_, 0.0)


def test_a_saturating_channel_is_judged_as_censored_at_its_limit():
    """Issue 33: a channel clipped at its range limit in 3 % of the rows.  Its clipped rows are
    flagged no more often than the same rows were before the clipping (they lie in the tail of
    the factors), instead of seven times as often; a reading at the limit that the other
    channels place far inside the range is still a fault."""
    from dask_mcpca.testing import clipped_channel

    X, clipped, sat, limit = clipped_channel()
    assert np.isclose(sat.mean(), 0.03, atol=1e-3) and (clipped[sat, 2] == limit).all()
    before = np.asarray(MCPCA().fit(X).is_outlier(X))
    model = MCPCA().fit(clipped)
    assert model.saturation_limits_[2, 1] == limit and np.isnan(model.saturation_limits_[2, 0])
    assert np.isnan(np.delete(model.saturation_limits_, 2, axis=0)).all()
    flags = np.asarray(model.is_outlier(clipped))
    assert flags[sat].mean() <= 1.5 * before[sat].mean()
    assert flags[~sat].mean() <= 1.5 * before[~sat].mean()
    low = np.argsort(X[:, 2])[:200]  # rows whose channel 2 lies far below the limit
    stuck = clipped[low].copy()
    stuck[:, 2] = limit
    assert np.asarray(model.is_outlier(stuck)).mean() >= 0.95


@pytest.mark.parametrize("own_noise", [False, True])
def test_saturated_clean_rows_are_flagged_as_often_as_the_others(own_noise):
    """Issue 33's target: the clean rows at a channel's limit flagged within 2x of the other clean rows.
    Where the clipped channel follows the factors, its top 3 % are the factors' tail: judged on the
    other cells alone (the censored cell left out) they were flagged 3.4x as often.  Three draws
    pooled (about 3,600 clipped rows)."""
    from dask_mcpca.testing import clipped_channel

    at_limit, others = [], []
    for seed in (1, 2, 3):
        _, clipped, sat, _ = clipped_channel(own_noise=own_noise, seed=seed)
        flags = np.asarray(MCPCA().fit(clipped).is_outlier(clipped))
        at_limit.append(flags[sat])
        others.append(flags[~sat])
    assert np.concatenate(at_limit).mean() <= 2.0 * np.concatenate(others).mean()


def test_a_censored_row_is_judged_given_the_quantity_beyond_the_limit():
    """The rule written out plainly, with the fitted model's own covariance: a row whose channel j sits
    at its upper limit L gets ``min over t >= L of d2(x with x_j = t)`` less ``min over t >= L of
    (t - mean_j)^2 / C_jj`` (what any reading beyond the limit costs on its own), judged on all p
    channels, or its distance as read where that is nearer.  Expected flags from scipy's bounded
    minimisation, on the clipped rows the other cells place at the limit: a quarter of them with a
    fault on another channel, a quarter with the factors pushed far along channel j's direction (a
    process excursion the limit hides; leaving the cell out charged it, the excess beyond the limit
    must be charged too)."""
    from scipy import optimize

    from dask_mcpca.testing import clipped_channel

    _, clipped, sat, limit = clipped_channel(n=20_000)
    model = MCPCA().fit(clipped)
    C, mu, j, p = model.get_covariance(), model.mean_, 2, clipped.shape[1]
    P = np.linalg.inv(C)
    other = np.arange(p) != j
    beta = np.linalg.solve(C[np.ix_(other, other)], C[other, j])
    rows = clipped[sat & ((clipped[:, other] - mu[other]) @ beta + mu[j] >= limit)]
    rows[::4, 5] += 3 * np.sqrt(C[5, 5])  # a fault in a quarter of them, so both sides of the cutoff are seen
    rows[1::4] += 4 * C[:, j] / np.sqrt(C[j, j])  # an excursion along channel j's direction, 4 SDs further out
    rows[:, j] = limit

    def full(t, x):
        y = x - mu
        y[j] = t - mu[j]
        return y @ P @ y

    own = max(limit - mu[j], 0.0) ** 2 / C[j, j]
    expected = []
    for x in rows:
        least = optimize.minimize_scalar(full, bounds=(limit, limit + 50 * np.sqrt(C[j, j])), args=(x.copy(),),
                                         method="bounded", options={"xatol": 1e-10}).fun
        expected.append(min(least - own, (x - mu) @ P @ (x - mu)))
    expected = np.array(expected)
    clear = np.abs(expected / model.outlier_cutoff_ - 1) > 0.01
    assert clear.sum() >= 0.95 * len(rows) and len(rows) >= 300
    # each row alone: a row rule is tested, and these rows (a fault in every fourth) are no time series
    flags = np.concatenate([model.is_outlier(row[None]) for row in rows])
    np.testing.assert_array_equal(flags[clear], (expected > model.outlier_cutoff_)[clear])
    assert flags[1::4].mean() >= 0.95  # the excursions are seen
    assert flags[2::4].mean() <= 0.05  # the clean ones mostly not


@pytest.mark.parametrize("scale", [None, "robust"])
def test_a_float32_copy_is_censored_at_the_limit_its_float64_recording_taught(scale):
    """A model fitted on a float64 recording scores its float32 copy: the copy's cells at the limit hold the
    float32 rounding of the learned limit, which an exact comparison did not take for the limit (more of the
    clipped rows flagged than in the recording).  Expected: the copy's flags are the recording's."""
    from dask_mcpca.testing import clipped_channel

    _, clipped, sat, limit = clipped_channel()
    assert np.float32(limit) != limit  # the copy's cells are not the limit exactly
    model = MCPCA(scale=scale).fit(clipped)
    np.testing.assert_array_equal(np.asarray(model.is_outlier(clipped.astype(np.float32)))[sat],
                                  np.asarray(model.is_outlier(clipped))[sat])


def test_a_dead_channel_with_a_few_glitches_at_one_value_has_no_step():
    """Five rows at 85 on a channel held at 20 in 20,000: the glitch is no level (the fit of the same
    channel without the glitches has step 0), so the glitches and any new value off 20 are flagged; the
    glitch once became a step of 65, whose floor and nearest-point rule hid every deviation up to 32."""
    rng = np.random.default_rng(0)
    F = rng.normal(size=(20_000, 2))
    X = F @ rng.normal(size=(2, 6)) + 0.3 * rng.normal(size=(20_000, 6)) + 10
    X[:, 2] = 20.0
    glitches = [500, 4000, 9000, 13000, 17000]
    X[glitches, 2] = 85.0
    model = MCPCA(random_state=0).fit(X)
    assert model.quantization_steps_[2] == 0.0
    assert model.is_outlier(X)[glitches].all()
    new = X[:4].copy()
    new[:, 2] = [20.0, 30.0, 50.0, 85.0]
    np.testing.assert_array_equal(model.is_outlier(new), [False, True, True, True])


def test_a_float32_copy_of_a_channel_rounded_to_tenths_keeps_its_step():
    """Values rounded to 0.1 near 1000, stored as float32: their gaps are off by a float32 spacing
    (0.0999756, 0.1000366), beyond the step rule's 1e-6, so the channel was taken as continuous.
    Expected from the construction: a step of 0.1 (to float32's resolution), as in float64."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20_000, 4)) @ rng.normal(size=(4, 4))
    X[:, 2] = np.round(1000 + 0.1 * X[:, 2] / X[:, 2].std(), 1)
    for dtype in (np.float64, np.float32):
        steps = MCPCA(random_state=0).fit(X.astype(dtype)).quantization_steps_
        assert steps[2] == pytest.approx(0.1, rel=1e-3), dtype
        assert not steps[[0, 1, 3]].any()


def test_the_least_distance_beyond_the_limits_is_scipys_bounded_minimum():
    """:func:`dask_mcpca._censored.least_beyond` (every set of cells held at their limits tried) against
    scipy's L-BFGS-B over the same box, for 1-3 censored cells, upper and lower limits mixed."""
    from scipy import optimize

    from dask_mcpca._censored import least_beyond

    rng = np.random.default_rng(0)
    for m in (1, 2, 3):
        B = rng.normal(size=(40, m, m))
        A = B @ B.transpose(0, 2, 1) + 0.1 * np.eye(m)
        c, limit = rng.normal(size=(40, m)), rng.normal(size=(40, m))
        upper = rng.random((40, m)) < 0.5
        got = least_beyond(A, c, limit, upper)
        for i in range(40):
            bounds = [(lo, None) if up else (None, lo) for lo, up in zip(limit[i], upper[i], strict=True)]
            Ai, ci = A[i], c[i]
            res = optimize.minimize(lambda t, Ai=Ai, ci=ci: (t - ci) @ Ai @ (t - ci), limit[i], bounds=bounds,
                                    jac=lambda t, Ai=Ai, ci=ci: 2 * Ai @ (t - ci), method="L-BFGS-B",
                                    options={"ftol": 1e-15, "gtol": 1e-12})
            assert got[i] == pytest.approx(res.fun, rel=1e-6, abs=1e-9)


def test_rows_with_two_saturated_channels_are_flagged_as_often_as_the_others():
    """Two channels that follow the factors, each clipped at its 97th percentile: the rows where both
    saturate (about 1 % of the rows, the factors' far tail) were flagged ten times as often as the
    clean rows when both cells were left out."""
    both_flagged, others = [], []
    for seed in (1, 2):
        rng = np.random.default_rng(seed)
        loadings = rng.normal(size=(16, 3))
        X = rng.normal(size=(40_000, 3)) @ loadings.T + 0.2 * rng.normal(size=(40_000, 16))
        at = np.zeros(X.shape, bool)
        for j in (2, 7):
            limit = np.quantile(X[:, j], 0.97)
            at[:, j] = X[:, j] >= limit
            X[at[:, j], j] = limit
        flags = np.asarray(MCPCA().fit(X).is_outlier(X))
        both = at[:, 2] & at[:, 7]
        both_flagged.append(flags[both])
        others.append(flags[~at.any(axis=1)])
    assert len(np.concatenate(both_flagged)) >= 800
    assert np.concatenate(both_flagged).mean() <= 2.0 * np.concatenate(others).mean()


def test_a_reading_inside_the_limit_is_not_at_it_whatever_the_channels_offset():
    """The same clipped channel written with an offset of 1e5 and a spread of 1e-3 (a pressure in kPa):
    2**-23 of the limit is 13 spreads, so a reading 8 spreads inside the limit counted as at it, was
    judged as censored and a fault there was missed (0 of 300 flagged against 300 at offset 0).  Known
    truth: the readings 8 channel SDs low are faults, at either offset."""
    from dask_mcpca.testing import clipped_channel

    X, clipped, sat, _ = clipped_channel(n=20_000)
    near = np.flatnonzero(~sat & (X[:, 2] > np.quantile(X[:, 2], 0.90)))[:300]
    sd = X[:, 2].std()
    for offset, unit in ((0.0, 1.0), (1e5, 1e-3)):
        shifted = clipped.copy()
        shifted[:, 2] = offset + unit * clipped[:, 2]
        model = MCPCA(random_state=0).fit(shifted)
        rows = shifted[near].copy()
        rows[:, 2] = model.saturation_limits_[2, 1] - 8 * unit * sd
        assert np.asarray(model.is_outlier(rows)).mean() >= 0.99, offset


def test_a_clipped_channel_beside_a_state_channel_is_no_frozen_record():
    """A flow that follows a valve's state (0 or 1) and is clipped at the top of its range: the rows at
    the limit repeat exactly (the limit, state 1), and the whole-row rule took them for a frozen logger's
    record, all 600 flagged.  Known truth: they are clean; a record really replayed over 300 rows, its
    flow inside the range, is still one."""
    rng = np.random.default_rng(0)
    state = rng.integers(0, 2, 20_000).astype(float)
    flow = 3.0 * state + rng.normal(size=20_000)
    flow = np.minimum(flow, np.quantile(flow, 0.97))
    X = np.column_stack([flow, state])
    model = MCPCA(random_state=0).fit(X)
    at = X[:, 0] == model.saturation_limits_[0, 1]
    assert at.sum() == 600 and len(model.repeated_rows_) == 0
    assert np.asarray(model.is_outlier(X))[at].mean() <= 0.01
    frozen = X.copy()
    frozen[5000:5300] = [1.234567, 1.0]
    model = MCPCA(random_state=0).fit(frozen)
    assert [1.234567, 1.0] in model.repeated_rows_.tolist()
    assert np.asarray(model.is_outlier(frozen))[5000:5300].all()


def test_a_float32_copy_of_a_narrow_channel_far_from_zero_keeps_its_limit():
    """A channel near 1000 with spread ~0.02, clipped at its 97th percentile: its float32 copy holds the limit
    3e-5 off (half a float32 step), beyond a thousandth of its spread, and 85 of its 600 rows at the limit
    were flagged against 2 in float64.  Expected: the float64 recording's flags."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20_000, 2)) @ rng.normal(size=(2, 6)) + 0.3 * rng.normal(size=(20_000, 6))
    X[:, 2] = 1000.0 + 0.01 * X[:, 2]
    X[:, 2] = np.minimum(X[:, 2], np.quantile(X[:, 2], 0.97))
    model = MCPCA(random_state=0).fit(X)
    np.testing.assert_array_equal(np.asarray(model.is_outlier(X.astype(np.float32))), np.asarray(model.is_outlier(X)))


@pytest.mark.parametrize("q", [0.5, 0.97])
def test_a_frozen_record_in_a_channels_tail_is_still_a_record(q):
    """A valve's state and a flow that follows it; a record replayed over 300 rows whose flow lies at the
    q-quantile of the open state's flows: in the last 5 % it looked like a saturation limit to the rule
    that tells clipped rows from frozen records, and the record was missed.  Known truth: it is one."""
    rng = np.random.default_rng(0)
    state = rng.integers(0, 2, 20_000).astype(float)
    flow = 3.0 * state + rng.normal(size=20_000)
    X = np.column_stack([flow, state])
    X[5000:5300] = [np.quantile(flow[state == 1], q), 1.0]
    model = MCPCA(random_state=0).fit(X)
    assert X[5000].tolist() in model.repeated_rows_.tolist()
    assert np.asarray(model.is_outlier(X))[5000:5300].all()
