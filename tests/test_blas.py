"""BLAS's triangular product and rank-k update without the GIL (:mod:`dask_mcpca._blas`), against scipy's wrappers.

The routines are the same library's, called through ctypes (which releases the GIL for the
call) instead of scipy's f2py wrappers (which hold it): the results must be the same bits, in
place, for the shapes the kernels use, and the fallback must give them too.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg.blas import dsyrk, dtrmm

from dask_mcpca import _blas


@pytest.fixture
def rows():
    rng = np.random.default_rng(0)
    W = rng.normal(size=(300, 60))
    L = np.asfortranarray(np.linalg.cholesky(W.T @ W / 300))
    return rng.normal(size=(517, 60)), L


def test_the_products_run_without_the_gil():
    """scipy exports the routines' pointers, so the kernels' products release the GIL."""
    assert _blas.RELEASES_GIL


def test_triangular_product_in_place_is_scipys_bit_for_bit(rows):
    Z, L = rows
    want = Z.copy()
    dtrmm(1.0, L, want.T, side=0, lower=1, trans_a=1, overwrite_b=1)
    got = Z.copy()
    assert _blas.trmm_rows(L, got) is got
    assert np.array_equal(got, want)
    assert np.allclose(got, Z @ L, rtol=1e-12, atol=1e-12)
    c_order = Z.copy()  # a triangular factor in C order: scipy's wrapper, the same product
    assert np.array_equal(_blas.trmm_rows(np.ascontiguousarray(L), c_order), want)


def test_rank_k_update_adds_to_the_upper_triangle_in_place(rows):
    Y, _ = rows
    C = _blas.syrk_update(1.0, Y, None)
    assert np.array_equal(np.triu(C), np.triu(dsyrk(1.0, Y.T, trans=0, lower=0)))
    assert not np.tril(C, -1).any()  # the lower triangle left as it was: zeros
    again = _blas.syrk_update(-0.5, Y[:40], C)
    assert again is C
    assert np.allclose(np.triu(C), np.triu(Y.T @ Y - 0.5 * Y[:40].T @ Y[:40]), rtol=1e-12, atol=1e-9)
    before = C.copy()
    assert np.array_equal(_blas.syrk_update(2.0, Y[:0], C), before)  # no rows: unchanged
