"""The wide kernel pass (:func:`dask_mcpca._kernels.wide_block`) against the plain definitions.

From ``_block.WIDE_MIN_FEATURES`` columns on, a robust step's block goes by BLAS's products on
sub-blocks that stay in cache (one sweep for the working rows, a triangular product for the
quadratic forms, one SYRK for the first kernel's sums).  Checked here against the definitions
written out plainly in float64: the weights ``exp(min(z_j - q/2, 0) - m_j)`` with
``q = y^T A y``, ``y = (x - c) 2^-u``, and the weighted mean and scatter; with NaN rows and
far rows in some sub-blocks (handed to the numpy spelling and merged), float32 rows as stored,
and the row sample; and the plans it does not serve left to the numpy spelling.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from numpy.testing import assert_allclose

from dask_mcpca import _block, _compiled, _kernels
from dask_mcpca._block import PassPlan, block_stats

DTYPES = [np.float64, np.float32]
#: Agreement with the plain float64 definitions, relative to each quantity's scale.
RTOL = 1e-10


def _plain(X, plan, keep=None):
    """Per kernel: log-scale, weight, mean and scatter of the rows ``keep``, float64, by einsum."""
    Y = np.ldexp(np.asarray(X, np.float64) - np.ldexp(plan.center, plan.unit_exp), -plan.unit_exp)
    if keep is not None:
        Y = Y[keep]
    out = []
    for A, z in zip(plan.kernels, plan.offsets, strict=True):
        e = np.minimum(z - np.einsum("ij,jk,ik->i", Y, A, Y) / 2, 0.0)
        g = np.exp(e - e.max())
        mean = g @ Y / g.sum()
        out.append((e.max(), g.sum(), mean + plan.center, ((Y - mean) * g[:, None]).T @ (Y - mean)))
    return out


def _assert_matches(got, want):
    for j, (m, weight, mean, scatter) in enumerate(want):
        assert_allclose(got.log_scale[j], m, atol=RTOL)
        assert_allclose(got.weight[j], weight, rtol=RTOL)
        assert_allclose(got.mean[j], mean, rtol=RTOL, atol=RTOL * np.abs(mean).max())
        assert_allclose(got.scatter[j], scatter, rtol=RTOL, atol=RTOL * np.abs(scatter).max())


def _step(n, p, dtype, seed=0, unit_exp=0):
    """Correlated rows about 3 and a robust step's two kernels (core, wider final) of their precision."""
    rng = np.random.default_rng(seed)
    B = rng.normal(size=(p, p)) / np.sqrt(p) + np.eye(p)
    X = rng.normal(size=(n, p)) @ B + 3.0
    X[: n // 50] *= 4  # rows outside the flat tops
    A = np.linalg.inv(B.T @ B) / 0.25
    plan = PassPlan(center=np.full(p, 2.9), kernels=np.stack([A, A]), offsets=2 * np.array([1.2 * p, 1.5 * p]),
                    unit_exp=unit_exp)
    return np.ldexp(X, unit_exp).astype(dtype), plan


@pytest.fixture
def spy(monkeypatch):
    """The rows :func:`numpy_part` was handed, by sub-block (by the wide kernel or the router)."""
    seen, numpy_part = [], _kernels.numpy_part

    def spied(Xs, plan, ws):
        seen.append(len(Xs))
        return numpy_part(Xs, plan, ws)

    monkeypatch.setattr(_kernels, "numpy_part", spied)
    monkeypatch.setattr(_block, "numpy_part", spied)
    return seen


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [40, 120])
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled sweep", "numpy sweep"])
def test_wide_step_matches_the_plain_definitions(dtype, p, compiled, spy, monkeypatch):
    """Several sub-blocks (the last one short), a working unit of 2^3: the plain statistics, numpy
    never; the working rows by the compiled sweep or, without numba, by numpy."""
    monkeypatch.setattr(_block, "WIDE_SUB_BLOCK_VALUES", 1100 * p)
    monkeypatch.setattr(_compiled, "AVAILABLE", compiled and _compiled.AVAILABLE)
    X, plan = _step(3 * 1100 + 37, p, dtype, unit_exp=3)
    got = block_stats(X, plan)
    assert got.routes == {"wide": len(X)} and spy == []
    assert (got.n_rows, got.n_nonfinite, got.n_far) == (len(X), 0, 0)
    _assert_matches(got, _plain(X, plan))
    # a stuck value in column 2 (every 40th row) and a repeated row (rows 7 and 2000): weight 0, counted
    X[::40, 2] = 8.0
    X[2000] = X[7]
    row = tuple(np.ldexp(X[7].astype(np.float64), -3))
    stuck = replace(plan, excluded=((2, 1.0),), excluded_rows=(row,))
    got = block_stats(X, stuck)
    assert spy == [] and (got.n_rows, got.n_nonfinite) == (len(X), 0)
    keep = (X[:, 2] != 8.0) & ~(X == X[7]).all(axis=1)
    _assert_matches(got, _plain(X, stuck, keep))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sub_blocks_with_nan_or_far_rows_go_to_numpy(dtype, spy, monkeypatch):
    """A NaN cell and an infinite cell (their rows left out, counted) in two of four sub-blocks:
    those two go to the numpy spelling, the others not (one with a far row: weight 0, in the
    SYRK's sums as zeros); the merged statistics are the plain ones of the finite rows, and the
    row sample holds the rows the numpy spelling draws."""
    p = 50
    monkeypatch.setattr(_block, "WIDE_SUB_BLOCK_VALUES", 1024 * p)
    X, plan = _step(4 * 1024, p, dtype)
    X[10, 3], X[1500, 0] = np.nan, np.inf
    X[2500] = 1e30  # finite, far out: weight exp(-1e60) = 0
    got = block_stats(X, plan)
    assert sorted(spy) == [1024, 1024]
    finite = np.isfinite(X).all(axis=1)
    assert (got.n_rows, got.n_nonfinite) == (len(X) - 2, 2)
    _assert_matches(got, _plain(X, plan, finite & (np.arange(len(X)) != 2500)))
    drawn = replace(plan, sample_rate=0.5, seed=3)
    sampled, want = block_stats(X, drawn, row_offset=7), block_stats(X, drawn, row_offset=7, route="numpy")
    assert np.array_equal(sampled.sample, want.sample)
    assert np.isfinite(sampled.sample).all() and len(sampled.sample) > 1000


def test_plans_it_does_not_serve_keep_the_numpy_spelling(spy):
    """Kernels of two matrices, a narrower second flat top, a kernel not positive definite: the numpy spelling."""
    p = 40
    X, plan = _step(2000, p, np.float64)
    A = plan.kernels[0]
    singular = A.copy()
    singular[0, :] = singular[:, 0] = 0
    for other in (PassPlan(center=plan.center, kernels=np.stack([A, 2 * A]), offsets=plan.offsets),
                  PassPlan(center=plan.center, kernels=plan.kernels, offsets=plan.offsets[::-1]),
                  PassPlan(center=plan.center, kernels=singular[None], offsets=plan.offsets[:1])):
        assert _kernels.wide_block(X, other, _block.Workspace(np.float64), sub_block_rows=1024) is None
        spy.clear()
        got = block_stats(X, other)
        assert sum(spy) == len(X)
        assert_allclose(got.weight, block_stats(X, other, route="numpy").weight, rtol=1e-12)


@pytest.mark.parametrize("offsets", [None, "zero"], ids=["no offsets", "zero offsets"])
def test_kernels_without_a_flat_top_are_left_to_the_numpy_spelling_at_once(offsets, spy, monkeypatch):
    """The paper solver's kernels (no positive offset: no row has weight 1) are not served: no sub-block
    is swept by the wide kernel before going to the numpy spelling (each was done twice before)."""
    swept = []
    wide_sums = _kernels._wide_sums
    monkeypatch.setattr(_kernels, "_wide_sums", lambda *a: swept.append(1) or wide_sums(*a))
    X, plan = _step(3000, 40, np.float64)
    paper = replace(plan, offsets=None if offsets is None else np.zeros(2))
    assert _kernels.wide_block(X, paper, _block.Workspace(np.float64), sub_block_rows=1024) is None
    got = block_stats(X, paper)
    assert swept == [] and sum(spy) == len(X)
    assert_allclose(got.weight, block_stats(X, paper, route="numpy").weight, rtol=1e-12)


def test_the_wide_route_can_be_asked_for():
    """Named "wide" (recorded in ``routes``, asked for with ``route="wide"``) where it serves the block:
    40 columns with flat-top kernels; not at 10 columns (the compiled loops' width) nor for a moments pass."""
    X, plan = _step(3000, 40, np.float64)
    assert _block.choose_route(X, plan).routes == ("wide", "numpy")
    assert _block.choose_route(X, plan, route="wide").routes == ("wide", "numpy")
    got = block_stats(X, plan, route="wide")
    assert got.routes == {"wide": len(X)}
    _assert_matches(got, _plain(X, plan))
    assert block_stats(X, plan, route="numpy").routes == {"numpy": len(X)}
    narrow, narrow_plan = _step(500, 10, np.float64)
    asked = _block.choose_route(narrow, narrow_plan, route="wide")
    assert asked.routes == ("numpy",) and "cannot serve" in asked.reason
    moments = PassPlan(center=plan.center)
    assert "wide" not in _block.choose_route(X, moments).routes
