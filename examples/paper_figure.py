"""Reproduce Figure 1 of the paper (its images are empty in the published source).

Section 4's experiment: n = 400 rows from N(0, S) with
S = [[8, 3, -1], [3, 4, -2], [-1, -2, 6]]; in (b) 5 % of the rows are replaced
by draws from N(0, 15 Lambda).  Each panel shows the rows and the true, PCA
and MCPI components (``solver="paper"``, eta = 0.95, n_decay = 65, no
centring, as published), plus the default solver for comparison.

Usage::

    python examples/paper_figure.py [--seed 0] [--out examples/paper_figure.png]
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from sklearn.decomposition import PCA

from dask_mcpca import MCPCA

S = np.array([[8.0, 3.0, -1.0], [3.0, 4.0, -2.0], [-1.0, -2.0, 6.0]])
STYLES = {
    "true": dict(color="black", lw=3.0),
    "PCA": dict(color="tab:red", lw=2.0, ls="--"),
    "MCPI (paper)": dict(color="tab:blue", lw=2.0),
    "MCPCA default": dict(color="tab:green", lw=1.5, ls=":"),
}


def experiment(seed: int, outliers: bool):
    lam, V = np.linalg.eigh(S)
    lam, V = lam[::-1], V[:, ::-1]
    rng = np.random.default_rng(seed)
    X = rng.multivariate_normal(np.zeros(3), S, size=400)
    bad = np.zeros(400, bool)
    if outliers:
        rows = rng.choice(400, 20, replace=False)
        X[rows] = rng.normal(size=(20, 3)) * np.sqrt(15 * lam)
        bad[rows] = True
    return X, bad, V.T, lam


def angles(est, true):
    return np.degrees(np.arccos(np.clip(np.abs(np.sum(est * true, axis=1)), 0, 1)))


def panel(ax, X, bad, estimates, lam, title):
    ax.scatter(*X[~bad].T, s=4, c="0.6", alpha=0.5, label="samples")
    if bad.any():
        ax.scatter(*X[bad].T, s=14, c="tab:orange", marker="x", label="outliers")
    for name, comps in estimates.items():
        for i, v in enumerate(comps):
            end = 2.5 * np.sqrt(lam[i]) * v
            ax.plot(*np.c_[-end, end], **STYLES[name], label=name if i == 0 else None)
    lim = 3.0 * np.sqrt(lam[0])
    ax.set(xlim=(-lim, lim), ylim=(-lim, lim), zlim=(-lim, lim), title=title)
    ax.set_xlabel("$x_1$")
    ax.set_ylabel("$x_2$")
    ax.set_zlabel("$x_3$")


def main(argv=None):
    ap = argparse.ArgumentParser(description="Reproduce the paper's Figure 1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="examples/paper_figure.png")
    args = ap.parse_args(argv)
    fig = plt.figure(figsize=(13, 6.2))
    for k, (outliers, title) in enumerate([(False, "(a) Gaussian samples"), (True, "(b) with 5 % outliers")]):
        X, bad, V, lam = experiment(args.seed, outliers)
        estimates = {
            "true": V,
            "PCA": PCA().fit(X).components_,
            "MCPI (paper)": MCPCA(solver="paper", center=False).fit(X).components_,
            "MCPCA default": MCPCA(center=False).fit(X).components_,
        }
        summary = ", ".join(
            f"{name} {angles(c, V).max():.1f}°" for name, c in estimates.items() if name != "true"
        )
        print(f"{title}: largest angle to the true components: {summary}")
        ax = fig.add_subplot(1, 2, k + 1, projection="3d")
        panel(ax, X, bad, estimates, lam, f"{title}\nlargest angle: {summary}")
        ax.title.set_fontsize(9)
    handles, labels = fig.axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, frameon=False)
    fig.suptitle("Principal components by MCPI (Algorithm 3) and standard PCA", fontsize=12)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
