"""The shifted-channel rule (``dask_mcpca/_shift.py``): a bias held over many rows, read in order.

Expected flags come from the rule written out plainly here (numpy's inverse of the model's
covariance, a loop over the rows), and from known truth in generated data: where a bias was
put, how long it lasted, which channel it was on.
"""

import json

import dask.array as da
import numpy as np
import pytest

from dask_mcpca import MCPCA, _shift, load

P = 6
WINDOW, CUTOFF, CLIP, PERCENTILE = 64, 5.0, 4.0, 90.0


def _factor_rows(n: int, seed: int) -> np.ndarray:
    """Two factors on six channels, each channel with its own noise: rows independent in time."""
    rng = np.random.default_rng(seed)
    loadings = rng.normal(size=(2, P))
    return rng.normal(size=(n, 2)) @ loadings + rng.normal(size=(n, P)) * rng.uniform(0.3, 1.0, P)


def _plain_means(model, X: np.ndarray) -> np.ndarray:
    """The mean clipped residual per channel over the last 64 rows up to each row, among it and the 255 before
    it, that the row rule does not flag, by a loop (NaN under 32 such rows); rows read from the first.  A mean
    over n < 64 rows is put on a 64-row mean's scale: times sqrt(n / 64)."""
    prec = np.linalg.inv(model.get_covariance())
    y = X - model.mean_
    kept = np.einsum("ij,jk,ik->i", y, prec, y) <= model.outlier_cutoff_
    r = np.clip(y @ prec / np.sqrt(np.diag(prec)), -CLIP, CLIP)
    out = np.full(X.shape, np.nan)
    for i in range(len(X)):
        span = np.arange(max(i - 4 * WINDOW + 1, 0), i + 1)
        window = span[kept[span]][-WINDOW:]
        if len(window) >= WINDOW // 2:
            out[i] = r[window].mean(axis=0) * np.sqrt(len(window) / WINDOW)
    return out


def _plain_named(means: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The cell the rule names in each row: of the channels whose mean is more than five scales from 0, the one
    whose mean is largest (none where no channel is)."""
    over = np.abs(means) / scale > CUTOFF
    size = np.where(over, np.abs(means), -1.0)
    return over & (size == size.max(axis=1, keepdims=True))


def _plain_scale(model, runs) -> np.ndarray:
    """The 90th percentile of the 64-row means' sizes (64 counted rows within the row's 256) over the runs of
    rows, each averaged on its own, over 1.645, at least half an independent mean's spread; where fewer than
    256 windows are full, of every mean the rule judges (32 rows or more, on a 64-row mean's scale)."""
    prec = np.linalg.inv(model.get_covariance())
    full, judged = [], []
    for rows in runs:
        kept = np.einsum("ij,jk,ik->i", rows - model.mean_, prec, rows - model.mean_) <= model.outlier_cutoff_
        whole = np.array([kept[max(i - 4 * WINDOW + 1, 0):i + 1].sum() >= WINDOW for i in range(len(rows))])
        means = _plain_means(model, rows)
        full.append(means[whole & kept])  # each window once: at the counted row it ends at
        judged.append(means[~np.isnan(means).any(axis=1) & kept])
    full, judged = np.concatenate(full), np.concatenate(judged)
    means = full if len(full) >= 4 * WINDOW else judged
    scale = np.percentile(np.abs(means), PERCENTILE, axis=0) / 1.6448536269514722
    return np.maximum(scale, 0.5 / np.sqrt(WINDOW))


def test_the_learned_scale_and_the_flags_are_the_rule_written_out():
    """``shift_scale_`` is the 90th percentile of the fitted rows' 64-row means (full windows only) over
    1.645, from 8 runs of rows evenly spread (a model on one in-memory block of 6,000
    rows: runs of 750, each its eighth); a cell is shifted where its mean is more than five of those from 0,
    and named where its mean is the largest of the row's channels beyond their cutoff."""
    X = _factor_rows(6_000, seed=1)
    model = MCPCA().fit(X)
    np.testing.assert_allclose(model.shift_scale_, _plain_scale(model, np.split(X, 8)), rtol=1e-7)
    Xf = X.copy()
    Xf[3_000:3_600, 2] += 1.2 * np.sqrt(model.get_covariance()[2, 2])
    shifted = _plain_named(_plain_means(model, Xf), model.shift_scale_)
    assert shifted[3_000:3_600, 2].mean() > 0.5  # the rule finds it, so the comparison below is not vacuous
    cells = np.asarray(model.cell_outliers(Xf))
    np.testing.assert_array_equal(cells[:, 2] | shifted[:, 2], cells[:, 2])  # every shifted cell is flagged
    flags = np.asarray(model.is_outlier(Xf))
    assert np.all(flags[shifted.any(axis=1)])


def test_a_bias_held_after_the_fit_is_found_and_named_and_clean_rows_are_left_alone():
    """A bias of one conditional SD on channel 4 over 2,000 rows after the fit: row by row inside the noise
    (the row distance finds few of its rows), over 64 rows eight spreads of the mean from 0."""
    X = _factor_rows(20_000, seed=2)
    model = MCPCA().fit(X[:10_000])
    later = X[10_000:].copy()
    clean_flags = np.asarray(model.is_outlier(later))
    sd = np.sqrt(1 / np.linalg.inv(model.get_covariance())[4, 4])  # channel 4's SD given the others
    later[4_000:6_000, 4] += sd
    flags = np.asarray(model.is_outlier(later))
    row_rule = np.asarray(model.mahalanobis(later)) > model.outlier_cutoff_
    assert row_rule[4_000:6_000].mean() < 0.2
    assert flags[4_000:6_000].mean() >= 0.9
    outside = np.r_[0:4_000, 6_100:10_000]  # after the bias, 100 rows for the window to leave it
    assert flags[outside].mean() <= clean_flags.mean() + 0.002
    cells = np.asarray(model.cell_outliers(later))
    assert cells[4_100:6_000, 4].mean() >= 0.95 and cells[4_100:6_000, [0, 1, 2, 3, 5]].mean() <= 0.01


def test_a_burst_of_gross_rows_does_not_make_the_rows_after_it_look_shifted():
    X = _factor_rows(12_000, seed=3)
    model = MCPCA().fit(X)
    Xf = X.copy()
    Xf[5_000:5_010] += 30 * X.std(axis=0)
    flags = np.asarray(model.is_outlier(Xf))
    assert flags[5_000:5_010].all()
    np.testing.assert_array_equal(flags[5_010:5_200], np.asarray(model.is_outlier(X))[5_010:5_200])


def test_verdicts_do_not_depend_on_the_blocks_and_do_not_change_when_rows_are_appended():
    X = _factor_rows(12_000, seed=4)
    model = MCPCA().fit(X)
    Xf = X.copy()
    Xf[6_000:7_000, 1] += 0.8 * X[:, 1].std()
    whole = np.asarray(model.is_outlier(Xf))
    assert whole[6_000:7_000].mean() > 0.5
    for chunks in (1_000, 777, 64):
        np.testing.assert_array_equal(model.is_outlier(da.from_array(Xf, chunks=(chunks, P))).compute(), whole)
    np.testing.assert_array_equal(np.asarray(model.is_outlier(Xf[:6_500])), whole[:6_500])


def test_the_scale_is_saved_and_checked_on_load(tmp_path):
    X = _factor_rows(5_000, seed=5)
    model = MCPCA().fit(X)
    assert model.shift_scale_.shape == (P,) and np.all(model.shift_scale_ > 0)
    model.save(tmp_path / "m.json")
    again = load(tmp_path / "m.json")
    np.testing.assert_array_equal(again.shift_scale_, model.shift_scale_)
    body = json.loads((tmp_path / "m.json").read_text())
    body["attributes"]["shift_scale_"].update(shape=[P - 1], data=body["attributes"]["shift_scale_"]["data"][:-1])
    (tmp_path / "bad.json").write_text(json.dumps(body))
    with pytest.raises(ValueError, match="shift_scale_ must be 6 finite floats > 0"):
        load(tmp_path / "bad.json")


def test_too_few_rows_learn_no_scale_and_judge_rows_alone():
    X = _factor_rows(200, seed=6)  # 200 rows: 8 runs of 25, none holding the 64 rows a mean needs
    model = MCPCA().fit(X)
    assert getattr(model, "shift_scale_", None) is None
    y = X - model.mean_
    d2 = np.einsum("ij,jk,ik->i", y, np.linalg.inv(model.get_covariance()), y)
    np.testing.assert_array_equal(np.asarray(model.is_outlier(X)), d2 > model.outlier_cutoff_)


@pytest.fixture(scope="module")
def plant():
    """A plant archive shaped as real ones are (a daily load cycle, slow AR(1) factors, a channel saturating at
    its 97th percentile for hours, a quantized one), no fault planted; a model of its first 7 days."""
    from dask_mcpca.testing import plant_archive

    archive = plant_archive(days=12, rows_per_day=720, outage=None, spikes=0, stuck=None, seed=1)
    return archive.X, MCPCA().fit(archive.X[: 7 * 720])


def test_a_channel_pinned_at_its_saturation_limit_for_hours_is_no_shift(plant):
    """Its reading sits below what the other channels predict while it is pinned: a censored residual, left
    out of the means (in them, 0.17 % of this archive's rows were shifted; 1.1-1.6 % of a 30-day one's)."""
    from dask_mcpca._shift import shifted_cells

    X, model = plant
    limited = np.flatnonzero(~np.isnan(model.saturation_limits_).all(axis=1))
    assert len(limited) == 1 and np.mean(X[:, limited[0]] >= np.nanmax(model.saturation_limits_[limited])) > 0.01
    assert shifted_cells(model, X, None).any(axis=1).mean() <= 0.0005


@pytest.mark.parametrize("channel", [2, 12, 20])
def test_a_bias_of_one_conditional_sd_for_a_day_of_a_plant_archive_is_found(plant, channel):
    X, model = plant
    day = slice(9 * 720, 10 * 720)
    Xf = X.copy()
    Xf[day, channel] += 1 / np.sqrt(model.get_precision()[channel, channel])
    flags = np.asarray(model.is_outlier(Xf))
    assert (np.asarray(model.mahalanobis(Xf[day])) > model.outlier_cutoff_).mean() <= 0.05  # the row rule's share
    assert flags[day].mean() >= 0.9
    cells = np.asarray(model.cell_outliers(Xf))[day]
    assert cells[64:, channel].mean() >= 0.9  # named, once its window is full


def test_a_fixed_contamination_has_no_shift_rule_adding_to_its_share():
    """``contamination=0.05`` flags that share of the fitted rows by distance; a shift would add to it."""
    X = _factor_rows(4_000, seed=7)
    X[2_000:2_600, 3] += 0.8 * X[:, 3].std()
    assert MCPCA().fit(X).shift_scale_ is not None
    model = MCPCA(contamination=0.05).fit(X)
    assert getattr(model, "shift_scale_", None) is None
    assert abs(np.mean(model.is_outlier(X)) - 0.05) <= 0.002


def test_the_compiled_sweep_and_the_numpy_spelling_give_the_same_cells(monkeypatch):
    """Bursts of gross rows (windows reaching back past them, some past their 256 rows), NaN rows, three
    biased stretches: the compiled ring of counted rows and numpy's ranks give the same verdicts, and both
    the plain loop's."""
    from dask_mcpca import _compiled

    if not _compiled.AVAILABLE:
        pytest.skip("numba is disabled: the numpy spelling is the only one")  # NUMBA_DISABLE_JIT=1 runs
    X = _factor_rows(9_000, seed=8)
    model = MCPCA().fit(X)
    rng = np.random.default_rng(8)
    Xf = X.copy()
    for start in (1_000, 4_000, 7_000):
        Xf[start:start + 700, rng.integers(P)] += rng.choice([-1, 1]) * X.std() * rng.uniform(0.5, 1.5)
    Xf[2_000:2_230] += 40 * X.std(axis=0)  # 230 gross rows: the windows after them reach back past them
    Xf[5_000:5_300:3] += 40 * X.std(axis=0)
    Xf[6_000:6_050:7, 2] = np.nan
    before = np.full((1_024, P), np.nan)
    compiled = _shift.shifted_cells(model, Xf, before)
    monkeypatch.setattr(_shift, "AVAILABLE", False)
    spelled = _shift.shifted_cells(model, Xf, before)
    assert compiled.sum() > 500
    np.testing.assert_array_equal(compiled, spelled)
    ok = np.isfinite(Xf).all(axis=1)
    plain = _plain_named(_plain_means(model, np.where(ok[:, None], Xf, np.nan)), model.shift_scale_)
    np.testing.assert_array_equal(compiled[ok], plain[ok])


def _adc(seed: int, n: int = 20_000):
    """Five continuous channels beside an ADC at rest at one level (noise 0.3 steps: a level off now and then),
    moving (8 steps) in 20 % of the rows, in stretches of 500 (benchmarks/modes.py's)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2)) @ rng.normal(size=(2, 5)) + 0.3 * rng.normal(size=(n, 5))
    on = np.zeros(n, bool)
    for start in rng.choice(np.arange(0, n - 500, 500), n // 2_500, replace=False):
        on[start:start + 500] = True
    level = 500 + np.where(on, 8.0, 0.3) * rng.normal(size=n)
    return np.column_stack([X, np.round(level)])


def test_an_adc_at_rest_is_no_shift_and_its_continuous_neighbours_are_judged():
    """The ADC's means have a tail far longer than their 90th percentile says: a channel written more coarsely
    than its noise is not judged by its means (0.2-0.5 % of these rows were flagged, by the resting mode, when
    it was).  A bias on a continuous channel is still found."""
    X = _adc(0)
    model = MCPCA(modes="auto").fit(X)
    assert model.n_modes_ == 2
    resting = model.mode_models_[0]
    assert resting.quantization_steps_[5] == 1.0 and np.all(resting.quantization_steps_[:5] == 0)
    assert np.mean(model.is_outlier(X)) <= 0.0025  # the rows the distance flags, 0.11-0.15 % here
    Xf = X.copy()
    rest = np.flatnonzero(model.predict_mode(X) == 0)[6_000:7_000]  # 1,000 resting rows, in order
    Xf[rest, 1] += 1.0 / np.sqrt(resting.get_precision()[1, 1])
    assert np.asarray(model.is_outlier(Xf))[rest[100:]].mean() >= 0.9


def test_a_chunked_fit_learns_the_scale_from_runs_of_its_blocks_read_anyway(tmp_path):
    """A Zarr store of 10 blocks of 2,000 rows (a full first read): runs of an eighth of the rows (2,500), each
    cut to its block, twice as many as 8 since the blocks are shorter than a run: 16 centres, every block
    whole, each averaged on its own; no pass is added."""
    import zarr

    X = _factor_rows(20_000, seed=10)
    store = zarr.create_array(tmp_path / "x.zarr", shape=X.shape, chunks=(2_000, P), dtype="f8")
    store[:] = X
    model = MCPCA().fit(str(tmp_path / "x.zarr"))
    assert model.n_passes_ == MCPCA().fit(da.from_array(X, chunks=(2_000, P))).n_passes_
    runs = [X[b * 2_000:(b + 1) * 2_000] for b in range(10)]
    np.testing.assert_allclose(model.shift_scale_, _plain_scale(model, runs), rtol=1e-7)


def test_states_one_after_another_in_one_block_are_learned_across_it():
    """Four clean states of 15,000 rows one after another, in one in-memory block: the runs are spread over
    all of it, so no state is flagged by its mean (learned from the first 16,384 rows, two of them were, in
    11 % of their rows), as with the same rows in 5,000-row chunks."""
    rng = np.random.default_rng(0)
    loadings, noise = rng.normal(size=(2, P)), rng.uniform(0.3, 1.0, P)
    X = np.concatenate([rng.normal(size=(15_000, 2)) @ loadings + rng.normal(size=(15_000, P)) * noise
                        + rng.normal(size=P) * noise * 1.5 for _ in range(4)])
    model = MCPCA().fit(X)
    flags = np.asarray(model.is_outlier(X))
    assert flags.mean() <= 0.003 and max(f.mean() for f in np.split(flags, 4)) <= 0.005
    assert np.mean(MCPCA().fit(da.from_array(X, chunks=(5_000, P))).is_outlier(X)) <= 0.003


def test_a_warm_start_refit_learns_the_scale_from_its_first_pass():
    X = _factor_rows(12_000, seed=11)
    model = MCPCA(warm_start=True).fit(X)
    cold = model.shift_scale_.copy()
    model.fit(X)  # from the previous state: its first pass keeps the runs, as a cold fit's first read
    assert model.shift_scale_ is not None
    np.testing.assert_allclose(model.shift_scale_, cold, rtol=0.05)


def test_the_channel_named_is_beyond_its_own_cutoff_beside_one_that_wanders():
    """A channel whose noise wanders (AR(1), phi 0.995, the others' marginal SD) has a wide scale; a bias of
    1.5 conditional SDs on another channel is named there, not on the wandering channel whose mean may be
    larger but inside its own cutoff (review of 2026-11-28: 0.117 of the biased rows named the wandering
    channel, 205 of them only it)."""
    rng = np.random.default_rng(7)
    n, p = 20_000, 5
    L = rng.normal(size=(2, p))
    E = 0.5 * rng.normal(size=(n, p))
    e, phi = np.zeros(n), 0.995
    z = rng.normal(size=n) * 0.5 * np.sqrt(1 - phi**2)
    for i in range(1, n):
        e[i] = phi * e[i - 1] + z[i]
    E[:, 0] = e
    X = rng.normal(size=(n, 2)) @ L + E
    model = MCPCA().fit(X)
    assert model.shift_scale_[0] > 2 * model.shift_scale_[3]  # the wandering channel's scale is the wider
    Xf = X.copy()
    Xf[10_000:12_000, 3] += 1.5 / np.sqrt(model.get_precision()[3, 3])
    cells = np.asarray(model.cell_outliers(Xf))
    named = _plain_named(_plain_means(model, Xf), model.shift_scale_)
    rows = slice(10_100, 12_000)
    assert named[rows, 3].mean() > 0.95 and cells[rows, 3].mean() > 0.95
    np.testing.assert_array_equal(cells[rows, 0], named[rows, 0] | cells[rows, 0])  # none named but by the rule
    assert cells[rows, 0].mean() < 0.01


def test_a_missing_reading_is_never_a_shifted_cell():
    """The rule judges a channel by the rows before; where the row has no reading on the shifted channel,
    nothing is named there (review of 2026-11-28: the NaN cells of a shifted channel, and cells of rows with
    no reading at all, were flagged by ``cell_outliers``)."""
    X = _factor_rows(8_000, seed=4)
    model = MCPCA().fit(X[:5_000])
    Xf = X.copy()
    Xf[6_000:7_000, 2] += 2.0 * np.sqrt(model.get_covariance()[2, 2])
    Xf[6_500:6_600:10, 2] = np.nan
    Xf[6_700:6_703] = np.nan
    cells = np.asarray(model.cell_outliers(Xf))
    assert cells[6_100:7_000, 2].sum() > 450  # the shift is found where there are readings
    assert not cells[np.isnan(Xf)].any()


def test_a_channel_logged_one_row_in_five_leaves_the_rule_its_scale():
    """With ``nan_policy="partial"`` and one channel logged one row in five, four rows in five have a gap and
    are left out of the means: no window is full, and the model had no shift rule at all (review of
    2026-11-28: a bias of 1.5 conditional SDs on another channel found in 0.017 of its rows).  The scale is
    then learned from every window the rule judges (the plain rule above), the bias is found, and the
    fitted rows are flagged no more often than without the rule."""
    rng = np.random.default_rng(3)
    n, p = 12_000, 6
    Y = rng.normal(size=(n, 2)) @ rng.normal(size=(2, p)) + rng.normal(size=(n, p)) * rng.uniform(0.3, 1.0, p)
    Y[np.arange(n) % 5 != 0, 5] = np.nan
    model = MCPCA(nan_policy="partial").fit(Y)
    np.testing.assert_allclose(model.shift_scale_, _plain_scale(model, np.split(Y, 8)), rtol=1e-7)
    Yf = Y.copy()
    Yf[4_000:6_000, 2] += 1.5 / np.sqrt(model.get_precision()[2, 2])
    assert np.asarray(model.is_outlier(Yf))[4_100:6_000].mean() > 0.95
    with_rule = np.asarray(model.is_outlier(Y)).mean()
    model.shift_scale_ = None
    assert with_rule <= np.asarray(model.is_outlier(Y)).mean() + 0.001


@pytest.mark.parametrize("block", [70, 100, 1_000])
def test_short_blocks_give_more_runs_and_the_same_scale(block):
    """A run of rows is cut to its block: with blocks of 100 rows, 8 runs held a dozen independent 64-row
    means and the scale fell up to 40 % low (clean rows flagged 0.0066 instead of 0.0018; review of
    2026-11-28).  Short blocks now give as many more runs as keep the rows, and the same model learns
    within 10 % of the scale of 8 long runs (the plain rule over eighths of the rows)."""
    X = _factor_rows(20_000, seed=11)
    model = MCPCA().fit(X)
    sizes = [block] * (len(X) // block) + ([len(X) % block] if len(X) % block else [])
    plan = _shift.run_plan(sizes, range(len(sizes)), X.shape[1])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    runs = [X[offsets[b] + a:offsets[b] + z] for b in sorted(plan) for a, z in plan[b]]
    assert sum(len(r) for r in runs) >= 0.9 * len(X)  # about the rows of 8 runs of an eighth each
    np.testing.assert_allclose(_shift.shift_scales(model, runs), _plain_scale(model, np.split(X, 8)), rtol=0.1)


def test_modes_given_as_labels_learn_the_rule_as_found_modes_do():
    """Modes given as labels kept no runs of rows, so they had no shift rule: a bias of one conditional SD on
    the resting mode's rows was found in 0.006 of them, against 0.998 when ``"auto"`` found the same modes
    (review of 2026-11-28).  Each mode's first read now keeps the runs, the other modes' rows left out;
    given the modes ``"auto"`` finds, the labels find the bias as it does and flag as few clean rows."""
    X = _adc(0)
    auto = MCPCA(modes="auto").fit(X)
    labels = np.asarray(auto.predict_mode(X))
    given = MCPCA().fit(X, modes=np.where(labels == 0, "rest", "moving"))
    assert all(m.shift_scale_ is not None for m in given.mode_models_)
    rest = np.flatnonzero(labels == 0)[6_000:7_000]
    Xf = X.copy()
    Xf[rest, 1] += 1.0 / np.sqrt(auto.mode_models_[0].get_precision()[1, 1])
    found = {name: np.asarray(m.is_outlier(Xf))[rest[100:]].mean() for name, m in (("auto", auto), ("given", given))}
    assert found["given"] > 0.95 and found["auto"] > 0.95
    assert np.asarray(given.is_outlier(X)).mean() <= np.asarray(auto.is_outlier(X)).mean() + 0.001


def test_a_mode_with_few_rows_in_one_stretch_learns_no_scale_from_copies_of_its_windows():
    """At the other modes' rows a mode's window is its last counted rows' again: 300 rows of a mode in one
    stretch gave hundreds of copies of about 5 independent means, a scale far too low, and up to 4 % of the
    mode's clean rows flagged (review of 2026-11-28).  Each window counts once and a scale needs 2,048 rows:
    such a mode has none, and its clean rows are flagged at the row rule's rate."""
    A = np.random.default_rng(99).normal(size=(2, 6))
    offset = np.array([10, -10, 10, 0, 0, 0.0])

    def rows(n, seed, ones):
        r = np.random.default_rng(seed)
        X = r.normal(size=(n, 2)) @ A + 0.3 * r.normal(size=(n, 6))
        labels = np.zeros(n, int)
        labels[ones] = 1
        return X + np.outer(labels, offset), labels

    X, labels = rows(20_000, 0, slice(12_000, 12_300))
    model = MCPCA().fit(X, modes=labels)
    assert getattr(model.mode_models_[1], "shift_scale_", None) is None
    assert model.mode_models_[0].shift_scale_ is not None
    Y, labels_y = rows(20_000, 100, slice(5_000, 15_000))
    assert np.asarray(model.is_outlier(Y))[labels_y == 1].mean() < 0.01


def test_the_compiled_fixed_point_is_numpys():
    """The residuals' fixed point in one compiled sweep (``_shift._fixed_point``) gives numpy's integers:
    ``rint(clip(r))``, 0 for NaN, on ties at .5 (to even), -0.0, values at and beyond the clip, and inf."""
    from dask_mcpca import _compiled

    if not _compiled.AVAILABLE:
        pytest.skip("numba is disabled: the numpy spelling is the only one")  # NUMBA_DISABLE_JIT=1 runs
    rng = np.random.default_rng(3)
    clip = _shift._CLIP_FIXED
    special = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, -0.0, 0.0, np.nan, np.inf, -np.inf, clip, -clip, clip + 0.5,
               np.nextafter(clip, 0), 1e300, -1e300, 2.0**52 + 0.5, 1e-300]
    r = np.concatenate([rng.normal(scale=clip / 3, size=400 - len(special)), special]).reshape(20, 20)
    with np.errstate(invalid="ignore"):
        want = np.clip(r, -clip, clip)
    want[np.isnan(want)] = 0.0
    want = np.rint(want).astype(np.int64)
    got = np.empty(r.shape, np.int64)
    _shift._fixed_point(r, clip, got)
    np.testing.assert_array_equal(got, want)
    assert got.ravel()[-19:-13].tolist() == [0, 2, 2, 0, -2, -2]  # ties to even
