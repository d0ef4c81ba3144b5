"""The paper solver's variances that its passes do not give (the paper outputs components only).

The last component's variance was the inversion of a Gaussian-weighted variance
at a kernel size ~0.1 % of it, so noise ruled it (on the paper's 3 x 3 example, clean:
0.24 for a true 1.94, and 22 % of the clean rows flagged); a single channel's was its
plain mean square; the discarded directions' total was the unweighted trace, outliers
included.  Expected values from the construction: the generating covariance.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from dask_mcpca import MCPCA


def _fit(X, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return MCPCA(solver="paper", center=False, **kw).fit(X)


@pytest.mark.slow  # CI tier: the paper's 65 kernel sizes (1.9 s)
def test_the_last_components_variance_on_the_papers_example():
    S = np.array([[8, 3, -1], [3, 4, -2], [-1, -2, 6.0]])  # the covariance of the paper's experiment
    truth = np.linalg.eigvalsh(S)[::-1]
    X = np.random.default_rng(0).multivariate_normal(np.zeros(3), S, size=20_000)
    model = _fit(X)  # the paper's schedule (65 kernel sizes): the last one ~0.1 % of the variance
    assert model.explained_variance_[-1] == pytest.approx(truth[-1], rel=0.1)
    assert model.explained_variance_ratio_.sum() == pytest.approx(1.0)
    assert np.mean(model.is_outlier(X)) < 0.01  # clean rows: near the nominal 0.2 %


def test_the_discarded_variance_ignores_outliers_in_the_discarded_channels():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20_000, 4)) * np.sqrt([9, 4, 1, 1])
    X[:2000, 2:] = rng.normal(size=(2000, 2)) * 5  # 10 % outliers in the two discarded channels
    model = _fit(X, n_components=2, n_decay=20)
    assert model.noise_variance_ == pytest.approx(1.0, rel=0.3)  # the clean rows' (1), not 3.4
    assert np.mean(model.is_outlier(X[:2000])) > 0.5


@pytest.mark.slow  # CI tier: the paper's 65 kernel sizes (2.3 s a draw; one draw keeps CI under 8 minutes)
@pytest.mark.parametrize("seed", [1])
def test_every_components_variance_on_clean_gaussian_data(seed):
    """Each component's variance was its weighted variance at its last kernel size, where ~20 of 5,000
    rows carry the weight, the rows its direction was chosen on: the first ones 75 % too high on average
    (up to 21 for a true 9).  Expected: the generating variances, within 15 % (the paper's directions
    are a few degrees off on such data)."""
    X = np.random.default_rng(seed).standard_normal((5000, 4)) * [3, 2, 1, 0.5]
    np.testing.assert_allclose(_fit(X, n_decay=65).explained_variance_, [9, 4, 1, 0.25], rtol=0.15)
