"""A report for any fitted archive, without the generator's truth: one streaming pass.

:func:`summarize` reads the archive once, one task per row block, each task
returning a small :class:`BlockSummary`: row counts, the mean and scatter
of the complete rows for the classical covariance (merged by Chan et al.'s
update, exact at any offset), the robust distance decimated to ``N_BINS``
bins over the row axis (largest, sum and count of d² per bin, the rows
flagged, the mean d² of the rows not flagged, each channel's summed
contribution), the runs of flagged rows with each channel's summed
contribution, their severity and the row coordinate (time) at both ends,
and with ``window`` the kernel-weighted sums of each drift window
(:mod:`._drift`).  A task reads its block ``SLICE_ROWS`` rows at a time and
keeps no per-row array of its own.  ``dask-mcpca report`` opens an xarray
archive without the index of its row coordinate, so the time labels are
read with the rows they label, never all at once.

The client takes the summaries in row order, with at most ``WINDOW_PER_THREAD``
blocks per scheduler thread in flight, and folds each one in before the next:
runs at most ``max_gap`` rows apart become one event (also across block
borders); an event is kept only while it is one of the ``MAX_EVENTS`` most
severe (the CSV lists those, the worst first, and the PNG the first
``EVENTS_SHOWN``; with ``max_events=0`` the CSV lists every event in row
order, each written as soon as a later run, or the end, closes it); a drift
window is closed as soon as the pass is past it.  Memory is flat in the
number of rows: a block holds at most about ``BLOCK_VALUES`` values of the
archive (whole store chunks, one chunk at least), the client holds one open
event, at most twice ``MAX_EVENTS`` kept ones, the open drift windows
(p x p each), ``N_BINS``-sized arrays, a p x p sum and a few numbers per
block and per window.  (The runs of one block are kept until
it is folded in: at most one per two rows of the block, all rows flagged
alternately.)

:func:`plot` (:mod:`._report_plot`) draws the PNG; ``dask-mcpca report``
calls :func:`summarize` with the CSV open and then :func:`plot`.
"""

from __future__ import annotations

import csv
import os
from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, TextIO

import numpy as np

from . import _missing
from ._contributions import contributions_with_gaps
from ._drift import (
    Window,
    WindowFold,
    WindowSums,
    add_windows,
    calibrate,
    drift_components,
    parse_window,
    window_columns,
    window_sums,
    write_windows,
)
from ._io import as_row_blocks
from ._kernels import _shifted
from ._labels import is_dataarray
from ._model import calibrated_d2, contribution_matrix, judge_cells, model_rows, outlier_flags
from ._passes import NonFiniteRowsError

__all__ = [
    "Window",
    "parse_window",
    "drift_components",
    "calibrate",
    "window_columns",
    "write_windows",
    "BlockSummary",
    "Event",
    "ArchiveSummary",
    "summarize",
    "summarize_block",
    "event_columns",
    "N_BINS",
    "TOP_CHANNELS",
    "BLOCK_VALUES",
]

#: Bins of the robust-distance curve over the row axis.
N_BINS = 2000
#: Channels named per event (the largest shares of its summed contributions).
TOP_CHANNELS = 3
#: Rows of a block processed at once (bounds the float64 working set of a task).
SLICE_ROWS = 65_536
#: Values (rows x columns) of the archive in one block of the report (whole
#: store chunks, at least one): 32 MiB of float32, 64 MiB of float64.
BLOCK_VALUES = 8 * 2**20
#: Block summaries in flight (computing or waiting to be folded in), per scheduler thread.
WINDOW_PER_THREAD = 2
#: Events listed in the PNG.
EVENTS_SHOWN = 8
#: Events listed in the CSV by default: the most severe, worst first (``report --max-events``;
#: 0 lists every event in row order).  An archive whose outliers are many and isolated has
#: about one event per flagged row (4.8 million in 100M rows at 5 %), whose formatting cost
#: the client 2.6 times a ``score`` of the archive; the per-row flags are ``score``'s output.
MAX_EVENTS = 10_000
#: Events formatted at once for the CSV (a column at a time: Python's per-value work, not numpy's per-item access).
WRITE_ROWS = 4096


@dataclass
class BlockSummary:
    """What one row block owes the report (small: no per-row arrays)."""

    start: int
    n_rows: int
    n_scored: int
    n_flagged: int
    mean: np.ndarray  # (p,) mean of the rows without a missing cell
    scatter: np.ndarray  # (p, p) their scatter about ``mean`` (sum of outer products of the deviations)
    bins: np.ndarray  # global bin index of each entry below
    bin_max: np.ndarray  # largest d^2 in the bin (NaN: no scored row, or an infinite one)
    bin_sum: np.ndarray  # sum of d^2 in the bin
    bin_count: np.ndarray  # scored rows in the bin
    bin_flagged: np.ndarray  # flagged rows in the bin
    bin_quiet_sum: np.ndarray  # sum of d^2 over the bin's scored rows not flagged
    bin_contrib: np.ndarray  # (width, p) summed channel contributions of the scored rows in the bin
    runs: np.ndarray  # (m, 2) global [start, stop) of the runs of flagged rows, in row order
    run_peak: np.ndarray  # (m,) largest d^2 of the run
    run_contrib: np.ndarray  # (m, p) summed channel contributions of the run
    run_severity: np.ndarray  # (m,) summed decades of d^2 above the cutoff over the run's flagged rows
    labelled_bins: np.ndarray | None = None  # bins whose first row is in this block
    bin_labels: np.ndarray | None = None  # the row coordinate at those first rows
    run_labels: np.ndarray | None = None  # (m, 2) the row coordinate at the first and last row of each run
    n_complete: int = 0  # rows without a missing cell (those in sum_x, sum_xx)
    bin_missing: np.ndarray | None = None  # (width, p) missing (NaN) cells per bin and channel
    bin_cells: np.ndarray | None = None  # (width, p) flagged cells per bin and channel (a cellwise model's)
    windows: WindowSums | None = None  # the drift windows the block's rows fall in (``--window``)


def _runs(flags: np.ndarray) -> np.ndarray:
    """[start, stop) of the runs of True in ``flags``, shape (m, 2)."""
    edges = np.diff(np.concatenate([[0], flags.astype(np.int8), [0]]))
    return np.column_stack([np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)])


def summarize_block(
    block: np.ndarray,
    start: int,
    n_total: int,
    model,
    labels: np.ndarray | None = None,
    window: Window | None = None,
) -> BlockSummary:
    """The :class:`BlockSummary` of rows ``start:start + len(block)`` of an archive of ``n_total`` rows.

    The block is processed ``SLICE_ROWS`` rows at a time, so the working set
    in float64 stays a few MB whatever the block's size, and nothing per row
    is kept.  A run of flagged rows that crosses a slice border comes out as
    two touching runs; the client joins them as it joins runs across block
    borders.

    Parameters
    ----------
    block : array of shape (n, p)
    start : int
        The block's first row in the archive.
    n_total : int
        Rows of the archive (the bins span them).
    model : MCPCA
        Fitted.
    labels : array of shape (n,), optional
        The row coordinate (time) of the block's rows.
    window : Window, optional
        Drift windows: their weighted sums are added to the summary.

    Raises
    ------
    NonFiniteRowsError
        The block holds rows with NaN or inf and the model was fitted with
        ``nan_policy="raise"`` (as :meth:`MCPCA.is_outlier` raises).
    """
    n, p = block.shape
    scale = max(n_total, 1)
    first_bin = start * N_BINS // scale
    width = (start + max(n, 1) - 1) * N_BINS // scale - first_bin + 1
    bin_max = np.full(width, -np.inf)
    bin_sum, bin_count = np.zeros(width), np.zeros(width, dtype=np.int64)
    bin_flagged = np.zeros(width, dtype=np.int64)
    bin_quiet_sum = np.zeros(width)
    bin_contrib = np.zeros((width, p))
    mean, scatter = np.zeros(p), np.zeros((p, p))
    n_scored, n_flagged, n_complete = 0, 0, 0
    bin_missing = np.zeros((width, p), dtype=np.int64)
    cellwise = getattr(model, "cell_cutoff_", None) is not None
    bin_cells = np.zeros((width, p), dtype=np.int64) if cellwise else None
    runs, peaks, contribs, severities, run_labels, labelled_bins, bin_labels = [], [], [], [], [], [], []
    win: dict[int, list] = {}  # window id -> [first row, first label, rows, scored, flagged, sw, sw2, swy, swyy]
    centre = model.mean_
    P, cov = model.get_precision(), model.get_covariance()  # d^2 = y^T P y
    M = contribution_matrix(model)  # (y M)_j^2 = (P y)_j^2 / P_jj
    two_c2 = 2 * float(model.kernel_scale_) ** 2
    cutoff = float(model.outlier_cutoff_)
    for a in range(0, n, SLICE_ROWS):
        X = model_rows(model, np.asarray(block[a : a + SLICE_ROWS], np.float64))  # scale="robust": X / scale_
        bad = _missing.nonfinite_rows(X)
        complete = np.ones(len(X), bool)
        complete[bad] = False
        whole = not len(bad)  # the usual slice: every row complete, no masked copies below
        ok = complete if whole or model.nan_policy != "partial" else complete | _missing.partial_rows(X)
        if model.nan_policy == "raise" and not complete.all():
            first = start + a + int(np.flatnonzero(~complete)[0])
            raise NonFiniteRowsError(
                f"row {first:,} holds NaN or inf, and the model was fitted with nan_policy='raise'; "
                "refit with nan_policy='partial' (rows judged on their observed cells) or nan_policy='omit' (such rows "
                "not scored), or clean the rows"
            )
        Xs = X if whole else np.where(ok[:, None], X, 0.0)  # unused rows (every cell missing, an inf): the centre
        judged = judge_cells(model, Xs) if cellwise else None  # once, for the distance and the cells
        d = calibrated_d2(model, Xs, judged=judged)  # rows with gaps: on their observed cells, as is_outlier does
        flags = ok & outlier_flags(model, Xs, d)
        Y = _shifted(X, centre) if whole else np.where(complete[:, None], X - centre, 0.0)
        Yc = Y if whole else Y[complete]
        m_c = len(Yc)
        if m_c:  # Chan et al.'s merge of (count, mean, scatter): exact at any offset of the data
            mean_y = np.ones(m_c) @ Yc / m_c  # a product, not Yc.mean(axis=0)'s slow narrow reduction
            slice_scatter = _centred_scatter(Yc, mean_y)
            delta = centre + mean_y - mean
            total = n_complete + m_c
            scatter += slice_scatter + np.outer(delta, delta) * (n_complete * m_c / total)
            mean += delta * (m_c / total)
        n_scored += int(ok.sum())
        n_complete += m_c
        n_flagged += int(flags.sum())

        contrib = Y @ M
        np.square(contrib, out=contrib)  # (P y)_j^2 / P_jj: reconstruction-based contributions (gaps below)
        if not whole:
            gaps = ok & ~complete
            contrib[~ok] = 0.0
            if gaps.any():
                contrib[gaps] = np.nan_to_num(contributions_with_gaps(X[gaps] - centre, P, cov))

        first, at = _bin_heads(start + a, len(X), scale)
        at -= first_bin
        bin_max[at] = np.fmax(bin_max[at], np.maximum.reduceat(np.where(ok, d, -np.inf), first))
        bin_sum[at] += np.add.reduceat(np.where(ok, d, 0.0), first)
        bin_count[at] += np.add.reduceat(ok.astype(np.int64), first)
        bin_flagged[at] += np.add.reduceat(flags.astype(np.int64), first)
        bin_quiet_sum[at] += np.add.reduceat(np.where(ok & ~flags, d, 0.0), first)
        bin_contrib[at] += np.add.reduceat(contrib, first, axis=0)
        if not whole:
            bin_missing[at] += np.add.reduceat(np.isnan(X).astype(np.int64), first, axis=0)
        if cellwise:
            bin_cells[at] += np.add.reduceat((judged.flags & ok[:, None]).astype(np.int64), first, axis=0)
        lab = None if labels is None else np.asarray(labels[a : a + len(X)])
        if lab is not None:
            head = start + a + first  # the first row of a bin is the one whose predecessor is in another bin
            own = (head == 0) | ((head - 1) * N_BINS // scale != at + first_bin)
            labelled_bins.append((at + first_bin)[own])
            bin_labels.append(lab[first[own]])
        if window is not None:
            add_windows(win, window, start + a, lab, Y, d, ok, complete, flags, two_c2)

        r = _runs(flags)
        if len(r):
            flagged = np.flatnonzero(flags)
            heads = np.concatenate([[0], np.cumsum(r[:, 1] - r[:, 0])[:-1]])  # each run's first flagged row
            contribs.append(np.add.reduceat(contrib[flagged], heads, axis=0))
            peaks.append(np.maximum.reduceat(d[flagged], heads))
            with np.errstate(divide="ignore", invalid="ignore"):
                excess = np.nan_to_num(np.maximum(np.log10(d[flagged] / cutoff), 0.0), nan=0.0, posinf=np.inf)
            severities.append(np.add.reduceat(excess, heads))
            runs.append(r + start + a)
            if lab is not None:
                run_labels.append(np.column_stack([lab[r[:, 0]], lab[r[:, 1] - 1]]))
    bin_max = np.where(np.isfinite(bin_max), bin_max, np.nan)
    return BlockSummary(
        start=int(start),
        n_rows=n,
        n_scored=n_scored,
        n_flagged=n_flagged,
        mean=mean,
        scatter=scatter,
        bins=np.arange(first_bin, first_bin + width),
        bin_max=bin_max,
        bin_sum=bin_sum,
        bin_count=bin_count,
        bin_flagged=bin_flagged,
        bin_quiet_sum=bin_quiet_sum,
        bin_contrib=bin_contrib,
        runs=np.concatenate(runs) if runs else np.empty((0, 2), dtype=np.int64),
        run_peak=np.concatenate(peaks) if peaks else np.empty(0),
        run_contrib=np.concatenate(contribs) if contribs else np.empty((0, p)),
        run_severity=np.concatenate(severities) if severities else np.empty(0),
        labelled_bins=np.concatenate(labelled_bins) if labels is not None and labelled_bins else None,
        bin_labels=np.concatenate(bin_labels) if labels is not None and bin_labels else None,
        run_labels=np.concatenate(run_labels) if run_labels else None,
        n_complete=n_complete,
        bin_missing=bin_missing,
        bin_cells=bin_cells,
        windows=None if window is None else window_sums(win, p, labels is not None),
    )


#: A slice's scatter is formed as ``Y^T Y - m ybar ybar^T`` (no centred copy) when each column's
#: mean squared lies within this share of its mean square: at most one bit of the centred sums is
#: lost to cancellation.  Otherwise (the rows far from the model's centre) as ``D^T D``, ``D = Y - ybar``.
_CANCEL_SHARE = 0.5


def _centred_scatter(Y: np.ndarray, mean_y: np.ndarray) -> np.ndarray:
    """``sum_k (y_k - ybar)(y_k - ybar)^T`` of the rows ``Y`` whose mean is ``mean_y`` (see ``_CANCEL_SHARE``)."""
    m = len(Y)
    S = Y.T @ Y  # numpy's product of an array with its own transpose: BLAS's SYRK
    if np.all(m * mean_y**2 <= _CANCEL_SHARE * np.diag(S)):
        return S - m * np.outer(mean_y, mean_y)
    D = Y - mean_y
    return D.T @ D


def _bin_heads(first_row: int, n: int, scale: int) -> tuple[np.ndarray, np.ndarray]:
    """For rows ``first_row .. first_row + n - 1`` of an archive of ``scale`` rows, binned by
    ``row * N_BINS // scale`` (``n`` >= 1): the position of each bin's first row among them, and the bins."""
    b0, b1 = first_row * N_BINS // scale, (first_row + n - 1) * N_BINS // scale
    if scale >= N_BINS:  # every bin holds a row: bin k starts at row ceil(k * scale / N_BINS)
        bins = np.arange(b0, b1 + 1, dtype=np.int64)
        heads = (bins[1:] * scale + N_BINS - 1) // N_BINS - first_row
        return np.concatenate([[0], heads]).astype(np.intp), bins
    bins = np.arange(first_row, first_row + n, dtype=np.int64) * N_BINS // scale
    heads = np.flatnonzero(np.diff(bins, prepend=-1))  # fewer rows than bins: some bins hold none
    return heads, bins[heads]


def _summarize_task(block, start: int, n_total: int, model, labels=None, window=None) -> BlockSummary:
    """:func:`summarize_block` in a dask task, with single-threaded BLAS (as a fit's passes)."""
    from ._passes import limit_blas_in_task

    limit_blas_in_task()
    return summarize_block(block, start, n_total, model, None if labels is None else np.asarray(labels), window)


@dataclass
class Event:
    """A run of flagged rows (or several within ``max_gap`` rows): where, how bad, which channels."""

    start: int
    stop: int
    n_flagged: int
    peak_d2: float
    shares: np.ndarray  # (p,) each channel's share of the event's summed contributions
    severity: float = 0.0  # decades of d^2 above the cutoff, summed over the flagged rows
    first_label: Any = None  # the row coordinate (time) of the first and the last row, if any
    last_label: Any = None


@dataclass
class ArchiveSummary:
    """Everything the report shows, folded from the block summaries."""

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
    n_events: int
    worst_events: list[Event]  # the EVENTS_SHOWN most severe, the worst first
    row_label: str = "row"
    row_values: Any = None  # the row coordinate (time) at bin_rows, or None
    has_row_coordinate: bool = False
    bin_missing_share: np.ndarray | None = None  # (bins, p) share of each bin's cells missing, per channel
    bin_cells_share: np.ndarray | None = None  # (bins, p) share of each bin's cells flagged (a cellwise model)
    bin_share: np.ndarray | None = None  # share of each bin's scored rows flagged
    bin_quiet_mean: np.ndarray | None = None  # mean d^2 of each bin's scored rows not flagged
    bin_contrib: np.ndarray | None = None  # (bins, p) mean channel contribution per scored row of the bin
    bin_count: np.ndarray | None = None  # scored rows per bin
    windows: dict[str, np.ndarray] | None = None  # the drift windows (window_columns), with --window
    window_text: str = ""  # the --window given
    drift_threshold: float = np.nan  # the threshold on the windows' residual_ratio
    drift_calibration: str = ""  # what the threshold was calibrated on (_drift.calibrate)
    drift_components: int = 0  # the leading components outside whose subspace drift is measured
    selection: str = ""  # the rows reported, when not the whole archive (``--rows``/``--time``)

    def top_channels(self, event: Event, k: int = TOP_CHANNELS) -> list[tuple[str, float]]:
        order = np.argsort(-event.shares, kind="stable")[:k]
        return [(self.channels[j], float(event.shares[j])) for j in order]


def event_columns(row_label: str | None) -> list[str]:
    """The header of the events CSV; ``row_label`` names the row coordinate (None: there is none).

    Columns: event, start_row, stop_row (exclusive), rows, flagged_rows,
    peak_d2, severity (the decades of d² above the cutoff, ``log10(d² /
    outlier_cutoff_)``, summed over the event's flagged rows: far and long
    events rank first; sort on it to rank them), the first and last row's coordinate (``first_time``,
    ``last_time``) when the archive has a row coordinate, and the
    ``TOP_CHANNELS`` channels most responsible with their shares of the
    event's summed contributions.
    """
    header = ["event", "start_row", "stop_row", "rows", "flagged_rows", "peak_d2", "severity"]
    if row_label is not None:
        header += [f"first_{row_label}", f"last_{row_label}"]
    return header + [f"channel_{i + 1}" for i in range(TOP_CHANNELS)] + [f"share_{i + 1}" for i in range(TOP_CHANNELS)]


class _Events:
    """Runs folded into events in row order, the most severe kept, the CSV written.

    The runs of one block are grouped with numpy (a gap above ``max_gap``
    starts a new group); the first group may extend the event left open by
    the blocks before, and the last group stays open for the blocks after.
    With ``max_events`` > 0 the CSV lists the ``max_events`` most severe
    events, worst first, written at :meth:`finish`; with 0 it lists every
    event in row order, each written as soon as it is closed.  Either way
    only the most severe events are kept (:class:`_MostSevere`), never all.
    """

    def __init__(self, channels: list[str], max_gap: int, writer, labelled: bool, max_events: int = 0):
        self.channels, self.max_gap, self.writer, self.labelled = channels, max_gap, writer, labelled
        self.max_events = max_events
        self.open: dict | None = None  # the last event, which the next run may extend
        self.count = 0
        self._kept = _MostSevere(max(max_events, EVENTS_SHOWN))

    def add(self, s: BlockSummary) -> None:
        if not len(s.runs):
            return
        runs = s.runs
        breaks = np.flatnonzero(runs[1:, 0] - runs[:-1, 1] > self.max_gap) + 1
        if len(breaks) == len(runs) - 1:  # every run an event of its own (isolated flags): nothing to add up
            groups = {
                "start": runs[:, 0], "stop": runs[:, 1], "n_flagged": runs[:, 1] - runs[:, 0],
                "peak": s.run_peak, "contrib": s.run_contrib, "severity": s.run_severity,
                "first": s.run_labels[:, 0] if self.labelled else None,
                "last": s.run_labels[:, 1] if self.labelled else None,
            }
        else:
            heads = np.concatenate([[0], breaks])
            tails = np.concatenate([breaks - 1, [len(runs) - 1]])
            groups = {
                "start": runs[heads, 0],
                "stop": runs[tails, 1],
                "n_flagged": np.add.reduceat(runs[:, 1] - runs[:, 0], heads),
                "peak": np.maximum.reduceat(s.run_peak, heads),
                "contrib": np.add.reduceat(s.run_contrib, heads, axis=0),
                "severity": np.add.reduceat(s.run_severity, heads),
                "first": s.run_labels[heads, 0] if self.labelled else None,
                "last": s.run_labels[tails, 1] if self.labelled else None,
            }
        closed = []
        if self.open is not None and groups["start"][0] - self.open["stop"][0] <= self.max_gap:
            o = self.open  # the first group extends the open event
            o["stop"] = groups["stop"][:1]
            o["n_flagged"] = o["n_flagged"] + groups["n_flagged"][:1]
            o["peak"] = np.maximum(o["peak"], groups["peak"][:1])
            o["contrib"] = o["contrib"] + groups["contrib"][:1]
            o["severity"] = o["severity"] + groups["severity"][:1]
            if self.labelled:
                o["last"] = groups["last"][:1]
            groups = {k: None if v is None else v[1:] for k, v in groups.items()}
        if len(groups["start"]):
            if self.open is not None:
                closed.append(self.open)
            closed.append({k: None if v is None else v[:-1] for k, v in groups.items()})
            self.open = {k: None if v is None else v[-1:] for k, v in groups.items()}
        for batch in closed:
            self._emit(batch)

    def finish(self) -> None:
        if self.open is not None:
            self._emit(self.open)
            self.open = None
        if self.writer is not None and self.max_events > 0 and self._kept.g is not None:
            self._write(_with_shares(self._kept.ranked(self.max_events)))

    def worst(self) -> list[Event]:
        """The ``EVENTS_SHOWN`` most severe events, the worst first (ties: more flagged rows, then the earlier)."""
        g = _with_shares(self._kept.ranked(EVENTS_SHOWN))
        return [
            Event(int(g["start"][i]), int(g["stop"][i]), int(g["n_flagged"][i]), float(g["peak"][i]),
                  g["shares"][i].copy(), float(g["severity"][i]), g["first"][i] if self.labelled else None,
                  g["last"][i] if self.labelled else None)
            for i in range(len(g["start"]))
        ]

    def _emit(self, g: dict) -> None:
        m = len(g["start"])
        if not m:
            return
        g = dict(g, number=np.arange(self.count + 1, self.count + m + 1))
        if self.writer is not None and self.max_events == 0:
            self._write(_with_shares(g))
        self._kept.add(g)  # the shares of the few kept only, when they are listed
        self.count += m

    def _write(self, g: dict) -> None:
        shares, length = g["shares"], g["stop"] - g["start"]
        k = min(TOP_CHANNELS, shares.shape[1])
        top = np.argsort(-shares, axis=1, kind="stable")[:, :k]
        top_shares = np.take_along_axis(shares, top, axis=1)
        names = np.asarray(self.channels, dtype=object)[top]
        n = len(length)
        for a in range(0, n, WRITE_ROWS):  # column by column, WRITE_ROWS events at a time (never a block's all)
            b = min(a + WRITE_ROWS, n)
            pad = [[""] * (b - a)] * (TOP_CHANNELS - k)
            columns = [g["number"][a:b].tolist(), g["start"][a:b].tolist(),
                       g["stop"][a:b].tolist(), length[a:b].tolist(), g["n_flagged"][a:b].tolist(),
                       [f"{v:.6g}" for v in g["peak"][a:b].tolist()], [f"{v:.6g}" for v in g["severity"][a:b].tolist()]]
            if self.labelled:
                columns += [[str(v) for v in g["first"][a:b]], [str(v) for v in g["last"][a:b]]]
            columns += [names[a:b, j].tolist() for j in range(k)] + pad
            columns += [[f"{s:.4f}" for s in top_shares[a:b, j].tolist()] for j in range(k)] + pad
            self.writer.writerows(zip(*columns, strict=True))


def _with_shares(g: dict) -> dict:
    """Events ``g`` with each channel's share of their summed contributions (``shares``) in place of
    the sums (``contrib``); an event whose contributions are all 0 keeps its zeros."""
    contrib = g["contrib"]
    total = contrib.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = np.where(total > 0, contrib / np.where(total > 0, total, 1.0), contrib)
    return dict({k: v for k, v in g.items() if k != "contrib"}, shares=shares)


class _MostSevere:
    """The ``size`` most severe events seen (ties: more flagged rows, then the earlier), as arrays.

    Events arrive in batches of arrays (start, stop, n_flagged, peak, severity, contrib, number,
    first and last labels or None).  Once ``size`` are kept, a batch's events below the least
    severe kept are dropped at once; the others are appended, and the arrays cut back to the
    ``size`` most severe when they reach twice that.  Memory: at most ``2 * size`` events between
    batches, and one block's batch more while it is added.
    """

    def __init__(self, size: int):
        self.size = size
        self.g: dict | None = None
        self.floor = -np.inf  # the least severity kept once size are held: less cannot enter

    def add(self, g: dict) -> None:
        keep = g["severity"] >= self.floor
        if not keep.all():
            g = {k: None if v is None else v[keep] for k, v in g.items()}
        if not len(g["start"]):
            return
        self.g = g if self.g is None else {
            k: None if v is None else np.concatenate([v, g[k]]) for k, v in self.g.items()
        }
        if len(self.g["start"]) >= 2 * self.size:
            self.g = self.ranked(self.size)
            self.floor = self.g["severity"][-1]

    def ranked(self, k: int) -> dict:
        """The ``k`` most severe kept, the worst first (empty arrays when none was seen)."""
        if self.g is None:
            return {"start": np.zeros(0, np.int64), "contrib": np.zeros((0, 0))}  # no event: nothing else is read
        order = np.lexsort((self.g["start"], -self.g["n_flagged"], -self.g["severity"]))[:k]
        return {key: None if v is None else v[order] for key, v in self.g.items()}


def _channel_names(model, X) -> list[str]:
    names = getattr(model, "feature_names_in_", None)
    if names is None and is_dataarray(X) and X.dims[1] in X.coords:
        names = X.coords[X.dims[1]].values
    if names is None:
        return [str(j) for j in range(model.n_features_in_)]
    return [str(n) for n in names]


def _in_model_order(model, X):
    """A DataArray ``X`` with its channels in the order of the model's ``feature_names_in_``.

    A Zarr store without consolidated metadata may list its variables in
    another order from one opening to the next; the channels are matched
    by name, as scikit-learn matches a DataFrame's columns.
    """
    names = getattr(model, "feature_names_in_", None)
    if names is None or not is_dataarray(X) or X.dims[1] not in X.coords:
        return X
    have = [str(c) for c in X.coords[X.dims[1]].values]
    want = [str(c) for c in names]
    if have == want:
        return X
    if sorted(have) != sorted(want):
        missing = sorted(set(want) - set(have))[:5]
        raise ValueError(f"the archive's channels are not the model's: missing {missing}")
    where = {c: j for j, c in enumerate(have)}
    return X.isel({X.dims[1]: [where[c] for c in want]})


def _row_coordinate(X):
    """The row coordinate (time) of a DataArray ``X``, numpy or lazy dask; None without one."""
    if is_dataarray(X) and X.dims[0] in X.coords:
        return X.coords[X.dims[0]].data
    return None


#: Names of dask's synchronous scheduler (``dask.config.set(scheduler=...)``).
_SYNCHRONOUS = ("sync", "synchronous", "single-threaded")


def _scheduler_threads(client) -> int:
    if client is not None:
        return max(1, sum(client.nthreads().values()))
    import dask

    if dask.config.get("scheduler", None) in _SYNCHRONOUS:
        return 1
    return max(1, int(dask.config.get("num_workers", None) or os.cpu_count() or 1))


def _in_row_order(tasks: list, *, window: int, client):
    """Compute the Delayed ``tasks`` and yield their results in order, ``window`` at most in flight.

    With a ``distributed.Client``, each task is a future; with dask's
    synchronous scheduler each task runs in this thread, one after the
    other; otherwise a pool of ``_scheduler_threads`` threads runs each
    task's small graph (read the block, summarize it) with the synchronous
    scheduler, so that results come back while later blocks run.
    """
    import dask

    if client is None and dask.config.get("scheduler", None) in _SYNCHRONOUS:
        for task in tasks:
            yield dask.compute(task, scheduler="sync")[0]
        return
    pool = None
    if client is not None:
        submit = client.compute
    else:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=_scheduler_threads(None), thread_name_prefix="dask-mcpca-report")

        def submit(task):
            return pool.submit(lambda: dask.compute(task, scheduler="sync")[0])

    pending: deque = deque()
    todo = iter(tasks)
    try:
        for task in todo:
            pending.append(submit(task))
            if len(pending) >= window:
                break
        while pending:
            value = pending.popleft().result()
            task = next(todo, None)
            if task is not None:
                pending.append(submit(task))
            yield value
    finally:
        for future in pending:
            future.cancel()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def summarize(
    model,
    X: Any,
    *,
    max_gap: int = 0,
    progress: bool = False,
    events: TextIO | None = None,
    max_events: int = MAX_EVENTS,
    storage_options: dict | None = None,
    window: str | Window | None = None,
    reference_rows: tuple[int, int] | None = None,
) -> ArchiveSummary:
    """One streaming pass over ``X`` under the fitted ``model``: the :class:`ArchiveSummary` of the report.

    Parameters
    ----------
    model : MCPCA
        A fitted model.
    X : any input of :meth:`MCPCA.fit`
        The archive; a DataArray's row coordinate (time) labels the curve
        and the events.  A store path or URL is read in blocks of about
        ``BLOCK_VALUES`` values; a dask array or DataArray in its own chunks (a task
        holds one); a numpy array in blocks of ``16 * SLICE_ROWS`` rows.
    max_gap : int, default=0
        Runs of flagged rows at most this many rows apart are one event.
    progress : bool, default=False
        Draw a progress line on stderr.
    events : text file, optional
        Where to write the events as CSV (:func:`event_columns`).
    max_events : int, default=MAX_EVENTS
        The CSV lists the ``max_events`` most severe events, the worst
        first (ties: more flagged rows, then the earlier), written at the
        end of the pass; 0 lists every event in row order, each written as
        soon as it is closed.  Either way the events are never all in
        memory, and ``n_events`` counts them all.
    storage_options : dict, optional
        fsspec options when ``X`` is a URL.
    window : str or Window, optional
        Drift windows (:func:`parse_window`): a row count, or a duration of
        the row coordinate (``"1D"``, ``"6h"``).  Each block adds, per window
        its rows fall in, the kernel-weighted scatter of those rows (p x p);
        a window's statistics (:func:`window_columns`) are computed as soon
        as the pass is past it, so memory stays flat in the rows; the drift
        threshold is calibrated on the windows at the end (:func:`calibrate`).
    reference_rows : (int, int), optional
        ``[start, stop)`` of the rows of ``X`` the model was fitted on
        (``dask-mcpca report`` passes the model's ``archive_rows_``): the
        windows inside them calibrate the drift threshold.  Without them,
        the spread of all the windows and the model's own level do.

    Returns
    -------
    ArchiveSummary

    Raises
    ------
    NonFiniteRowsError
        Rows hold NaN or inf and the model was fitted with ``nan_policy="raise"``.
    ValueError
        A duration ``window`` on an archive without a time coordinate, or
        rows out of time order.
    """
    import dask
    import dask.array as da

    from ._passes import single_threaded_blas
    from ._progress import PassProgress, _active_client

    X = _in_model_order(model, X)
    rows = as_row_blocks(X, storage_options=storage_options, block_values=BLOCK_VALUES)
    if rows.shape[1] != model.n_features_in_:
        raise ValueError(f"X has {rows.shape[1]} features, but the model expects {model.n_features_in_}")
    n, p = rows.shape
    coordinate = _row_coordinate(X)
    row_label = str(X.dims[0]) if is_dataarray(X) else "row"
    channels = _channel_names(model, X)
    if max_events < 0:
        raise ValueError(f"max_events must be 0 (every event) or positive; got {max_events}")
    writer = None
    if events is not None:
        writer = csv.writer(events)
        writer.writerow(event_columns(row_label if coordinate is not None else None))
    fold = _Events(channels, max_gap, writer, coordinate is not None, max_events)
    if isinstance(window, str):
        window = parse_window(window)
    if window is not None and window.nanoseconds is not None:
        dtype = getattr(coordinate, "dtype", None)
        if dtype is None or dtype.kind != "M":
            raise ValueError(
                f"--window {window.text!r} is a duration, but the archive has no time coordinate; "
                "give a row count (e.g. --window 100000)"
            )
    drift = WindowFold(model, window, reference_rows) if window is not None else None

    if isinstance(rows, da.Array):
        sizes = rows.chunks[0]
        data_blocks = rows.to_delayed().ravel()
    else:
        sizes = tuple(min(SLICE_ROWS * 16, n - a) for a in range(0, n, SLICE_ROWS * 16)) or (0,)
        data_blocks = None
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int)
    label_blocks = [None] * len(sizes)
    if coordinate is not None:
        if isinstance(coordinate, da.Array):
            label_blocks = coordinate.rechunk((sizes,)).to_delayed().ravel()
        else:
            label_blocks = [coordinate[s : s + m] for s, m in zip(starts, sizes, strict=True)]

    mean, scatter, n_scored, n_flagged, n_complete = np.zeros(p), np.zeros((p, p)), 0, 0, 0
    bin_flagged, bin_contrib = np.zeros(N_BINS, dtype=np.int64), np.zeros((N_BINS, p))
    bin_quiet_sum = np.zeros(N_BINS)
    bin_missing = np.zeros((N_BINS, p), dtype=np.int64)
    bin_cells = np.zeros((N_BINS, p), dtype=np.int64) if getattr(model, "cell_cutoff_", None) is not None else None
    bin_max = np.full(N_BINS, np.nan)
    bin_sum, bin_count = np.zeros(N_BINS), np.zeros(N_BINS, dtype=np.int64)
    bin_labels = None
    block_share = np.zeros(len(sizes))
    client = _active_client()
    runner = SimpleNamespace(n_rows=n, n_blocks=len(sizes), n_passes=0)
    with single_threaded_blas(), PassProgress(runner, "report", enabled=progress) as bar:
        if data_blocks is None:
            results = (
                summarize_block(rows[s : s + m], int(s), n, model, lab, window)
                for s, m, lab in zip(starts, sizes, label_blocks, strict=True)
            )
        else:
            tasks = [
                dask.delayed(_summarize_task, pure=True)(b, int(s), n, model, lab, window)
                for b, s, lab in zip(data_blocks, starts, label_blocks, strict=True)
            ]
            results = _in_row_order(tasks, window=WINDOW_PER_THREAD * _scheduler_threads(client), client=client)
        for i, s in enumerate(results):
            if s.n_complete:  # Chan et al.'s merge of (count, mean, scatter)
                total = n_complete + s.n_complete
                delta = s.mean - mean
                scatter += s.scatter + np.outer(delta, delta) * (n_complete * s.n_complete / total)
                mean += delta * (s.n_complete / total)
            n_scored += s.n_scored
            n_flagged += s.n_flagged
            n_complete += s.n_complete
            if s.bin_missing is not None:
                bin_missing[s.bins] += s.bin_missing
            if bin_cells is not None and s.bin_cells is not None:
                bin_cells[s.bins] += s.bin_cells
            bin_flagged[s.bins] += s.bin_flagged
            bin_quiet_sum[s.bins] += s.bin_quiet_sum
            bin_contrib[s.bins] += s.bin_contrib
            if drift is not None:
                drift.add(s.windows)
            bin_max[s.bins] = np.fmax(bin_max[s.bins], s.bin_max)
            bin_sum[s.bins] += s.bin_sum
            bin_count[s.bins] += s.bin_count
            if s.bin_labels is not None and len(s.bin_labels):
                if bin_labels is None:
                    bin_labels = np.empty(N_BINS, dtype=s.bin_labels.dtype)
                bin_labels[s.labelled_bins] = s.bin_labels
            block_share[i] = s.n_flagged / max(s.n_scored, 1)
            fold.add(s)
            bar.advance(1)
    fold.finish()
    windows = None
    if drift is not None:
        drift.finish()
        windows = drift.table()

    cov = scatter / max(n_complete, 1)
    classical = np.clip(np.linalg.eigvalsh(cov)[::-1], 0, None)
    bin_rows = -(-np.arange(N_BINS) * n // N_BINS)  # first row r of bin b: r * N_BINS // n == b
    used = slice(None) if n > N_BINS else np.flatnonzero(_bins_with_rows(n))
    bin_rows, bin_max, bin_sum, bin_count = bin_rows[used], bin_max[used], bin_sum[used], bin_count[used]
    bin_flagged, bin_contrib, bin_quiet_sum = bin_flagged[used], bin_contrib[used], bin_quiet_sum[used]
    rows_in_bin = np.diff(np.append(-(-np.arange(N_BINS) * n // N_BINS), n))[used]
    missing_share = bin_missing[used] / np.maximum(rows_in_bin, 1)[:, None] if bin_missing.any() else None
    cells_share = None if bin_cells is None else bin_cells[used] / np.maximum(rows_in_bin, 1)[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        bin_mean = np.where(bin_count > 0, bin_sum / bin_count, np.nan)
        bin_share = np.where(bin_count > 0, bin_flagged / bin_count, np.nan)
        quiet = bin_count - bin_flagged
        bin_quiet_mean = np.where(quiet > 0, bin_quiet_sum / np.maximum(quiet, 1), np.nan)
        bin_contrib = np.where(bin_count[:, None] > 0, bin_contrib / np.maximum(bin_count, 1)[:, None], np.nan)
    return ArchiveSummary(
        n_rows=n,
        n_scored=n_scored,
        n_flagged=n_flagged,
        cutoff=float(model.outlier_cutoff_),
        channels=channels,
        components=model.components_,
        robust_ratio=np.asarray(model.explained_variance_ratio_),
        classical_ratio=classical / classical.sum() if classical.sum() > 0 else classical,
        bin_rows=bin_rows,
        bin_max=bin_max,
        bin_mean=bin_mean,
        block_starts=starts,
        block_share=block_share,
        n_events=fold.count,
        worst_events=fold.worst(),
        row_label=row_label,
        row_values=None if bin_labels is None else bin_labels[used],
        has_row_coordinate=coordinate is not None,
        bin_missing_share=missing_share,
        bin_cells_share=cells_share,
        bin_share=bin_share,
        bin_quiet_mean=bin_quiet_mean,
        bin_contrib=bin_contrib,
        bin_count=bin_count,
        windows=windows,
        window_text="" if window is None else window.text,
        drift_threshold=np.nan if drift is None else drift.threshold,
        drift_calibration="" if drift is None else drift.calibration,
        drift_components=0 if drift is None else drift.k,
    )


def _bins_with_rows(n: int) -> np.ndarray:
    """1 for each of the ``N_BINS`` bins that holds a row of an ``n``-row archive (``n <= N_BINS``)."""
    return np.bincount(np.arange(n) * N_BINS // max(n, 1), minlength=N_BINS)


