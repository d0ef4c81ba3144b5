"""Wide rows' quadratic forms screened in single precision (:mod:`dask_mcpca._screen`).

A row whose single-precision form, with its error bound, lies below a flat top's edge is taken as
inside it (weight exactly 1); every other row gets its double-precision form.  Checked here against
the double-precision forms written out plainly: which rows lie inside the edge is the same for rows
placed within 1e-9 of it, for an ill-conditioned kernel, and for rows beyond single precision's range,
tiny or NaN; the norm bound the error bound rests on is an upper bound; a wide fit keeps its model.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from conftest import assert_close_fits, planted_rows
from numpy.testing import assert_allclose

from dask_mcpca import MCPCA, _screen
from dask_mcpca._block_rows import Workspace


def _factor(p, condition, seed=0):
    """The lower Cholesky factor (Fortran order) of a random SPD matrix of the given condition number."""
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.normal(size=(p, p)))[0]
    A = (Q * np.geomspace(1.0, 1.0 / condition, p)) @ Q.T
    return np.asfortranarray(np.linalg.cholesky((A + A.T) / 2))


def _double_forms(Y, L):
    """|L^T y|^2 of each row, in float64, by a plain product."""
    Z = Y @ L
    return np.einsum("ij,ij->i", Z, Z)


@pytest.mark.parametrize("seed", range(3))
def test_the_norm_bound_lies_above_the_two_norm_and_close_to_it(seed):
    rng = np.random.default_rng(seed)
    for M in (np.abs(_factor(120, 1e4, seed)), rng.random((50, 50)), np.diag(rng.random(30)),
              np.pad(rng.random((20, 20)), ((0, 5), (0, 5)))):  # zero rows and columns
        true = np.linalg.norm(M, 2)
        bound = _screen._abs_norm(M)
        assert true <= bound <= true * (1 + 1e-3)
        assert bound <= np.sqrt((M**2).sum()) * (1 + 1e-9)


@pytest.mark.parametrize("condition", [10.0, 1e6])
def test_rows_inside_the_edge_are_those_of_the_double_forms_and_the_others_get_them(condition):
    p, n = 150, 3000
    rng = np.random.default_rng(1)
    L = _factor(p, condition)
    Y = rng.normal(size=(n, p)) * rng.uniform(0.2, 3.0, size=(n, 1))
    q = _double_forms(Y, L)
    edge = float(np.median(q))
    # rows placed on the edge and within 1e-12 .. 1e-3 of it, on either side
    at = np.arange(0, 300, 3)
    delta = np.tile([0.0, 1e-12, -1e-12, 1e-9, -1e-9, 1e-6, -1e-6, 1e-3, -1e-3, 0.0], 10)
    Y[at] *= np.sqrt(edge * (1 + delta) / q[at])[:, None]
    q = _double_forms(Y, L)
    screen = _screen.Screen.of(L)
    got = screen.quad_forms(np.ascontiguousarray(Y), L, edge, Workspace(np.float64)).copy()
    # the double forms' own round-off decides the rows placed exactly on the edge: skip those 20
    decided = np.abs(q - edge) > 1e-13 * edge
    np.testing.assert_array_equal((got <= edge)[decided], (q <= edge)[decided])
    beyond = got > edge
    assert_allclose(got[beyond], q[beyond], rtol=1e-12)
    assert (got < edge).all() or beyond.any()
    screened = np.flatnonzero(np.abs(got - q) > 1e-12 * q)  # single-precision values: rows taken as inside
    assert len(screened) > 0.3 * n and (q[screened] < edge).all()


def test_rows_beyond_single_precision_tiny_rows_and_nan_rows():
    p = 120
    rng = np.random.default_rng(2)
    L = _factor(p, 100.0)
    Y = rng.normal(size=(400, p))
    Y[0] *= 1e30  # overflows single precision
    Y[1, 3] = 3e38  # a cell beyond single precision's range
    Y[2] *= 1e-42  # subnormal in single precision
    Y[3, 7] = np.nan
    Y[4] = 0.0
    q = _double_forms(np.nan_to_num(Y), L)
    q[3] = np.nan
    edge = float(np.nanmedian(q))
    got = _screen.Screen.of(L).quad_forms(Y, L, edge, Workspace(np.float64))
    assert np.isnan(got[3])
    keep = np.arange(len(Y)) != 3
    np.testing.assert_array_equal((got <= edge)[keep], (q <= edge)[keep])
    assert_allclose(got[:2], q[:2], rtol=1e-12)
    assert got[2] <= edge and got[4] == 0.0


def test_narrow_rows_and_factors_beyond_single_precision_are_not_screened():
    assert _screen.Screen.of(_factor(_screen.SCREEN_FEATURES - 1, 10.0)) is None
    L = _factor(_screen.SCREEN_FEATURES, 10.0) * 1e39
    assert _screen.Screen.of(L) is None


def test_a_wide_fit_keeps_its_model(monkeypatch):
    """p = 100, 3 % gross rows: the fit with the screen against the fit without it (every form in
    double precision): the same passes and flags, the model within 1e-9."""
    n, p, k = 16_000, 100, 4
    X, _ = planted_rows(n, p, k)
    Xd = da.from_array(X, chunks=(4000, p))
    fits, calls = {}, []
    screened = _screen.Screen.quad_forms
    monkeypatch.setattr(_screen.Screen, "quad_forms", lambda *a: calls.append(1) or screened(*a))
    for on in (True, False):
        monkeypatch.setattr(_screen, "SCREEN_FEATURES", 64 if on else 10**6)
        calls.clear()
        fits[on] = MCPCA(n_components=k).fit(Xd)
        assert bool(calls) == on  # the wide passes' sub-blocks went through the screen, or none did
    assert_close_fits(fits[True], fits[False], X)


def test_a_pass_blocks_share_one_screen_per_kernel_and_the_oldest_goes():
    factors = [_factor(80, 10.0, seed) for seed in range(_screen.CACHED + 1)]
    keys = [L.tobytes() for L in factors]
    first = _screen.Screen.of(factors[0], keys[0])
    assert _screen.Screen.of(factors[0], keys[0]) is first
    assert first.L32.dtype == np.float32 and first.norm >= np.linalg.norm(np.abs(factors[0]), 2)
    for L, key in zip(factors[1:], keys[1:], strict=True):
        _screen.Screen.of(L, key)
    assert (keys[0], 80) not in _screen._CACHE and (keys[-1], 80) in _screen._CACHE
    assert len(_screen._CACHE) <= _screen.CACHED
