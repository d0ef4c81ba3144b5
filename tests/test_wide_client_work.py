"""The client's work of a wide fit (issue 37 point 1): the breakdown check's cells, the sample's stop.

At wide p the client's in-memory work costs p^2 per sample row, so two rules bound it: the breakdown
check judges at most ``_cells.BREAKDOWN_CELLS`` cells (rows evenly strided over the sample), and the
sample's fixed point stops at ``tol``
where the sample is a part of the rows (``_stats.WIDE_FEATURES``).  Narrow fits keep
their work (and bits).  The fits they give must agree with the fits without the rules, within the
sample's noise.
"""

from __future__ import annotations

import numpy as np
import pytest
from paper_reference import angles_deg

import dask_mcpca._cells as cells_module
import dask_mcpca._fit as fit_module
import dask_mcpca._robust_sample as robust_sample
from dask_mcpca import MCPCA


def _rows(n: int, p: int, seed: int = 0) -> np.ndarray:
    """Gaussian rows of distinct variances (3 to 0.3), 5 % of them a tight cluster 12 SDs out."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p)) * np.geomspace(3.0, 0.3, p)
    X[: n // 20] = 12.0 + 0.01 * rng.normal(size=(n // 20, p))
    return X


@pytest.mark.parametrize(("p", "cells", "judged"),
                         [(10, None, 5_000), (100, None, 5_000), (200, None, 2_500), (100, 50_000, 500)])
def test_breakdown_check_judges_a_bounded_number_of_cells(monkeypatch, p, cells, judged):
    """5,000 sample rows up to 500,000 cells (p = 100), fewer rows beyond: 2,500 at p = 200; a cap of
    50,000 cells judges 500 rows at p = 100, as the default cap does at p = 1000 (too long a fit here)."""
    shapes = []
    flags = fit_module.breakdown_flags
    monkeypatch.setattr(fit_module, "breakdown_flags",
                        lambda model, rows: shapes.append(rows.shape) or flags(model, rows))
    if cells is not None:
        monkeypatch.setattr(cells_module, "BREAKDOWN_CELLS", cells)
    MCPCA().fit(_rows(6_000, p))
    assert shapes == [(judged, p)]


def test_breakdown_check_leaves_rows_off_in_every_channel_after_a_tenth_of_their_cells(monkeypatch):
    """Rows 4 SDs off in every channel (2 %) at p = 200: the check counts them as rows with flagged cells,
    as judging every cell does, and completes none of them from its last good cells (the fit spent 46 of
    63 s there at p = 1000); the other rows are judged as before, flag for flag."""
    import dask_mcpca._distances as distances
    import dask_mcpca._missing as missing_module

    rng = np.random.default_rng(5)
    n, p = 1_500, 200
    X = rng.normal(size=(n, 3)) @ rng.normal(size=(3, p)) + rng.normal(size=(n, p))
    off = rng.random(n) < 0.02
    X[off] += 4.0 * X.std(axis=0)
    X[~off, 7] += np.where(rng.random((~off).sum()) < 0.05, 25.0, 0.0)  # single glitched cells elsewhere
    model = MCPCA(n_components=3).fit(X)
    widest = []
    complete = missing_module._complete_rows
    monkeypatch.setattr(missing_module, "_complete_rows",
                        lambda U, rows, cols, prec: widest.append(cols.shape[1]) or complete(U, rows, cols, prec))
    counted = distances.breakdown_flags(model, X)
    assert max(widest) <= int(0.1 * p) + 1
    monkeypatch.setattr(missing_module, "_complete_rows", complete)
    full = distances.cell_flags(model, X)
    assert counted[off].any(axis=1).all() and full[off].any(axis=1).all()
    np.testing.assert_array_equal(counted[~off], full[~off])


def test_breakdown_rows_are_strided_over_the_whole_sample():
    """At p = 200, 2,500 of 10,000 sample rows: every fourth row, from the first to the 9,997th, so
    the sample's later blocks are judged as well as its first (a prefix took rows 0..2,499 only)."""
    sample = np.repeat(np.arange(10_000.0)[:, None], 200, axis=1)
    rows = cells_module.breakdown_rows(sample)
    np.testing.assert_array_equal(rows[:, 0], np.arange(0.0, 10_000.0, 4.0))
    np.testing.assert_array_equal(cells_module.breakdown_rows(sample[:2_000]), sample[:2_000])


def test_breakdown_check_judges_the_archives_end(monkeypatch):
    """The archive's later half glitched (a cell 30 SDs off in every row), its first half clean: the
    check judges rows from both halves in their shares; a prefix of the sample saw clean rows only."""
    rng = np.random.default_rng(3)
    n, p = 12_000, 200
    X = rng.normal(size=(n, p))
    cols = rng.integers(0, p, n - n // 2)
    X[np.arange(n // 2, n), cols] += 30.0
    judged = []
    flags = fit_module.breakdown_flags
    monkeypatch.setattr(fit_module, "breakdown_flags",
                        lambda model, rows: judged.append(rows.copy()) or flags(model, rows))
    MCPCA().fit(X)
    (rows,) = judged
    glitched = (np.abs(rows) > 15).any(axis=1).mean()
    assert 0.3 < glitched < 0.7


def test_wide_sample_stops_at_tol(monkeypatch):
    """A 40-column fit of 60,000 rows (a sample of 20,000): the sample's fixed point takes fewer steps than
    with the narrow rule (a tenth of ``tol``), and the components agree within the sample's noise."""
    X = _rows(60_000, 40, seed=1)
    steps = []
    step = robust_sample._sample_step
    monkeypatch.setattr(robust_sample, "_sample_step", lambda *a, **k: steps.append(1) or step(*a, **k))
    wide = MCPCA().fit(X)
    n_wide = len(steps)
    steps.clear()
    monkeypatch.setattr(robust_sample, "WIDE_FEATURES", 10**9)  # the narrow rules
    narrow = MCPCA().fit(X)
    assert 2 <= n_wide < len(steps)
    assert wide.converged_ and narrow.converged_ and wide.n_passes_ == narrow.n_passes_
    assert angles_deg(wide.components_[:5], narrow.components_[:5]).max() < 0.5
    np.testing.assert_allclose(wide.explained_variance_, narrow.explained_variance_, rtol=0.01)


@pytest.mark.parametrize("n_components", [None, 20])
def test_calibration_distances_at_wide_p_agree_with_the_precision(n_components):
    """The cutoff's calibration distances at p = 150 (BLAS products, runs of rows): each row's
    ``y^T P y`` with ``P`` the inverse of the model's covariance built from its attributes, to round-off,
    and the per-row methods' distances (the compiled loop) to round-off; rows with a gap and a row far out
    as the per-row methods give them."""
    from dask_mcpca._distances import SAMPLE_GEMM_FEATURES, SAMPLE_GEMM_ROWS, mahalanobis_d2, sample_d2

    p = 150
    assert p >= SAMPLE_GEMM_FEATURES
    model = MCPCA(n_components=n_components).fit(_rows(4_000, p, seed=2)[400:])
    rng = np.random.default_rng(5)
    rows = rng.normal(size=(SAMPLE_GEMM_ROWS + 37, p)) * np.geomspace(3.0, 0.3, p)
    C = model.components_
    cov = C.T @ np.diag(model.explained_variance_) @ C + model.noise_variance_ * (np.eye(p) - C.T @ C)
    y = rows - model.mean_
    expected = np.einsum("ij,ij->i", y @ np.linalg.inv(cov), y)
    np.testing.assert_allclose(sample_d2(model, rows), expected, rtol=1e-9)
    np.testing.assert_allclose(sample_d2(model, rows), mahalanobis_d2(model, rows), rtol=1e-12)
    rows[3, 7] = np.nan
    rows[5] = 1e200
    got, per_row = sample_d2(model, rows[:8]), mahalanobis_d2(model, rows[:8])
    np.testing.assert_array_equal(got[[3, 5]], per_row[[3, 5]])
    assert np.isfinite(got[3]) and got[5] == np.inf
    np.testing.assert_allclose(got, per_row, rtol=1e-12)


def test_triangular_distances_in_runs_of_rows():
    """The sample steps' triangular whitening, ``TRIANGULAR_ROWS`` rows at a time: each row's ``|y^T L|^2``
    (numpy's product), the rows' results those of one product of all of them to round-off (BLAS takes the
    last rows of a run by another kernel), a row that overflows inf."""
    rng = np.random.default_rng(6)
    p = 40
    L = np.asfortranarray(np.linalg.cholesky(np.cov(rng.normal(size=(200, p)), rowvar=False)))
    Y = rng.normal(size=(2 * robust_sample.TRIANGULAR_ROWS + 5, p))
    Y[-1] = 1e300
    d2 = robust_sample._triangular_d2(Y, L)
    np.testing.assert_allclose(d2[:-1], np.sum((Y[:-1] @ L) ** 2, axis=1), rtol=1e-12)
    assert d2[-1] == np.inf
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(robust_sample, "TRIANGULAR_ROWS", len(Y))
        np.testing.assert_allclose(robust_sample._triangular_d2(Y, L), d2, rtol=1e-14)
    assert len(robust_sample._triangular_d2(Y[:0], L)) == 0
