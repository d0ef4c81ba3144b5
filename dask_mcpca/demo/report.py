"""The demo's printed tables and its PNG report (matplotlib, imported only to plot)."""

from __future__ import annotations

import numpy as np

from .._atomic import atomic_open
from .._schedule import outlier_cutoff_d2
from .archive import CHANNELS, KINDS, TRUE_LOADINGS
from .evaluate import DemoResult

__all__ = ["plot", "table", "outlier_table"]

_COLORS = {"true": "#222222", "PCA": "#e07b39", "MCPCA": "#2a6fb0"}
_KIND_COLORS = {0: "#b8b8b8", 1: "#d62728", 2: "#9467bd", 3: "#2ca02c"}


def _panel_loadings(ax, i: int, result: DemoResult, pca_components, mcpca_components) -> None:
    x = np.arange(len(CHANNELS))
    true = TRUE_LOADINGS[:, i]
    for j, (name, v) in enumerate((("true", true), ("PCA", pca_components[i]), ("MCPCA", mcpca_components[i]))):
        v = v * (np.sign(v @ true) or 1.0)  # an axis has no sign: show it the way the truth points
        ax.bar(x + (j - 1) * 0.27, v, 0.27, color=_COLORS[name], label=name)
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(x, CHANNELS, fontsize=8)
    ax.set_ylim(-0.75, 0.75)
    ax.set_title(
        f"component {i + 1}: angle to truth\nPCA {result.angles_pca[i]:.1f}°   MCPCA {result.angles_mcpca[i]:.2f}°"
    )
    if i == 0:
        ax.set_ylabel("loading")
        ax.legend(loc="lower left", fontsize=8, frameon=False, ncol=3)


def _panel_variances(ax, result: DemoResult) -> None:
    k = np.arange(1, len(CHANNELS) + 1)
    ax.bar(k - 0.2, result.variances_pca, 0.4, color=_COLORS["PCA"], label="PCA")
    ax.bar(k + 0.2, result.variances_mcpca, 0.4, color=_COLORS["MCPCA"], label="MCPCA (robust)")
    ax.scatter(
        k, result.variances_true, marker="_", s=400, color=_COLORS["true"], lw=2.5, zorder=3, label="true (clean rows)"
    )
    ax.set_yscale("log")
    ax.set_xticks(k)
    ax.set_xlabel("component")
    ax.set_ylabel("explained variance (log)")
    ax.set_title("explained variance: PCA's noise floor is inflated by the faults")
    ax.legend(fontsize=8, frameon=False)


def _panel_flagged(ax, result: DemoResult) -> None:
    labels = ["all faults", *KINDS.values(), "false alarms\n(clean rows)"]
    xs = np.arange(len(labels))
    for j, (name, m) in enumerate((("PCA (classical Mahalanobis)", 1), ("MCPCA is_outlier", 0))):
        flagged, total = result.counts[m, :, 0], np.maximum(result.counts[m, :, 1], 1)
        shares = [flagged[1:].sum() / total[1:].sum(), *(flagged[k] / total[k] for k in KINDS), flagged[0] / total[0]]
        bars = ax.bar(xs + (j - 0.5) * 0.4, np.array(shares) * 100, 0.4, color=_COLORS["PCA" if m else "MCPCA"],
                      label=name)
        for bar, share in zip(bars, shares, strict=True):
            text = f"{share:.0%}" if share >= 0.01 or share == 0 else f"{share:.2%}"
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + 1.5, text, ha="center", fontsize=7.5)
    ax.set_xticks(xs, labels, fontsize=9)
    ax.set_ylim(0, 132)  # room for the legend above the bars
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylabel("rows flagged (%)")
    precision, recall = result.precision_recall(0)
    ax.set_title(
        f"rows flagged (MCPCA: d² > {result.cutoff:.1f}, PCA: d² > {outlier_cutoff_d2(len(CHANNELS)):.1f})\n"
        f"MCPCA: precision {precision:.1%}, recall {recall:.1%}"
    )
    ax.legend(fontsize=8, frameon=False, loc="upper center", ncol=2)


def _panel_scores(ax, result: DemoResult, sample) -> None:
    import matplotlib.ticker

    rows, d2, kind = sample
    scored = np.isfinite(d2)  # rows with a gap have no score
    rows, d2, kind = rows[scored], d2[scored], kind[scored]
    cut = result.cutoff
    for k in (0, 1, 2, 3):  # clean rows first, faults drawn on top
        sel = kind == k
        n_total = result.counts[0, k, 1]
        shown = f"{sel.sum():,} of {n_total:,}" if sel.sum() < n_total else f"{n_total:,}"
        ax.scatter(
            rows[sel], np.maximum(d2[sel], 1e-2), s=2 if k == 0 else 4, color=_KIND_COLORS[k],
            alpha=0.5 if k == 0 else 0.8, lw=0, rasterized=True,
            label=f"{KINDS.get(k, 'clean')} ({shown} rows)",
        )
    ax.axhline(cut, color="black", lw=1, ls="--", label=f"is_outlier threshold d² = {cut:.1f}")
    ax.set_yscale("log")
    ax.set_xlim(0, result.n_rows)
    ax.set_ylim(1e-1, max(float(d2.max()) if len(d2) else cut, cut) * 30)  # room for the legend
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_xlabel("row (time)")
    ax.set_ylabel("robust squared distance d²")
    ax.set_title("outlier score of each row over time, coloured by the generator's truth")
    ax.legend(fontsize=8, markerscale=4, loc="upper left", ncol=5, frameon=True, framealpha=0.9)


def plot(path, result: DemoResult, pca_components, model, sample, seed) -> None:
    """The PNG report: loadings, explained variance, rows flagged, scores over time."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.gridspec import GridSpec

    style = {"font.size": 10, "axes.titlesize": 11, "axes.spines.top": False, "axes.spines.right": False}
    # A Figure on its own Agg canvas: the caller's backend and pyplot state are left alone.
    with matplotlib.rc_context(style):
        fig = Figure(figsize=(15, 11.5), dpi=110)
        FigureCanvasAgg(fig)
        gs = GridSpec(3, 6, figure=fig, height_ratios=[1.0, 1.0, 1.15], hspace=0.5, wspace=0.9, top=0.9, bottom=0.05)
        faulty = result.counts[0, 1:, 1].sum() / result.n_rows
        fig.suptitle(
            f"dask-mcpca demo: {result.n_rows:,} rows x {len(CHANNELS)} sensor channels, 3 latent factors, "
            f"{faulty:.1%} faulty rows (seed {seed})",
            fontsize=13,
            y=0.965,
        )
        for i in range(3):
            _panel_loadings(fig.add_subplot(gs[0, 2 * i : 2 * i + 2]), i, result, pca_components, model.components_)
        _panel_variances(fig.add_subplot(gs[1, 0:3]), result)
        _panel_flagged(fig.add_subplot(gs[1, 3:6]), result)
        _panel_scores(fig.add_subplot(gs[2, :]), result, sample)
        with atomic_open(path, "wb") as f:  # whole or not at all (a symlink named as it: its target)
            fig.savefig(f, format="png", bbox_inches="tight")


def table(result: DemoResult) -> str:
    lines = [
        f"{'component':>9}  {'true var':>9}  {'PCA var':>9}  {'MCPCA var':>9}  {'PCA angle':>9}  {'MCPCA angle':>11}"
    ]
    for i in range(3):
        lines.append(
            f"{i + 1:>9}  {result.variances_true[i]:>9.3f}  {result.variances_pca[i]:>9.3f}  "
            f"{result.variances_mcpca[i]:>9.3f}  {result.angles_pca[i]:>8.2f}°  {result.angles_mcpca[i]:>10.2f}°"
        )
    noise = slice(3, None)
    lines.append(
        f"{'4-12':>9}  {result.variances_true[noise].mean():>9.3f}  {result.variances_pca[noise].mean():>9.3f}  "
        f"{result.variances_mcpca[noise].mean():>9.3f}  {'(mean noise variance)':>22}"
    )
    lines.append(
        f"{'subspace':>9}  {'':>9}  {'':>9}  {'':>9}  {result.subspace_pca:>8.2f}°  {result.subspace_mcpca:>10.2f}°"
        "   (largest principal angle, 3 components)"
    )
    return "\n".join(lines)


def outlier_table(result: DemoResult) -> str:
    kinds = "".join(f"  {name:>8}" for name in KINDS.values())
    lines = [f"{'':>28}  {'precision':>9}  {'recall':>7}{kinds}  {'false alarms':>12}"]
    for name, m in (("MCPCA is_outlier", 0), ("PCA (classical Mahalanobis)", 1)):
        prec, rec = result.precision_recall(m)
        flagged, total = result.counts[m, :, 0], result.counts[m, :, 1]
        per_kind = "".join(f"  {flagged[k] / max(total[k], 1):>8.1%}" for k in KINDS)
        lines.append(f"{name:>28}  {prec:>9.1%}  {rec:>7.1%}{per_kind}  {flagged[0]:>12,}")
    return "\n".join(lines)
