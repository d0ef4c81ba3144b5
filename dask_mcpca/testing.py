"""Generated data with known truth, for the tests and the benchmarks (as ``numpy.testing``).

Importable by both (``from dask_mcpca.testing import make_scenario``), so the
tests do not reach into ``benchmarks/``.

Inliers are Gaussian with eigenvalues ``10 * 0.7**i`` along a random
orthonormal basis, centred away from the origin.  Each scenario replaces a
fraction of the rows by a kind of contamination (issue 4):

==============  ==========================================================
clean           no contamination
paper5/paper20  5 % / 20 % of rows from N(mu, 15 Lambda) with Lambda diagonal in
                the coordinate axes (not the components), as in the paper
orthogonal10    10 % of inlier rows shifted 8 sd (of component 1) along
                the last component
cluster10/25    10 % / 25 % in a tight cluster (sd 0.05 of component 1) far
                out (8 sd of component 1) in the plane of components 2-3
t3              multivariate t with 3 degrees of freedom (no labels)
gaps5           clean data with 5 % of rows holding a NaN (sensor gaps)
==============  ==========================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SCENARIOS", "Sample", "make_scenario", "true_basis", "cluster_cell", "clipped_channel", "stuck_in_outage"]

SCENARIOS = ("clean", "paper5", "paper20", "orthogonal10", "cluster10", "cluster25", "t3", "gaps5")


@dataclass
class Sample:
    """Data with its truth: components (rows), eigenvalues, centre, outlier rows."""

    X: np.ndarray
    components: np.ndarray
    eigenvalues: np.ndarray
    center: np.ndarray
    outliers: np.ndarray  # bool per row; all False where nothing is labelled


def true_basis(p: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues ``10 * 0.7**i`` and a random orthonormal basis (rows)."""
    rng = np.random.default_rng(10_000 + seed)
    Q, R = np.linalg.qr(rng.normal(size=(p, p)))
    Q = Q * np.sign(np.diag(R))
    return 10.0 * 0.7 ** np.arange(p), Q.T


def make_scenario(name: str, *, n: int = 20_000, p: int = 10, seed: int = 0) -> Sample:
    """Draw one data set of the scenario ``name`` (see the module docstring)."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; choose from {SCENARIOS}")
    lam, V = true_basis(p, seed)
    rng = np.random.default_rng(seed)
    center = 5.0 + rng.normal(size=p)
    Z = rng.normal(size=(n, p)) * np.sqrt(lam)
    if name == "t3":
        Z = Z / np.sqrt(rng.chisquare(3, size=(n, 1)) / 3)
    X = center + Z @ V
    bad = np.zeros(n, bool)
    s1 = np.sqrt(lam[0])
    if name in ("paper5", "paper20"):
        k = int(n * (0.05 if name == "paper5" else 0.20))
        rows = rng.choice(n, k, replace=False)
        X[rows] = center + rng.normal(size=(k, p)) * np.sqrt(15 * lam)
        bad[rows] = True
    elif name == "orthogonal10":
        rows = rng.choice(n, n // 10, replace=False)
        X[rows] += 8 * s1 * V[-1]
        bad[rows] = True
    elif name in ("cluster10", "cluster25"):
        k = int(n * (0.10 if name == "cluster10" else 0.25))
        rows = rng.choice(n, k, replace=False)
        where = center + 8 * s1 * (V[1] + V[min(2, p - 1)]) / np.linalg.norm(V[1] + V[min(2, p - 1)])
        X[rows] = where + 0.05 * s1 * rng.normal(size=(k, p))
        bad[rows] = True
    elif name == "gaps5":
        rows = rng.choice(n, n // 20, replace=False)
        X[rows, rng.integers(0, p, size=len(rows))] = np.nan
    return Sample(X=X, components=V, eigenvalues=lam, center=center, outliers=bad)


def cluster_cell(eps: float, D: float, seed: int, n: int = 4000, p: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian rows (:func:`true_basis`) whose first ``eps * n`` rows are a tight cluster at
    distance ``D`` (in the spreads of components 3 and 4) in their plane; returns (X, basis rows)."""
    lam, V = true_basis(p, seed)
    rng = np.random.default_rng(seed)
    X = (rng.normal(size=(n, p)) * np.sqrt(lam)) @ V
    k = int(eps * n)
    where = D * (np.sqrt(lam[2]) * V[2] + np.sqrt(lam[3]) * V[3]) / np.sqrt(2)
    X[:k] = where + 0.05 * np.sqrt(lam[-1]) * rng.normal(size=(k, p))
    return X, V


def clipped_channel(*, own_noise: bool = False, n: int = 40_000, seed: int = 1):
    """A 16-channel archive of 3 strong factors whose channel 2 saturates at its 97th percentile.

    Returns ``(X, clipped, saturated, limit)``: the rows before and after the clipping, the mask of the
    clipped rows and the limit.  With ``own_noise`` channel 2 is mostly its own noise (its high
    readings are not the factors' tail); else it follows the factors as the others do.
    """
    rng = np.random.default_rng(seed)
    p, k = 16, 3
    L = rng.normal(size=(p, k))
    X = rng.normal(size=(n, k)) @ L.T + 0.2 * rng.normal(size=(n, p))
    if own_noise:
        X[:, 2] = 0.3 * X[:, 2] + rng.normal(size=n)
    limit = np.quantile(X[:, 2], 0.97)
    saturated = X[:, 2] >= limit
    clipped = X.copy()
    clipped[saturated, 2] = limit
    return X, clipped, saturated, limit


def stuck_in_outage(*, n: int = 20_000, seed: int = 0):
    """An 8-channel archive whose channel 0 is offline (NaN) in 12 stretches of 500 rows, and whose
    channel 3 holds one plausible value exactly over 400 rows that all lie in the first stretch.

    Returns ``(X, stuck)``: the rows and the mask of the stuck rows.
    """
    rng = np.random.default_rng(seed)
    p = 8
    A = rng.normal(size=(p, p))
    X = rng.multivariate_normal(np.zeros(p), A @ A.T / p + np.eye(p), size=n)
    gap = np.zeros(n, bool)
    for s in rng.integers(0, n - 500, 12):
        gap[s : s + 500] = True
    X[gap, 0] = np.nan
    stuck = np.zeros(n, bool)
    first = np.flatnonzero(gap)[0]
    stuck[first : first + 400] = True
    X[stuck, 3] = np.round(np.nanmedian(X[:, 3]) + 0.3, 6)
    return X, stuck
