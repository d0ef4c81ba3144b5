"""Cells judged one by one (issue 33): the conditional algebra, the flags and a cellwise fit.

Expected values come from the textbook: the Gaussian conditional of a row's
missing cells given its observed ones, with ``S_OO`` inverted explicitly per
row (Little and Rubin 2002, ch. 11), and from the truth of generated data.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dask_mcpca import MCPCA, load
from dask_mcpca._cells import cell_cutoff2, flag_cells
from dask_mcpca._missing import conditional


def _covariance(p: int, seed: int) -> np.ndarray:
    A = np.random.default_rng(seed).normal(size=(p, p))
    return A @ A.T / p + np.eye(p)


def _textbook(y: np.ndarray, missing: np.ndarray, S: np.ndarray):
    """One row: completed cells ``S_MO S_OO^-1 y_O``, ``d2_O``, ``S_OO^-1 y_O`` and ``C``, by explicit inverses."""
    o, m = np.flatnonzero(~missing), np.flatnonzero(missing)
    inv = np.linalg.inv(S[np.ix_(o, o)])
    u = y.copy()
    u[m] = S[np.ix_(m, o)] @ inv @ y[o]
    t = np.zeros_like(y)
    t[o] = inv @ y[o]
    C = S[np.ix_(m, m)] - S[np.ix_(m, o)] @ inv @ S[np.ix_(o, m)]
    return u, float(y[o] @ inv @ y[o]), t, C


@pytest.mark.parametrize("p", [3, 12, 40])
def test_conditional_matches_the_textbook_per_row(p):
    rng = np.random.default_rng(p)
    S = _covariance(p, p)
    Y = rng.multivariate_normal(np.zeros(p), S, size=300)
    missing = rng.random(Y.shape) < 0.15
    missing[0] = False
    missing[1, : p - 1] = True  # one observed cell
    cond = conditional(np.where(missing, 1e9, Y), missing, np.linalg.inv(S))  # missing values are ignored
    covs = {}
    for rows, cols, cov in cond.groups:
        for r, c, C in zip(rows, cols, cov, strict=True):
            covs[r] = (c, C)
    for i in range(len(Y)):
        if missing[i].all():  # nothing to condition on: the row stays unknown
            assert np.isnan(cond.d2[i]) and np.isnan(cond.completed[i]).all() and cond.n_observed[i] == 0
            continue
        u, d2, t, C = _textbook(Y[i], missing[i], S)
        np.testing.assert_allclose(cond.completed[i], u, rtol=1e-8, atol=1e-8)
        np.testing.assert_allclose(cond.d2[i], d2, rtol=1e-8)
        np.testing.assert_allclose(cond.residual[i], t, rtol=1e-7, atol=1e-8)
        assert cond.n_observed[i] == p - missing[i].sum()
        if missing[i].any():
            np.testing.assert_array_equal(covs[i][0], np.flatnonzero(missing[i]))
            np.testing.assert_allclose(covs[i][1], C, rtol=1e-8, atol=1e-10)


def test_covariance_sums_embed_each_rows_conditional_covariance():
    p = 6
    S = _covariance(p, 1)
    rng = np.random.default_rng(1)
    Y = rng.normal(size=(50, p))
    missing = rng.random(Y.shape) < 0.3
    missing[:, 0] = False
    w = rng.random((2, 50))
    expected = np.zeros((2, p, p))
    for i in range(50):
        m = np.flatnonzero(missing[i])
        if len(m):
            C = _textbook(Y[i], missing[i], S)[3]
            for j in range(2):
                expected[j][np.ix_(m, m)] += w[j, i] * C
    got = conditional(Y, missing, np.linalg.inv(S)).covariance_sums(w, p)
    np.testing.assert_allclose(got, expected, rtol=1e-8, atol=1e-12)


def test_clean_gaussian_cells_are_flagged_at_the_cutoffs_rate():
    p, n = 20, 20_000
    S = _covariance(p, 2)
    Y = np.random.default_rng(2).multivariate_normal(np.zeros(p), S, size=n)
    flags = flag_cells(Y, np.zeros(Y.shape, bool), np.linalg.inv(S), cell_cutoff2())
    # each clean cell's standardized residual is N(0, 1): 0.1 % beyond the 99.9 % chi2(1) quantile
    assert 0.0005 < flags.mean() < 0.002


@pytest.mark.parametrize("p", [10, 50])
def test_gross_cells_are_flagged_and_their_rows_clean_cells_are_not(p):
    rng = np.random.default_rng(p)
    S = _covariance(p, p)
    Y = rng.multivariate_normal(np.zeros(p), S, size=4000)
    sd = np.sqrt(np.diag(S))
    bad = rng.random(Y.shape) < 0.05  # 1 - 0.95**p of the rows hold at least one
    Y[bad] += (rng.uniform(8, 20, bad.sum()) * rng.choice([-1, 1], bad.sum())) * np.broadcast_to(sd, Y.shape)[bad]
    flags = flag_cells(Y, np.zeros(Y.shape, bool), np.linalg.inv(S), cell_cutoff2())
    assert flags[bad].mean() >= 0.99
    rows = bad.any(axis=1)
    assert flags[~bad & rows[:, None]].mean() < 0.003  # the clean cells of the rows that hold a bad one


def test_missing_cells_are_never_flagged():
    p = 8
    S = _covariance(p, 3)
    Y = np.random.default_rng(3).multivariate_normal(np.zeros(p), S, size=500)
    missing = np.zeros(Y.shape, bool)
    missing[:, 2] = True
    Y[:, 2] = 1e6
    flags = flag_cells(Y, missing, np.linalg.inv(S), cell_cutoff2())
    assert not flags[:, 2].any()


def _factor_archive(n: int, p: int, eps: float, seed: int, k: int = 3):
    rng = np.random.default_rng(seed)
    L = np.linalg.qr(rng.normal(size=(p, k)))[0]
    sv = np.linspace(8, 4, k)
    X = (rng.normal(size=(n, k)) * sv) @ L.T + rng.normal(size=(n, p))
    bad = rng.random(X.shape) < eps
    X[bad] = rng.uniform(8, 20, bad.sum()) * rng.choice([-1, 1], bad.sum()) * np.sqrt(sv[0] ** 2 / p + 1) * 3
    S = (L * sv**2) @ L.T + np.eye(p)
    return X, S, L, bad


def _angle(A: np.ndarray, B: np.ndarray) -> float:
    s = np.linalg.svd(np.linalg.qr(A)[0].T @ np.linalg.qr(B)[0], compute_uv=False)
    return float(np.degrees(np.arccos(np.clip(s.min(), -1, 1))))


@pytest.mark.parametrize("chunks", [None, 2500])
def test_cellwise_fit_holds_where_most_rows_hold_a_bad_cell(chunks):
    import dask.array as da

    n, p, eps = 10_000, 40, 0.03  # 1 - 0.97**40 = 70 % of rows hold a bad cell
    X, S, L, bad = _factor_archive(n, p, eps, seed=5)
    data = X if chunks is None else da.from_array(X, chunks=(chunks, p))
    model = MCPCA(cellwise=True, random_state=0).fit(data)
    default = MCPCA(random_state=0).fit(data)
    truth_var = np.linalg.eigvalsh(S)[::-1][:3]
    assert _angle(model.components_[:3].T, L) < 1.5
    assert _angle(default.components_[:3].T, L) > 5 * _angle(model.components_[:3].T, L)  # the row-wise fit breaks
    np.testing.assert_allclose(model.explained_variance_[:3], truth_var, rtol=0.1)
    flags = np.asarray(model.cell_outliers(X))
    assert flags[bad].mean() >= 0.95
    assert flags[~bad].mean() <= 0.002
    rows = np.asarray(model.is_outlier(X))
    assert rows.mean() < 0.02  # rows judged on their good cells: a glitch does not make a row an outlier


def test_cellwise_fit_of_clean_gaussian_data_is_pca():
    from sklearn.decomposition import PCA

    rng = np.random.default_rng(7)
    S = _covariance(6, 7)
    X = rng.multivariate_normal(np.zeros(6), S, size=20_000)
    model = MCPCA(cellwise=True).fit(X)
    pca = PCA().fit(X)
    assert _angle(model.components_[:2].T, pca.components_[:2].T) < 1.0
    np.testing.assert_allclose(model.explained_variance_, pca.explained_variance_, rtol=0.05)
    assert np.asarray(model.cell_outliers(X)).mean() < 0.002


def test_impute_fills_flagged_cells_from_the_rows_good_cells(tmp_path):
    X, S, L, bad = _factor_archive(8000, 12, 0.02, seed=9)
    model = MCPCA(cellwise=True).fit(X)
    filled = np.asarray(model.impute(X))
    flags = np.asarray(model.cell_outliers(X))
    np.testing.assert_array_equal(filled[~flags], X[~flags])
    # a filled gross cell lies near what the model predicts, not 8-20 SDs off
    sd = np.sqrt(np.diag(S))
    assert np.all(np.abs(filled[flags & bad] - model.mean_[np.nonzero(flags & bad)[1]])
                  < 6 * sd[np.nonzero(flags & bad)[1]])
    model.save(tmp_path / "m.json")
    again = load(tmp_path / "m.json")
    assert again.cellwise and again.cell_cutoff_ == pytest.approx(stats.chi2.ppf(0.999, 1))
    np.testing.assert_array_equal(np.asarray(again.cell_outliers(X)), flags)


def test_cell_outliers_keep_a_dataframes_index_and_columns():
    pd = pytest.importorskip("pandas")
    X, S, L, bad = _factor_archive(3000, 5, 0.01, seed=11)
    frame = pd.DataFrame(X, columns=[f"c{i}" for i in range(5)], index=np.arange(3000) + 100)
    model = MCPCA(cellwise=True).fit(frame)
    out = model.cell_outliers(frame)
    assert isinstance(out, pd.DataFrame)
    assert list(out.columns) == list(frame.columns) and (out.index == frame.index).all()
    assert out.dtypes.eq(bool).all()


def test_a_row_wise_fit_without_a_clean_majority_warns_and_names_the_fix():
    from dask_mcpca import BreakdownWarning

    X, S, L, bad = _factor_archive(6000, 40, 0.03, seed=13)  # 70 % of the rows hold a bad cell
    with pytest.warns(BreakdownWarning, match=r"cellwise=True"):
        MCPCA().fit(X)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", BreakdownWarning)
        MCPCA(cellwise=True).fit(X)  # the cellwise fit holds: no warning
        clean = np.random.default_rng(13).multivariate_normal(np.zeros(40), S, size=6000)
        MCPCA().fit(clean)  # clean rows: no warning


@pytest.mark.parametrize("p", [20, 80])
def test_scattered_gaps_at_wide_p_fit_as_the_complete_rows(p):
    """1 % NaN cells at random: most rows have a gap, each in its own place (the precision path)."""
    X, S, L, _ = _factor_archive(8000, p, 0.0, seed=p)
    gappy = X.copy()
    gappy[np.random.default_rng(p).random(X.shape) < 0.01] = np.nan
    assert np.isnan(gappy).any(axis=1).mean() > 0.18
    full = MCPCA().fit(X)
    part = MCPCA(nan_policy="partial").fit(gappy)
    assert part.n_samples_ == len(X)
    truth = np.linalg.eigvalsh(S)[::-1][:3]
    assert _angle(part.components_[:3].T, L) < 1.0 + _angle(full.components_[:3].T, L)
    np.testing.assert_allclose(part.explained_variance_[:3], truth, rtol=0.1)


@pytest.fixture(scope="module")
def glitchy_store(tmp_path_factory):
    """A Zarr store of a 30-channel factor archive, 2 % of its cells 8-20 SDs off, and their mask."""
    import zarr

    X, S, L, bad = _factor_archive(12_000, 30, 0.02, seed=17)
    path = tmp_path_factory.mktemp("cells") / "archive.zarr"
    z = zarr.open_array(str(path), mode="w", shape=X.shape, chunks=(3000, 30), dtype="f8")
    z[:] = X
    return path, X, bad


@pytest.mark.slow  # two dask-mcpca processes
def test_command_line_fit_cellwise_then_score_writes_the_flagged_cells(glitchy_store, tmp_path):
    import subprocess
    import sys

    import zarr

    path, X, bad = glitchy_store
    model, scores = tmp_path / "m.json", tmp_path / "s.zarr"
    run = [sys.executable, "-m", "dask_mcpca"]
    done = subprocess.run([*run, "fit", str(path), "--cellwise", "-o", str(model), "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert load(model).cellwise and load(model).progress is False  # no progress line in a notebook
    done = subprocess.run([*run, "score", str(path), "--model", str(model), "--output", str(scores), "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "cells (12,000 x 30)" in done.stdout
    group = zarr.open_group(str(scores), mode="r")
    cells = group["cells"][:]
    assert cells.dtype == bool and cells.shape == X.shape
    assert cells[bad].mean() >= 0.95 and cells[~bad].mean() <= 0.002
    np.testing.assert_array_equal(group["n_observed"][:], 30 - cells.sum(axis=1))  # judged on the good cells
    assert "cells" in group.attrs["arrays"]


def test_report_of_a_cellwise_model_counts_flagged_cells_per_channel_over_time(glitchy_store):
    from dask_mcpca._report import summarize

    path, X, bad = glitchy_store
    model = MCPCA(cellwise=True).fit(X)
    summary = summarize(model, str(path))
    share = summary.bin_cells_share
    assert share is not None and share.shape[1] == 30
    rows_per_bin = np.diff(np.append(summary.bin_rows, len(X)))
    counted = (share * rows_per_bin[:, None]).sum(axis=0)
    expected = np.asarray(model.cell_outliers(X)).sum(axis=0)
    np.testing.assert_allclose(counted, expected, atol=1e-6)
    assert summarize(MCPCA().fit(X), X).bin_cells_share is None  # a row-wise model's report has no such panel


def test_a_partial_fit_starts_from_rows_with_gaps_when_too_few_rows_are_complete():
    """p = 100, 4 % NaN cells: 1.7 % of the rows are complete, fewer than p + 2 in the sample."""
    X, S, L, _ = _factor_archive(6000, 100, 0.0, seed=21)
    gappy = X.copy()
    gappy[np.random.default_rng(21).random(X.shape) < 0.04] = np.nan
    assert (~np.isnan(gappy).any(axis=1)).sum() < 102
    with pytest.raises(ValueError, match="too few"):
        MCPCA(nan_policy="omit").fit(gappy)
    part = MCPCA(nan_policy="partial").fit(gappy)
    full = MCPCA().fit(X)
    assert part.n_samples_ == len(X)
    assert _angle(part.components_[:3].T, L) < 1.0 + _angle(full.components_[:3].T, L)
    np.testing.assert_allclose(part.explained_variance_[:3], full.explained_variance_[:3], rtol=0.1)


def test_score_is_the_mean_gaussian_log_likelihood_and_ranks_models():
    from scipy.stats import multivariate_normal
    from sklearn.decomposition import PCA
    from sklearn.model_selection import cross_val_score

    rng = np.random.default_rng(5)
    S = _covariance(5, 5)
    X = rng.multivariate_normal(np.ones(5), S, size=8000)
    model = MCPCA().fit(X)
    expected = multivariate_normal(model.mean_, model.get_covariance()).logpdf(X).mean()
    assert model.score(X) == pytest.approx(expected, rel=1e-9)
    assert model.score(X) == pytest.approx(PCA().fit(X).score(X), rel=0.01)  # clean data: PCA's
    gappy = X.copy()
    gappy[:10, 0] = np.nan
    assert MCPCA(nan_policy="partial").fit(gappy).score(gappy) == pytest.approx(expected, rel=0.01)
    assert np.isfinite(cross_val_score(MCPCA(), X, cv=3)).all()


def test_a_cellwise_fit_leaves_a_stuck_cell_out_and_keeps_its_row():
    X, S, L, bad = _factor_archive(12_000, 20, 0.01, seed=23)
    stuck = np.zeros(len(X), bool)
    stuck[3000:3400] = True
    X[stuck, 7] = np.round(np.median(X[:, 7]) + 0.2, 6)  # a plausible value, held exactly
    model = MCPCA(cellwise=True).fit(X)
    assert [7, X[3000, 7]] in model.repeated_values_.tolist()
    flags = np.asarray(model.cell_outliers(X))
    assert flags[stuck, 7].all()  # the stuck cells are bad cells
    assert flags[stuck][:, np.arange(20) != 7][~bad[stuck][:, np.arange(20) != 7]].mean() < 0.005
    assert np.asarray(model.is_outlier(X))[stuck].all()  # and their rows are flagged, as stuck rows are
    counts = np.asarray(model.n_observed(X))
    assert (counts[stuck] <= 19).all()  # judged on the row's other cells


def test_a_cellwise_models_distance_is_that_of_the_row_without_its_bad_cells():
    import dask.array as da
    import xarray as xr

    X, S, L, bad = _factor_archive(8000, 12, 0.02, seed=29)
    model = MCPCA(cellwise=True).fit(X)
    flags = np.asarray(model.cell_outliers(X))
    without = np.where(flags, np.nan, X)  # the bad cells as missing ones, judged by the row-wise rule
    reference = MCPCA(nan_policy="partial").fit(X[:100])  # any model; its parameters replaced below
    for name in ("components_", "explained_variance_", "mean_", "noise_variance_", "n_components_",
                 "n_features_in_", "quantization_steps_"):
        setattr(reference, name, getattr(model, name))
    np.testing.assert_allclose(np.asarray(model.mahalanobis(X)), np.asarray(reference.mahalanobis(without)),
                               rtol=1e-8)
    lazy = model.cell_outliers(da.from_array(X, chunks=(2000, 12)))
    assert isinstance(lazy, da.Array) and np.array_equal(lazy.compute(), flags)
    arr = xr.DataArray(X, dims=("time", "channel"), coords={"channel": [f"c{i}" for i in range(12)]})
    labelled = MCPCA(cellwise=True).fit(arr).cell_outliers(arr)
    assert isinstance(labelled, xr.DataArray) and labelled.dims == ("time", "channel")
    assert list(labelled.coords["channel"].values) == [f"c{i}" for i in range(12)]


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_a_cellwise_fit_is_the_same_whatever_the_chunking_and_the_threads():
    import dask
    import dask.array as da
    from conftest import assert_same_fit

    X, S, L, bad = _factor_archive(8000, 30, 0.02, seed=31)
    ref = MCPCA(cellwise=True).fit(X)
    for chunks, workers in ((1000, 1), (1000, 2), (3000, 2)):
        with dask.config.set(scheduler="threads", num_workers=workers):
            model = MCPCA(cellwise=True).fit(da.from_array(X, chunks=(chunks, 30)))
        assert_same_fit(model, ref, rtol=1e-9, atol=1e-11, names=("components_", "explained_variance_", "mean_"),
                        up_to_sign=True)
        assert model.outlier_cutoff_ == pytest.approx(ref.outlier_cutoff_, rel=1e-9)


@pytest.mark.parametrize("p", [40, 300, 1000])
def test_breakdown_counts_the_rows_glitched_beyond_a_clean_rows_chance_flags(p):
    """Clean cells flagged at the cell cutoff's rate (0.1 %) put a flag in 63 % of the rows at p = 1000
    by chance; the warning is about the rows holding a glitch, generated here apart from the chance flags."""
    from dask_mcpca import _cells

    rng = np.random.default_rng(p)
    n = 2000
    chance = rng.random((n, p)) < 1 - _cells.CELL_QUANTILE
    assert _cells.breakdown_message(chance, 1.0, cellwise=False) is None
    glitched = chance.copy()
    hit = rng.random(n) < 0.7  # 70 % of the rows hold one gross cell
    glitched[np.flatnonzero(hit), rng.integers(0, p, hit.sum())] = True
    message = _cells.breakdown_message(glitched, 1.0, cellwise=False)
    assert message is not None and "cellwise=True" in message
    assert 0.65 <= float(message.split("%")[0].split()[-1]) / 100 <= 0.75
    few = glitched.copy()
    few[np.flatnonzero(hit)[: int(0.45 * n)]] = chance[np.flatnonzero(hit)[: int(0.45 * n)]]  # ~ 25 % glitched
    assert _cells.breakdown_message(few, 1.0, cellwise=False) is None


@pytest.mark.parametrize("kw", [{"nan_policy": "partial"}, {"cellwise": True}])
def test_an_infinite_cell_is_flagged_and_filled_and_its_row_kept(kw):
    """As documented: ``cell_outliers`` flags an inf cell (not a NaN one) and judges the row's other cells
    as with that cell missing; ``impute`` fills it from the row's good cells by the conditional expectation
    under ``get_covariance`` (written out here) and returns the others unchanged.  Rows holding an inf were
    blanked whole: no flag at all, and NaN for the row's finite cells."""
    rng = np.random.default_rng(0)
    t = rng.normal(size=(4000, 1))
    X = np.hstack([t, 2 * t, -t, t]) + 0.3 * rng.normal(size=(4000, 4))
    model = MCPCA(**kw).fit(X)
    rows = np.array([[1.0, np.inf, -1.0, 9.0], [1.0, np.nan, -1.0, 9.0], [np.inf, np.nan, np.nan, np.nan]])
    flags = model.cell_outliers(rows)
    np.testing.assert_array_equal(flags[0], [False, True, False, flags[1][3]])
    assert flags[1][3] and not flags[1][:3].any()  # 9 is far from what t = 1 predicts
    np.testing.assert_array_equal(flags[2], [True, False, False, False])
    filled = model.impute(rows[:2])
    S, mu = model.get_covariance(), model.mean_
    gaps = [1, 3] if kw.get("cellwise") else [1]  # a cellwise model fills its flagged cells too
    seen = [j for j in range(4) if j not in gaps]
    expected = mu[gaps] + S[np.ix_(gaps, seen)] @ np.linalg.solve(S[np.ix_(seen, seen)], rows[0, seen] - mu[seen])
    for row in filled:
        np.testing.assert_allclose(row[gaps], expected, rtol=1e-9)
        np.testing.assert_array_equal(row[seen], rows[0, seen])
    assert np.isnan(model.impute(rows[2:])).all()


@pytest.mark.parametrize("p", [20, 40, 100])
def test_a_cellwise_fit_of_clean_data_converges_without_a_warning(p):
    """Each full-data pass judges every cell afresh, so cells at the cutoff toggle between passes and the
    steps stopped contracting at about tol: most cellwise fits at p = 100 spent every pass and warned, on
    clean data.  Now the start ends as the passes judge cells and a stall at the flags' noise converges.
    Expected: converged in at most 3 robust steps (4 passes), no ConvergenceWarning, and on clean Gaussian
    data classical PCA's answer (scikit-learn): the top-3 variances within 2 %, and the top-3 components
    capturing at least 99 % of the variance PCA's capture (close eigenvalues let the directions turn
    within their span by several degrees, in the robust fits as in any)."""
    import warnings

    from sklearn.decomposition import PCA
    from sklearn.exceptions import ConvergenceWarning

    for seed in range(2):
        rng = np.random.default_rng(seed)
        X = rng.normal(size=(4000, p)) @ (rng.normal(size=(p, p)) / np.sqrt(p) + np.eye(p))
        with warnings.catch_warnings():
            warnings.simplefilter("error", ConvergenceWarning)
            model = MCPCA(cellwise=True).fit(X)
        assert model.converged_ and model.n_passes_ <= 4
        pca = PCA(n_components=3).fit(X)
        np.testing.assert_allclose(model.explained_variance_[:3], pca.explained_variance_, rtol=0.02)
        Y = X - X.mean(axis=0)
        captured = [np.sum((Y @ C.T) ** 2) for C in (model.components_[:3], pca.components_)]
        assert captured[0] >= 0.99 * captured[1]


@pytest.mark.parametrize("nan_policy", ["omit", "partial"])
def test_score_rows_writes_the_cells_cell_outliers_flags_in_rows_with_nan_or_inf(nan_policy):
    """``score``'s ``cells`` output is ``cell_outliers``, also in the rows a row-wise output leaves out (an inf
    cell; under ``"omit"`` any NaN): those rows were written with no flag."""
    rng = np.random.default_rng(0)
    t = rng.normal(size=(4000, 1))
    X = np.hstack([t, 2 * t, -t, t]) + 0.3 * rng.normal(size=(4000, 4))
    model = MCPCA(cellwise=True, nan_policy=nan_policy).fit(X)
    rows = X[:6].copy()
    rows[0, 1], rows[1, 2], rows[2, 3] = np.inf, np.nan, 9.0
    rows[3, 0], rows[3, 3] = np.nan, 9.0
    cells = model.score_rows(rows, outputs=("cells",))["cells"]
    np.testing.assert_array_equal(cells, model.cell_outliers(rows))
    assert cells[0, 1] and cells[2, 3] and cells[3, 3] and not cells[1].any()


def test_a_row_whose_every_cell_is_flagged_is_an_outlier():
    """A cellwise model judges a row on its good cells; a row with none left (every cell far off) had
    distance NaN and was called an inlier, where a row-wise model flags it."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20_000, 3)) @ rng.normal(size=(3, 8)) + 0.2 * rng.normal(size=(20_000, 8))
    model = MCPCA(cellwise=True, random_state=0).fit(X)
    far = np.vstack([np.full((1, 8), 1e6), 1e4 * (-1.0) ** np.arange(8), 50 * rng.normal(size=(2, 8))])
    out = model.score_rows(far, outputs=("outlier", "cells", "d2"))
    assert out["cells"].all()  # nothing left to judge the rows on
    assert out["outlier"].all() and np.asarray(model.is_outlier(far)).all()
    assert np.isinf(np.asarray(out["d2"])).all()
    nan_row = np.full((1, 8), np.nan)  # a row of no reading at all is missing, not an outlier
    assert not np.asarray(MCPCA(cellwise=True, nan_policy="partial", random_state=0).fit(X).is_outlier(nan_row)).any()


def test_a_cellwise_models_scores_complete_the_flagged_cells():
    """One cell of a row glitched by +100 (p = 80): a cellwise model flags the cell and does not flag the
    row, so its scores must not follow the glitch (they moved by 15 where the row's other cells place the
    quantity).  Expected: the row with the cell replaced by its conditional expectation given the other
    cells under the model's covariance (the textbook formula), projected; and close to the clean row's."""
    rng = np.random.default_rng(81)
    X = rng.normal(size=(6000, 3)) @ rng.normal(size=(3, 80)) * 3 + rng.normal(size=(6000, 80)) + 5
    model = MCPCA(n_components=3, cellwise=True, random_state=0).fit(X)
    rows = X[:5].copy()
    rows[np.arange(5), [7, 20, 33, 46, 79]] += 100
    assert np.asarray(model.cell_outliers(rows)).sum() == 5 and not np.asarray(model.is_outlier(rows)).any()
    S, mu = model.get_covariance(), model.mean_
    expected = []
    for row, j in zip(rows, [7, 20, 33, 46, 79], strict=True):
        o = np.arange(80) != j
        y = row - mu
        y[j] = S[j, o] @ np.linalg.solve(S[np.ix_(o, o)], y[o])
        expected.append(y @ model.components_.T)
    got = np.asarray(model.transform(rows))
    np.testing.assert_allclose(got, np.array(expected), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(np.asarray(model.score_rows(rows, outputs=("scores",))["scores"]), got, rtol=1e-12)
    assert np.abs(got - np.asarray(model.transform(X[:5]))).max() < 1.0


def _uneven_noise_archive(n: int, p: int, eps: float, seed: int) -> np.ndarray:
    """10 factors (spreads 10 to 1) and each channel's own noise, 0.2-1.0 of a unit, standardised;
    a share ``eps`` of the cells gross (8-20 channel SDs)."""
    rng = np.random.default_rng(seed)
    L = rng.normal(size=(10, p)) * np.geomspace(10.0, 1.0, 10)[:, None] * 3 / np.sqrt(p)
    noise = rng.uniform(0.2, 1.0, p)
    X = rng.normal(size=(n, 10)) @ L + rng.normal(size=(n, p)) * noise
    X /= np.sqrt((L**2).sum(axis=0) + noise**2)
    bad = rng.random(X.shape) < eps
    X[bad] = rng.uniform(8, 20, bad.sum()) * rng.choice([-1, 1], bad.sum())
    return X


def test_fewer_components_do_not_make_clean_rows_a_breakdown():
    """With k < p the model's discarded directions share one variance, so under it a loud channel's cells
    look unexplained (at p = 300, k = 10, 93 % of clean rows held a flagged cell) and the fit warned that
    clean data had no clean majority (review of 2026-11-28).  The warning is about the robust fit, so it is
    judged under every component: none on clean rows, and still one where 3 % of the cells are gross."""
    import warnings

    from dask_mcpca import BreakdownWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", BreakdownWarning)
        MCPCA(n_components=10).fit(_uneven_noise_archive(8000, 100, 0.0, seed=5))
    with pytest.warns(BreakdownWarning, match=r"cellwise=True"):
        MCPCA(n_components=10).fit(_uneven_noise_archive(8000, 100, 0.03, seed=5))
