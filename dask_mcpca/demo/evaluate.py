"""The demo's evaluation: ordinary PCA's pass, angles to the truth, outlier counts."""

from __future__ import annotations

import time
from dataclasses import dataclass

import dask
import dask.array as da
import numpy as np
import scipy.linalg

from .._power import descending_eigh, orient_rows
from .._schedule import outlier_cutoff_d2
from .archive import KINDS

__all__ = ["angles_deg", "subspace_angle_deg", "evaluate", "DemoResult"]


def angles_deg(estimated: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Angle between each estimated axis (row) and the true one (column), in degrees."""
    cos = np.abs(np.sum(estimated[: true.shape[1]].T * true, axis=0))
    return np.degrees(np.arccos(np.clip(cos, 0.0, 1.0)))


def subspace_angle_deg(estimated: np.ndarray, true: np.ndarray) -> float:
    """Largest principal angle between the spans of the first k estimated axes and the truth."""
    return float(np.degrees(scipy.linalg.subspace_angles(estimated[: true.shape[1]].T, true).max()))


def _covariance_pass(X: da.Array, shift: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ordinary mean and covariance of the complete rows in one pass (sums about ``shift``)."""
    Y = X.astype(np.float64) - shift
    complete = da.isfinite(Y).all(axis=1)
    Y = da.where(complete[:, None], Y, 0.0)
    s1, s2, n = dask.compute(Y.sum(axis=0), Y.T @ Y, complete.sum())
    mean = s1 / n
    cov = (s2 - n * np.outer(mean, mean)) / (n - 1)
    return mean + shift, cov


def _score_block(X, kind, offset, model, classical, n_keep_by_kind, seed):
    """Counts and a row sample of the outlier scores of one block (one task)."""
    X = np.asarray(X)
    kind = np.asarray(kind)
    flagged = model.is_outlier(X)
    d2 = model.mahalanobis(X)
    mean, prec, cut = classical
    Y = X.astype(np.float64) - mean
    flagged_pca = np.einsum("ij,jk,ik->i", Y, prec, Y) > cut
    counts = np.zeros((2, 4, 2), dtype=np.int64)  # method x kind x (flagged, total)
    for m, f in enumerate((flagged, flagged_pca)):
        for k in range(4):
            sel = kind == k
            counts[m, k] = (f[sel].sum(), sel.sum())
    # Keep every row of a kind with probability n_keep / n_rows_of_that_kind.
    rows = np.arange(offset, offset + len(X))
    u = np.random.default_rng([seed, 3, offset]).random(len(X))
    keep = u < n_keep_by_kind[kind]
    return counts, rows[keep], d2[keep].astype(np.float32), kind[keep]


@dataclass
class DemoResult:
    """What :func:`run_demo` measured (also printed)."""

    n_rows: int
    angles_pca: np.ndarray
    angles_mcpca: np.ndarray
    subspace_pca: float
    subspace_mcpca: float
    variances_true: np.ndarray
    variances_pca: np.ndarray
    variances_mcpca: np.ndarray
    counts: np.ndarray  # method (MCPCA, PCA) x kind (clean, spike, stuck, swapped) x (flagged, total)
    n_passes: int
    seconds: dict
    paths: dict
    cutoff: float  # MCPCA's outlier_cutoff_ (the classical flags use the chi-square quantile)

    def precision_recall(self, method: int = 0) -> tuple[float, float]:
        flagged, total = self.counts[method, :, 0], self.counts[method, :, 1]
        tp = flagged[1:].sum()
        precision = tp / flagged.sum() if flagged.sum() else float("nan")
        recall = tp / total[1:].sum() if total[1:].sum() else float("nan")
        return float(precision), float(recall)


def evaluate(X, truth_path, model, faults, seed):
    """Ordinary PCA (one covariance pass) and the outlier counts of both methods (one more pass).

    Returns
    -------
    (pca_components, pca_variances), counts, sample, seconds
        ``counts``: method (MCPCA, PCA) x kind (clean, spike, stuck, swapped)
        x (flagged, total); ``sample``: rows, ``d^2`` and kind of about
        20,000 rows per kind, for the report.
    """
    n, p = X.shape
    t = time.perf_counter()
    pca_mean, pca_cov = _covariance_pass(X, model.mean_)
    lam, V = descending_eigh(pca_cov)
    components = orient_rows(V.T)
    classical = (pca_mean, np.linalg.inv(pca_cov), outlier_cutoff_d2(p))
    # About 20 000 plotted rows per kind, whatever the archive's size.
    n_kind = np.array([n - sum(faults.n_rows_of(k) for k in KINDS)] + [faults.n_rows_of(k) for k in KINDS])
    n_keep = np.minimum(1.0, 20_000 / np.maximum(n_kind, 1))
    truth = da.from_zarr(truth_path).rechunk((X.chunks[0],))
    offsets = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]])
    tasks = [
        dask.delayed(_score_block)(xb, tb, int(off), model, classical, n_keep, seed)
        for xb, tb, off in zip(X.to_delayed()[:, 0], truth.to_delayed(), offsets, strict=True)
    ]
    parts = dask.compute(*tasks)
    counts = sum(part[0] for part in parts)
    sample = tuple(np.concatenate([part[i] for part in parts]) for i in (1, 2, 3))
    return (components, lam), counts, sample, time.perf_counter() - t
