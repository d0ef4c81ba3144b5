"""Pass counts: how many times a fit reads the data, and how it reads it.

The pass is the unit of cost of an out-of-core fit.  These tests count passes
and block reads, never time: the default solver makes a small number of
passes whatever p and n are, ``n_passes_`` is the number of times every block
was really read, each pass reads each block exactly once, and numpy input
never builds a task graph.
"""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from conftest import RecordingRows

import dask_mcpca._passes as passes_module
from dask_mcpca import MCPCA
from dask_mcpca._block import PassPlan
from dask_mcpca._passes import PassRunner

#: The default solver's documented bound on full-data passes.
MAX_DEFAULT_PASSES = 12

OUTLIER_FRACTION = 0.05


def _data(n: int, p: int, seed: int = 0) -> np.ndarray:
    """Gaussian rows (variances 10 .. 0.1) with a 5 % outlier cluster along the weakest axis."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) * np.sqrt(np.geomspace(10.0, 0.1, p))
    out = rng.random(n) < OUTLIER_FRACTION
    X[out] = rng.standard_normal((out.sum(), p))
    X[out, -1] += 10.0 * np.sqrt(10.0)
    return X


@pytest.fixture
def pass_log(monkeypatch):
    """Record, for every pass of a dask-backed runner, the reads made during it."""
    log: list[dict] = []
    original = passes_module.PassRunner.run

    def run(self, plan, **kwargs):
        source = getattr(self, "_counting_source", None)
        before = len(source.reads) if source is not None else None
        try:
            return original(self, plan, **kwargs)
        finally:
            if source is not None:
                log.append({"runner": id(self), "reads": source.reads[before:]})

    monkeypatch.setattr(passes_module.PassRunner, "run", run)
    return log


@pytest.fixture
def counting_fit(monkeypatch, pass_log):
    """Fit a RecordingRows through ``da.from_array``; return (model, source, blocks, log)."""
    original_init = passes_module.PassRunner.__init__

    def fit(X: np.ndarray, chunk_rows: int, **params):
        source = RecordingRows(X)

        def init(self, data, **kwargs):
            original_init(self, data, **kwargs)
            self._counting_source = source if self.is_dask else None

        monkeypatch.setattr(passes_module.PassRunner, "__init__", init)
        dX = da.from_array(source, chunks=(chunk_rows, X.shape[1]), asarray=True)
        source.reads.clear()  # from_array may peek at the array; only the fit counts
        model = MCPCA(**params).fit(dX)
        bounds = np.cumsum([0, *dX.chunks[0]])
        blocks = sorted(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))
        return model, source, blocks, pass_log

    return fit


@pytest.mark.parametrize("p", [3, 10, 64])
def test_default_fit_makes_few_passes(p):
    X = _data(20_000, p)
    model = MCPCA().fit(da.from_array(X, chunks=(4_000, p)))
    assert 2 <= model.n_passes_ <= MAX_DEFAULT_PASSES
    assert model.converged_


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pass_count_does_not_grow_with_n(seed):
    # Both sizes are well above the row sample, so the start has the same
    # sampling error and the fixed point the same contraction; the number of
    # steps to reach tol is then the same up to the luck of the draw (+-1),
    # not a function of n.  Different chunkings on purpose.
    counts = []
    for n, chunk in [(20_000, 3_000), (200_000, 45_000)]:
        X = _data(n, 10, seed=seed)
        model = MCPCA(sample_size=2_000).fit(da.from_array(X, chunks=(chunk, 10)))
        counts.append(model.n_passes_)
    assert abs(counts[1] - counts[0]) <= 1, counts
    assert max(counts) <= MAX_DEFAULT_PASSES


@pytest.mark.parametrize("solver", ["auto", "paper"])
def test_n_passes_counts_real_reads_block_by_block(counting_fit, solver):
    params = {"solver": solver}
    if solver == "paper":  # keep the published schedule short: 2 sizes, few re-weightings
        params.update(n_components=1, n_decay=2, max_iter=3)
    X = _data(12_000, 4, seed=3)
    model, source, blocks, log = counting_fit(X, chunk_rows=2_500, **params)
    assert len(blocks) == 5
    # n_passes_ is the number of passes of the full-data runner ...
    full = [entry for entry in log if entry["runner"] == log[0]["runner"]]
    assert len(full) == model.n_passes_
    # ... every read happened inside one of them ...
    assert sum(len(entry["reads"]) for entry in full) == len(source.reads)
    # ... and each of them read every block exactly once.
    for entry in full:
        assert sorted(entry["reads"]) == blocks
    assert len(source.reads) == model.n_passes_ * len(blocks)


def _no_graph(dsk, keys, **kwargs):
    raise AssertionError(f"a task graph was computed for keys {list(keys)[:3]}")


def test_numpy_input_builds_no_task_graph():
    X = _data(5_000, 5)
    with dask.config.set(scheduler=_no_graph):
        model = MCPCA().fit(X)
        # The guard is live: the same data as a dask array does reach it.
        with pytest.raises(AssertionError, match="task graph"):
            MCPCA().fit(da.from_array(X, chunks=(1_000, 5)))
    reference = MCPCA().fit(da.from_array(X, chunks=(1_000, 5)))
    assert model.n_passes_ == reference.n_passes_
    np.testing.assert_allclose(model.components_, reference.components_, atol=1e-8)


@pytest.mark.parametrize("rows_per_block", [7, 64, 1000])
def test_moments_pass_finds_the_column_ranges_of_the_finite_rows(rows_per_block):
    rng = np.random.default_rng(4)
    X = rng.normal(size=(500, 3)) * [1.0, 10.0, 0.1]
    X[[3, 200], [1, 2]] = [np.nan, -np.inf]  # left out of the ranges, as of every other statistic
    finite = np.isfinite(X).all(axis=1)
    runner = PassRunner(da.from_array(X, chunks=(rows_per_block, -1)), nan_policy="omit")
    result = runner.run(PassPlan(center=np.zeros(3)))
    np.testing.assert_array_equal(result.col_min, X[finite].min(axis=0))
    np.testing.assert_array_equal(result.col_max, X[finite].max(axis=0))


# ------------------------------------------------------- the block kernel
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kernels_of_one_pass_equal_separate_passes(dtype):
    """Two flat tops on one quadratic form (the wider one's sums are the narrower's
    plus the rows between them) give each kernel's own moments; float32 rows give
    the float64 moments of the same values to float32 round-off."""
    from dask_mcpca._block import block_stats

    rng = np.random.default_rng(3)
    X = (rng.normal(size=(50_000, 6)) * [3, 2, 1, 1, 0.5, 0.2] + 7.0).astype(dtype)
    X[::25] += 30.0  # outliers beyond both radii
    P = np.linalg.inv(np.cov(X[:5000].astype(np.float64), rowvar=False))
    center = np.median(X.astype(np.float64), axis=0)
    kw = {"center": center}
    both = block_stats(X, PassPlan(kernels=np.stack([P, P]) / 0.25, offsets=np.array([30.0, 50.0]), **kw))
    x64 = X.astype(np.float64)
    for j, z in enumerate((30.0, 50.0)):
        one = block_stats(x64, PassPlan(kernels=P[None] / 0.25, offsets=np.array([z]), **kw))
        assert both.log_scale[j] == one.log_scale[0] == 0
        rtol = 1e-12 if dtype == np.float64 else 1e-5
        np.testing.assert_allclose(both.weight[j], one.weight[0], rtol=rtol)
        np.testing.assert_allclose(both.mean[j], one.mean[0], rtol=rtol)
        scale = one.scatter[0].max()
        np.testing.assert_allclose(both.scatter[j], one.scatter[0], rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("kernels", [None, np.stack([np.eye(3), np.eye(3) / 4])], ids=["moments", "two-kernels"])
def test_a_block_returns_the_type_a_pass_returns(kernels):
    """One typed value from a block to the solvers: it pickles (it travels between
    workers), dask's ``sizeof`` counts its arrays, and ``combine`` merges two
    without modifying either; the pass's result is the same type."""
    import pickle

    from dask.sizeof import sizeof

    from dask_mcpca._block import BlockStats, block_stats, combine

    X = _data(900, 3)
    plan = PassPlan(center=np.zeros(3), kernels=kernels, sample_rate=0.5)
    a, b = block_stats(X[:400], plan, 0), block_stats(X[400:], plan, 400)
    assert isinstance(a, BlockStats)
    assert (a.col_min is None) == (kernels is not None)
    copies = [pickle.loads(pickle.dumps(x)) for x in (a, b)]
    merged = combine(a, b)
    for x, copy in zip((a, b), copies, strict=True):  # inputs untouched
        for name in ("n_rows", "log_scale", "weight", "mean", "scatter", "sample", "col_min", "unit_exp"):
            np.testing.assert_array_equal(getattr(x, name), getattr(copy, name), err_msg=name)
    assert merged.n_rows == 900 and len(merged.sample) == len(a.sample) + len(b.sample)
    assert sizeof(merged) >= merged.sample.nbytes + merged.scatter.nbytes
    runner = PassRunner(da.from_array(X, chunks=(400, -1)))
    result = runner.run(plan)
    assert type(result) is BlockStats is passes_module.PassResult
    np.testing.assert_allclose(result.scatter, merged.scatter, rtol=1e-12)
