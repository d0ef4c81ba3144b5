"""Reconstruction-based contributions: against their definition, units, single faults, the default.

The expected values are computed here from the definition, independently of
the formula ``(P y)_j^2 / P_jj``: the drop in ``d^2 = y^T P y`` when channel j
alone is moved to the value that minimises ``d^2`` (its conditional
expectation given the others), found by a numerical minimisation.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from dask_mcpca import MCPCA
from dask_mcpca._contributions import __all__ as public
from dask_mcpca._contributions import contributions_with_gaps, reconstruction_contributions


def _cov(rng, k):
    A = rng.normal(size=(k, k))
    return A @ A.T + 0.1 * np.eye(k)


def _brute_force(y, P):
    d2 = float(y @ P @ y)
    out = np.empty(len(y))
    for j in range(len(y)):

        def f(t, j=j):
            z = y.copy()
            z[j] = t
            return float(z @ P @ z)

        out[j] = d2 - minimize_scalar(f, bracket=(y[j] - 1.0, y[j] + 1.0), tol=1e-12).fun
    return out


def test_public_names():
    assert public == ["reconstruction_contributions", "contributions_with_gaps"]


@pytest.mark.parametrize("k", [1, 2, 3, 6])
def test_equals_the_drop_in_d2_by_brute_force(k):
    rng = np.random.default_rng(k)
    P = np.linalg.inv(_cov(rng, k))
    Y = rng.normal(size=(5, k)) * 3
    expected = np.array([_brute_force(y, P) for y in Y])
    np.testing.assert_allclose(reconstruction_contributions(Y, P), expected, rtol=1e-6, atol=1e-9)


def test_a_subset_of_channels_with_the_marginal_precision():
    """A row with gaps: its observed channels, the inverse of the covariance restricted to them."""
    rng = np.random.default_rng(7)
    C = _cov(rng, 5)
    obs = np.array([0, 2, 3])
    P_obs = np.linalg.inv(C[np.ix_(obs, obs)])
    y = rng.normal(size=5) * 2
    got = reconstruction_contributions(y[obs], P_obs)  # one row, 1-D
    assert got.shape == (3,)
    np.testing.assert_allclose(got, _brute_force(y[obs], P_obs), rtol=1e-6, atol=1e-9)


def test_unit_invariance():
    rng = np.random.default_rng(1)
    C = _cov(rng, 6)
    Y = rng.multivariate_normal(np.zeros(6), C, size=50)
    base = reconstruction_contributions(Y, np.linalg.inv(C))
    s = 10.0 ** np.array([-6, -3, 0, 2, 4, 6])
    D = np.diag(s)
    scaled = reconstruction_contributions(Y * s, np.linalg.inv(D @ C @ D))
    np.testing.assert_allclose(scaled, base, rtol=1e-7, atol=1e-12)


def test_a_channel_the_precision_does_not_see():
    P = np.array([[2.0, 0.5, 0.0], [0.5, 1.0, 0.0], [0.0, 0.0, 0.0]])
    c = reconstruction_contributions(np.array([[1.0, -1.0, 1e300]]), P)
    assert c[0, 2] == 0.0 and np.all(np.isfinite(c))
    np.testing.assert_allclose(c[0, :2], reconstruction_contributions(np.array([[1.0, -1.0]]), P[:2, :2])[0])
    bad = P.copy()
    bad[2, 2] = np.nan
    assert reconstruction_contributions(np.ones((1, 3)), bad)[0, 2] == 0.0
    bad[2, 2] = -1.0
    assert reconstruction_contributions(np.ones((1, 3)), bad)[0, 2] == 0.0


def test_nan_cells_and_bad_shapes():
    P = np.eye(3)
    c = reconstruction_contributions(np.array([[np.nan, 1.0, 1.0], [1.0, 2.0, 3.0]]), P)
    assert np.isnan(c[0]).all() and np.allclose(c[1], [1.0, 4.0, 9.0])
    with pytest.raises(ValueError, match="square"):
        reconstruction_contributions(np.ones((2, 3)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="channels"):
        reconstruction_contributions(np.ones((2, 3)), np.eye(4))


@pytest.mark.parametrize("seed", range(5))
def test_a_single_channel_fault_is_named(seed):
    """Known truth: a fault of 10 conditional sd on channel i, correlated channels in units 1e6 apart."""
    rng = np.random.default_rng(seed)
    k = 8
    C = _cov(rng, k)
    s = 10.0 ** rng.uniform(-3, 3, k)
    C = C * s[:, None] * s[None, :]
    P = np.linalg.inv(C)
    Y = rng.multivariate_normal(np.zeros(k), C, size=800)
    truth = np.arange(len(Y)) % k
    sign = rng.choice([-1, 1], len(Y))
    Y[np.arange(len(Y)), truth] += sign * 10 / np.sqrt(np.diag(P))[truth]  # 10 conditional sd
    c = reconstruction_contributions(Y, P)
    assert (c.argmax(axis=1) == truth).mean() >= 0.95  # random covariances: some partial correlations ~0.9
    # the guarantee's limit: a fault large enough is always named, whatever the noise
    Y[np.arange(len(Y)), truth] += sign * 1e4 / np.sqrt(np.diag(P))[truth]
    assert (reconstruction_contributions(Y, P).argmax(axis=1) == truth).all()


def _fitted():
    rng = np.random.default_rng(0)
    W = rng.normal(size=(5, 2))
    X = rng.normal(size=(3000, 2)) @ W.T + 0.3 * rng.normal(size=(3000, 5))
    return X, MCPCA().fit(X)


def test_the_default_method_of_the_estimator():
    X, model = _fitted()
    rows = X[:40].copy()
    rows[:, 1] += 5.0
    default = model.channel_contributions(rows)
    expected = reconstruction_contributions(rows - model.mean_, model.get_precision())
    np.testing.assert_allclose(default, expected, rtol=1e-12)
    np.testing.assert_array_equal(model.channel_contributions(rows, method="reconstruction"), default)
    np.testing.assert_array_equal(model.channel_contributions(rows, method="residual"), default)  # former name
    assert (default.max(axis=1) <= model.mahalanobis(rows) * (1 + 1e-9)).all()
    assert (default.argmax(axis=1) == 1).all()


def test_the_fitted_model_attributes_alike_in_any_units():
    """Fit and attribute in other units: the reconstruction contributions do not move, whitened ones do.

    (Units 1e-2 to 30: over six decades the fit itself, not the attribution,
    drifts: its smallest variances are found to a tolerance relative to the
    largest.)
    """
    X, model = _fitted()
    s = np.array([1e-2, 1.0, 30.0, 0.1, 10.0])
    scaled = MCPCA().fit(X * s)
    rows = X[:200].copy()
    rows[np.arange(200), np.arange(200) % 5] += 3.0
    a = model.channel_contributions(rows)
    b = scaled.channel_contributions(rows * s)
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-8 * a.max())
    assert (a.argmax(axis=1) == b.argmax(axis=1)).all()
    w_a = model.channel_contributions(rows, method="whitened").argmax(axis=1)
    w_b = scaled.channel_contributions(rows * s, method="whitened").argmax(axis=1)
    assert (w_a != w_b).mean() > 0.1


def test_rows_with_gaps_are_judged_on_their_observed_channels():
    X, model = _fitted()
    P, cov = model.get_precision(), model.get_covariance()
    Y = X[:3] - model.mean_
    Y[:, 2] += 10.0
    Y[1, 0] = np.nan
    c = contributions_with_gaps(Y, P, cov)
    assert np.isnan(c[1, 0]) and (np.nanargmax(c, axis=1) == 2).all()
    obs = np.array([1, 2, 3, 4])
    np.testing.assert_allclose(
        c[1, obs], reconstruction_contributions(Y[1, obs], np.linalg.inv(cov[np.ix_(obs, obs)])), rtol=1e-8
    )
    np.testing.assert_allclose(c[[0, 2]], reconstruction_contributions(Y[[0, 2]], P), rtol=1e-12)
    # the estimator under nan_policy="partial" gives the same, NaN for the missing cell
    model.set_params(nan_policy="partial")
    np.testing.assert_allclose(model.channel_contributions(Y + model.mean_), c, rtol=1e-10)
