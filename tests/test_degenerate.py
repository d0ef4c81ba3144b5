"""Degenerate data: a correct answer or a clear error, never NaN and never a hang.

Constant and duplicate columns, rank-deficient data, p = 1 and p = 2, a
single row block, all rows identical, isotropic data; both solvers (the
paper's with a short schedule).  Every test runs under an alarm, so a loop
without a bound fails instead of hanging the suite.
"""

from __future__ import annotations

import signal
import warnings

import dask.array as da
import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from dask_mcpca import MCPCA
from dask_mcpca._start import robust_start

#: Seconds any one test may take before it counts as a hang.
ALARM_SECONDS = 60

SOLVERS = [
    pytest.param({}, id="auto"),
    pytest.param({"solver": "paper", "n_decay": 4}, id="paper-robust-centre"),
    pytest.param({"solver": "paper", "n_decay": 4, "center": "mean"}, id="paper-mean-centre"),
]


@pytest.fixture(autouse=True)
def _no_hang():
    def hung(signum, frame):
        raise TimeoutError(f"test ran past {ALARM_SECONDS} s: an unbounded loop?")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(ALARM_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _gaussian(n=300, scales=(3.0, 2.0, 1.0, 0.5), seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, len(scales))) * np.asarray(scales)


def _check_sane(m, p, *, orth_atol=1e-5):
    """No NaN anywhere that matters; orthonormal components; a bool converged_."""
    k = m.n_components_
    assert m.components_.shape == (k, p)
    for name in ("components_", "explained_variance_", "explained_variance_ratio_", "mean_", "covariance_"):
        assert np.isfinite(getattr(m, name)).all(), name
    assert np.isfinite(m.noise_variance_) and np.isfinite(m.kernel_scale_)
    assert (m.explained_variance_ >= 0).all()
    np.testing.assert_allclose(m.components_ @ m.components_.T, np.eye(k), atol=orth_atol)
    assert isinstance(m.converged_, (bool, np.bool_))


# ------------------------------------------------------------ constant column
@pytest.mark.parametrize("kw", SOLVERS)
def test_constant_column(kw):
    base = _gaussian()
    X = np.column_stack([base[:, :2], np.full(len(base), 7.0), base[:, 2:]])
    m = MCPCA(**kw).fit(X)
    _check_sane(m, 5)
    assert m.converged_
    # the constant direction carries no variance: it is the last component ...
    np.testing.assert_allclose(np.abs(m.components_[-1]), [0, 0, 1, 0, 0], atol=1e-8)
    assert m.explained_variance_[-1] < 1e-12 * m.explained_variance_[0]
    # ... no other component leans on it, and the centre is the constant
    np.testing.assert_allclose(m.components_[:-1, 2], 0.0, atol=1e-8)
    assert m.mean_[2] == pytest.approx(7.0, rel=1e-12)
    # the other columns are fitted as without the constant one
    ref = MCPCA(**kw).fit(base)
    cos = np.abs(np.sum(np.delete(m.components_[:3], 2, axis=1) * ref.components_[:3], axis=1))
    np.testing.assert_allclose(cos, 1.0, atol=1e-3)
    np.testing.assert_allclose(m.explained_variance_[:3], ref.explained_variance_[:3], rtol=0.05)


def _correlated(n, p, seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, p)) @ (rng.normal(size=(p, p)) / np.sqrt(p) + np.eye(p))


@pytest.mark.parametrize("value", [3.0, 0.0])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cellwise_fit_with_a_dead_channel_is_the_fit_without_it(value, dtype):
    """A constant channel (a dead sensor; all zeros) in a cellwise fit: its round-off in the
    pseudo-inverse once flagged its cells and completed them 1e11 from the centre, so the mean and
    the variances blew up (1e26) with no warning, or the fit stopped with a NumericalRangeError.
    Expected: the fit of the other channels alone."""
    for seed in (3, 5):
        X = _correlated(3000, 12, seed).astype(dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            m = MCPCA(cellwise=True).fit(np.insert(X, 6, value, axis=1))
            ref = MCPCA(cellwise=True).fit(X)
        assert m.mean_[6] == value
        np.testing.assert_allclose(np.delete(m.mean_, 6), ref.mean_, atol=0.02)
        np.testing.assert_allclose(m.explained_variance_[:12], ref.explained_variance_, rtol=0.02)
        assert m.explained_variance_[12] <= 1e-12 * m.explained_variance_[0]
        assert not m.cell_outliers(np.insert(X, 6, value, axis=1))[:, 6].any()


def test_outlier_cutoff_counts_no_round_off_dimension_whatever_the_chunks():
    """The calibrated cutoff's degrees of freedom are the directions the distances count: a constant
    channel's round-off variance (1.1e-15 in one block, 0.0 summed over three) counted as one
    dimension in one and not the other, so the cutoff and the flags depended on the chunking."""
    X = np.insert(_correlated(3000, 49, 3), 7, 3.0, axis=1)
    cutoffs = [MCPCA().fit(X).outlier_cutoff_]
    cutoffs += [MCPCA().fit(da.from_array(X, chunks=(rows, 50))).outlier_cutoff_ for rows in (1500, 1000)]
    np.testing.assert_allclose(cutoffs, cutoffs[0], rtol=1e-12)
    without = MCPCA().fit(np.delete(X, 7, axis=1)).outlier_cutoff_  # 49 dimensions, as the distances count
    assert cutoffs[0] == pytest.approx(without, rel=0.01)


def test_constant_column_leaves_robust_start_of_the_others_alone():
    """DetMCD ranks its starts by the (pseudo-)determinant of the h-subset scatter.

    A constant column makes every start singular; the ranking must then look
    at the other directions, as it does without that column.  With 40 % of
    the rows in a tight cluster the starts differ, so a ranking that ties all
    singular starts picks another one.
    """
    for seed in (9, 39):  # seeds where the ranking matters
        rng = np.random.default_rng(seed)
        n, p = 400, 5
        X = rng.normal(size=(n, p)) * np.geomspace(3, 0.3, p)
        X[:160] = rng.normal(size=(160, p)) * 0.05 + rng.normal(size=p) * 4
        mu, S = robust_start(X)
        mu_c, S_c = robust_start(np.column_stack([X, np.full(n, 5.0)]))
        np.testing.assert_allclose(mu_c[:p], mu, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(S_c[:p, :p], S, rtol=1e-8, atol=1e-10)
        assert mu_c[p] == 5.0 and np.all(S_c[p] == 0)


# ------------------------------------------------------------ duplicate column
@pytest.mark.parametrize("kw", SOLVERS)
def test_duplicate_column(kw):
    base = _gaussian()
    X = np.column_stack([base, base[:, 0]])
    m = MCPCA(**kw).fit(X)
    _check_sane(m, 5)
    assert m.converged_
    # x0 - x4 is identically zero: that direction has no variance
    null = np.array([1, 0, 0, 0, -1]) / np.sqrt(2)
    assert abs(m.components_[-1] @ null) == pytest.approx(1.0, abs=1e-8)
    assert m.explained_variance_[-1] < 1e-12 * m.explained_variance_[0]
    # the first component is the doubled column, shared equally
    c = m.components_[0]
    assert abs(c[0] - c[4]) < 1e-8 and abs(c[0]) > 0.7 - 0.05


# ------------------------------------------------------------- low rank
def _low_rank(rank=2, p=5, n=300, seed=0):
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.normal(size=(p, rank)))[0]  # orthonormal columns
    return rng.normal(size=(n, rank)) * np.geomspace(3, 1, rank) @ basis.T + rng.normal(size=p), basis


def _spans(components, basis, atol):
    """The rows of ``components`` lie in the column space of ``basis``."""
    resid = components - (components @ basis) @ basis.T
    return np.abs(resid).max() < atol


def test_rank_deficient_auto_gives_zero_variance_directions():
    X, basis = _low_rank()
    m = MCPCA().fit(X)
    _check_sane(m, 5)
    assert m.converged_
    assert _spans(m.components_[:2], basis, 1e-8)
    assert (m.explained_variance_[2:] < 1e-12 * m.explained_variance_[0]).all()
    assert m.explained_variance_[1] > 0.5  # the data's two directions have spread 3 and 1


@pytest.mark.parametrize("kw", SOLVERS[1:])
def test_rank_deficient_paper_is_a_clear_error_or_fits_within_the_rank(kw):
    X, basis = _low_rank()
    with pytest.raises(ValueError, match="rank 2 .* use n_components <= 2"):
        MCPCA(**kw).fit(X)
    m = MCPCA(n_components=2, **kw).fit(X)
    _check_sane(m, 5)
    assert _spans(m.components_, basis, 1e-6)


@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
def test_rank_deficient_paper_error_does_not_depend_on_round_off(scale):
    """Round-off eigenvalues (1e-20 .. 1e-13 of the largest) count as zero at any scale."""
    for seed in range(4):
        X, _ = _low_rank(rank=2, p=4, seed=seed)
        with pytest.raises(ValueError, match="rank 2"):
            MCPCA(solver="paper", n_decay=3, center="mean").fit(X * scale)


# ------------------------------------------------------------------ p = 1, 2
@pytest.mark.parametrize("kw", SOLVERS)
def test_one_feature(kw):
    X = _gaussian(n=400, scales=(2.0,))
    m = MCPCA(**kw).fit(X)
    _check_sane(m, 1)
    np.testing.assert_array_equal(m.components_, [[1.0]])
    # clean Gaussian data: the robust variance is the variance, within sampling error
    assert m.explained_variance_[0] == pytest.approx(np.var(X), rel=0.15)
    if kw.get("center") == "mean":
        return  # a mean centre moves with outliers, and the spread about it with them
    # and robust: 5 % of rows 30 spreads out leave it near the clean rows' variance (the paper solver's
    # p = 1 variance was the plain mean square, 46 times the clean rows' here)
    Y = X.copy()
    Y[:20] = 60.0
    robust = MCPCA(**kw).fit(Y).explained_variance_[0]
    assert robust == pytest.approx(np.var(X[20:]), rel=0.25) and robust < 0.1 * np.var(Y)


@pytest.mark.parametrize("kw", SOLVERS)
def test_two_features(kw):
    rng = np.random.default_rng(1)
    angle = 0.4
    R = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    X = rng.normal(size=(500, 2)) * [3.0, 0.5] @ R.T
    m = MCPCA(**kw).fit(X)
    _check_sane(m, 2)
    assert m.converged_
    assert abs(m.components_[0] @ R[:, 0]) > 0.995
    assert m.explained_variance_[0] > m.explained_variance_[1] > 0


# ----------------------------------------------------------- single block
@pytest.mark.parametrize("kw", SOLVERS)
def test_single_row_block(kw):
    X = _gaussian(n=250)
    one = MCPCA(**kw).fit(da.from_array(X, chunks=(250, 4)))
    ref = MCPCA(**kw).fit(X)
    for name in ("components_", "explained_variance_", "mean_"):
        np.testing.assert_allclose(getattr(one, name), getattr(ref, name), rtol=1e-9, atol=1e-12)
    assert one.n_passes_ == ref.n_passes_


# ---------------------------------------------------------- identical rows
@pytest.mark.parametrize("kind", ["numpy", "dask"])
def test_identical_rows_auto_gives_zero_variance(kind):
    row = np.array([1.5, -2.0, 3.0])
    X = np.tile(row, (60, 1))
    m = MCPCA().fit(X if kind == "numpy" else da.from_array(X, chunks=(20, 3)))
    _check_sane(m, 3, orth_atol=1e-12)
    assert m.converged_
    np.testing.assert_array_equal(m.explained_variance_, 0.0)
    np.testing.assert_allclose(m.mean_, row, rtol=1e-14)
    np.testing.assert_allclose(m.transform(X), 0.0, atol=1e-12)
    np.testing.assert_array_equal(m.score_samples(X[:5]), 1.0)  # every row at the centre


@pytest.mark.parametrize("kw", SOLVERS[1:])
def test_identical_rows_paper_is_a_clear_error(kw):
    X = np.tile([1.5, -2.0, 3.0], (60, 1))
    with pytest.raises(ValueError, match="every row equals the centre"):
        MCPCA(**kw).fit(X)


def test_identical_rows_paper_uncentred_finds_the_row():
    """Without centring, identical rows have rank 1: the component is the row's direction."""
    row = np.array([1.5, -2.0, 3.0])
    m = MCPCA(n_components=1, solver="paper", n_decay=4, center=False).fit(np.tile(row, (60, 1)))
    _check_sane(m, 3)
    assert abs(m.components_[0] @ row) / np.linalg.norm(row) == pytest.approx(1.0, abs=1e-8)
    assert m.explained_variance_[0] == pytest.approx(row @ row, rel=1e-10)


# ------------------------------------------------------- isotropic / bounds
@pytest.mark.parametrize("kw", SOLVERS)
def test_isotropic_data_terminates(kw):
    """Equal eigenvalues: the directions are arbitrary, the answer must still be sane."""
    X = np.random.default_rng(2).normal(size=(300, 3))
    m = MCPCA(**kw).fit(X)
    _check_sane(m, 3, orth_atol=1e-4)
    np.testing.assert_allclose(m.explained_variance_, 1.0, rtol=0.35)


@pytest.mark.parametrize("kw", SOLVERS)
def test_every_loop_is_bounded_and_reports_convergence(kw):
    """A tolerance no loop can meet: the bounds stop the fit and converged_ says so."""
    X = _gaussian(n=300, scales=(3.0, 1.0, 0.3))
    m = MCPCA(tol=1e-300, max_iter=2, **kw).fit(X)
    _check_sane(m, 3, orth_atol=1e-3)
    assert not m.converged_
    if kw.get("solver") == "paper":
        # each of the p - 1 = 2 components: n_decay sizes x max_iter re-weightings
        assert m.n_iter_ == 2 * 4 * 2
    else:
        assert m.n_iter_ == 2 and m.n_passes_ == 1 + 2


def test_a_direction_without_spread_is_measured_consistently():
    """A constant column (digits' blank pixels): a new row that leaves it is flagged, round-off is not.

    The fit has zero variance there; a deviation far above round-off (1 or
    1e6) must be flagged alike, a deviation at round-off (1e-12) must not.
    (With ``n_components < p`` the discarded directions share
    ``noise_variance_``, as in probabilistic PCA, so a blank pixel is no
    longer a direction without spread.)
    """
    from sklearn.datasets import load_digits

    X = load_digits().data[:600]
    blank = int(np.flatnonzero(X.std(axis=0) == 0)[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = MCPCA().fit(X)
    base = np.asarray(model.is_outlier(X[:50]))
    for value, flagged in ((1e6, True), (1.0, True), (1e-12, False)):
        rows = X[:50].copy()
        rows[:, blank] = value
        assert (np.asarray(model.is_outlier(rows)) == (True if flagged else base)).all(), value


@pytest.mark.parametrize("p, fill", [(50, np.float32(9.96921e36)), (5, 1e37)])
def test_one_row_of_a_fill_value_does_not_move_the_fit(p, fill):
    """A record written with a fill value (netCDF's float32 default, 9.97e36) in every cell, one row in
    6,000: the robust start centred the sample at its mean, which that row moved so far that every other
    row lost its digits; the fit then followed the row (variances 1e72) or flagged every row, converged
    and silent.  Expected: scikit-learn's PCA of the rows without it, and the row flagged."""
    from sklearn.decomposition import PCA

    rng = np.random.default_rng(17)
    X = (rng.normal(size=(6000, 3)) @ rng.normal(size=(3, p)) * 3 + rng.normal(size=(6000, p)) + 5)
    X = X.astype(np.float32) if p == 50 else X
    ref = PCA(n_components=3).fit(np.delete(X, 10, axis=0).astype(np.float64))
    X[10] = fill
    model = MCPCA(n_components=3, random_state=0).fit(X)
    np.testing.assert_allclose(model.explained_variance_, ref.explained_variance_, rtol=0.05)
    flags = np.asarray(model.is_outlier(X))
    assert flags[10] and flags.mean() < 0.01


@pytest.mark.parametrize("extra", ["constant", "derived"])
def test_dead_or_derived_channels_do_not_inflate_the_variances(extra):
    """30 live channels (3 factors) with 30 constant ones beside them, or with 10 channels that are
    differences of others: the robust fit's consistency factor was taken for the full width while its
    radii were for the rank, and every variance came out 1.3x (constant) or 1.2 % (derived) too large.
    Expected: scikit-learn's PCA on these clean rows, within 1 %."""
    from sklearn.decomposition import PCA

    rng = np.random.default_rng(71)
    X = rng.normal(size=(20_000, 3)) @ rng.normal(size=(3, 30)) * 3 + rng.normal(size=(20_000, 30)) + 5
    if extra == "constant":
        X = np.hstack([X, np.full((20_000, 30), 2.0)])
    else:
        X = np.hstack([X, X[:, :10] - X[:, 10:20]])
    got = MCPCA(n_components=3, random_state=0).fit(X).explained_variance_
    np.testing.assert_allclose(got, PCA(3).fit(X).explained_variance_, rtol=0.01)


def test_a_model_updated_with_rows_of_a_higher_rank_saves_and_loads(tmp_path):
    """Rank-3 rows fitted, then partial_fit with noisy rows (rank 10): the update weighed its rows with the
    rank-3 scatter's consistency factor while the file's check read the rank off the merged scatter, and
    refused the saved model as damaged.  Expected: it loads, with the attributes it was saved with."""
    from dask_mcpca import load

    rng = np.random.default_rng(0)
    X = rng.normal(size=(5000, 3)) @ rng.normal(size=(3, 10))
    model = MCPCA(n_components=3, random_state=0).fit(X)
    model.partial_fit(X[:2000] + 0.1 * rng.normal(size=(2000, 10)))
    model.save(tmp_path / "m.json")
    loaded = load(tmp_path / "m.json")
    np.testing.assert_array_equal(loaded.components_, model.components_)
    np.testing.assert_array_equal(loaded.explained_variance_, model.explained_variance_)
