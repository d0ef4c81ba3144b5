"""A cellwise fit of rank-deficient data: channels that copy others or total them (review 6 of 2026-11-28).

The passes complete a row's flagged cells through the scatter's precision; with a pseudo-inverse a
missing copy was completed to make the row lie in the null direction, and a row missing both copies
got round-off conditional covariances (1e11), so the fit's scatter was not a covariance and its file
did not load.  Expected values from scikit-learn's PCA of the same (clean) rows, and from the copy itself.
"""

from __future__ import annotations

import numpy as np
from sklearn.decomposition import PCA

from dask_mcpca import MCPCA, load
from dask_mcpca._cells import cell_precision
from dask_mcpca._missing import conditional


def _derived(seed: int = 3, n: int = 6000) -> np.ndarray:
    """Rank 3 plus noise on 8 channels, then a total of the first three and a copy of channel 4."""
    rng = np.random.default_rng(seed)
    B = rng.normal(size=(n, 3)) @ rng.normal(size=(3, 8)) + 0.3 * rng.normal(size=(n, 8))
    return np.hstack([B, B[:, :3].sum(axis=1, keepdims=True), B[:, [4]]])


def test_a_missing_copy_is_completed_to_the_channel_it_copies():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(500, 3)) @ rng.normal(size=(3, 3))
    Y = np.hstack([A, A[:, [1]]])  # channel 3 copies channel 1
    Y -= Y.mean(axis=0)
    T = cell_precision(np.cov(Y, rowvar=False))
    missing = np.zeros(Y.shape, bool)
    missing[:, 3] = True
    cond = conditional(Y, missing, T)
    np.testing.assert_allclose(cond.completed[:, 3], Y[:, 1], rtol=1e-6, atol=1e-6)
    both = np.zeros(Y.shape, bool)
    both[:, [1, 3]] = True  # both copies missing: a finite conditional covariance, the two equal
    cov = conditional(Y, both, T).groups[0][2]
    assert np.all(np.isfinite(cov)) and np.abs(cov).max() < 10 * np.var(Y[:, 1])
    np.testing.assert_allclose(cov[:, 0, 1], cov[:, 0, 0], rtol=1e-6)


def test_cellwise_fit_of_copied_and_derived_channels_is_pca_and_its_file_loads(tmp_path):
    X = _derived()
    truth = PCA().fit(X).explained_variance_
    rowwise = MCPCA(random_state=0).fit(X)
    model = MCPCA(cellwise=True, random_state=0).fit(X)
    k = model.n_components_
    np.testing.assert_allclose(model.explained_variance_[:3], truth[:3], rtol=0.01)
    np.testing.assert_allclose(model.explained_variance_[3:8], truth[3:8], rtol=0.02)  # noise: as a full-rank fit
    assert np.all(model.explained_variance_[8:k] < 1e-6 * truth[0])  # the two null directions: none
    C = np.asarray(model.update_covariances_[0])
    assert np.abs(C - C.T).max() <= 1e-12 * np.abs(C).max()
    assert np.linalg.eigvalsh(C).min() > -1e-9 * np.abs(C).max()
    model.save(tmp_path / "m.json")
    np.testing.assert_array_equal(load(tmp_path / "m.json").explained_variance_, model.explained_variance_)
    flagged, flagged_rowwise = np.mean(model.is_outlier(X)), np.mean(rowwise.is_outlier(X))
    assert flagged <= 1.5 * flagged_rowwise + 0.001


def test_cellwise_fit_of_exactly_rank_two_data_has_no_variance_beyond_two():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(4000, 2)) @ rng.normal(size=(2, 6))
    truth = PCA().fit(X).explained_variance_
    model = MCPCA(cellwise=True, random_state=0).fit(X)
    np.testing.assert_allclose(model.explained_variance_[:2], truth[:2], rtol=0.01)
    assert np.all(model.explained_variance_[2:] < 1e-6 * truth[0])  # were 2.59, 1.22, 0.26
