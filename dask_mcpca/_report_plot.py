"""The PNG of ``dask-mcpca report``: :func:`render` draws an :class:`~dask_mcpca._report.ArchiveSummary`.

Drawn on a :class:`matplotlib.figure.Figure` with its own Agg canvas, so a
caller's backend and pyplot state are left alone.  Sizes are set in inches
from the number of channels and the length of their names, so 24-64
channels of 15-20 characters stay readable.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ._report import ArchiveSummary, Event

__all__ = ["plot", "render", "HEATMAP_COLUMNS", "contribution_norm", "figure_title"]


#: Columns of the heatmaps over time (groups of consecutive bins).
HEATMAP_COLUMNS = 300
#: Inches between two panels over time (room for the time axis' labels and the next title).
GAP = 0.8
#: Colours: the model (blue), classical PCA (orange), alarms (red), not monitored (grey).
_BLUE, _ORANGE, _RED, _GREY = "#2a6fb0", "#e07b39", "#c0392b", "#888888"
#: The contributions heatmap's colours span the cells' median (a normal row) to their largest,
#: at least ``HEAT_MIN_DECADES`` and at most ``HEAT_MAX_DECADES`` decades above it; larger cells take
#: the darkest colour, so that one huge event does not wash out the others.
HEAT_MIN_DECADES, HEAT_MAX_DECADES = 1.0, 3.0


def _describe_event(summary: ArchiveSummary, e: Event, rank: int) -> str:
    top = ", ".join(f"{c} {s:.0%}" for c, s in summary.top_channels(e))
    where = f"rows {e.start:,}-{e.stop - 1:,}"
    if summary.has_row_coordinate:
        first, last = str(e.first_label)[:19].replace("T", " "), str(e.last_label)[:19].replace("T", " ")
        where = f"{first} - {last[11:] if last[:10] == first[:10] else last}"
    return (f"#{rank} severity {e.severity:8.3g}  {where}  ({e.stop - e.start:,} rows, {e.n_flagged:,} flagged, "
            f"peak d² {e.peak_d2:.3g}): {top}")


def _groups(n_bins: int, columns: int = HEATMAP_COLUMNS) -> np.ndarray:
    """First bin of each of ``min(n_bins, columns)`` groups of consecutive bins."""
    return np.flatnonzero(np.diff(np.arange(n_bins) * min(n_bins, columns) // max(n_bins, 1), prepend=-1))


def _edges(xs, heads: np.ndarray):
    """Left edges of the groups starting at ``heads`` and the right edge of the last, in ``xs``'s units."""
    xs = np.asarray(xs)
    step = xs[-1] - xs[-2] if len(xs) > 1 else (np.timedelta64(1, "s") if xs.dtype.kind == "M" else 1)
    return np.append(xs[heads], xs[-1] + step)


def _channel_heatmap(ax, values: np.ndarray, xs, heads, channels, *, cmap, norm, label: str, title: str):
    """``values`` (groups x channels) as a heatmap, channels down, time across; a colour bar at the right."""
    mesh = ax.pcolormesh(_edges(xs, heads), np.arange(len(channels) + 1) - 0.5, values.T, cmap=cmap, norm=norm,
                         shading="flat", rasterized=True)
    ax.set_ylim(len(channels) - 0.5, -0.5)
    ax.set_yticks(np.arange(len(channels)), channels, fontsize=7 if len(channels) > 20 else 8)
    ax.set_title(title, loc="left")
    cax = ax.inset_axes((1.006, 0.0, 0.008, 1.0))  # inside the axes' box: the time axes stay aligned
    ax.figure.colorbar(mesh, cax=cax, label=label)


def _plot_outages(ax, summary: ArchiveSummary, xs, heads) -> None:
    """Share of each channel's cells missing (NaN) per group of bins, channels down, time across."""
    from matplotlib.colors import Normalize

    rows = np.add.reduceat(summary.bin_missing_share, heads, axis=0) / np.diff(np.append(heads, len(xs)))[:, None]
    shown = _outage_channels(summary)
    top = float(np.nanmax(rows[:, shown])) * 100 if shown else 100.0  # short gaps stay visible
    _channel_heatmap(ax, rows[:, shown] * 100, xs, heads, [summary.channels[j] for j in shown], cmap="Greys",
                     norm=Normalize(0, top if top > 0 else 100.0), label="% missing",
                     title=f"outages: share of values missing (NaN), the {len(shown)} channels with gaps "
                     f"(of {len(summary.channels)})")


def _plot_cells(ax, summary: ArchiveSummary, xs, heads) -> None:
    """Share of each channel's cells flagged (a cellwise model's :meth:`MCPCA.cell_outliers`) per group
    of bins, the channels with a flag, channels down, time across."""
    from matplotlib.colors import Normalize

    rows = np.add.reduceat(summary.bin_cells_share, heads, axis=0) / np.diff(np.append(heads, len(xs)))[:, None]
    shown = _cell_channels(summary)
    top = float(np.nanmax(rows[:, shown])) * 100 if shown else 100.0
    _channel_heatmap(ax, rows[:, shown] * 100, xs, heads, [summary.channels[j] for j in shown], cmap="Purples",
                     norm=Normalize(0, top if top > 0 else 100.0), label="% flagged",
                     title=f"cells judged bad: share of values flagged, the {len(shown)} channels with flags "
                     f"(of {len(summary.channels)})")


def _cell_channels(summary: ArchiveSummary) -> list[int]:
    """The channels with a flagged cell, by name."""
    order = _display_order(summary.channels)
    return [j for j in order if summary.bin_cells_share[:, j].any()]


def _outage_channels(summary: ArchiveSummary) -> list[int]:
    """The channels with a missing value, by name."""
    order = _display_order(summary.channels)
    return [j for j in order if summary.bin_missing_share[:, j].any()]


def _display_order(channels: list[str]) -> np.ndarray:
    """Channels by name, so that a plant's or a unit's channels stand together."""
    return np.argsort(np.asarray(channels, dtype=str), kind="stable")


def _plot_contributions(ax, summary: ArchiveSummary, xs, heads) -> None:
    """Mean channel contribution to d² per row, per group of bins (log colour)."""
    count = np.add.reduceat(np.nan_to_num(summary.bin_count).astype(float), heads)
    total = np.add.reduceat(np.nan_to_num(summary.bin_contrib) * summary.bin_count[:, None], heads, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count[:, None] > 0, total / count[:, None], np.nan)
    norm = contribution_norm(mean)
    order = _display_order(summary.channels)
    _channel_heatmap(ax, mean[:, order], xs, heads, [summary.channels[j] for j in order], cmap="magma_r", norm=norm,
                     label="mean contribution to d² per row",
                     title="which channel departs from the model, over time (reconstruction contributions)")


def figure_title(summary: ArchiveSummary, title: str = "") -> str:
    """The PNG's title: ``title`` (the store's name), the rows selected (``summary.selection``: ``--rows``,
    ``--time``), then the rows, channels and flags."""
    head = " ".join(t for t in (title, f"({summary.selection})" if summary.selection else "") if t)
    share = summary.n_flagged / max(summary.n_scored, 1)
    return ((head + ": ") if head else "") + (
        f"{summary.n_rows:,} rows x {len(summary.channels)} channels, {summary.n_flagged:,} rows flagged "
        f"({share:.2%}) in {summary.n_events:,} events")


def contribution_norm(values: np.ndarray):
    """The log colour scale of the contributions heatmap for the cells ``values`` (NaN: no row).

    Anchored at a normal row, not at the largest event: from the median of
    the positive cells to their largest, at least ``HEAT_MIN_DECADES`` and
    at most ``HEAT_MAX_DECADES`` decades above the median.  One huge event
    (a swap with d² of 1e6) takes the darkest colour instead of setting the
    scale, and events 10-1000 times a normal cell keep distinct, visible
    colours.
    """
    from matplotlib.colors import LogNorm

    values = np.asarray(values, float)
    finite = values[np.isfinite(values) & (values > 0)]
    if not len(finite):
        return LogNorm(vmin=1e-3, vmax=1.0, clip=True)
    low = float(np.median(finite))
    high = min(max(float(finite.max()), low * 10**HEAT_MIN_DECADES), low * 10**HEAT_MAX_DECADES)
    return LogNorm(vmin=low, vmax=high, clip=True)


def _plot_distance(ax, summary: ArchiveSummary, xs) -> None:
    """The robust distance as a band per bin, the bins holding a flagged row as dots (not a barcode)."""
    cutoff = summary.cutoff
    floor = 1e-3
    mean = np.maximum(summary.bin_quiet_mean, floor)
    high = np.maximum(np.fmin(summary.bin_max, cutoff), mean)
    ax.fill_between(xs, mean, high, color=_BLUE, alpha=0.18, lw=0, step="post",
                    label="up to the largest d² below the threshold")
    ax.plot(xs, mean, color=_BLUE, lw=0.8, drawstyle="steps-post", label="mean d² of the rows not flagged")
    above = np.flatnonzero(summary.bin_max > cutoff)
    ax.scatter(np.asarray(xs)[above], np.minimum(summary.bin_max[above], 1e300), s=7, color=_RED, lw=0, zorder=3,
               label="largest d² of a bin with a flagged row")
    ax.axhline(cutoff, color="black", ls="--", lw=1, label=f"is_outlier threshold d² = {cutoff:.3g}")
    ax.set_yscale("log")
    finite = summary.bin_max[np.isfinite(summary.bin_max)]
    top = min(float(finite.max()), 1e300) if len(finite) else cutoff
    ax.set_ylim(bottom=max(np.nanmin(mean) / 2, floor) if np.isfinite(mean).any() else floor,
                top=max(top, cutoff) * 30)
    for rank, e in enumerate(summary.worst_events, 1):  # the ranked events, numbered where they are
        at = e.first_label if summary.has_row_coordinate else e.start
        ax.annotate(f"#{rank}", (at, min(e.peak_d2, top)), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=8, color=_RED, fontweight="bold")
    ax.set_ylabel("robust distance d²")
    ax.set_title("robust distance over time: bins with a flagged row in red, the ranked events numbered", loc="left")
    ax.legend(frameon=False, loc="upper left", ncol=4, fontsize=8)


def _plot_share(ax, summary: ArchiveSummary, xs, heads) -> None:
    count = np.add.reduceat(summary.bin_count.astype(float), heads)
    flagged = np.add.reduceat(np.nan_to_num(summary.bin_share) * summary.bin_count, heads)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(count > 0, flagged / count, np.nan) * 100
    edges = _edges(xs, heads)
    ax.stairs(share, edges, fill=True, color=_BLUE, alpha=0.8)
    overall = summary.n_flagged / max(summary.n_scored, 1) * 100
    ax.axhline(overall, color=_GREY, ls=":", lw=1, label=f"whole archive {overall:.2g} %")
    ax.set_ylabel("rows flagged (%)")
    ax.set_title("share of rows flagged over time", loc="left")
    ax.legend(frameon=False, loc="upper left", fontsize=8)


def _plot_modes(ax, summary: ArchiveSummary, xs, heads) -> None:
    """The share of the rows in each operating mode over time, stacked (a model fitted with ``modes``)."""
    share = summary.mode_shares(heads) * 100
    edges = _edges(xs, heads)
    base = np.zeros(len(share))
    colors = (_BLUE, _ORANGE, "#2ca02c", "#9467bd")
    for m, label in enumerate(summary.modes):
        top = base + np.nan_to_num(share[:, m])
        ax.stairs(top, edges, baseline=base, fill=True, color=colors[m % len(colors)], alpha=0.8,
                  label=f"mode {m} ({label}): {summary.mode_weights[m]:.0%} of the fitted rows")
        base = top
    ax.set_ylim(0, 100)
    ax.set_ylabel("rows in mode (%)")
    ax.set_title("operating modes over time: the share of rows each mode judges", loc="left")
    ax.legend(frameon=False, loc="upper left", ncol=4, fontsize=8)


def _plot_drift(ax, summary: ArchiveSummary) -> None:
    """Each window's residual ratio (log), the threshold, the drift windows in red and the windows not
    monitored (too few complete rows, with modes of the largest mode) as grey spans."""
    from ._drift import unmonitored_reason

    w = summary.windows
    x, ratio = np.asarray(w["window_start"]), np.asarray(w["residual_ratio"], float)
    monitored, drift = w["monitored"] == 1, np.nan_to_num(w["drift"]) == 1
    edges = _edges(x, np.arange(len(x))) if len(x) else x
    off = np.flatnonzero(~monitored)
    for i in off:
        ax.axvspan(edges[i], edges[i + 1], color=_GREY, alpha=0.35, lw=0,
                   label=f"not monitored ({len(off)} windows: {unmonitored_reason(summary.modes is not None)})"
                   if i == off[0] else None)
    ref = np.flatnonzero(w["reference"] == 1)
    if len(ref):
        ax.axvspan(edges[ref[0]], edges[ref[-1] + 1], color=_BLUE, alpha=0.06, lw=0,
                   label="the model's fitted rows (calibration)")
    top = float(np.nanmax(ratio[np.isfinite(ratio)])) if np.isfinite(ratio).any() else 1.0
    shown = np.where(np.isinf(ratio), max(top, summary.drift_threshold) * 2, ratio)  # every row far: drawn on top
    ax.plot(x, shown, color=_BLUE, lw=1, marker="o", ms=3,
            label="residual ratio: variance outside the model's subspace / the model's")
    if np.isfinite(summary.drift_threshold):
        ax.axhline(summary.drift_threshold, color="black", ls="--", lw=1,
                   label=f"drift threshold {summary.drift_threshold:.3g} ({summary.drift_calibration})")
    ax.scatter(x[drift], shown[drift], s=36, color=_RED, zorder=3, label=f"drift ({int(drift.sum())} windows)")
    ax.set_ylabel("residual ratio")
    if np.any(np.isfinite(shown) & (shown > 0)):
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no monitored window", transform=ax.transAxes, ha="center", va="center", color=_GREY)
    ax.set_title(f"drift of the correlation structure: windows of {summary.window_text}, variance outside the "
                 f"subspace of the {summary.drift_components} leading components", loc="left")
    ax.legend(frameon=False, loc="upper left", ncol=3, fontsize=8)


#: The matplotlib modules :func:`plot` imports (``dask-mcpca report`` imports them during its
#: pass, about 1.4 s of a fresh process's time, so that the PNG is drawn without waiting for them).
MATPLOTLIB_MODULES = ("matplotlib", "matplotlib.backends.backend_agg", "matplotlib.figure", "matplotlib.gridspec")


def plot(summary: ArchiveSummary, path: str | os.PathLike, *, title: str = "", storage_options=None) -> None:
    """Write the PNG report of ``summary`` (:func:`render`) to ``path``, which may be a URL, atomically."""
    from ._atomic import write_bytes

    write_bytes(path, render(summary, title=title), storage_options=storage_options)


def render(summary: ArchiveSummary, *, title: str = "") -> bytes:
    """The PNG report of ``summary``, as bytes.

    Drawn on a :class:`matplotlib.figure.Figure` with its own Agg canvas, so
    the caller's matplotlib backend and pyplot state are left alone.  Every
    panel but the spectrum and the loadings shares one time axis: the robust
    distance (a band per bin, the bins with a flagged row as dots, the
    ranked events numbered), the share flagged, the operating modes (a
    model fitted with ``modes``: the share of rows in each), the drift windows (with
    ``window``), the channels' contributions as a heatmap (channels down,
    time across), the outages (when cells are missing), the cells judged bad
    (a model fitted with ``cellwise=True``); the events ranked
    by severity are listed at the bottom.
    """
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.gridspec import GridSpec

    style = {"font.size": 9, "axes.titlesize": 10, "axes.spines.top": False, "axes.spines.right": False}
    p = len(summary.channels)
    k = len(summary.robust_ratio)
    xs = summary.row_values if summary.row_values is not None else summary.bin_rows
    heads = _groups(len(xs))
    gaps = summary.bin_missing_share is not None
    cells = summary.bin_cells_share is not None and len(_cell_channels(summary)) > 0
    drift = summary.windows is not None and len(summary.windows["window_start"]) > 0
    modes = summary.bin_mode_share is not None
    heat = max(1.2, 0.12 * p + 0.4)
    outage = max(0.8, 0.12 * len(_outage_channels(summary)) + 0.4) if gaps else 0.0
    flagged_cells = max(0.8, 0.12 * len(_cell_channels(summary)) + 0.4) if cells else 0.0
    # inches: the spectrum and loadings, room for the loadings' channel names, then the panels over time
    head = max(2.6, 0.04 * p + 2.0)
    names = max(0.06 * max(len(c) for c in summary.channels) + 0.3, 0.9) if p <= 80 else 0.9
    heights = [2.8, 1.4] + ([1.4] if modes else []) + ([1.8] if drift else []) + [heat] + ([outage] if gaps else []) + (
        [flagged_cells] if cells else [])
    heights.append(0.22 * max(len(summary.worst_events), 1) + 0.3)
    rest = sum(heights) + GAP * (len(heights) - 1)
    total = 0.9 + head + names + rest * 1.0 + 0.3
    with matplotlib.rc_context(style):
        fig = Figure(figsize=(16, total), dpi=100)
        FigureCanvasAgg(fig)
        top = GridSpec(1, 3, figure=fig, wspace=0.3, top=1 - 0.9 / total, bottom=1 - (0.9 + head) / total,
                       left=0.12, right=0.93)
        gs = GridSpec(len(heights), 1, figure=fig, height_ratios=heights, hspace=GAP * len(heights) / sum(heights),
                      top=1 - (0.9 + head + names) / total, bottom=0.3 / total, left=0.12, right=0.93)
        fig.suptitle(figure_title(summary, title), fontsize=13, x=0.12, ha="left")
        ax = fig.add_subplot(top[0, 0])
        shown = min(k, 20)
        x = np.arange(1, shown + 1)
        ax.bar(x - 0.2, summary.classical_ratio[:shown], 0.4, color=_ORANGE, label="classical (PCA)")
        ax.bar(x + 0.2, summary.robust_ratio[:shown], 0.4, color=_BLUE, label="robust (MCPCA)")
        ax.set_yscale("log")
        ax.set_xticks(x[:: max(1, shown // 10)])
        ax.set_xlabel("component")
        ax.set_ylabel("explained variance ratio (log)")
        ax.set_title("explained variance: robust vs classical", loc="left")
        ax.legend(frameon=False, fontsize=8)

        ax = fig.add_subplot(top[0, 1:])
        order = _display_order(summary.channels)
        comps = summary.components[: min(k, 8)][:, order]
        lim = float(np.abs(comps).max()) or 1.0
        im = ax.imshow(comps, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
        if p <= 80:
            names = [summary.channels[j] for j in order]
            ax.set_xticks(np.arange(p), names, rotation=90 if p > 8 else 0, fontsize=7 if p > 24 else 8)
        ax.set_yticks(np.arange(len(comps)), [str(i + 1) for i in range(len(comps))])
        ax.set_ylabel("component")
        ax.set_title("robust loadings of the leading components", loc="left")
        fig.colorbar(im, ax=ax, fraction=0.02, pad=0.01)

        # The panels over time, top to bottom, on one shared time axis.
        panels = [lambda ax: _plot_distance(ax, summary, xs), lambda ax: _plot_share(ax, summary, xs, heads)]
        if modes:
            panels.append(lambda ax: _plot_modes(ax, summary, xs, heads))
        if drift:
            panels.append(lambda ax: _plot_drift(ax, summary))
        panels.append(lambda ax: _plot_contributions(ax, summary, xs, heads))
        if gaps:
            panels.append(lambda ax: _plot_outages(ax, summary, xs, heads))
        if cells:
            panels.append(lambda ax: _plot_cells(ax, summary, xs, heads))
        time_axes = []
        for row, draw in enumerate(panels):
            time_axes.append(fig.add_subplot(gs[row, :], sharex=time_axes[0] if time_axes else None))
            draw(time_axes[-1])
        for ax in time_axes[:-1]:
            ax.tick_params(labelbottom=False)
        time_axes[-1].set_xlabel(summary.row_label)
        time_axes[0].set_xlim(xs[0], _edges(xs, heads)[-1])

        ax = fig.add_subplot(gs[row + 1, :])
        ax.axis("off")
        lines = [_describe_event(summary, e, i) for i, e in enumerate(summary.worst_events, 1)]
        ax.set_title(f"the {len(lines)} most severe of {summary.n_events:,} events (severity: decades of d² above "
                     "the threshold, summed over the flagged rows), with the channels most responsible", loc="left")
        ax.text(0, 1, "\n".join(lines) or "no flagged rows", va="top", family="monospace", fontsize=8,
                transform=ax.transAxes)
        png = io.BytesIO()
        fig.savefig(png, format="png")
    return png.getvalue()
