"""The outlier cutoff of small samples (issue 21, part 3: "Small samples lost their outliers").

Expected values come from outside the code under test: the stackloss data
(Brownlee 1965, as in R's ``datasets::stackloss``) and its published
outliers, rows 1, 2, 3 and 21 (Rousseeuw and Leroy 1987, p. 76-80; Rousseeuw
and Van Driessen 1999, FAST-MCD, robust distances of all four variables);
the law of a fitted row's distance checked by simulation; quantiles of the
Beta, F and chi-square laws computed here from scipy.
"""

import warnings

import numpy as np
from scipy import stats

from dask_mcpca import MCPCA
from dask_mcpca._schedule import OUTLIER_QUANTILE, calibrated_cutoff, fitted_quantile

# Air.Flow, Water.Temp, Acid.Conc., stack.loss (Brownlee 1965, pp. 491-500).
STACKLOSS = np.array([
    [80, 27, 89, 42], [80, 27, 88, 37], [75, 25, 90, 37], [62, 24, 87, 28], [62, 22, 87, 18],
    [62, 23, 87, 18], [62, 24, 93, 19], [62, 24, 93, 20], [58, 23, 87, 15], [58, 18, 80, 14],
    [58, 18, 89, 14], [58, 17, 88, 13], [58, 18, 82, 11], [58, 19, 93, 12], [50, 18, 89, 8],
    [50, 18, 86, 7], [50, 19, 72, 8], [50, 19, 79, 8], [50, 20, 80, 9], [56, 20, 82, 15],
    [70, 20, 91, 15],
], dtype=float)
STACKLOSS_OUTLIERS = np.array([1, 2, 3, 21]) - 1


def _fit(X):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MCPCA().fit(X)


def test_fitted_rows_distances_follow_the_beta_law():
    """d^2 of rows under their own mean and covariance (divisor n), simulated, against fitted_quantile."""
    rng = np.random.default_rng(0)
    n, p = 21, 4
    d2 = []
    for _ in range(4000):
        X = rng.normal(size=(n, p))
        Y = X - X.mean(axis=0)
        d2.append(np.einsum("ij,ij->i", Y @ np.linalg.inv(Y.T @ Y / n), Y))
    d2 = np.concatenate(d2)
    assert d2.max() <= n - 1 + 1e-9
    for q in (0.9, 0.99):
        assert abs(np.quantile(d2, q) / fitted_quantile(p, n, q) - 1) < 0.03
    assert fitted_quantile(p, p + 1, 0.9) == np.inf


def test_outlier_floor_is_the_beta_law_for_small_samples_and_hotelling_beyond():
    tiny = np.full(50, 1e-3)  # the calibrated quantile far below any floor
    n, p = 21, 4
    beta = (n - 1) * stats.beta.ppf(OUTLIER_QUANTILE, p / 2, (n - p - 1) / 2)
    assert abs(calibrated_cutoff(tiny, OUTLIER_QUANTILE, p=p, n_effective=n, law="fitted") / beta - 1) < 1e-9
    assert beta < stats.chi2.ppf(OUTLIER_QUANTILE, p)
    # The re-weighting radii keep the new-row (Hotelling) law.
    f = stats.f.ppf(OUTLIER_QUANTILE, p, n - p)
    hotelling = p * (n - 1) * (n + 1) / (n * (n - p)) * f
    assert abs(calibrated_cutoff(tiny, OUTLIER_QUANTILE, p=p, n_effective=n) / hotelling - 1) < 1e-9
    # p = 2, 40 rows: the Beta quantile lies beyond the flat top (Hotelling's 97.5 %), so rows that
    # far out carry no weight and the new-row law is the floor.
    n, p = 40, 2
    assert (n - 1) * stats.beta.ppf(OUTLIER_QUANTILE, 1, (n - 3) / 2) > (
        p * (n - 1) * (n + 1) / (n * (n - p)) * stats.f.ppf(0.975, p, n - p))
    hotelling = p * (n - 1) * (n + 1) / (n * (n - p)) * stats.f.ppf(OUTLIER_QUANTILE, p, n - p)
    assert abs(calibrated_cutoff(tiny, OUTLIER_QUANTILE, p=p, n_effective=n, law="fitted") / hotelling - 1) < 1e-9


def test_stackloss_published_outliers_are_found():
    model = _fit(STACKLOSS)
    flags = np.asarray(model.is_outlier(STACKLOSS))
    truth = np.zeros(len(STACKLOSS), bool)
    truth[STACKLOSS_OUTLIERS] = True
    tp = (flags & truth).sum()
    precision, recall = tp / max(flags.sum(), 1), tp / truth.sum()
    assert 2 * precision * recall / (precision + recall) >= 0.8, np.flatnonzero(flags) + 1
    assert model.outlier_cutoff_ < stats.chi2.ppf(OUTLIER_QUANTILE, 4)


def test_small_clean_samples_flag_few_rows():
    for n, p in ((20, 5), (21, 4), (40, 8)):
        shares = [np.mean(_fit(X := np.random.default_rng(s).normal(size=(n, p))).is_outlier(X))
                  for s in range(20)]
        assert np.median(shares) <= 0.05 and max(shares) <= 0.25, (n, p, shares)
