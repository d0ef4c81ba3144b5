"""Rows with gaps at wide p (issue 37, point 2): scattered NaN cells, almost every row its own pattern.

Expected values come from the textbook (the Gaussian conditional with
``S_OO`` inverted explicitly per row, Little and Rubin 2002, ch. 11), from
an eigendecomposition for a semi-definite precision, and from the fit of
the same rows without gaps.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from scipy.linalg import subspace_angles

from dask_mcpca import MCPCA
from dask_mcpca._missing import conditional

#: Widths where 1 % NaN cells leave most rows with a gap, each in its own place.
WIDTHS = [80, 150]


def _covariance(p: int, seed: int) -> np.ndarray:
    A = np.random.default_rng(seed).normal(size=(p, p))
    return A @ A.T / p + np.eye(p)


def _gappy(p: int, n: int, seed: int, share: float = 0.01):
    rng = np.random.default_rng(seed)
    S = _covariance(p, seed)
    Y = rng.multivariate_normal(np.zeros(p), S, size=n)
    return Y, rng.random(Y.shape) < share, S


@pytest.mark.parametrize("p", WIDTHS)
def test_wide_rows_with_scattered_gaps_match_the_textbook(p):
    Y, missing, S = _gappy(p, 400, p)
    missing[:5, :6] = True  # a few rows with several gaps
    cond = conditional(Y, missing, np.linalg.inv(S))
    for i in np.flatnonzero(missing.any(axis=1))[:40]:
        o, m = np.flatnonzero(~missing[i]), np.flatnonzero(missing[i])
        inv = np.linalg.inv(S[np.ix_(o, o)])
        np.testing.assert_allclose(cond.completed[i, m], S[np.ix_(m, o)] @ inv @ Y[i, o], rtol=1e-8, atol=1e-9)
        np.testing.assert_allclose(cond.d2[i], Y[i, o] @ inv @ Y[i, o], rtol=1e-9)
        np.testing.assert_allclose(cond.residual[i, o], inv @ Y[i, o], rtol=1e-7, atol=1e-9)
        np.testing.assert_array_equal(cond.residual[i, m], 0.0)


@pytest.mark.parametrize("p", WIDTHS)
def test_a_rows_completion_does_not_depend_on_its_block(p):
    Y, missing, S = _gappy(p, 3000, p + 1)
    T = np.linalg.inv(S)
    whole = conditional(Y, missing, T)
    for cuts in ([1, 777, 2000], [1234], [2999]):
        parts = [conditional(y, g, T) for y, g in zip(np.split(Y, cuts), np.split(missing, cuts), strict=True)]
        np.testing.assert_array_equal(np.concatenate([c.completed for c in parts]), whole.completed)
        np.testing.assert_allclose(np.concatenate([c.d2 for c in parts]), whole.d2, rtol=1e-12)


def test_a_semi_definite_precision_gives_the_quadratic_form():
    """Where the precision has a null direction (a pseudo-inverse), no triangular root exists: the
    distance is still ``y^T T y``, here from the precision's eigenvectors."""
    p = 12
    rng = np.random.default_rng(3)
    Q, _ = np.linalg.qr(rng.normal(size=(p, p)))
    lam = np.r_[rng.uniform(0.5, 2.0, p - 1), 0.0]
    T = (Q * lam) @ Q.T
    Y = rng.normal(size=(50, p))
    cond = conditional(Y, np.zeros(Y.shape, bool), T)
    np.testing.assert_allclose(cond.d2, ((Y @ Q) ** 2 * lam).sum(axis=1), rtol=1e-9)


@pytest.mark.parametrize("p", WIDTHS)
def test_partial_fit_at_wide_p_holds_the_complete_fit_and_any_chunking(p):
    """1 % NaN cells at p = 80 and 150: 55 % and 78 % of the rows with a gap, nearly every one its
    own pattern.  The partial fit stays close to the fit of the same rows without gaps, and
    the same on any row chunking."""
    rng = np.random.default_rng(p)
    n = 6000
    L = rng.normal(size=(p, 3)) * np.array([3.0, 2.0, 1.5])
    X = rng.normal(size=(n, 3)) @ L.T + rng.normal(size=(n, p))
    Xg = np.where(rng.random(X.shape) < 0.01, np.nan, X)
    assert (np.isnan(Xg).any(axis=1)).mean() > 0.5
    full = MCPCA(n_components=3, random_state=0).fit(X)
    part = MCPCA(n_components=3, nan_policy="partial", random_state=0).fit(Xg)
    angle = np.degrees(subspace_angles(full.components_.T, part.components_.T)).max()
    assert angle < 0.5
    np.testing.assert_allclose(part.explained_variance_, full.explained_variance_, rtol=0.03)
    chunked = MCPCA(n_components=3, nan_policy="partial", random_state=0).fit(da.from_array(Xg, chunks=(1700, p)))
    np.testing.assert_allclose(np.abs(np.sum(chunked.components_ * part.components_, axis=1)), 1.0, atol=1e-9)
    np.testing.assert_allclose(chunked.explained_variance_, part.explained_variance_, rtol=1e-9)


@pytest.mark.parametrize("p", WIDTHS)
def test_compiled_and_numpy_completions_agree(p, monkeypatch):
    from dask_mcpca import _compiled

    if not _compiled.AVAILABLE:
        pytest.skip("numba is not available: only the numpy spelling runs")
    Y, missing, S = _gappy(p, 500, p + 2, share=0.03)
    T = np.linalg.inv(S)
    compiled = conditional(Y, missing, T)
    monkeypatch.setattr(_compiled, "AVAILABLE", False)
    numpy = conditional(Y, missing, T)
    np.testing.assert_allclose(compiled.completed, numpy.completed, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(compiled.variances(), numpy.variances(), rtol=1e-10, atol=1e-12)


def test_a_channel_without_precision_is_completed_by_the_pseudo_inverse():
    """A precision with no weight on channel 0 (a pseudo-inverse of a scatter where channel 0 has no
    spread): a row missing it has a singular ``T_MM``, which the compiled solve leaves to the
    pseudo-inverse, so that channel is completed with 0 and a conditional variance of 0, and the
    other rows are completed as the precision on the remaining channels says."""
    p = 8
    S = _covariance(p - 1, 4)
    T = np.zeros((p, p))
    T[1:, 1:] = np.linalg.inv(S)
    rng = np.random.default_rng(4)
    Y = rng.normal(size=(30, p))
    missing = np.zeros(Y.shape, bool)
    missing[:10, 0] = True
    missing[10:, 3] = True
    cond = conditional(Y, missing, T)
    np.testing.assert_array_equal(cond.completed[:10, 0], 0.0)
    np.testing.assert_array_equal(cond.variances()[:10, 0], 0.0)
    o = [1, 2, 4, 5, 6, 7]
    inv = np.linalg.inv(S[np.ix_([i - 1 for i in o], [i - 1 for i in o])])
    expected = S[2, [i - 1 for i in o]] @ inv @ Y[10:, o].T
    np.testing.assert_allclose(cond.completed[10:, 3], expected, rtol=1e-9)


def test_e_step_scatter_of_several_kernels_is_the_weighted_sum_row_by_row():
    """Rows inside every kernel's flat top are summed once per count and scaled per kernel; the sum
    is still ``sum_i G_ji (c_p / c_k_i) y_i y_i^T`` per kernel, here written out row by row."""
    from dask_mcpca._partial_stats import _completed_scatter

    rng = np.random.default_rng(5)
    n, p = 400, 7
    Y = rng.normal(size=(n, p))
    counts = rng.integers(4, p, n)
    G = np.where(rng.random((2, n)) < 0.7, 1.0, rng.random((2, n)))
    G[1] = np.maximum(G[0], G[1])
    ratio = 1.0 + rng.random((2, p + 1))
    weight, wsum, scatter = _completed_scatter(Y, G, ratio, counts)
    for j in range(2):
        w = G[j] * ratio[j, counts]
        np.testing.assert_allclose(scatter[j], sum(w[i] * np.outer(Y[i], Y[i]) for i in range(n)), rtol=1e-12)
        np.testing.assert_allclose(wsum[j], G[j] @ Y, rtol=1e-12)
        np.testing.assert_allclose(weight[j], G[j].sum(), rtol=1e-12)
    single = _completed_scatter(Y, G[:1], ratio[:1], counts)[2]
    np.testing.assert_allclose(single[0], scatter[0], rtol=1e-12)


def test_e_step_scales_are_the_flat_top_consistency_per_count():
    """One scipy call for all counts and kernels gives what the scalar consistency factor gives for
    each (an infinite radius: every row has weight 1, scale 1)."""
    from dask_mcpca._missing import estep_scales
    from dask_mcpca._schedule import flat_top_consistency

    p, c2 = 40, 1.7
    offsets = np.random.default_rng(6).uniform(0.5, 3.0, (2, p + 1))
    offsets[1, 5] = np.inf
    shrink, ratio = estep_scales(offsets, c2)
    expected = np.ones((2, p + 1))
    for j in range(2):
        for k in range(1, p + 1):
            q = 2 * c2 * offsets[j, k]
            expected[j, k] = 1 / flat_top_consistency(k, c2, q) if np.isfinite(q) else 1.0
    np.testing.assert_allclose(shrink, expected[:, p], rtol=1e-14)
    np.testing.assert_allclose(ratio, expected[:, p:] / expected, rtol=1e-14)


@pytest.mark.parametrize("k", [5, 40])
def test_row_distances_give_a_row_the_same_bits_in_any_run_of_rows(k):
    """The compiled distances take rows eight at a time: a row's distance and top channel are the same
    bits alone, in a short last run, or anywhere in a block; and they are the plain definitions."""
    from dask_mcpca import _compiled

    if not _compiled.AVAILABLE:
        pytest.skip("numba is not available: the numpy spelling serves every row")
    rng = np.random.default_rng(k)
    p, n = 40, 27
    X = rng.normal(size=(n, p))
    center = rng.normal(size=p)
    components = np.linalg.qr(rng.normal(size=(p, p)))[0][:k].copy()
    inv_var = rng.uniform(0.5, 2.0, k)
    inv_noise = 0.0 if k == p else 0.8
    top_matrix = rng.normal(size=(p, p))

    def run(rows):
        d2, top = np.empty(len(rows)), np.empty(len(rows), np.int16)
        _compiled.row_distances(np.ascontiguousarray(rows), center, 0.5, components, inv_var, inv_noise,
                                top_matrix, d2, top)
        return d2, top

    d2, top = run(X)
    for i in range(n):
        d, t = run(X[i : i + 1])
        assert d[0] == d2[i] and t[0] == top[i]
    np.testing.assert_array_equal(run(X[5:])[0], d2[5:])
    Y = (X - center) * 0.5
    z = Y @ components.T
    plain = (z**2 * inv_var).sum(axis=1) + np.maximum((Y**2).sum(axis=1) - (z**2).sum(axis=1), 0) * inv_noise
    np.testing.assert_allclose(d2, plain, rtol=1e-10)
    np.testing.assert_array_equal(top, np.argmax((Y @ top_matrix) ** 2, axis=1))
