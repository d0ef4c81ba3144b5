"""Operating modes, review 5 of 2026-11-28: saving a robust-scaled modes model, updating a loaded one, the
mode of rows no mode can judge, clear errors for bad labels, the routing a fit with ``"auto"`` is judged by.

Expected values come from the generated truth (each row's state) and from plain fits of one state's rows
(``MCPCA().fit``), which the rest of the suite checks against independent references.
"""

import dask.array as da
import numpy as np
import pandas as pd
import pytest
from test_modes import two_states

from dask_mcpca import MCPCA, NonFiniteRowsError, load
from dask_mcpca._scale import scale_text


def test_a_robust_scaled_modes_model_saves_loads_and_updates(tmp_path):
    X, truth = two_states(seed=3, n=(1500, 1000))
    model = MCPCA(scale="robust").fit(X, modes=truth)
    assert scale_text(model).startswith("scale robust")
    model.save(tmp_path / "m.json")
    loaded = load(tmp_path / "m.json")
    for m in range(2):  # each mode's scales are those of a plain robust-scaled fit of its rows
        alone = MCPCA(scale="robust").fit(X[truth == m])
        np.testing.assert_allclose(loaded.mode_models_[m].scale_, alone.scale_, rtol=1e-12)
    np.testing.assert_array_equal(loaded.is_outlier(X), model.is_outlier(X))
    assert scale_text(loaded).startswith("scale robust")
    loaded.partial_fit(X[:200])
    assert loaded.mode_models_[0].n_samples_seen_ == 1700


def test_a_loaded_modes_model_updates_when_its_largest_mode_gets_no_rows(tmp_path):
    X, truth = two_states(seed=4, n=(1500, 1000))
    MCPCA().fit(X, modes=truth).save(tmp_path / "m.json")
    loaded = load(tmp_path / "m.json")
    loaded.partial_fit(X[truth == 1][:300])  # rows of the smaller mode only
    assert [m.n_samples_seen_ for m in loaded.mode_models_] == [1500, 1300]
    np.testing.assert_allclose(loaded.mode_weights_, [1500 / 2800, 1300 / 2800])


def _multistate(sizes, p=6, seed=0):
    """States of one machine, each its own Gaussian (its centre, its correlations), rows shuffled; the truth."""
    rng = np.random.default_rng(seed)
    rows, truth = [], []
    for k, n in enumerate(sizes):
        mean = rng.normal(size=p) * 8 + k * 5
        mix = rng.normal(size=(p, p)) * (0.5 + k)
        rows.append(rng.multivariate_normal(mean, mix @ mix.T + np.eye(p) * 0.1, size=n))
        truth.append(np.full(n, k))
    order = rng.permutation(sum(sizes))
    return np.concatenate(rows)[order], np.concatenate(truth)[order]


def test_auto_modes_judge_the_rows_they_were_fitted_on():
    """Each mode judges the rows it was fitted on: predict_mode sends each mode as many rows as its model was
    fitted on, and no state the fit held as a mode's inliers is flagged whole (before: the 3000-row state,
    fitted within the largest mode, was sent to the other and 96 % of it flagged; modes=None flags none)."""
    X, truth = _multistate((5000, 3000, 1500, 800), seed=1)
    assert MCPCA().fit(X).is_outlier(X)[truth == 1].mean() < 0.02
    model = MCPCA(modes="auto").fit(X)
    sent = np.bincount(model.predict_mode(X), minlength=model.n_modes_)
    np.testing.assert_allclose(sent, [m.n_samples_ for m in model.mode_models_], rtol=0.005)
    flagged = model.is_outlier(X)
    assert flagged[truth == 1].mean() < 0.02
    assert flagged[truth == 0].mean() < 0.02


def test_auto_finds_a_contiguous_state_whatever_the_blocks():
    """A state recorded in one stretch (10 % of the rows) is found with small blocks too: the states are
    looked for in a sample of every block (before: 1000-row blocks sampled 1/8 of them, missed it, and its
    2000 rows were flagged whole)."""
    rng = np.random.default_rng(3)
    n, p = 20_000, 6
    truth = np.zeros(n, int)
    truth[6000:9000], truth[15000:17000] = 1, 2
    X = rng.normal(size=(n, 3)) @ rng.normal(size=(3, p)) + rng.normal(size=(n, p)) * 0.3
    shifts = rng.normal(size=(3, p)) * 6
    shifts[0] = 0
    X += shifts[truth]
    model = MCPCA(modes="auto").fit(da.from_array(X, chunks=(1000, p)))
    assert model.n_modes_ == 3
    np.testing.assert_array_equal(np.bincount(model.predict_mode(X)), [15000, 3000, 2000])
    flagged = model.is_outlier(X)
    assert max(flagged[truth == k].mean() for k in range(3)) < 0.02


def test_predict_mode_gives_no_mode_for_rows_it_cannot_judge():
    """A row holding NaN (one cell or all) under nan_policy="omit" has no mode: -1, as score_rows's mode says;
    the clean row beside them is the loaded state's (its generated centre is 10 on every channel)."""
    X, truth = two_states(seed=6, n=(1500, 1000))
    X[truth == 1] = np.random.default_rng(6).normal(size=(1000, X.shape[1])) + 10
    model = MCPCA(nan_policy="omit").fit(X, modes=truth)
    rows = np.array([[10.0] * 5, [10, 10, np.nan, 10, 10], [np.nan] * 5])
    np.testing.assert_array_equal(model.predict_mode(rows), [1, -1, -1])
    np.testing.assert_array_equal(model.score_rows(rows, outputs=("mode",))["mode"], [1, -1, -1])
    np.testing.assert_array_equal(MCPCA(nan_policy="omit").fit(X).predict_mode(rows), [0, -1, -1])


@pytest.mark.parametrize("missing", ["categorical", "object-nan", "object-none"])
def test_missing_labels_are_a_value_error(missing):
    X, truth = two_states(seed=7, n=(300, 200))
    names = np.where(truth == 0, "idle", "load").astype(object)
    names[[5, 50]] = None if missing == "object-none" else np.nan
    labels = pd.Categorical(names) if missing == "categorical" else names
    with pytest.raises(ValueError, match=r"2 labels are missing .* the first at row 5"):
        MCPCA().fit(X, modes=labels)


def test_errors_of_one_mode_name_it():
    X, truth = two_states(seed=7, n=(300, 200))  # 5 features: a robust fit needs 7 rows
    labels = np.where(truth == 0, "idle", "load").astype(object)
    labels[:6] = "peak"
    with pytest.raises(ValueError, match=r"at least 7 rows for 5 features; too few for mode 'peak' \(6 rows\)"):
        MCPCA().fit(X, modes=labels)
    X = X.copy()
    X[np.flatnonzero(truth == 1)[:3], 2] = np.nan
    with pytest.raises(NonFiniteRowsError, match=r"^mode 1: 3 of 200 rows of the mode hold NaN") as err:
        MCPCA(nan_policy="raise").fit(X, modes=truth)
    assert "partial' to fit" not in str(err.value)


def test_variables_of_a_store_that_does_not_exist(tmp_path):
    import zarr

    from dask_mcpca import open_archive

    with pytest.raises(FileNotFoundError, match="no such store"):
        open_archive(tmp_path / "missing.zarr", variables=["c0"])
    zarr.open_array(str(tmp_path / "plain.zarr"), mode="w", shape=(10, 2), chunks=(5, 2), dtype="f8")[:] = 1.0
    with pytest.raises(ValueError, match="was not written by xarray"):
        open_archive(tmp_path / "plain.zarr", variables=["c0"])


def test_an_exact_value_of_a_collapsed_channel_does_not_decide_the_mode():
    """An idle state whose counter reads exactly 0, a running one whose counter is Poisson(3): the running rows
    that read 0 stay in the running mode (channels 0-2 sit 3 SDs from idle), whose plain fit flags about
    none of them (before: 122 of 212 were sent to the idle mode and 110 flagged)."""
    rng = np.random.default_rng(1)
    n, p = 12_000, 5
    on = (np.arange(n) // 1000) % 3 == 2
    X = rng.normal(size=(n, p))
    X[on, :3] += 3
    X[:, 4] = np.where(on, rng.poisson(3, n), 0)
    model = MCPCA().fit(X, modes=on.astype(int))
    zero = on & (X[:, 4] == 0)
    alone = MCPCA().fit(X[on]).is_outlier(X[zero]).mean()  # the running state's own model
    assert np.mean(model.predict_mode(X[zero]) == 1) > 0.9
    assert model.is_outlier(X[zero]).mean() <= alone + 0.05
    assert model.is_outlier(X[~on]).mean() < 0.01
