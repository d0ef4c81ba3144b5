"""Operating modes (``modes``): one robust model per state of the machine, fitted in shared passes.

Expected values come from the generated truth (which state, which rows
are faulty) and from single-mode fits of each state's rows alone, the
estimator without modes, which the rest of the suite checks against
independent references.
"""

import dask.array as da
import numpy as np
import pytest

from dask_mcpca import MCPCA


def _state(rng, n, mean, scales, rotation):
    return (rng.normal(size=(n, len(mean))) * scales) @ rotation.T + mean


def two_states(seed=0, n=(6000, 4000), p=5):
    """Two operating states of one machine: every channel moves between them (a state, not a fault)."""
    rng = np.random.default_rng(seed)
    q1, _ = np.linalg.qr(rng.normal(size=(p, p)))
    q2, _ = np.linalg.qr(rng.normal(size=(p, p)))
    a = _state(rng, n[0], np.zeros(p), np.linspace(3, 0.5, p), q1)
    b = _state(rng, n[1], np.linspace(12, -9, p), np.linspace(2, 0.3, p), q2)
    return np.concatenate([a, b]), np.r_[np.zeros(n[0], int), np.ones(n[1], int)]


def test_auto_finds_both_states_and_flags_neither():
    X, truth = two_states()
    one = MCPCA().fit(X)
    assert one.is_outlier(X)[truth == 1].mean() > 0.9  # one model flags the smaller state whole
    model = MCPCA(modes="auto").fit(X)
    assert model.n_modes_ == 2
    np.testing.assert_allclose(model.mode_weights_, [0.6, 0.4], atol=0.01)
    assert np.mean(model.predict_mode(X) == truth) > 0.999
    assert model.is_outlier(X).mean() < 0.02
    d = model.decision_function(X)
    np.testing.assert_array_equal(d < 0, model.is_outlier(X))
    np.testing.assert_array_equal(model.predict(X) == -1, model.is_outlier(X))


def test_given_labels_fit_each_mode_as_its_rows_alone():
    X, truth = two_states(seed=1)
    model = MCPCA().fit(X, modes=np.where(truth == 0, "idle", "load"))
    assert list(model.modes_) == ["idle", "load"]
    for m in range(len(model.modes_)):
        alone = MCPCA().fit(X[truth == m])
        mine = model.mode_models_[m]
        np.testing.assert_allclose(mine.mean_, alone.mean_, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.abs(mine.components_), np.abs(alone.components_), atol=1e-10)
        np.testing.assert_allclose(mine.outlier_cutoff_, alone.outlier_cutoff_, rtol=1e-12)
    # the passes are shared: the fit reads the data as often as its slowest mode does
    assert model.n_passes_ == max(m.n_passes_ for m in model.mode_models_)
    assert model.n_passes_ <= 4


def test_dask_input_gives_the_same_modes_and_flags():
    X, truth = two_states(seed=2)
    labels = np.where(truth == 0, 3, 7)
    mem = MCPCA().fit(X, modes=labels)
    lazy = MCPCA().fit(da.from_array(X, chunks=1000), modes=labels)
    assert lazy.n_passes_ == mem.n_passes_
    for a, b in zip(mem.mode_models_, lazy.mode_models_, strict=True):
        np.testing.assert_allclose(a.mean_, b.mean_, rtol=1e-9)
        np.testing.assert_allclose(a.explained_variance_, b.explained_variance_, rtol=1e-9)
    np.testing.assert_array_equal(lazy.is_outlier(da.from_array(X, chunks=1000)).compute(), mem.is_outlier(X))


def test_same_data_same_model_in_threads():
    X, _ = two_states(seed=4)
    Xd = da.from_array(X, chunks=700)
    a, b = MCPCA(modes="auto").fit(Xd), MCPCA(modes="auto").fit(Xd)
    assert a.n_modes_ == 2
    for ma, mb in zip(a.mode_models_, b.mode_models_, strict=True):
        np.testing.assert_array_equal(ma.components_, mb.components_)
        np.testing.assert_array_equal(ma.mean_, mb.mean_)


def test_one_state_auto_is_the_fit_without_modes():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(5000, 6)) * [5, 3, 2, 1, 1, 0.5]
    auto, none = MCPCA(modes="auto").fit(X), MCPCA().fit(X)
    assert not hasattr(auto, "n_modes_")
    np.testing.assert_array_equal(auto.components_, none.components_)
    np.testing.assert_array_equal(auto.outlier_cutoff_, none.outlier_cutoff_)
    assert auto.n_passes_ == none.n_passes_


def _fault(X, rows, kind, channel, rng):
    X = X.copy()
    sd = X[:, channel].std()
    if kind == "bias":
        X[rows, channel] += 8 * sd
    elif kind == "stuck":
        X[rows, channel] = np.quantile(X[:, channel], 0.99)
    elif kind == "drift":
        X[rows, channel] += np.linspace(0, 12 * sd, len(rows))
    elif kind == "spike":
        X[rows, channel] += rng.choice([-1, 1], len(rows)) * rng.uniform(8, 15, len(rows)) * sd
    return X


@pytest.mark.parametrize(("kind", "share"), [("bias", 0.05), ("bias", 0.15), ("drift", 0.05), ("drift", 0.15),
                                             ("stuck", 0.05), ("stuck", 0.09), ("stuck", 0.15), ("stuck", 0.25)])
def test_a_fault_on_one_channel_is_not_a_mode(kind, share):
    # a measured value held by more than MAX_REPEATED_SHARE (10 %) of a continuous channel's rows is
    # still a stuck sensor's (below 50 %): the channel repeats no other value
    rng = np.random.default_rng(5)
    X = rng.normal(size=(8000, 6)) @ np.linalg.qr(rng.normal(size=(6, 6)))[0] * 2
    rows = np.arange(2000, 2000 + int(share * len(X)))
    faulty = _fault(X, rows, kind, 2, rng)
    model = MCPCA(modes="auto").fit(faulty)
    assert getattr(model, "n_modes_", 1) == 1
    flags = model.is_outlier(faulty)
    late = rows[len(rows) // 2 :] if kind == "drift" else rows  # a drift starts inside the noise
    assert flags[late].mean() >= 0.8
    assert np.delete(flags, rows).mean() < 0.05


def test_a_swap_is_not_a_mode():
    rng = np.random.default_rng(6)
    X = rng.normal(size=(8000, 5)) + [0, 20, 0, 0, -20]
    rows = np.arange(1000, 2200)
    X[np.ix_(rows, [1, 4])] = X[np.ix_(rows, [4, 1])]
    model = MCPCA(modes="auto").fit(X)
    assert getattr(model, "n_modes_", 1) == 1
    assert model.is_outlier(X)[rows].mean() > 0.95


@pytest.mark.parametrize("kind", ["spike", "bias", "stuck", "drift"])
def test_faults_in_a_two_state_recording_are_found(kind):
    X, truth = two_states(seed=7)
    rng = np.random.default_rng(7)
    rows = np.arange(7000, 7300) if kind != "spike" else rng.choice(len(X), 200, replace=False)
    faulty = _fault(X, rows, kind, 1, rng)
    model = MCPCA(modes="auto").fit(faulty)
    assert model.n_modes_ == 2
    flags = model.is_outlier(faulty)
    late = rows[len(rows) // 2 :] if kind == "drift" else rows
    assert flags[late].mean() >= 0.8
    assert np.delete(flags, rows).mean() <= 0.05


def test_modes_refuse_what_is_not_built_for_them():
    X, truth = two_states(seed=8, n=(600, 400))
    model = MCPCA().fit(X, modes=truth)
    for call in (lambda: model.transform(X), lambda: model.score_rows(X, outputs=("scores",))):
        with pytest.raises(NotImplementedError, match="operating modes"):
            call()
    with pytest.raises(ValueError, match="solver='auto'"):
        MCPCA(solver="paper").fit(X, modes=truth)
    with pytest.raises(ValueError, match="one label per row"):
        MCPCA().fit(X, modes=truth[:10])
    with pytest.raises(ValueError, match="modes"):
        MCPCA(modes="many").fit(X)
    refit = MCPCA().fit(X)
    assert not hasattr(refit, "mode_models_")


def test_modes_from_a_state_channel_of_a_dataarray():
    xr = pytest.importorskip("xarray")
    X, truth = two_states(seed=0)
    channels = [f"c{i}" for i in range(X.shape[1])]
    archive = xr.DataArray(np.column_stack([X, truth]), dims=("time", "channel"),
                           coords={"channel": [*channels, "state"]})
    model = MCPCA().fit(archive, modes="state")
    assert list(model.feature_names_in_) == channels  # the state channel is not fitted
    assert list(model.modes_) == [0.0, 1.0]
    np.testing.assert_array_equal(model.predict_mode(archive.sel(channel=channels)), truth)
    with pytest.raises(ValueError, match="no such channel"):
        MCPCA().fit(archive, modes="valve")
    with pytest.raises(ValueError, match="needs a DataArray"):
        MCPCA().fit(X, modes="state")


def test_given_modes_do_not_depend_on_the_blocks():
    """Each mode's row sample is drawn by the rows' global indices: any chunking, the same model."""
    X, truth = two_states(seed=9, n=(30_000, 20_000), p=4)
    fits = [MCPCA(sample_size=4000).fit(da.from_array(X, chunks=c), modes=truth) for c in (50_000, 7_000, 3_333)]
    for other in fits[1:]:
        for a, b in zip(fits[0].mode_models_, other.mode_models_, strict=True):
            np.testing.assert_allclose(a.mean_, b.mean_, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(a.explained_variance_, b.explained_variance_, rtol=1e-9)
            np.testing.assert_allclose(a.outlier_cutoff_, b.outlier_cutoff_, rtol=1e-9)


def test_partial_fit_updates_each_mode_by_its_rows():
    """An update by the second half of the rows gives each mode the fit of all its rows (sampling noise)."""
    X, truth = two_states(seed=0, n=(30_000, 20_000))
    order = np.random.default_rng(0).permutation(len(X))
    X, truth = X[order], truth[order]
    half = len(X) // 2
    model = MCPCA(modes="auto").fit(X[:half])
    model.partial_fit(da.from_array(X[half:], chunks=5_000))
    assert model.n_passes_ == 3  # the rows sent to their modes, then one pass per mode
    np.testing.assert_allclose(model.mode_weights_, [0.6, 0.4], atol=1e-12)
    for m in range(2):  # each mode against PCA of all of its rows, the truth's grouping
        rows = X[truth == m]
        np.testing.assert_allclose(model.mode_models_[m].mean_, rows.mean(axis=0), atol=0.05)
        pca = np.sort(np.linalg.eigvalsh(np.cov(rows, rowvar=False)))[::-1]
        np.testing.assert_allclose(model.mode_models_[m].explained_variance_, pca, rtol=0.05)
    assert model.is_outlier(X).mean() < 0.01
    np.testing.assert_array_equal(model.predict_mode(X), truth)


def _adc(seed, n=10_000, p=5, moving=0.2, stretch=500):
    """Continuous channels beside an ADC at rest at one level (noise 0.3 steps, rounded) that moves (sd 8
    steps) in ``moving`` of the rows, in stretches: two states, told apart by the ADC alone."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2)) @ rng.normal(size=(p, 2)).T + 0.3 * rng.normal(size=(n, p))
    on = np.zeros(n, bool)
    for start in rng.choice(np.arange(0, n - stretch, stretch), int(moving * n / stretch), replace=False):
        on[start : start + stretch] = True
    level = 500 + 0.3 * rng.normal(size=n)
    level[on] = 500 + 8 * rng.normal(size=on.sum())
    return np.column_stack([X, np.round(level)]), on


@pytest.mark.parametrize("share", [0.1, 0.2])
def test_a_stretch_stuck_over_a_large_share_of_a_smaller_mode_is_found(share):
    """A channel stuck at its 99th percentile over 10-20 % of the rows, in one stretch across both states
    (mode 1 holds 40 % of the rows, so the stretch is 25-50 % of its rows there): every stuck row flagged,
    in both modes; the regime of the ADC at rest (one level in ~90 % of its mode's rows) is no fault."""
    X, truth = two_states(seed=7, n=(6000, 4000))
    order = np.random.default_rng(3).permutation(len(X))  # the states interleaved, as a machine visits them
    X, truth = X[order], truth[order]
    rows = np.arange(1000, 1000 + int(share * len(X)))
    faulty = X.copy()
    faulty[rows, 2] = np.quantile(X[rows, 2], 0.99)
    model = MCPCA(modes="auto").fit(faulty)
    assert model.n_modes_ == 2
    for sub in model.mode_models_:
        np.testing.assert_array_equal(sub.repeated_values_, [[2.0, faulty[rows[0], 2]]])
    flags = model.is_outlier(faulty)
    assert flags[rows].all()
    assert np.delete(flags, rows).mean() <= 0.01


def test_a_stuck_channel_beside_an_adc_that_moves_is_found():
    """The ADC moves 20 % of the time (a mode); a continuous channel stuck over 20 % of the rows in one
    stretch: every stuck row flagged, and the ADC's resting level is no stuck value."""
    X, on = _adc(2)
    rows = np.arange(3000, 5000)
    faulty = X.copy()
    faulty[rows, 1] = np.quantile(X[rows, 1], 0.99)
    model = MCPCA(modes="auto").fit(faulty)
    assert model.n_modes_ == 2
    assert all(5 not in sub.repeated_values_[:, 0] for sub in model.mode_models_)
    flags = model.is_outlier(faulty)
    assert flags[rows].mean() >= 0.95
    assert np.delete(flags, rows).mean() <= 0.01


@pytest.mark.parametrize("seed", [1, 4])
def test_a_bias_left_with_a_device_switching_on_does_not_hide_its_mode(seed):
    """A 4-SD bias on a continuous channel over 15 % of the rows: the rows no state explains are the
    bias's and the moving ADC's, fitted as one group that is no state.  The bias's rows (to one side of
    the state on their channel) are set aside and the ADC's rows fitted again: two modes, every biased
    row flagged, the untouched rows not (one mode flagged 12-14 % of them)."""
    X, on = _adc(seed)
    rows = np.arange(2000, 3500)
    faulty = X.copy()
    faulty[rows, 2] += 4 * X[~on, 2].std()
    model = MCPCA(modes="auto").fit(faulty)
    assert model.n_modes_ == 2
    flags = model.is_outlier(faulty)
    assert flags[rows].mean() >= 0.95
    assert np.delete(flags, rows).mean() <= 0.01


def test_a_handful_of_fault_rows_sets_the_whole_group_aside(monkeypatch):
    """An 8-SD bias over 15 % of a one-state archive (1,200 of 8,000 rows): the state's fit, then one fit
    of the biased rows, which are no state.  Where the rows found departing to one side are fewer than
    a state needs (here made 5, TIGHT_MIN_ROWS), the whole group is set aside: still two fits, not one
    fit per 5 rows set aside (about 160 before)."""
    from dask_mcpca import _fit_modes

    rng = np.random.default_rng(5)
    X = rng.normal(size=(8000, 6)) @ np.linalg.qr(rng.normal(size=(6, 6)))[0] * 2
    faulty = _fault(X, np.arange(2000, 3200), "bias", 2, rng)
    fault_rows = _fit_modes._fault_rows
    monkeypatch.setattr(_fit_modes, "_fault_rows", lambda z, group, states: fault_rows(z, group, states)[:5])
    fits = []
    fit = MCPCA.fit
    monkeypatch.setattr(MCPCA, "fit", lambda self, *a, **k: fits.append(1) or fit(self, *a, **k))
    assert _fit_modes.find_modes(faulty, MCPCA()) is None
    assert len(fits) == 2


def test_a_stuck_stretch_does_not_join_two_states_into_one():
    """Three states (55/30/15 %, each its own centre, axes and spread, visited in stretches of 500 rows) and a
    channel stuck over 10 % of the rows, across the largest and the smallest state.  The robust start took the
    least outlying half with the stuck rows in it, which widened it over the second state: one fit took two
    states, and every row of the second (30 %) was flagged.  The stuck rows get no weight in the fit, so the
    start leaves them out too.  Expected from the construction: three modes, each state's rows sent to one
    mode of their own, under 1 % of the untouched rows flagged, the stuck stretch found."""
    rng = np.random.default_rng(4)
    n, p, stretch = 20_000, 8, 500
    order = rng.permutation(np.repeat(np.arange(3), np.round(np.array([0.55, 0.30, 0.15]) * n / stretch).astype(int)))
    truth = np.repeat(order, stretch)[:n]
    X = np.empty((n, p))
    for s in range(3):
        mean = rng.choice([-1, 1], p) * rng.uniform(6, 12, p) * (s > 0)
        basis, _ = np.linalg.qr(rng.normal(size=(p, p)))
        X[truth == s] = (rng.normal(size=((truth == s).sum(), p)) * np.geomspace(3, 0.3, p)) @ basis.T + mean
    stuck = np.arange(3666, 5666)
    assert set(truth[stuck]) == {0, 2}
    X[stuck, 4] = np.quantile(X[stuck, 4], 0.99)
    model = MCPCA(modes="auto").fit(X)
    assert model.n_modes_ == 3
    mode = np.asarray(model.predict_mode(X))
    assert all(len(np.unique(mode[truth == s])) == 1 for s in range(3)) and len(np.unique(mode)) == 3
    flags = np.asarray(model.is_outlier(X))
    untouched = np.ones(n, bool)
    untouched[stuck] = False
    assert flags[untouched].mean() < 0.01
    assert flags[stuck].mean() > 0.95
