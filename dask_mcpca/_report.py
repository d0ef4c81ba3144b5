"""A report for any fitted archive, without the generator's truth: one streaming pass.

:func:`summarize` reads the archive once, one task per row block, each task
returning a small :class:`BlockSummary` (row count, sums for the classical
covariance, the robust distance binned over the row axis, the share flagged,
and the runs of flagged rows with each channel's summed contribution).  The
client merges them: runs that touch across a block boundary (or lie within
``max_gap`` rows of each other) become one event.  Memory is flat in the
number of rows: a block summary holds ``N_BINS``-sized arrays, a p x p sum
and its own runs, never rows.

:func:`plot` draws the PNG (robust vs classical explained variance, the
loadings with channel names, the robust distance over rows or time with the
threshold, the share flagged per block, the largest events) and
:func:`write_events` the events as CSV.  ``dask-mcpca report`` calls the three.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._io import as_row_blocks
from ._labels import is_dataarray

__all__ = ["BlockSummary", "ArchiveSummary", "summarize", "plot", "write_events", "N_BINS", "TOP_CHANNELS"]

#: Bins of the robust-distance curve over the row axis.
N_BINS = 2000
#: Channels named per event (the largest shares of its summed contributions).
TOP_CHANNELS = 3
#: Rows of a block processed at once (bounds the float64 working set of a task).
SLICE_ROWS = 65_536
#: Events listed in the PNG.
EVENTS_SHOWN = 8


@dataclass
class BlockSummary:
    """What one row block owes the report (small: no rows)."""

    start: int
    n_rows: int
    n_scored: int
    n_flagged: int
    sum_x: np.ndarray  # (p,) over the scored rows
    sum_xx: np.ndarray  # (p, p)
    bins: np.ndarray  # global bin index of each entry below
    bin_max: np.ndarray  # largest d^2 in the bin (NaN: no scored row)
    bin_sum: np.ndarray  # sum of d^2 in the bin
    bin_count: np.ndarray  # scored rows in the bin
    runs: np.ndarray  # (m, 2) global [start, stop) of the runs of flagged rows
    run_peak: np.ndarray  # (m,) largest d^2 of the run
    run_contrib: np.ndarray  # (m, p) summed channel contributions of the run


def _runs(flags: np.ndarray) -> np.ndarray:
    """[start, stop) of the runs of True in ``flags``, shape (m, 2)."""
    edges = np.diff(np.concatenate([[0], flags.astype(np.int8), [0]]))
    return np.column_stack([np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)])


def summarize_block(block: np.ndarray, start: int, n_total: int, model) -> BlockSummary:
    """The :class:`BlockSummary` of rows ``start:start + len(block)`` of an archive of ``n_total`` rows.

    The block is processed ``SLICE_ROWS`` rows at a time, so the working set
    in float64 stays a few MB whatever the block's size; only the per-row
    distance and flag of the block are kept whole (9 bytes a row).
    """
    n, p = block.shape
    d2 = np.full(n, np.nan)
    flags = np.zeros(n, dtype=bool)
    sum_x, sum_xx, n_scored = np.zeros(p), np.zeros((p, p)), 0
    for a in range(0, n, SLICE_ROWS):
        X = np.asarray(block[a : a + SLICE_ROWS], np.float64)
        ok = np.isfinite(X).all(axis=1)
        Xs = np.where(ok[:, None], X, 0.0)  # rows with a gap add nothing to the sums
        d = model._d2(Xs)
        d2[a : a + len(X)] = np.where(ok, d, np.nan)
        flags[a : a + len(X)] = ok & ((d > model.outlier_cutoff_) | model._repeated(Xs))
        sum_x += Xs.sum(axis=0)
        sum_xx += Xs.T @ Xs
        n_scored += int(ok.sum())
    bins = np.arange(start, start + n) * N_BINS // max(n_total, 1)
    first = np.flatnonzero(np.diff(np.concatenate([[-1], bins])))  # bins are contiguous
    scored = ~np.isnan(d2)
    if n:
        bin_max = np.fmax.reduceat(np.where(scored, d2, -np.inf), first)
        bin_max = np.where(np.isfinite(bin_max), bin_max, np.nan)
        bin_sum = np.add.reduceat(np.where(scored, d2, 0.0), first)
        bin_count = np.add.reduceat(scored.astype(np.int64), first)
    else:
        bin_max, bin_sum, bin_count = np.empty(0), np.empty(0), np.empty(0, np.int64)
    runs = _runs(flags)
    root = model._precision(0.5)
    run_contrib = np.empty((len(runs), p))
    run_peak = np.empty(len(runs))
    for i, (a, b) in enumerate(runs):  # flagged rows are finite
        run_contrib[i] = (((np.asarray(block[a:b], np.float64) - model.mean_) @ root) ** 2).sum(axis=0)
        run_peak[i] = d2[a:b].max()
    return BlockSummary(
        start=int(start),
        n_rows=n,
        n_scored=n_scored,
        n_flagged=int(flags.sum()),
        sum_x=sum_x,
        sum_xx=sum_xx,
        bins=bins[first],
        bin_max=bin_max,
        bin_sum=bin_sum,
        bin_count=bin_count,
        runs=runs + start,
        run_peak=run_peak,
        run_contrib=run_contrib,
    )


@dataclass
class Event:
    """A run of flagged rows (or several within ``max_gap`` rows): where, how bad, which channels."""

    start: int
    stop: int
    n_flagged: int
    peak_d2: float
    shares: np.ndarray  # (p,) each channel's share of the event's summed contributions


@dataclass
class ArchiveSummary:
    """Everything the report shows, merged from the block summaries."""

    n_rows: int
    n_scored: int
    n_flagged: int
    cutoff: float
    channels: list[str]
    components: np.ndarray
    robust_ratio: np.ndarray
    classical_ratio: np.ndarray
    bin_rows: np.ndarray  # first row of each bin
    bin_max: np.ndarray
    bin_mean: np.ndarray
    block_starts: np.ndarray
    block_share: np.ndarray  # share of the scored rows flagged, per block
    events: list[Event] = field(default_factory=list)
    row_label: str = "row"
    row_values: Any = None  # the row coordinate (time) at bin_rows, or None
    row_coordinate: Any = None  # the row coordinate of every row (an in-memory index), or None

    def top_channels(self, event: Event, k: int = TOP_CHANNELS) -> list[tuple[str, float]]:
        order = np.argsort(-event.shares)[:k]
        return [(self.channels[j], float(event.shares[j])) for j in order]


def _merge_events(summaries: list[BlockSummary], max_gap: int) -> list[Event]:
    events: list[Event] = []
    for s in summaries:
        for (a, b), peak, contrib in zip(s.runs, s.run_peak, s.run_contrib, strict=True):
            last = events[-1] if events else None
            if last is not None and a - last.stop <= max_gap:
                last.stop, last.n_flagged = int(b), last.n_flagged + int(b - a)
                last.peak_d2 = max(last.peak_d2, float(peak))
                last.shares = last.shares + contrib  # summed here, normalised below
            else:
                events.append(Event(int(a), int(b), int(b - a), float(peak), contrib.copy()))
    for e in events:
        total = e.shares.sum()
        e.shares = e.shares / total if total > 0 else e.shares
    return events


def _channel_names(model, X) -> list[str]:
    names = getattr(model, "feature_names_in_", None)
    if names is None and is_dataarray(X) and X.dims[1] in X.coords:
        names = X.coords[X.dims[1]].values
    if names is None:
        return [str(j) for j in range(model.n_features_in_)]
    return [str(n) for n in names]


def summarize(model, X: Any, *, max_gap: int = 0, progress: bool = False, storage_options=None) -> ArchiveSummary:
    """One pass over ``X`` under the fitted ``model``: the :class:`ArchiveSummary` of the report.

    Parameters
    ----------
    model : MCPCA
        A fitted model.
    X : any input of :meth:`MCPCA.fit`
        The archive; a DataArray's row coordinate (time) labels the curve
        and the events.
    max_gap : int, default=0
        Runs of flagged rows at most this many rows apart are one event.
    progress : bool, default=False
        Draw dask's progress bar on stderr.

    Returns
    -------
    ArchiveSummary
    """
    import dask
    import dask.array as da

    from ._progress import compute_with_progress

    rows = as_row_blocks(X, storage_options=storage_options)
    if rows.shape[1] != model.n_features_in_:
        raise ValueError(f"X has {rows.shape[1]} features, but the model expects {model.n_features_in_}")
    n = rows.shape[0]
    if isinstance(rows, da.Array):
        starts = np.concatenate([[0], np.cumsum(rows.chunks[0])[:-1]])
        parts = [
            dask.delayed(summarize_block, pure=True)(b, int(s), n, model)
            for b, s in zip(rows.to_delayed().ravel(), starts, strict=True)
        ]
        summaries = list(compute_with_progress(*parts, enabled=progress))
    else:
        summaries = [summarize_block(rows, 0, n, model)]
    n_scored = sum(s.n_scored for s in summaries)
    sum_x = sum(s.sum_x for s in summaries)
    sum_xx = sum(s.sum_xx for s in summaries)
    mean = sum_x / max(n_scored, 1)
    cov = sum_xx / max(n_scored, 1) - np.outer(mean, mean)
    classical = np.clip(np.linalg.eigvalsh(cov)[::-1], 0, None)
    bin_max = np.full(N_BINS, np.nan)
    bin_sum, bin_count = np.zeros(N_BINS), np.zeros(N_BINS, dtype=np.int64)
    for s in summaries:
        bin_max[s.bins] = np.fmax(bin_max[s.bins], s.bin_max)
        np.add.at(bin_sum, s.bins, s.bin_sum)
        np.add.at(bin_count, s.bins, s.bin_count)
    used = np.flatnonzero(np.bincount(np.arange(n) * N_BINS // n, minlength=N_BINS)) if n <= N_BINS else None
    bin_rows = -(-np.arange(N_BINS) * n // N_BINS)  # first row r of bin b: r * N_BINS // n == b
    if used is not None:
        bin_rows, bin_max, bin_sum, bin_count = bin_rows[used], bin_max[used], bin_sum[used], bin_count[used]
    with np.errstate(invalid="ignore", divide="ignore"):
        bin_mean = np.where(bin_count > 0, bin_sum / bin_count, np.nan)
    row_label, row_values, row_coordinate = "row", None, None
    if is_dataarray(X):
        row_label = str(X.dims[0])
        if X.dims[0] in X.coords:
            row_coordinate = X.coords[X.dims[0]].values
            row_values = row_coordinate[bin_rows]
    return ArchiveSummary(
        n_rows=n,
        n_scored=n_scored,
        n_flagged=sum(s.n_flagged for s in summaries),
        cutoff=float(model.outlier_cutoff_),
        channels=_channel_names(model, X),
        components=model.components_,
        robust_ratio=np.asarray(model.explained_variance_ratio_),
        classical_ratio=classical / classical.sum() if classical.sum() > 0 else classical,
        bin_rows=bin_rows,
        bin_max=bin_max,
        bin_mean=bin_mean,
        block_starts=np.array([s.start for s in summaries]),
        block_share=np.array([s.n_flagged / max(s.n_scored, 1) for s in summaries]),
        events=_merge_events(summaries, max_gap),
        row_label=row_label,
        row_values=row_values,
        row_coordinate=row_coordinate,
    )


def _event_labels(summary: ArchiveSummary, event: Event) -> tuple[str, str]:
    """The row coordinate (time) of the first and the last row of ``event``."""
    coordinate = summary.row_coordinate
    return str(coordinate[event.start]), str(coordinate[event.stop - 1])


def write_events(summary: ArchiveSummary, path: str | os.PathLike, *, storage_options: dict | None = None) -> None:
    """The events as CSV, written atomically, also to an object store URL (see :func:`write_events_to`)."""
    from ._atomic import write_bytes

    text = io.StringIO(newline="")
    write_events_to(summary, text)
    data = text.getvalue().encode()
    write_bytes(path if isinstance(path, str) else os.fspath(path), data, storage_options=storage_options)


def write_events_to(summary: ArchiveSummary, f) -> None:
    """The events as CSV into an open text file.

    Columns: event, start_row, stop_row (exclusive), rows, flagged_rows,
    peak_d2, the first and last row's coordinate (``first_time``,
    ``last_time``) when the archive has a row coordinate, and the
    ``TOP_CHANNELS`` channels most responsible with their shares of the
    event's summed contributions.
    """
    writer = csv.writer(f)
    label = summary.row_label
    row_coordinate = summary.row_coordinate
    header = ["event", "start_row", "stop_row", "rows", "flagged_rows", "peak_d2"]
    if row_coordinate is not None:
        header += [f"first_{label}", f"last_{label}"]
    header += [f"channel_{i + 1}" for i in range(TOP_CHANNELS)] + [f"share_{i + 1}" for i in range(TOP_CHANNELS)]
    writer.writerow(header)
    for i, e in enumerate(summary.events):
        top = summary.top_channels(e)
        line = [i + 1, e.start, e.stop, e.stop - e.start, e.n_flagged, f"{e.peak_d2:.6g}"]
        if row_coordinate is not None:
            line += list(_event_labels(summary, e))
        line += [c for c, _ in top] + [""] * (TOP_CHANNELS - len(top))
        line += [f"{s:.4f}" for _, s in top] + [""] * (TOP_CHANNELS - len(top))
        writer.writerow(line)


def _describe_event(summary: ArchiveSummary, e: Event) -> str:
    top = ", ".join(f"{c} {s:.0%}" for c, s in summary.top_channels(e))
    where = f"rows {e.start:,}-{e.stop - 1:,}"
    if summary.row_coordinate is not None:
        first, last = _event_labels(summary, e)
        where = f"{first[:19]} - {last[:19]}"
    return f"{where} ({e.stop - e.start:,} rows), peak d² {e.peak_d2:.3g}: {top}"


def plot(summary: ArchiveSummary, path: str | os.PathLike, *, title: str = "", storage_options=None) -> None:
    """The PNG report of ``summary`` (matplotlib, imported only here); ``path`` may be a URL."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.gridspec import GridSpec

    from ._atomic import write_bytes

    style = {"font.size": 9, "axes.titlesize": 10, "axes.spines.top": False, "axes.spines.right": False}
    p = len(summary.channels)
    k = len(summary.robust_ratio)
    with plt.rc_context(style):
        fig = plt.figure(figsize=(14, 10), dpi=100)
        gs = GridSpec(3, 2, figure=fig, height_ratios=[1.0, 1.1, 0.9], hspace=0.55, wspace=0.25, top=0.9)
        share = summary.n_flagged / max(summary.n_scored, 1)
        fig.suptitle(
            (title + "\n" if title else "")
            + f"{summary.n_rows:,} rows x {p} channels: {summary.n_flagged:,} rows flagged ({share:.2%}) "
            f"in {len(summary.events):,} events",
            fontsize=12,
        )
        ax = fig.add_subplot(gs[0, 0])
        shown = min(k, 20)
        x = np.arange(1, shown + 1)
        ax.bar(x - 0.2, summary.classical_ratio[:shown], 0.4, color="#e07b39", label="classical (PCA)")
        ax.bar(x + 0.2, summary.robust_ratio[:shown], 0.4, color="#2a6fb0", label="robust (MCPCA)")
        ax.set_yscale("log")
        ax.set_xticks(x)
        ax.set_xlabel("component")
        ax.set_ylabel("explained variance ratio (log)")
        ax.set_title("explained variance: robust vs classical")
        ax.legend(frameon=False)

        ax = fig.add_subplot(gs[0, 1])
        comps = summary.components[: min(k, 12)]
        lim = float(np.abs(comps).max()) or 1.0
        im = ax.imshow(comps, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
        if p <= 60:
            ax.set_xticks(np.arange(p), summary.channels, rotation=90 if p > 16 else 0, fontsize=8)
        ax.set_yticks(np.arange(len(comps)), [str(i + 1) for i in range(len(comps))])
        ax.set_ylabel("component")
        ax.set_title("robust loadings")
        fig.colorbar(im, ax=ax, fraction=0.04)

        ax = fig.add_subplot(gs[1, :])
        xs = summary.row_values if summary.row_values is not None else summary.bin_rows
        ax.plot(xs, np.maximum(summary.bin_max, 1e-3), color="#2a6fb0", lw=0.8, label="largest d² per bin")
        ax.plot(xs, np.maximum(summary.bin_mean, 1e-3), color="#888888", lw=0.8, label="mean d² per bin")
        label = f"is_outlier threshold d² = {summary.cutoff:.3g}"
        ax.axhline(summary.cutoff, color="black", ls="--", lw=1, label=label)
        ax.set_yscale("log")
        top = np.nanmax(summary.bin_max) if np.isfinite(summary.bin_max).any() else summary.cutoff
        ax.set_ylim(top=max(top, summary.cutoff) * 30)  # room for the legend
        ax.set_xlabel(summary.row_label)
        ax.set_ylabel("robust squared distance d²")
        ax.set_title(f"robust distance over the {summary.row_label} axis ({len(xs):,} bins)")
        ax.legend(frameon=False, loc="upper left", ncol=3)

        ax = fig.add_subplot(gs[2, 0])
        ax.bar(np.arange(len(summary.block_share)), summary.block_share * 100, color="#2a6fb0")
        ax.set_xlabel("block (in row order)")
        ax.set_ylabel("rows flagged (%)")
        ax.set_title("share flagged per block")

        ax = fig.add_subplot(gs[2, 1])
        ax.axis("off")
        largest = sorted(summary.events, key=lambda e: -(e.stop - e.start))[:EVENTS_SHOWN]
        lines = [_describe_event(summary, e) for e in sorted(largest, key=lambda e: e.start)]
        ax.set_title(f"largest events, with the channels most responsible ({len(summary.events):,} in all)")
        ax.text(0, 1, "\n".join(lines) or "no flagged rows", va="top", family="monospace", fontsize=8)
        png = io.BytesIO()
        fig.savefig(png, format="png", bbox_inches="tight")
        plt.close(fig)
    write_bytes(path if isinstance(path, str) else os.fspath(path), png.getvalue(), storage_options=storage_options)
