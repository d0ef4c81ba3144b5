"""How often a fit reads the data: the row sample from a spread of blocks, warm refits.

A store of many row blocks draws the robust start's row sample from a spread
of its blocks (a partial read, ``n_partial_reads_``), so the default fit
makes its full passes in the robust stage only; a warm refit of a grown
archive starts from the previous fit's state.  Both must give the cold,
full-pass fit's components (0.1 degree).
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from paper_reference import angles_deg

from dask_mcpca import MCPCA
from dask_mcpca._passes import (
    PARTIAL_MIN_BLOCKS,
    PARTIAL_MIN_BLOCKS_WIDE,
    NonFiniteRowsError,
    spread_blocks,
)
from dask_mcpca._stats import WIDE_FEATURES

#: Largest angle (degrees) between components of fits that differ only in how
#: the row sample was drawn (its sampling noise moves the radii a little).
SAMPLE_NOISE_DEG = 0.1


def archive(n=200_000, p=6, seed=0, outliers=0.05):
    """Gaussian rows with a tight 5 % cluster along the weakest axis, in time order."""
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(p, p)))
    X = (rng.normal(size=(n, p)) * np.geomspace(3.0, 0.3, p)) @ Q.T + 10.0
    k = int(outliers * n)
    X[n // 3 : n // 3 + k] = 10.0 + 12.0 * Q[:, -1] + 0.01 * rng.normal(size=(k, p))  # one run of faults
    return X


def test_spread_blocks():
    assert spread_blocks(PARTIAL_MIN_BLOCKS - 1) is None
    for n_blocks in (PARTIAL_MIN_BLOCKS, 20, 100, 1000):
        chosen = spread_blocks(n_blocks)
        assert 4 <= len(chosen) <= min(32, n_blocks // 2)
        assert chosen[0] < n_blocks / len(chosen) and chosen[-1] >= n_blocks - n_blocks / len(chosen)
        assert np.all(np.diff(chosen) > 0)


def test_wide_rows_spread_from_fewer_blocks():
    """Wide rows read a spread from ``PARTIAL_MIN_BLOCKS_WIDE`` blocks on; narrow rows keep ``PARTIAL_MIN_BLOCKS``."""
    wide, narrow = WIDE_FEATURES, WIDE_FEATURES - 1
    assert spread_blocks(PARTIAL_MIN_BLOCKS_WIDE - 1, wide) is None
    assert spread_blocks(PARTIAL_MIN_BLOCKS - 1, narrow) is None
    assert list(spread_blocks(7, wide)) == [0, 2, 4, 6]  # the middle block of each of 4 equal runs
    for n_blocks in range(PARTIAL_MIN_BLOCKS_WIDE, PARTIAL_MIN_BLOCKS + 2):
        chosen = spread_blocks(n_blocks, wide)
        assert len(chosen) == 4 and len(chosen) <= 0.6 * n_blocks and np.all(np.diff(chosen) > 1)
    assert np.array_equal(spread_blocks(40, wide), spread_blocks(40, narrow))


def test_wide_store_of_few_blocks_reads_a_spread():
    """A 40-column store of 8 blocks: a spread of 4 for the row sample, then the full passes; the components
    of the fit whose first read is full (8 blocks made narrow-rule by a huge threshold) within sampling noise."""
    X = archive(n=40_000, p=WIDE_FEATURES + 7, seed=2)
    spread = MCPCA().fit(da.from_array(X, chunks=(5_000, -1)))
    assert (spread.n_partial_reads_, spread.n_blocks_read_) == (1, 4)
    assert spread.n_passes_ == 2 and spread.converged_ and spread.n_samples_ == len(X)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("dask_mcpca._passes.PARTIAL_MIN_BLOCKS_WIDE", 10**9)
        full = MCPCA().fit(da.from_array(X, chunks=(5_000, -1)))
    assert (full.n_partial_reads_, full.n_passes_) == (0, 3)
    assert angles_deg(spread.components_[:3], full.components_[:3]).max() < 1.0
    assert spread.is_outlier(X[len(X) // 3 : len(X) // 3 + 100]).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_many_blocks_make_two_full_passes(dtype):
    X = archive().astype(dtype)
    few = MCPCA().fit(da.from_array(X, chunks=(50_000, -1)))  # 4 blocks: a full first pass
    many = MCPCA().fit(da.from_array(X, chunks=(5_000, -1)))  # 40 blocks: a spread of 5 (an eighth)
    assert (few.n_partial_reads_, few.n_blocks_read_) == (0, 0)
    assert few.n_passes_ == 3
    assert many.n_partial_reads_ == 1 and many.n_blocks_read_ == len(spread_blocks(40)) == 5
    assert many.n_passes_ == 2 and many.converged_
    assert many.n_samples_ == few.n_samples_ == len(X)
    assert angles_deg(many.components_, few.components_).max() < SAMPLE_NOISE_DEG
    # the cluster is flagged either way
    assert many.is_outlier(X[len(X) // 3 : len(X) // 3 + 100]).all()


@pytest.mark.parametrize("chunk_rows", [4_000, 6_000, 9_000, 12_500])
def test_chunkings_of_a_many_block_store_agree(chunk_rows):
    X = archive()
    ref = MCPCA().fit(X)
    model = MCPCA().fit(da.from_array(X, chunks=(chunk_rows, -1)))
    assert model.n_partial_reads_ == 1
    assert angles_deg(model.components_, ref.components_).max() < SAMPLE_NOISE_DEG


def test_nonfinite_rows_outside_the_spread_are_found():
    X = archive()
    X[7_000, 2] = np.nan  # block 1 of 40, which the spread does not read
    assert 1 not in spread_blocks(40)
    with pytest.raises(NonFiniteRowsError, match="1 of"):
        MCPCA().fit(da.from_array(X, chunks=(5_000, -1)))
    model = MCPCA(nan_policy="omit").fit(da.from_array(X, chunks=(5_000, -1)))
    assert model.n_samples_ == len(X) - 1


def test_a_stuck_stretch_outside_the_spread_is_found():
    """A sensor stuck for 5 % of the archive, in a block the spread does not read: the first full
    pass's sample of the whole archive finds the held value, as a full first pass does."""
    X = archive(n=200_000, outliers=0.0)
    stretch = slice(40_000, 50_000)  # block 4 of 20
    assert 4 not in spread_blocks(20)
    X[stretch, 1] = X[stretch.start, 1]  # the value it held when it stuck, inside the bulk
    model = MCPCA().fit(da.from_array(X, chunks=(10_000, -1)))
    assert model.n_partial_reads_ == 1
    np.testing.assert_array_equal(model.repeated_values_, [[1, X[stretch.start, 1]]])
    assert model.is_outlier(X[stretch]).mean() > 0.99
    assert model.is_outlier(X[:40_000]).mean() < 0.01
    full = MCPCA().fit(X)  # in memory: the sample from a full first pass
    np.testing.assert_array_equal(full.repeated_values_, model.repeated_values_)
    assert angles_deg(model.components_, full.components_).max() < SAMPLE_NOISE_DEG


@pytest.mark.parametrize("center", ["robust", False])
def test_warm_refit_of_a_grown_archive(center):
    X = archive(n=240_000)
    old, grown = X[:200_000], X
    cold = MCPCA(center=center).fit(grown)
    model = MCPCA(center=center, warm_start=True).fit(old)
    model.fit(grown)
    assert model.n_passes_ <= 2 and model.converged_
    assert model.n_partial_reads_ == 0 and model.n_samples_ == len(grown)
    assert angles_deg(model.components_, cold.components_).max() < SAMPLE_NOISE_DEG
    np.testing.assert_allclose(model.explained_variance_, cold.explained_variance_, rtol=0.01)
    np.testing.assert_allclose(model.outlier_cutoff_, cold.outlier_cutoff_, rtol=0.05)


def test_warm_start_off_or_another_width_starts_cold():
    X = archive(n=50_000)
    cold = MCPCA().fit(X)
    assert MCPCA().fit(X[:, :5]).fit(X).n_passes_ == cold.n_passes_  # warm_start=False
    model = MCPCA(warm_start=True).fit(X[:, :5]).fit(X)  # another width
    assert model.n_passes_ == cold.n_passes_
    np.testing.assert_allclose(model.components_, cold.components_)


def test_float32_and_float64_stores_get_the_same_blocks(tmp_path, monkeypatch):
    """Blocks are sized in values, not bytes: the same chunks, the same spread, the same passes.

    Sized in bytes, the float32 store's blocks held twice the chunks, so it had
    half the blocks: here 10 instead of 20, below ``PARTIAL_MIN_BLOCKS``, and its
    fit made a full first pass that the float64 fit skipped.
    """
    import zarr

    from dask_mcpca import _io

    monkeypatch.setattr(_io, "DEFAULT_BLOCK_VALUES", 6 * 10_000)  # 10,000 rows of 6 columns: 2 store chunks
    X = archive()
    fits = {}
    for dtype in (np.float64, np.float32):
        path = tmp_path / f"{np.dtype(dtype).name}.zarr"
        z = zarr.open_array(str(path), mode="w", shape=X.shape, chunks=(5_000, X.shape[1]), dtype=dtype)
        z[:] = X.astype(dtype)
        assert _io.as_row_blocks(str(path)).chunks[0] == (10_000,) * 20
        fits[dtype] = MCPCA().fit(str(path))
    for model in fits.values():
        assert (model.n_passes_, model.n_partial_reads_, model.n_blocks_read_) == (2, 1, len(spread_blocks(20)))
    assert angles_deg(fits[np.float32].components_, fits[np.float64].components_).max() < 0.01
