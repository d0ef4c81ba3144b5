"""The compiled loops of a kernel pass, and the numpy spelling they stand in for, against plain numpy.

:mod:`dask_mcpca._compiled` does the usual sub-block of a kernel pass; the
numpy spelling in :mod:`dask_mcpca._kernels` does the rest (NaN or inf rows,
far rows, kernels that are not one matrix) and all of it
when ``COMPILED`` is False; the router, :func:`dask_mcpca._block.block_stats`,
takes the route a test asks for (``route=``).  All are checked here against the definitions
written out plainly in float64 (``_plain``): the weights
``exp(min(z_j - q/2, 0) - m_j)`` with ``q = (y - c)^T A (y - c)`` in working
units, and the weighted mean and scatter about it.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from numpy.testing import assert_allclose

from dask_mcpca import _block, _compiled, _kernels
from dask_mcpca._block import SUB_BLOCK_ROWS, PassPlan, block_stats, choose_route

#: The usual routes (the compiled loops: one sweep for kernels with flat tops, two for the
#: others and for any kernel none of whose rows is near its flat top), the two compiled sweeps
#: asked for, and the numpy spelling asked for: the ``route=`` of :func:`block_stats`.
SPELLINGS = {"usual": None, "two sweeps": "two_sweeps", "numpy": "numpy"}
DTYPES = [np.float64, np.float32]
#: Agreement with the plain float64 definitions, relative to each quantity's magnitude: float32
#: rows are worked in float64 too (issue 23), so they agree as closely.
RTOL = {np.float64: 1e-11, np.float32: 1e-11}


@pytest.fixture(params=list(SPELLINGS))
def spelling(request):
    """The route to ask :func:`block_stats` for (None: the usual choice)."""
    return SPELLINGS[request.param]


def _plain(X, plan, keep=None):
    """Per kernel: log-scale, weight, mean and scatter of the rows ``keep`` (working units), float64."""
    Y = np.ldexp(np.asarray(X, np.float64) - np.ldexp(plan.center, plan.unit_exp), -plan.unit_exp)
    if keep is not None:
        Y = Y[keep]
    offsets = np.zeros(plan.n_kernels) if plan.offsets is None else plan.offsets
    out = []
    for A, z in zip(plan.kernels, offsets, strict=True):
        q = np.einsum("ij,jk,ik->i", Y, A, Y)
        e = np.minimum(z - q / 2, 0.0)
        m = e.max()
        g = np.exp(e - m)
        mean = g @ Y / g.sum()
        scatter = ((Y - mean) * g[:, None]).T @ (Y - mean)
        raw = np.abs((Y * g[:, None]).T @ Y).max()  # the sums are formed about the centre: their round-off scale
        out.append((m, g.sum(), mean + plan.center, scatter, raw))
    return out


def _assert_matches(got, want, dtype):
    rtol = RTOL[dtype]
    for j, (m, weight, mean, scatter, raw) in enumerate(want):
        assert_allclose(got.log_scale[j], m, rtol=rtol, atol=rtol)
        assert_allclose(got.weight[j], weight, rtol=rtol)
        assert_allclose(got.mean[j], mean, rtol=rtol, atol=rtol * np.abs(mean).max())
        assert_allclose(got.scatter[j], scatter, rtol=rtol, atol=rtol * raw)


def _bulk(n, p, dtype, seed=0, unit_exp=0):
    rng = np.random.default_rng(seed)
    B = rng.normal(size=(p, p))
    X = rng.normal(size=(n, p)) @ B + 3.0
    return np.ldexp(X, unit_exp).astype(dtype), np.linalg.inv(B.T @ B)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 255, 257, 5000, SUB_BLOCK_ROWS + 100])
@pytest.mark.parametrize("offsets", [[1.5], [1.5, 4.0], [0.0, 1.5, 4.0]], ids=["step", "step+final", "three"])
def test_kernel_pass_matches_the_plain_definitions(spelling, dtype, n, offsets):
    """Any row count (runs of TILE rows and sub-blocks cut anywhere), one to three kernels of one matrix."""
    p = 6
    X, A = _bulk(n, p, dtype)
    plan = PassPlan(center=np.full(p, 2.9), kernels=np.repeat(A[None], len(offsets), 0), offsets=np.array(offsets))
    got = block_stats(X, plan, route=spelling)
    assert sum(got.routes.values()) == n
    assert (got.n_rows, got.n_nonfinite, got.n_far) == (n, 0, 0)
    _assert_matches(got, _plain(X, plan), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_flat_top_kernels_take_one_sweep(dtype, monkeypatch):
    """The default solver's kernels (each with a flat top) over a block of several sub-blocks,
    with NaN rows and excluded rows: one sweep, never the two-sweep loops nor numpy, no second
    scan for the mask of finite rows (no row sample is drawn: a robust step over an archive with
    gaps), and the plain definitions' statistics."""
    p = 6
    X, A = _bulk(3 * 4000 + 7, p, dtype)
    X[5, 1], X[4003, 0] = np.nan, -np.inf
    X[::50, 2] = 0.25
    plan = PassPlan(center=np.full(p, 2.9), kernels=np.stack([A, A]), offsets=np.array([4.0, 6.0]),
                    excluded=((2, 0.25),))
    monkeypatch.setattr(_block, "SUB_BLOCK_ROWS", 4000)

    def forbidden(*args):
        raise AssertionError("the mask of finite rows was made, though no row sample is drawn")

    monkeypatch.setattr(_kernels, "finite_rows", forbidden)  # the mask serves a row sample only
    excluded_rows, seen = _kernels.excluded_rows, []
    monkeypatch.setattr(_kernels, "excluded_rows", lambda Xs, plan: seen.append(len(Xs)) or excluded_rows(Xs, plan))
    assert choose_route(X, plan).routes[0] == "whole_block"
    got = block_stats(X, plan)
    assert got.routes == {"whole_block": len(X)}
    assert sum(seen) == len(X) and max(seen) <= 4000  # temporaries the size of a sub-block's
    finite = np.isfinite(X).all(axis=1)
    assert (got.n_rows, got.n_nonfinite) == (len(X) - 2, 2)
    _assert_matches(got, _plain(X, plan, finite & (X[:, 2] != 0.25)), dtype)


def test_one_sweep_draws_the_row_sample_by_sub_blocks(monkeypatch):
    """A whole block in one sweep still draws its row sample a sub-block at a time (the draw's
    temporaries stay small), and draws exactly the rows the hash of their index picks, NaN rows
    left out."""
    p = 4
    X, A = _bulk(3 * 1000 + 5, p, np.float64)
    X[1500, 2] = np.nan
    plan = PassPlan(center=np.full(p, 2.9), kernels=np.stack([A, A]), offsets=np.array([4.0, 6.0]),
                    sample_rate=0.3, seed=5)
    monkeypatch.setattr(_block, "SUB_BLOCK_ROWS", 1000)
    sampled_rows, seen = _compiled.sampled_rows, []
    monkeypatch.setattr(_compiled, "sampled_rows", lambda first, n, *a: seen.append(n) or sampled_rows(first, n, *a))
    got = block_stats(X, plan, row_offset=123)
    assert seen == [1000, 1000, 1000, 5]
    drawn = _block._row_uniforms(np.arange(123, 123 + len(X)), 5) < 0.3
    np.testing.assert_array_equal(got.sample, X[drawn & np.isfinite(X).all(axis=1)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("distance", [7.0, 12.0], ids=["near", "far"])
def test_rows_all_outside_the_flat_top(dtype, distance):
    """Every row of the sub-block outside the flat top: its largest weight ``exp(m)`` is below 1.
    Near (m ~ -20) and far (m ~ -65), the one sweep divides its sums by ``exp(m)``: both lie
    above ``_LOG_TINY / 2`` (-350), below which the two sweeps, which scale the weights before
    forming them, would take the block (float32 rows too: they are worked in float64)."""
    rng = np.random.default_rng(6)
    n = 3000
    X = np.column_stack([distance + rng.uniform(-0.5, 0.5, n), rng.uniform(-0.5, 0.5, n)])
    X[:5, 0] += 6.0  # e about 45 lower
    X = X.astype(dtype)
    plan = PassPlan(center=np.zeros(2), kernels=np.eye(2)[None], offsets=np.array([1.0]))
    want = _plain(X, plan)
    got = block_stats(X, plan)
    m = want[0][0]
    assert -70 < m < -15
    assert m >= _kernels._LOG_TINY / 2
    assert got.routes == {"whole_block": n}
    _assert_matches(got, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("unit_exp", [-60, 0, 70])
def test_working_units_scale_the_rows_exactly(spelling, dtype, unit_exp):
    """Data times 2**k in working unit 2**k: the same statistics as the data in unit 1."""
    p = 4
    X, A = _bulk(3000, p, dtype)
    kw = dict(kernels=np.stack([A, A]), offsets=np.array([1.0, 3.0]))
    ref = block_stats(X, PassPlan(center=np.full(p, 3.0), **kw), route=spelling)
    scaled = block_stats(np.ldexp(X, unit_exp), PassPlan(center=np.full(p, 3.0), unit_exp=unit_exp, **kw),
                         route=spelling)
    assert_allclose(scaled.weight, ref.weight, rtol=1e-12)
    assert_allclose(scaled.mean, ref.mean, rtol=1e-12)
    assert_allclose(scaled.scatter, ref.scatter, rtol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_that_are_not_finite_are_counted_and_left_out(spelling, dtype, monkeypatch):
    """NaN and inf rows (an archive with gaps, nan_policy="omit"), in two sub-blocks of three:
    counted, in no sum and not in the row sample; the compiled loops take those sub-blocks
    themselves (they used to hand them to numpy, which made a gappy archive slower than numpy
    alone)."""
    p = 5
    X, A = _bulk(3 * 4000, p, dtype)
    X[4100, 2], X[4200, 0], X[9000] = np.nan, np.inf, -np.inf
    plan = PassPlan(center=np.full(p, 3.0), kernels=np.stack([A, A]), offsets=np.array([1.0, 3.0]),
                    sample_rate=0.5)
    keep = np.isfinite(X).all(axis=1)
    monkeypatch.setattr(_block, "SUB_BLOCK_ROWS", 4000)
    got = block_stats(X, plan, route=spelling)
    assert got.routes == {spelling or "whole_block": len(X)}  # not handed to numpy
    assert (got.n_rows, got.n_nonfinite, got.n_far) == (len(X) - 3, 3, 0)
    _assert_matches(got, _plain(X, plan, keep), dtype)
    drawn = _block._row_uniforms(np.arange(len(X)), plan.seed) < plan.sample_rate
    np.testing.assert_array_equal(got.sample, X[drawn & keep].astype(np.float64))


def test_float32_rows_far_out_get_weight_zero(spelling):
    """Finite float32 rows 1e20 spreads out, whose squares would overflow float32: worked in
    float64, their quadratic forms are finite and their weights exactly 0; rows, not far rows."""
    p = 3
    X, _ = _bulk(2000, p, np.float32)
    A = np.array([[1.0, 0.5, 0.0], [0.5, 1.0, 0.0], [0.0, 0.0, 1.0]])
    X[7] = 1e20  # every product +inf
    X[8] = [1e20, -1e20, 1e20]  # products of both signs
    plan = PassPlan(center=np.full(p, 3.0), kernels=A[None], offsets=np.array([2.0]))
    got = block_stats(X, plan, route=spelling)
    assert (got.n_rows, got.n_far) == (len(X), 0)
    keep = ~np.isin(np.arange(len(X)), [7, 8])
    _assert_matches(got, _plain(X, plan, keep), np.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_excluded_values_and_rows_enter_no_sum(spelling, dtype):
    p = 3
    X, A = _bulk(6000, p, dtype)
    X[::10, 1] = 0.5
    X[3::20] = [1.0, 2.0, 3.0]
    plan = PassPlan(
        center=np.full(p, 3.0), kernels=np.stack([A, A]), offsets=np.array([1.0, 3.0]),
        excluded=((1, 0.5),), excluded_rows=((1.0, 2.0, 3.0),),
    )
    got = block_stats(X, plan, route=spelling)
    keep = (X[:, 1] != dtype(0.5)) & ~(X == np.array([1.0, 2.0, 3.0], dtype)).all(axis=1)
    assert keep.sum() == len(X) - 600 - 300
    assert got.n_rows == len(X)  # left out of the sums, still rows
    _assert_matches(got, _plain(X, plan, keep), dtype)


def test_sub_block_whose_rows_are_all_excluded_adds_nothing(spelling, monkeypatch):
    """Every row of the second sub-block excluded: the merged result is the first sub-block's."""
    p = 2
    X, A = _bulk(2 * 500, p, np.float64)
    X[500:, 0] = 7.0
    plan = PassPlan(center=np.full(p, 3.0), kernels=A[None], offsets=np.array([1.0]), excluded=((0, 7.0),))
    monkeypatch.setattr(_block, "SUB_BLOCK_ROWS", 500)
    got = block_stats(X, plan, route=spelling)
    _assert_matches(got, _plain(X, plan, np.arange(len(X)) < 500), np.float64)


def test_compiled_loops_take_one_matrix_in_a_normal_unit_only():
    """Kernels of different matrices, a unit whose power of two is not a normal number, or rows
    wider than COMPILED_MAX_FEATURES: the numpy spelling (its results are checked above and in
    test_mcpca)."""
    A = np.eye(3)

    def routes(X, **kw):
        return choose_route(X, PassPlan(center=np.zeros(X.shape[1]), **kw)).routes

    X64, X32 = np.ones((5, 3)), np.ones((5, 3), np.float32)
    assert routes(X64, kernels=np.stack([A, A]), offsets=np.array([0.0, 1.0])) == ("two_sweeps", "numpy")
    flat = dict(kernels=np.stack([A, A]), offsets=np.array([1.0, 2.0]))
    assert routes(X64, **flat) == ("whole_block", "one_sweep", "two_sweeps", "numpy")
    assert routes(X32, **flat)[0] == "whole_block"  # float32 rows read as stored, widened in the sweep
    assert routes(np.asfortranarray(X64), **flat) == ("one_sweep", "two_sweeps", "numpy")
    assert routes(X64.astype(">f8"), **flat) == ("one_sweep", "two_sweeps", "numpy")  # cast by sub-blocks
    assert routes(X64, kernels=np.stack([A, 2 * A])) == ("numpy",)
    assert routes(X64) == ("compiled_moments", "numpy")
    assert routes(X32, kernels=A[None], unit_exp=200) == ("two_sweeps", "numpy")  # worked in float64
    assert routes(X64, kernels=A[None], unit_exp=1100) == ("numpy",)
    wide = np.ones((5, _block.COMPILED_MAX_FEATURES + 1))  # BLAS's products are faster there
    assert routes(wide, kernels=np.eye(wide.shape[1])[None]) == ("numpy",)
    assert routes(wide) == ("numpy",)
    assert "COMPILED_MAX_FEATURES" in choose_route(wide, PassPlan(center=np.zeros(wide.shape[1]))).reason


def test_a_route_asked_for_serves_where_it_can_and_numpy_elsewhere():
    """``route=``: the route asked for, then numpy; a route that cannot serve the block (a kernel
    route for a moments pass) leaves it to numpy, and says so; an unknown name is refused."""
    X, A = _bulk(3000, 3, np.float64)
    plan = PassPlan(center=np.full(3, 3.0), kernels=np.stack([A, A]), offsets=np.array([1.0, 3.0]))
    assert choose_route(X, plan, route="one_sweep").routes == ("one_sweep", "numpy")
    assert choose_route(X, plan, route="numpy").routes == ("numpy",)
    for route in ("whole_block", "one_sweep", "two_sweeps", "numpy"):
        assert block_stats(X, plan, route=route).routes == {route: len(X)}
    moments = PassPlan(center=np.zeros(3))
    assert block_stats(X, moments, route="compiled_moments").routes == {"compiled_moments": len(X)}
    asked = choose_route(X, moments, route="two_sweeps")
    assert asked.routes == ("numpy",) and "cannot serve" in asked.reason
    assert block_stats(X, moments, route="two_sweeps").routes == {"numpy": len(X)}
    with pytest.raises(ValueError, match="route must be one of"):
        block_stats(X, plan, route="fast")


@pytest.mark.parametrize(
    ("first", "seed", "rate"), [(0, 0, 0.004), (2**40 + 3, 7, 0.5), (123, 2**32 - 1, 0.01), (5, 0, 1.0), (5, 0, 0.0)]
)
def test_compiled_row_sample_is_the_hash_of_the_row_index(first, seed, rate):
    """The compiled draw keeps exactly the rows numpy's splitmix64 of the global row index keeps
    (so the sample does not depend on the spelling, nor on the chunking)."""
    n = 20_000
    want = np.flatnonzero(_block._row_uniforms(np.arange(first, first + n), seed) < rate)
    np.testing.assert_array_equal(_compiled.sampled_rows(first, n, seed, rate), want)


def test_upper_doubled_gives_the_quadratic_form():
    rng = np.random.default_rng(4)
    B = rng.normal(size=(5, 5))
    A, y = B @ B.T, rng.normal(size=5)
    U = _compiled.upper_doubled(A)
    assert np.all(np.tril(U, -1) == 0)
    assert_allclose(sum(U[a, b] * y[a] * y[b] for a in range(5) for b in range(a, 5)), y @ A @ y, rtol=1e-13)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 2.0**-120, 1e37], ids=["one", "tiny", "near-max"])
def test_moments_pass_matches_the_plain_definitions(spelling, dtype, scale, monkeypatch):
    """Mean, scatter, column ranges and row count of the finite rows, in data units, over three
    sub-blocks (two with NaN rows, one of them its first row, and one with an inf row, which the
    compiled loops leave out themselves), at any magnitude of the data."""
    p = 4
    rng = np.random.default_rng(5)
    X = ((rng.normal(size=(3 * 700 + 11, p)) * [1.0, 3.0, 0.5, 2.0] + 4.0) * scale).astype(dtype)
    X[800, 1], X[1500, 3] = np.nan, np.inf
    X[700, 0] = np.nan  # a sub-block's first row: the shift reads its NaN as 0
    monkeypatch.setattr(_block, "SUB_BLOCK_ROWS", 700)
    route = {"two_sweeps": "compiled_moments"}.get(spelling, spelling)  # a moments pass's compiled loops
    got = block_stats(X, PassPlan(center=np.zeros(p)), route=route)
    if route != "numpy" and scale < 1e30:  # near float32's top the unit's power of two is not normal: numpy's
        assert got.routes == {"compiled_moments": len(X)}
    keep = np.isfinite(X).all(axis=1)
    Y = X[keep].astype(np.float64)
    assert (got.n_rows, got.n_nonfinite) == (len(Y), 3)
    np.testing.assert_array_equal(got.col_min, Y.min(axis=0))
    np.testing.assert_array_equal(got.col_max, Y.max(axis=0))
    data = got.in_units(0)
    mean = Y.mean(axis=0)
    rtol = RTOL[dtype]
    assert_allclose(data.weight, [len(Y)])
    assert_allclose(data.mean[0], mean, rtol=rtol)
    assert_allclose(data.scatter[0], (Y - mean).T @ (Y - mean), rtol=rtol, atol=rtol * (Y**2).sum(axis=0).max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_non_finite_value_in_a_direction_the_kernel_ignores_is_still_counted(spelling, dtype, bad):
    """A kernel blind to column 2 (its row and column of A are 0, as for a direction without
    spread): a row with inf or NaN there is still not finite, so in no sum."""
    p = 3
    X, _ = _bulk(1000, p, dtype)
    A = np.diag([1.0, 0.5, 0.0])
    X[10, 2] = bad
    plan = PassPlan(center=np.full(p, 3.0), kernels=A[None], offsets=np.array([1.0]))
    got = block_stats(X, plan, route=spelling)
    assert (got.n_rows, got.n_nonfinite) == (len(X) - 1, 1)
    _assert_matches(got, _plain(X, plan, np.arange(len(X)) != 10), dtype)


@pytest.mark.slow  # a fresh interpreter in a subprocess: the CI tier
def test_package_works_where_numba_cannot_cache(tmp_path):
    """A read-only install run by a user without a writable home: numba refuses ``cache=True``
    at decoration ("no locator available"); the loops are then compiled in the process.
    (The package is copied under another name, so that this install's own copy is not the
    one imported.)"""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import dask_mcpca

    copy = tmp_path / "site" / "mcpca_copy"
    shutil.copytree(Path(dask_mcpca.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "__pycache__").write_text("not a folder")  # the in-tree cache cannot be made
    blocked = tmp_path / "home-is-a-file"
    blocked.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(PYTHONPATH=str(copy.parent), HOME=str(blocked), XDG_CACHE_HOME=str(blocked),
               PYTHONDONTWRITEBYTECODE="1")
    code = (
        "import numpy as np, mcpca_copy._block as b\n"
        "X = np.random.default_rng(0).normal(size=(300, 3))\n"
        "got = b.block_stats(X, b.PassPlan(center=np.zeros(3), kernels=np.eye(3)[None]))\n"
        "print(b.COMPILED, got.weight[0] > 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


# ------------------------------------------------------------- per-row distances
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_components", [2, 6])
def test_row_distances_match_the_plain_definitions(dtype, n_components):
    """The compiled per-row sweep and the numpy spelling give ``d^2 = y^T P y`` and the channel of the
    largest ``(P y)_j^2 / P_jj`` (Alcala and Qin's definition), each written out plainly here, on rows
    in units far from 1, with a row that overflows, one with a gap and one with an inf."""
    from dask_mcpca import MCPCA, _distances, _precision

    rng = np.random.default_rng(5)
    X = (rng.normal(size=(3000, 6)) @ rng.normal(size=(6, 6)) * [1e3, 1.0, 1e-2, 5.0, 1.0, 1.0] + 7e4)
    model = MCPCA(n_components=n_components).fit(X)
    rows = rng.normal(size=(500, 6)) * X.std(axis=0) * 3 + X.mean(axis=0)
    rows[7] = 1e300  # overflows in the sweep: the numpy spelling's inf
    rows[8, 2] = np.nan  # a gap: judged on its observed cells
    rows[9, 4] = np.inf
    rows = rows.astype(dtype)
    P = _precision.precision_power(model, 1.0)
    Y = rows.astype(np.float64) - model.mean_
    complete = np.isfinite(Y).all(axis=1) & (np.abs(Y) < 1e200).all(axis=1)
    d2_plain = np.einsum("ij,jk,ik->i", Y[complete], P, Y[complete])
    top_plain = np.argmax((Y[complete] @ P) ** 2 / np.diag(P), axis=1)
    d2, top = _distances.distances_and_top(model, rows, top=True)
    assert_allclose(d2[complete], d2_plain, rtol=1e-9)
    np.testing.assert_array_equal(top[complete], top_plain)
    assert d2[7] == np.inf and d2[9] == np.inf
    assert np.isfinite(d2[8]) and top[8] != 2
    # the two spellings agree row by row to round-off (the residual |y|^2 - |z|^2 cancels: 1e-9 of
    # d^2 here), and a row gets the same bits whichever block it is in
    assert_allclose(d2, _distances._numpy_d2(model, rows), rtol=1e-9)
    alone = np.array([_distances.distances_and_top(model, rows[i : i + 1], top=True)[0][0] for i in range(20)])
    np.testing.assert_array_equal(alone, d2[:20])
    assert _distances.mahalanobis_d2(model, rows).tobytes() == d2.tobytes()


# ------------------------------------------------------------- the same bits wherever arrays lie
def _sums_behind_alias_checks(ir: str) -> list[str]:
    """The runtime alias checks (``vector.memcheck`` blocks) in LLVM IR that guard a vectorised loop
    ending in a horizontal sum (``bin.rdx`` or ``vector.reduce.fadd`` before the loop's
    ``middle.block``).  Where such a check fails (arrays that lie within a few hundred bytes of each
    other), the unvectorised copy of the loop runs, and its sum rounds otherwise."""
    labels = [(m.start(), m.group(1)) for m in re.finditer(r"^([A-Za-z_][\w.]*):", ir, re.M)]
    found = []
    for i, (start, name) in enumerate(labels):
        if not name.startswith("vector.memcheck"):
            continue
        end = next((s for s, n in labels[i + 1 :] if n.startswith("middle.block")), len(ir))
        after = next((s for s, _ in labels if s > end), len(ir))  # the middle block itself
        if re.search(r"bin\.rdx|vector\.reduce\.fadd", ir[start:after]):
            found.append(name)
    return found


@pytest.mark.slow  # compiles every fast-math loop again, uncached (about 10 s): the CI tier
def test_no_fast_math_sum_depends_on_where_the_arrays_lie():
    """A fast-math sum in a loop that also stores is vectorised behind a run-time check that the
    arrays do not overlap, with the unvectorised loop as the fallback; heap addresses then chose
    the rounding of a row's distance (3 ulp, in 1 of about 30 processes under load).  Each
    compiled loop of the package, compiled afresh for each signature the usual calls use
    (``conftest.compile_the_loops``), has no such check before a sum."""
    import sys

    import numba
    from conftest import compile_the_loops

    compile_the_loops()

    def stores_and_sums(x, y, k):  # the shape the check is about (the rows at an offset): found on this LLVM
        s = 0.0
        for i in range(y.shape[0]):
            y[i] = 2.0 * x[i + k]
            s += y[i]
        return s

    probe = numba.njit(fastmath=_compiled._FLAGS)(stores_and_sums)
    probe(np.ones(64), np.empty(60), 2)
    assert _sums_behind_alias_checks(probe.inspect_llvm(probe.signatures[0]))
    loops = [f for name, module in list(sys.modules.items()) if name.startswith("dask_mcpca")
             for f in vars(module).values() if isinstance(f, numba.core.registry.CPUDispatcher)
             and f.__module__ == name and f.targetoptions.get("fastmath")
             and f.targetoptions.get("inline", "never") == "never"]
    assert {f.__name__ for f in loops} >= {"row_distances", "flat_top_sums", "complete_gaps"}
    found = {}
    for f in loops:
        fresh = numba.njit(cache=False, **f.targetoptions)(f.py_func)
        for sig in f.signatures:
            fresh.compile(sig)
            if checks := _sums_behind_alias_checks(fresh.inspect_llvm(sig)):
                found[f"{f.__name__}{sig}"] = checks
    assert not found
