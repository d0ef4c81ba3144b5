"""The one Chan-Golub-LeVeque merge (``_stats.merge_moments``) against numpy's moments of all the rows."""

import numpy as np
import pytest

from dask_mcpca._stats import merge_moments


def _moments(rows: np.ndarray):
    mean = rows.mean(axis=0)
    return len(rows), mean, (rows - mean).T @ (rows - mean)


@pytest.mark.parametrize("offset", [0.0, 1e8])
def test_two_parts_merge_to_the_moments_of_all_rows(offset):
    rows = np.random.default_rng(0).normal(size=(300, 3)) + offset
    n, mean, scatter = merge_moments(*_moments(rows[:120]), *_moments(rows[120:]))
    whole = _moments(rows)
    assert n == 300
    np.testing.assert_allclose(mean, whole[1], rtol=1e-14)
    # far from 0 the rows themselves hold ~1e-8 of their spread: a sum of squares about 0 would lose it all
    np.testing.assert_allclose(scatter, whole[2], rtol=1e-9, atol=1e-6 * np.trace(whole[2]) if offset else 0)


def test_stacked_sets_and_an_empty_one():
    rows = np.random.default_rng(1).normal(size=(50, 2))
    a, b = _moments(rows[:20]), _moments(rows[20:])
    weight, mean, scatter = merge_moments(np.array([a[0], 0.0]), np.stack([a[1], a[1]]), np.stack([a[2], a[2]]),
                                          np.array([b[0], 0.0]), np.stack([b[1], b[1]]), np.stack([b[2], b[2]]))
    np.testing.assert_array_equal(weight, [50, 0])
    np.testing.assert_allclose(mean[0], rows.mean(axis=0), rtol=1e-13)
    np.testing.assert_allclose(scatter[0], _moments(rows)[2], rtol=1e-12)
    np.testing.assert_array_equal(mean[1], a[1])  # no weight: the first mean is kept
