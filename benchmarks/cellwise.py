"""Cells you cannot trust (issue 33): a wide factor-model archive whose cells glitch one by one.

Each cell is replaced, with probability ``eps`` and independently per channel,
by a value 8-20 channel standard deviations off (sign at random), so a share
``1 - (1 - eps)^p`` of the rows holds at least one bad cell.  The channels are
standardised (the truth is known in those units): a 5-factor model with factor
standard deviations 10 to 4 and unit noise.  For each setting the methods run
in turn on the same data (one run, alternated):

- classical PCA (scikit-learn),
- ``MCPCA()``, the default row-wise robust fit,
- ``MCPCA(cellwise=True)``,
- robpy's DDC (cells flagged, then imputed) followed by PCA,
- robpy's ROBPCA (row-wise),
- scikit-learn's MinCovDet (p <= 30).

Reported: the top-5 subspace's largest principal angle to the truth, the
largest relative error of the top-5 variances, the share of bad cells named
and of clean cells named (methods with per-cell output), the share of rows
flagged, and the fit time.  ``oracle`` is classical PCA of the same rows
before the glitches: the sampling error that no method can beat.

Run: ``python benchmarks/cellwise.py [--n 20000] [--quick]``; writes
``benchmarks/CELLWISE.md``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np

from dask_mcpca import MCPCA

RESULTS = Path(__file__).resolve().parent / "CELLWISE.md"
K = 5


def archive(n: int, p: int, eps: float, seed: int = 0):
    """Rows, the true top-K basis and variances, the clean rows and the mask of bad cells."""
    rng = np.random.default_rng(seed)
    L = np.linalg.qr(rng.standard_normal((p, K)))[0]
    sv = np.linspace(10, 4, K)
    clean = (rng.standard_normal((n, K)) * sv) @ L.T + rng.standard_normal((n, p))
    sd = np.sqrt((L**2 * sv**2).sum(axis=1) + 1)
    clean /= sd
    bad = rng.random((n, p)) < eps
    X = clean.copy()
    X[bad] = rng.uniform(8, 20, bad.sum()) * rng.choice([-1, 1], bad.sum())
    S = ((L * sv**2) @ L.T + np.eye(p)) / np.outer(sd, sd)
    w, V = np.linalg.eigh(S)
    return X, V[:, ::-1][:, :K], w[::-1][:K], clean, bad


def angle(A: np.ndarray, B: np.ndarray) -> float:
    s = np.linalg.svd(np.linalg.qr(A)[0].T @ np.linalg.qr(B)[0], compute_uv=False)
    return float(np.degrees(np.arccos(np.clip(s.min(), -1.0, 1.0))))


def _eig(S: np.ndarray):
    w, V = np.linalg.eigh(S)
    return V[:, ::-1][:, :K], w[::-1][:K]


def run_pca(X):
    from sklearn.decomposition import PCA

    m = PCA(K).fit(X)
    return m.components_.T, m.explained_variance_, None, None


def run_mcpca(X, cellwise: bool):
    m = MCPCA(cellwise=cellwise, random_state=0).fit(X)
    cells = np.asarray(m.cell_outliers(X)) if cellwise else None
    return m.components_[:K].T, m.explained_variance_[:K], cells, np.asarray(m.is_outlier(X))


def run_ddc_pca(X):
    import pandas as pd
    from robpy.outliers import DDC
    from sklearn.decomposition import PCA

    frame = pd.DataFrame(X)  # robpy's DDC takes a DataFrame only
    ddc = DDC().fit(frame)
    cells = np.asarray(ddc.cellwise_outliers_, bool)
    imputed = np.asarray(ddc.impute(frame))
    m = PCA(K).fit(imputed)
    return m.components_.T, m.explained_variance_, cells, None


def run_robpca(X):
    from robpy.pca import ROBPCA

    m = ROBPCA(n_components=K).fit(X)
    comps = np.asarray(m.components_)
    comps = comps if comps.shape[0] == X.shape[1] else comps.T
    return comps[:, :K], np.asarray(m.explained_variance_)[:K], None, None


def run_mcd(X):
    from sklearn.covariance import MinCovDet

    m = MinCovDet(random_state=0).fit(X)
    V, w = _eig(m.covariance_)
    return V, w, None, np.asarray(m.mahalanobis(X) > 0)


METHODS = {
    "PCA": run_pca,
    "MCPCA()": lambda X: run_mcpca(X, False),
    "MCPCA(cellwise=True)": lambda X: run_mcpca(X, True),
    "DDC + PCA (robpy)": run_ddc_pca,
    "ROBPCA (robpy)": run_robpca,
    "MinCovDet": run_mcd,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true", help="p = 30 and 100 only, eps = 1 and 5 %%")
    args = parser.parse_args()
    ps = (30, 100) if args.quick else (30, 100, 300)
    epss = (0.01, 0.05) if args.quick else (0.005, 0.01, 0.02, 0.05)
    lines = [
        "# Cells you cannot trust (benchmarks/cellwise.py)",
        "",
        f"Command: `python benchmarks/cellwise.py --n {args.n}{' --quick' if args.quick else ''}`; 2-core machine; "
        "seed 0. Angle: largest principal angle of the top-5 subspace to the truth (deg); var: largest "
        "relative error of the top-5 variances; cells named: share of bad cells flagged / share of clean "
        "cells flagged; rows: share of rows flagged as outliers. `oracle` is PCA of the same rows before "
        "the glitches. A method 'holds' at angle <= oracle + 1 deg and var <= 10 %.",
        "",
        "| p | eps | rows with a bad cell | method | angle | var | cells named (bad / clean) | rows flagged | "
        "holds | time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in ps:
        for eps in epss:
            X, V, lam, clean, bad = archive(args.n, p, eps)
            oracle = angle(V, run_pca(clean)[0])
            share = bad.any(axis=1).mean()
            lines.append(f"| {p} | {eps:.1%} | {share:.0%} | oracle (clean rows, PCA) | {oracle:.2f} | | | | | |")
            for name, func in METHODS.items():
                if name == "MinCovDet" and p > 30:
                    continue
                t = time.perf_counter()
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        comps, var, cells, rows = func(X)
                except Exception as err:  # a peer that fails is reported, not fatal
                    lines.append(f"| {p} | {eps:.1%} | {share:.0%} | {name} | failed: {type(err).__name__} | | | | | |")
                    print(lines[-1], err, flush=True)
                    continue
                dt = time.perf_counter() - t
                a = angle(V, comps)
                v = float(np.max(np.abs(np.asarray(var)[:K] / lam - 1)))
                named = "—" if cells is None else f"{cells[bad].mean():.3f} / {cells[~bad].mean():.4f}"
                flagged = "—" if rows is None else f"{rows.mean():.3f}"
                holds = "yes" if a <= oracle + 1 and v <= 0.10 else "no"
                lines.append(f"| {p} | {eps:.1%} | {share:.0%} | {name} | {a:.2f} | {v:.1%} | {named} | {flagged} | "
                             f"{holds} | {dt:.1f} |")
                print(lines[-1], flush=True)
    RESULTS.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
