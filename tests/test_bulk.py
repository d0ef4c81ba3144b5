"""The bulk's plain sums kept between wide kernel passes (:mod:`dask_mcpca._bulk`), against the plain definitions.

A wide pass that keeps them computes each row's quadratic form and the weighted sums of the few
rows a flat top does not hold whole; the rest comes from the plain sums the first pass collected.
Checked here: two passes of different centres and kernels over blocks holding NaN rows, far rows,
a spike of 1e12, stuck values and float32 rows give the weighted statistics written out plainly
in float64 (einsum); a block that the wide route does not serve in the later pass is caught by
the count of bulk rows; a runner that meets one makes the pass again in full, counted; and a fit
keeps its model (against the fit with every row weighed in full, and scikit-learn's PCA where
the kernel holds every row).
"""

from __future__ import annotations

from dataclasses import replace
from functools import reduce

import dask.array as da
import numpy as np
import pytest
from conftest import assert_close_fits, planted_rows
from numpy.testing import assert_allclose

from dask_mcpca import MCPCA, _block, _bulk
from dask_mcpca._passes import PassRunner
from dask_mcpca._stats import PassPlan, combine, empty

#: Agreement with the plain float64 definitions, relative to each quantity's scale.
RTOL = 1e-10


def _plain(X, plan, keep):
    """Per kernel: weight (up to the common factor of ``exp(log_scale)``), mean and scatter of the
    rows ``keep``, float64, by einsum; the true weight is returned (log-scale folded in)."""
    Y = np.ldexp(np.asarray(X, np.float64)[keep] - np.ldexp(plan.center, plan.unit_exp), -plan.unit_exp)
    out = []
    for A, z in zip(plan.kernels, plan.offsets, strict=True):
        g = np.exp(np.minimum(z - np.einsum("ij,jk,ik->i", Y, A, Y) / 2, 0.0))
        mean = g @ Y / g.sum()
        out.append((g.sum(), mean + plan.center, ((Y - mean) * g[:, None]).T @ (Y - mean)))
    return out


def _assert_matches(got, want):
    for j, (weight, mean, scatter) in enumerate(want):
        assert_allclose(got.weight[j] * np.exp(got.log_scale[j]), weight, rtol=RTOL)
        assert_allclose(got.mean[j], mean, rtol=RTOL, atol=RTOL * np.abs(mean).max())
        assert_allclose(got.scatter[j] * np.exp(got.log_scale[j]), scatter, rtol=RTOL,
                        atol=RTOL * np.abs(scatter).max())


def _rows(n, p, dtype, seed=0, unit_exp=0):
    """Correlated rows about 3, with 2 % of rows four times as far out, a spike of 1e12, a NaN row,
    and every 50th row's column 2 stuck at 8."""
    rng = np.random.default_rng(seed)
    B = rng.normal(size=(p, p)) / np.sqrt(p) + np.eye(p)
    X = rng.normal(size=(n, p)) @ B + 3.0
    X[: n // 50] *= 4
    X[n // 3, 4] = 1e12
    X[n // 2, 1] = np.nan
    X[::50, 2] = 8.0
    return np.ldexp(X, unit_exp).astype(dtype), B


def _plan(B, center, spread, p, unit_exp=0):
    A = np.linalg.inv(B.T @ B) / spread
    return PassPlan(center=np.full(p, center), kernels=np.stack([A, A]), offsets=2 * np.array([1.2 * p, 1.5 * p]),
                    unit_exp=unit_exp, excluded=((2, 8.0),))


def _pass(X, plan, kept, block_rows=1500, route=None):
    parts = [_block.block_stats(X[s : s + block_rows], plan, s, route=route if s == 0 else None)
             for s in range(0, len(X), block_rows)]
    return _bulk.completed(reduce(combine, parts, empty(plan, X.shape[1])), plan, kept)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("p", [40, 90, 120])  # 120: the forms screened in single precision (_screen)
def test_two_passes_give_the_plain_weighted_statistics(dtype, p, monkeypatch):
    """The collecting pass and a later one of another centre and kernel (the sums moved to its
    centre), over sub-blocks the wide route serves and two it does not (NaN, far rows): the plain
    weighted statistics of the finite rows, stuck values given weight 0."""
    monkeypatch.setattr(_block, "WIDE_SUB_BLOCK_VALUES", 700 * p)
    X, B = _rows(5200, p, dtype, unit_exp=2)
    first = _plan(B, 2.9, 0.25, p, unit_exp=2)
    first = replace(first, bulk=_bulk.box_for(first, None))
    assert first.bulk.collect
    parts = [_block.block_stats(X[s : s + 1500], first, s) for s in range(0, len(X), 1500)]
    stats = reduce(combine, parts, empty(first, p))
    kept = stats.bulk.plain.copy()
    inside = _bulk.inside(X, first.bulk)
    assert stats.bulk.n_rows == inside.sum() == round(kept[p, p])
    assert not inside[len(X) // 3] and not inside[len(X) // 2]  # the spike and the NaN row
    keep = np.isfinite(X).all(axis=1) & (X[:, 2] != 32.0)
    _assert_matches(_bulk.completed(stats, first, None), _plain(X, first, keep))
    held = _bulk.KeptBulk(first.bulk, kept, 2, None)
    later = replace(_plan(B, 3.05, 0.3, p, unit_exp=2), bulk=_bulk.box_for(first, held))
    assert not later.bulk.collect
    got = _pass(X, later, kept)
    assert got.bulk is None
    _assert_matches(got, _plain(X, later, keep))


def test_a_block_that_takes_another_route_is_caught_by_the_count():
    """In the later pass one block goes by the numpy spelling: its bulk rows are not counted, and the
    completion declines (None) rather than count them twice."""
    p = 40
    X, B = _rows(4500, p, np.float64)
    first = _plan(B, 2.9, 0.25, p)
    first = replace(first, bulk=_bulk.box_for(first, None))
    parts = [_block.block_stats(X[s : s + 1500], first, s) for s in range(0, len(X), 1500)]
    kept = reduce(combine, parts, empty(first, p)).bulk.plain
    held = _bulk.KeptBulk(first.bulk, kept, 0, None)
    later = replace(_plan(B, 3.0, 0.3, p), bulk=_bulk.box_for(first, held))
    assert _pass(X, later, kept, route="numpy") is None
    assert _pass(X, later, kept) is not None


def test_a_runner_whose_later_pass_is_not_served_makes_it_again_in_full():
    """A later kernel without a triangular factor (the wide route declines every block): the runner
    finds the count short, makes the pass again with every row weighed (one more pass counted) and
    drops the kept sums; its statistics are the plain ones."""
    p = 40
    X, B = _rows(6000, p, np.float64)
    runner = PassRunner(da.from_array(X, chunks=(1500, p)), nan_policy="omit")
    runner.run(_plan(B, 2.9, 0.25, p))
    assert runner.n_passes == 1 and runner._bulk is not None
    singular = _plan(B, 3.0, 0.3, p)
    A = singular.kernels[0].copy()
    A[0, :] = A[:, 0] = 0
    singular = replace(singular, kernels=np.stack([A, A]))
    got = runner.run(singular)
    assert runner.n_passes == 3 and runner._bulk is None
    _assert_matches(got, _plain(X, singular, np.isfinite(X).all(axis=1) & (X[:, 2] != 8.0)))


def test_a_fit_keeps_its_model(tmp_path):
    """A wide fit (p = 60, 3 % gross rows) with the bulk's sums kept against the same fit with every
    row weighed in full: the same passes, the same flags, its model within 1e-9; both recover the
    planted subspace."""
    n, p, k = 40_000, 60, 4
    X, basis = planted_rows(n, p, k)
    Xd = da.from_array(X, chunks=(5000, p))
    fits = {}
    for keep in (True, False):
        _bulk.KEEP_BULK = keep
        try:
            fits[keep] = MCPCA(n_components=k).fit(Xd)
        finally:
            _bulk.KEEP_BULK = True
    a = fits[True]
    assert_close_fits(a, fits[False], X)
    angle = np.degrees(np.arccos(np.clip(np.linalg.svd(a.components_ @ basis)[1].min(), -1, 1)))
    assert angle < 1.0


def test_a_runner_collects_again_when_the_rows_are_seen_in_other_units():
    """Kept sums are of the rows as one scale and working unit show them: after ``scale`` or
    ``unit_exp`` changes, the next pass collects anew (its statistics the plain ones of the rows
    it sees), and the pass after uses those."""
    p = 40
    X, B = _rows(4500, p, np.float64)
    runner = PassRunner(da.from_array(X, chunks=(1500, p)), nan_policy="omit")
    plan = _plan(B, 2.9, 0.25, p)
    runner.run(plan)
    first = runner._bulk
    runner.scale = np.full(p, 2.0)
    halved = _plan(B * 0.5, 1.45, 0.25, p)
    halved = replace(halved, excluded=((2, 4.0),))
    got = runner.run(halved)
    assert runner._bulk is not first and runner._bulk.scale is runner.scale and runner._bulk.box.collect
    keep = np.isfinite(X).all(axis=1) & (X[:, 2] != 8.0)
    _assert_matches(got, _plain(X / 2.0, halved, keep))
    runner.unit_exp = 1  # the same rows halved again
    quarter = replace(_plan(B * 0.25, 0.725, 0.25, p), excluded=((2, 2.0),))
    got = runner.run(quarter)
    assert runner._bulk.unit_exp == 1 and runner._bulk.box.collect and runner.n_passes == 3
    _assert_matches(got, _plain(X / 4.0, quarter, keep))


def test_a_pass_made_again_counts_its_blocks_again_on_the_live_line(monkeypatch):
    """The live progress line of a pass made again (the later kernel unserved, as above) never counts
    more blocks than the pass reads."""
    import io
    import re
    import sys

    from dask_mcpca import _progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    monkeypatch.setattr(_progress, "REDRAW_SECONDS", 0.0)  # every block redrawn
    p = 40
    X, B = _rows(6000, p, np.float64)
    runner = PassRunner(da.from_array(X, chunks=(1500, p)), nan_policy="omit", progress=True)
    runner.run(_plan(B, 2.9, 0.25, p))
    singular = _plan(B, 3.0, 0.3, p)
    A = singular.kernels[0].copy()
    A[0, :] = A[:, 0] = 0
    runner.run(replace(singular, kernels=np.stack([A, A])))
    assert runner.n_passes == 3
    counts = [(int(done), int(total)) for done, total in re.findall(r"(\d+)/(\d+) blocks", sys.stderr.getvalue())]
    assert counts and max(total for _, total in counts) == 4
    assert all(done <= total for done, total in counts)
