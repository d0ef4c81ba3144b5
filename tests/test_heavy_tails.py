"""The outlier cutoff on a heavy-tailed bulk (issue 36, point 4).

Expected values come from outside the code under test: the law of a
multivariate t row's squared distance, ``d^2 / p ~ F(p, nu)`` under its
scatter (Anderson 2003, sec. 2.7), whose quantiles scipy gives, and the
chi-square law of a Gaussian row's.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import optimize, stats

import dask_mcpca._schedule as schedule
from dask_mcpca import MCPCA
from dask_mcpca._schedule import OUTLIER_QUANTILE, TAIL_GUARD, TAIL_QUANTILE, calibrated_cutoff, upper_tail_spread

P = 6


def _law_spread(cdf, ppf) -> float:
    """The upper-tail spread of ``cbrt(d^2)`` from the law of ``d^2`` alone (cdf, ppf), written out:
    median c, MAD m (P(|r - c| <= m) = 1/2), the TAIL_QUANTILE quantile of the roots within
    TAIL_GUARD normal MADs of c, over the normal quantile."""
    c = np.cbrt(ppf(0.5))
    m = optimize.brentq(lambda m: cdf((c + m) ** 3) - cdf(max(c - m, 0) ** 3) - 0.5, 1e-9, 10 * c)
    guard = c + TAIL_GUARD * m * 1.482602218505602
    q = np.cbrt(ppf(TAIL_QUANTILE * cdf(guard**3)))
    return (q - c) / stats.norm.ppf(TAIL_QUANTILE)


@pytest.mark.parametrize("dof", [3, 5])
def test_upper_tail_spread_is_the_t_laws(dof):
    """On d^2 drawn from the law of a t row's distance, the spread matches the F law's quantiles."""
    d2 = P * stats.f.rvs(P, dof, size=400_000, random_state=np.random.default_rng(dof))
    roots = np.cbrt(d2)
    got = upper_tail_spread(roots, np.median(roots), stats.median_abs_deviation(roots, scale="normal"))
    want = _law_spread(lambda x: stats.f.cdf(x / P, P, dof), lambda q: P * stats.f.ppf(q, P, dof))
    assert abs(got / want - 1) < 0.01
    mad = stats.median_abs_deviation(roots, scale="normal")
    assert got > 1.15 * mad  # the tail is longer than the MAD says


def test_gaussian_cutoff_is_still_the_chi_square_quantile():
    """Chi-square distances: the upper decile gives the MAD's spread, and the cutoff its 99.8 % quantile."""
    d2 = stats.chi2.rvs(P, size=400_000, random_state=np.random.default_rng(0))
    cutoff = calibrated_cutoff(d2, OUTLIER_QUANTILE, p=P, n_effective=len(d2), law="fitted")
    assert abs(cutoff / stats.chi2.ppf(OUTLIER_QUANTILE, P) - 1) < 0.02


@pytest.mark.parametrize("dof", [3, 5])
def test_cutoff_moves_towards_the_t_laws_quantile(dof):
    """The extrapolated cutoff lies between the MAD-only one and the t law's own 99.8 % quantile, and
    flags fewer of the law's rows than the MAD-only one (the exact rate is not reached: HEAVY_TAILS.md)."""
    d2 = P * stats.f.rvs(P, dof, size=200_000, random_state=np.random.default_rng(10 + dof))
    after = calibrated_cutoff(d2, OUTLIER_QUANTILE, p=P, n_effective=len(d2), law="fitted")
    saved, schedule.TAIL_QUANTILE = schedule.TAIL_QUANTILE, None
    try:
        before = calibrated_cutoff(d2, OUTLIER_QUANTILE, p=P, n_effective=len(d2), law="fitted")
    finally:
        schedule.TAIL_QUANTILE = saved
    exact = P * stats.f.ppf(OUTLIER_QUANTILE, P, dof)
    assert before < after < exact
    assert stats.f.sf(after / P, P, dof) < 0.7 * stats.f.sf(before / P, P, dof)


def _t_rows(dof, seed, n=20_000):
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, P)) @ rng.normal(size=(P, P)).T
    return Z / np.sqrt(rng.chisquare(dof, n) / dof)[:, None]


@pytest.mark.slow
def test_fit_on_t_rows_flags_fewer_and_still_finds_far_rows():
    """A fitted model on t5 rows: fewer than 2.5 % flagged (2.9 % with the MAD alone), and rows moved
    100 scale units away (far beyond the t law's 99.99 % quantile) are all found."""
    X = _t_rows(5, 0)
    far = np.arange(0, len(X), 50)  # 2 % of the rows
    X[far] += 100 * np.sqrt(np.diag(np.cov(X[::7], rowvar=False)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flags = np.asarray(MCPCA().fit(X).is_outlier(X))
    rest = np.ones(len(X), bool)
    rest[far] = False
    assert flags[far].all()
    assert flags[rest].mean() < 0.025
