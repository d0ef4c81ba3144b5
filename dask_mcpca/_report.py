"""A report for any fitted archive, without the generator's truth: one streaming pass.

:func:`summarize` reads the archive once, one task per row block, each task
returning a small :class:`BlockSummary`: row counts, sums for the classical
covariance, the robust distance decimated to ``N_BINS`` bins over the row
axis (largest, sum and count of d² per bin, as a datashader-style envelope
of the per-row curve), the rows flagged, and the runs of flagged rows with
each channel's summed contribution and the row coordinate (time) at both
ends.  A task reads its block ``SLICE_ROWS`` rows at a time and keeps no
per-row array of its own.  ``dask-mcpca report`` opens an xarray archive
without the index of its row coordinate, so the time labels are read with
the rows they label, never all at once.

The client takes the summaries in row order, with at most ``WINDOW_PER_THREAD``
blocks per scheduler thread in flight, and folds each one in before the next:
runs at most ``max_gap`` rows apart become one event (also across block
borders); an event is written to the CSV as soon as a later run, or the end,
closes it, and forgotten except when it is one of the ``EVENTS_SHOWN``
longest (the PNG lists those).  Memory is flat in the number of rows: a block
holds at most about ``BLOCK_VALUES`` values of the archive (whole store chunks, one
chunk at least), the client holds one open event, ``N_BINS``-sized arrays, a
p x p sum and a few numbers per block.  (The runs of one block are kept until
it is folded in: at most one per two rows of the block, all rows flagged
alternately.)

:func:`plot` draws the PNG (robust vs classical explained variance, the
loadings with channel names, the robust distance over rows or time with the
threshold, the share flagged per block, the longest events).
``dask-mcpca report`` calls :func:`summarize` with the CSV open and then
:func:`plot`.
"""

from __future__ import annotations

import csv
import heapq
import io
import os
from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, TextIO

import numpy as np

from . import _missing
from ._contributions import contributions_with_gaps
from ._io import as_row_blocks
from ._labels import is_dataarray
from ._passes import NonFiniteRowsError

__all__ = [
    "BlockSummary",
    "Event",
    "ArchiveSummary",
    "summarize",
    "summarize_block",
    "plot",
    "event_columns",
    "N_BINS",
    "TOP_CHANNELS",
    "BLOCK_VALUES",
    "return_large_frees_to_os",
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
#: Allocations from this size up go back to the OS when freed (:func:`return_large_frees_to_os`).
MMAP_THRESHOLD = 8 * 2**20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)


@dataclass(frozen=True)
class Window:
    """How rows are cut into drift windows: ``rows`` rows each, or ``nanoseconds`` of the row coordinate.

    Windows of a duration start at multiples of it since 1970-01-01 (as
    pandas' ``resample(origin="epoch")``), so that every block finds a row's
    window from its time alone.
    """

    rows: int | None = None
    nanoseconds: int | None = None
    text: str = ""

    def ids(self, rows: np.ndarray, labels: np.ndarray | None) -> np.ndarray:
        """The window of each row (``rows``: their numbers in the archive, ``labels``: their times)."""
        if self.rows is not None:
            return rows // self.rows
        return np.asarray(labels).astype("datetime64[ns]").astype(np.int64) // self.nanoseconds

    def start(self, window_id: int):
        """The first row number, or the time, at which window ``window_id`` starts."""
        if self.rows is not None:
            return int(window_id) * self.rows
        return np.datetime64(int(window_id) * self.nanoseconds, "ns")


def parse_window(text: str) -> Window:
    """A :class:`Window` from ``--window``: a row count (``100000``) or a duration (``1D``, ``6h``, ``30min``)."""
    text = str(text).strip()
    if text.isdigit():
        if int(text) < 2:
            raise ValueError(f"--window {text!r}: a window needs at least 2 rows")
        return Window(rows=int(text), text=text)
    import pandas as pd

    try:
        ns = pd.Timedelta(text).value
    except ValueError:
        ns = 0
    if ns <= 0:
        raise ValueError(f"--window {text!r}: expected a row count (e.g. 100000) or a positive duration (e.g. 1D, 6h)")
    return Window(nanoseconds=int(ns), text=text)


@dataclass
class WindowSums:
    """The kernel-weighted sums of the drift windows the rows of one block fall in (window-major arrays).

    Rows are centred on the model's ``mean_`` (``y = x - mean_``) and weighted
    by the model's correntropy weight ``w = exp(-d^2 / (2 c^2))`` (what
    :meth:`MCPCA.score_samples` returns); only rows without a missing cell
    enter the sums.
    """

    ids: np.ndarray  # (m,) window ids, increasing
    first_row: np.ndarray  # (m,) first row of the archive in the window (within this block)
    first_label: np.ndarray | None  # (m,) its row coordinate, if any
    rows: np.ndarray  # (m,) rows
    scored: np.ndarray  # (m,) scored rows
    flagged: np.ndarray  # (m,) flagged rows
    sw: np.ndarray  # (m,) sum of w
    sw2: np.ndarray  # (m,) sum of w^2
    swy: np.ndarray  # (m, p) sum of w y
    swyy: np.ndarray  # (m, p, p) sum of w y y^T


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
    windows: WindowSums | None = None  # the drift windows the block's rows fall in (``--window``)


def return_large_frees_to_os(threshold: int = MMAP_THRESHOLD) -> bool:
    """Have glibc's malloc give every block of ``threshold`` bytes or more back to the OS when freed.

    glibc serves a large allocation from its own heap once a block of that
    size has been freed (its mmap threshold rises with the frees, up to 32
    MiB), and keeps the freed memory: each chunk a reader thread reads (the
    compressed bytes, the decoded chunk, the block) lands in a different
    place, so the resident size grows well past what is in use.  Pinning
    the threshold makes such blocks mmap'd and unmapped on free.  Dask's
    nanny does the same for its workers (``MALLOC_TRIM_THRESHOLD_``).  The
    setting is global to the process, so the command line sets it for
    ``dask-mcpca report``; a library call never does.  Returns whether it
    was set (False off glibc).
    """
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):
        return False


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
    runs, peaks, contribs, severities, run_labels, labelled_bins, bin_labels = [], [], [], [], [], [], []
    win: dict[int, list] = {}  # window id -> [first row, first label, rows, scored, flagged, sw, sw2, swy, swyy]
    centre = model.mean_
    P, cov = model.get_precision(), model.get_covariance()  # d^2 = y^T P y
    diag_P = np.diag(P)
    two_c2 = 2 * float(model.kernel_scale_) ** 2
    cutoff = float(model.outlier_cutoff_)
    for a in range(0, n, SLICE_ROWS):
        X = np.asarray(block[a : a + SLICE_ROWS], np.float64)
        complete = np.isfinite(X).all(axis=1)
        ok = complete | (_missing.partial_rows(X) if model.nan_policy == "partial" else False)
        if model.nan_policy == "raise" and not complete.all():
            first = start + a + int(np.flatnonzero(~complete)[0])
            raise NonFiniteRowsError(
                f"row {first:,} holds NaN or inf, and the model was fitted with nan_policy='raise'; "
                "refit with nan_policy='partial' (rows judged on their observed cells) or nan_policy='omit' (such rows "
                "not scored), or clean the rows"
            )
        Xs = np.where(ok[:, None], X, 0.0)  # unused rows (every cell missing, an inf) are scored as the centre
        d = model._calibrated_d2(Xs)  # rows with gaps: on their observed cells, as is_outlier judges them
        flags = ok & model._flags(Xs, d)
        Xc = X[complete]
        m_c = len(Xc)
        if m_c:  # Chan et al.'s merge of (count, mean, scatter): exact at any offset of the data
            slice_mean = Xc.mean(axis=0)
            D = Xc - slice_mean
            delta = slice_mean - mean
            total = n_complete + m_c
            scatter += D.T @ D + np.outer(delta, delta) * (n_complete * m_c / total)
            mean += delta * (m_c / total)
        n_scored += int(ok.sum())
        n_complete += m_c
        n_flagged += int(flags.sum())

        Y = np.where(complete[:, None], X - centre, 0.0)
        PY = Y @ P
        contrib = PY**2 / diag_P  # reconstruction-based contributions (rows with gaps below)
        if not complete.all():
            gaps = ok & ~complete
            contrib[~ok] = 0.0
            if gaps.any():
                contrib[gaps] = np.nan_to_num(contributions_with_gaps(X[gaps] - centre, P, cov))

        rows = np.arange(start + a, start + a + len(X))
        bins = rows * N_BINS // scale
        first = np.flatnonzero(np.diff(bins, prepend=-1))  # bins are contiguous
        at = bins[first] - first_bin
        bin_max[at] = np.fmax(bin_max[at], np.maximum.reduceat(np.where(ok, d, -np.inf), first))
        bin_sum[at] += np.add.reduceat(np.where(ok, d, 0.0), first)
        bin_count[at] += np.add.reduceat(ok.astype(np.int64), first)
        bin_flagged[at] += np.add.reduceat(flags.astype(np.int64), first)
        bin_quiet_sum[at] += np.add.reduceat(np.where(ok & ~flags, d, 0.0), first)
        bin_contrib[at] += np.add.reduceat(contrib, first, axis=0)
        if not complete.all():
            bin_missing[at] += np.add.reduceat(np.isnan(X).astype(np.int64), first, axis=0)
        lab = None if labels is None else np.asarray(labels[a : a + len(X)])
        if lab is not None:
            head = rows[first]  # the first row of a bin is the one whose predecessor is in another bin
            own = (head == 0) | ((head - 1) * N_BINS // scale != bins[first])
            labelled_bins.append(bins[first][own])
            bin_labels.append(lab[first[own]])
        if window is not None:
            _add_windows(win, window.ids(rows, lab), rows, lab, Y, d, ok, complete, flags, two_c2)

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
        windows=None if window is None else _window_sums(win, p, labels is not None),
    )


def _add_windows(win: dict, ids, rows, labels, Y, d2, ok, complete, flags, two_c2: float) -> None:
    """Add one slice's rows to the per-window sums ``win`` (see :class:`WindowSums`)."""
    w = np.where(complete, np.exp(-np.where(complete, d2, np.inf) / two_c2), 0.0)
    heads = np.flatnonzero(np.diff(ids, prepend=ids[0] - 1))
    for h, t in zip(heads, np.append(heads[1:], len(ids)), strict=True):
        wid = int(ids[h])
        Yw, ww = Y[h:t], w[h:t]
        sums = win.get(wid)
        if sums is None:
            label = None if labels is None else labels[h]
            p = Y.shape[1]
            sums = win[wid] = [int(rows[h]), label, 0, 0, 0, 0.0, 0.0, np.zeros(p), np.zeros((p, p))]
        sums[2] += t - h
        sums[3] += int(ok[h:t].sum())
        sums[4] += int(flags[h:t].sum())
        sums[5] += float(ww.sum())
        sums[6] += float((ww**2).sum())
        sums[7] += ww @ Yw
        sums[8] += (Yw * ww[:, None]).T @ Yw


def _window_sums(win: dict, p: int, labelled: bool) -> WindowSums:
    ids = np.array(sorted(win), dtype=np.int64)
    col = [win[i] for i in ids]
    return WindowSums(
        ids=ids,
        first_row=np.array([c[0] for c in col], dtype=np.int64),
        first_label=np.array([c[1] for c in col]) if labelled and col else None,
        rows=np.array([c[2] for c in col], dtype=np.int64),
        scored=np.array([c[3] for c in col], dtype=np.int64),
        flagged=np.array([c[4] for c in col], dtype=np.int64),
        sw=np.array([c[5] for c in col]),
        sw2=np.array([c[6] for c in col]),
        swy=np.array([c[7] for c in col]).reshape(len(col), p),
        swyy=np.array([c[8] for c in col]).reshape(len(col), p, p),
    )


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
    bin_share: np.ndarray | None = None  # share of each bin's scored rows flagged
    bin_quiet_mean: np.ndarray | None = None  # mean d^2 of each bin's scored rows not flagged
    bin_contrib: np.ndarray | None = None  # (bins, p) mean channel contribution per scored row of the bin
    bin_count: np.ndarray | None = None  # scored rows per bin
    windows: dict[str, np.ndarray] | None = None  # the drift windows (window_columns), with --window
    window_text: str = ""  # the --window given
    drift_reference_deg: float = np.nan  # drift threshold at DRIFT_REFERENCE_ROWS effective rows
    drift_components: int = 0  # the leading components whose subspace drift is measured

    def top_channels(self, event: Event, k: int = TOP_CHANNELS) -> list[tuple[str, float]]:
        order = np.argsort(-event.shares, kind="stable")[:k]
        return [(self.channels[j], float(event.shares[j])) for j in order]


#: Quantile of the largest principal angle of a stationary window taken as the drift threshold.
DRIFT_QUANTILE = 0.99
#: Simulated windows (Wishart draws) behind the drift threshold, and their effective rows.
DRIFT_DRAWS, DRIFT_REFERENCE_ROWS = 400, 10_000
#: Robust variances per component written to windows.csv (var_1, var_2, ...).
WINDOW_VARIANCES = 10


def drift_components(model) -> int:
    """How many leading components span the subspace whose drift is measured.

    The model's ``n_components_`` when it discarded some; otherwise (every
    direction kept, where the angle would be 0) the fewest leading
    components explaining 90 % of the robust variance, at most
    ``n_features - 1``.
    """
    p, k = model.n_features_in_, model.n_components_
    if k < p:
        return int(k)
    ratio = np.cumsum(model.explained_variance_ratio_)
    return int(min(np.searchsorted(ratio, 0.9) + 1, p - 1)) if p > 1 else 1


def largest_angle_deg(basis: np.ndarray, scatter: np.ndarray, k: int) -> float:
    """Largest principal angle (degrees) between the row space of ``basis`` (k x p, orthonormal)
    and the span of the ``k`` leading eigenvectors of the symmetric ``scatter``."""
    _, vectors = np.linalg.eigh(scatter)
    s = np.linalg.svd(basis[:k] @ vectors[:, ::-1][:, :k], compute_uv=False)
    return float(np.degrees(np.arccos(np.clip(s.min(), -1.0, 1.0))))


def drift_threshold(model, *, seed: int = 0) -> float:
    """The drift threshold, in degrees, for a window of ``DRIFT_REFERENCE_ROWS`` effective rows.

    The sampling spread of a weighted principal subspace under the model
    itself: ``DRIFT_DRAWS`` covariances of ``DRIFT_REFERENCE_ROWS`` Gaussian
    rows with the model's covariance (:meth:`MCPCA.get_covariance`) are drawn
    (Wishart), and the ``DRIFT_QUANTILE`` quantile of their largest
    principal angle to the model's subspace is returned.  (The kernel
    weights of Gaussian rows scale their covariance by one factor, leaving
    its eigenvectors alone; they lower the effective rows, which
    :func:`window_threshold` accounts for.)  A stationary window with
    independent rows then exceeds the threshold with probability about
    ``1 - DRIFT_QUANTILE``; autocorrelated rows carry less information
    than their count, so their windows exceed it more often.
    """
    from scipy.stats import wishart

    k = drift_components(model)
    cov = model.get_covariance()
    cov = (cov + cov.T) / 2
    draws = wishart(df=DRIFT_REFERENCE_ROWS, scale=cov / DRIFT_REFERENCE_ROWS).rvs(
        size=DRIFT_DRAWS, random_state=np.random.default_rng(seed)
    )
    draws = draws.reshape(DRIFT_DRAWS, *cov.shape)
    angles = [largest_angle_deg(model.components_, S, k) for S in draws]
    return float(np.quantile(angles, DRIFT_QUANTILE))


def window_threshold(reference_deg: float, n_eff: np.ndarray) -> np.ndarray:
    """The drift threshold of windows of ``n_eff`` effective rows: angles shrink as ``1 / sqrt(n_eff)``."""
    with np.errstate(divide="ignore"):
        return np.minimum(reference_deg * np.sqrt(DRIFT_REFERENCE_ROWS / np.asarray(n_eff, float)), 90.0)


def window_columns(n_variances: int) -> list[str]:
    """The header of windows.csv.

    window_start (the window's first time, or first row without a row
    coordinate), first_row, rows, scored_rows, flagged_rows, share_flagged,
    effective_rows (Kish's ``(sum w)^2 / sum w^2`` of the kernel weights),
    subspace_angle_deg (largest principal angle between the model's leading
    subspace and the window's weighted one), drift_threshold_deg, drift
    (1 above the threshold), then var_1, ... (the robust variance of each
    component in the window: ``c_j^T S c_j`` with S the weighted covariance).
    """
    return ["window_start", "first_row", "rows", "scored_rows", "flagged_rows", "share_flagged", "effective_rows",
            "subspace_angle_deg", "drift_threshold_deg", "drift"] + [f"var_{j + 1}" for j in range(n_variances)]


class _Drift:
    """Window sums folded in row order; a window is closed (its statistics computed, the p x p sums
    dropped) as soon as a later block starts past it."""

    def __init__(self, model, window: Window):
        self.window, self.k = window, drift_components(model)
        self.basis = model.components_
        self.reference = drift_threshold(model)
        self.n_var = min(WINDOW_VARIANCES, model.n_components_)
        self.open: dict[int, list] = {}
        self.closed: list[tuple] = []
        self.last_closed = None

    def add(self, s: WindowSums) -> None:
        for i, wid in enumerate(s.ids.tolist()):
            if self.last_closed is not None and wid <= self.last_closed:
                raise ValueError(
                    f"--window {self.window.text!r}: the row coordinate is not increasing (a row at "
                    f"{s.first_label[i] if s.first_label is not None else s.first_row[i]} falls in a window already "
                    "closed); drift windows need rows in time order"
                )
            o = self.open.get(wid)
            fields = [s.first_row[i], None if s.first_label is None else s.first_label[i], s.rows[i], s.scored[i],
                      s.flagged[i], s.sw[i], s.sw2[i], s.swy[i].copy(), s.swyy[i].copy()]
            if o is None:
                self.open[wid] = fields
            else:
                for j in range(2, 9):
                    o[j] = o[j] + fields[j]
        if len(s.ids):
            for wid in sorted(w for w in self.open if w < s.ids[0]):
                self._close(wid)

    def finish(self) -> None:
        for wid in sorted(self.open):
            self._close(wid)

    def _close(self, wid: int) -> None:
        first_row, label, rows, scored, flagged, sw, sw2, swy, swyy = self.open.pop(wid)
        self.last_closed = wid
        start = self.window.start(wid) if self.window.nanoseconds is not None or label is None else label
        n_eff = sw**2 / sw2 if sw2 > 0 else 0.0
        angle, var = np.nan, np.full(self.n_var, np.nan)
        if n_eff > self.k + 1:
            m = swy / sw
            S = swyy / sw - np.outer(m, m)
            angle = largest_angle_deg(self.basis, S, self.k)
            var = np.einsum("ij,jk,ik->i", self.basis[: self.n_var], S, self.basis[: self.n_var])
        limit = float(window_threshold(self.reference, n_eff)) if n_eff > 0 else np.nan
        self.closed.append((start, int(first_row), int(rows), int(scored), int(flagged),
                            flagged / max(scored, 1), n_eff, angle, limit, int(angle > limit), *var))

    def table(self) -> dict[str, np.ndarray]:
        cols = window_columns(self.n_var)
        return {c: np.array([r[j] for r in self.closed]) for j, c in enumerate(cols)}


def write_windows(table: dict[str, np.ndarray], f: TextIO) -> None:
    """Write the drift windows (:attr:`ArchiveSummary.windows`) as CSV to the open text file ``f``."""
    writer = csv.writer(f)
    cols = list(table)
    writer.writerow(cols)
    for i in range(len(table[cols[0]]) if cols else 0):
        writer.writerow([_csv_value(table[c][i]) for c in cols])


def _csv_value(v) -> str:
    if isinstance(v, np.datetime64):
        return str(v)
    if isinstance(v, float | np.floating):
        return "" if np.isnan(v) else f"{v:.6g}"
    return str(v)


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
    """Runs folded into events in row order; each closed event is written at once, then forgotten.

    The runs of one block are grouped with numpy (a gap above ``max_gap``
    starts a new group); the first group may extend the event left open by
    the blocks before, and the last group stays open for the blocks after.
    Only the ``EVENTS_SHOWN`` longest events are kept (a heap).
    """

    def __init__(self, channels: list[str], max_gap: int, writer, labelled: bool):
        self.channels, self.max_gap, self.writer, self.labelled = channels, max_gap, writer, labelled
        self.open: dict | None = None  # the last event, which the next run may extend
        self.count = 0
        self._largest: list[tuple[int, int, int, Event]] = []  # (length, -start, count, event), a min-heap

    def add(self, s: BlockSummary) -> None:
        if not len(s.runs):
            return
        runs = s.runs
        breaks = np.flatnonzero(runs[1:, 0] - runs[:-1, 1] > self.max_gap) + 1
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

    def worst(self) -> list[Event]:
        """The ``EVENTS_SHOWN`` most severe events, the worst first (ties: more flagged rows, then the earlier)."""
        return [e for *_, e in sorted(self._largest, reverse=True)]

    def _emit(self, g: dict) -> None:
        m = len(g["start"])
        if not m:
            return
        total = g["contrib"].sum(axis=1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            shares = np.where(total > 0, g["contrib"] / np.where(total > 0, total, 1.0), g["contrib"])
        length = g["stop"] - g["start"]
        if self.writer is not None:
            self._write(g, shares, length)
        # the batch's EVENTS_SHOWN most severe (ties: more flagged rows, then the earlier) compete with those kept
        for i in np.lexsort((g["start"], -g["n_flagged"], -g["severity"]))[:EVENTS_SHOWN]:
            event = Event(  # shares copied: a view would keep the whole batch's array alive
                int(g["start"][i]), int(g["stop"][i]), int(g["n_flagged"][i]), float(g["peak"][i]), shares[i].copy(),
                float(g["severity"][i]), g["first"][i] if self.labelled else None,
                g["last"][i] if self.labelled else None,
            )
            item = (event.severity, event.n_flagged, -event.start, -(self.count + int(i)), event)
            if len(self._largest) < EVENTS_SHOWN:
                heapq.heappush(self._largest, item)
            elif item[:4] > self._largest[0][:4]:
                heapq.heapreplace(self._largest, item)
        self.count += m

    def _write(self, g: dict, shares: np.ndarray, length: np.ndarray) -> None:
        k = min(TOP_CHANNELS, shares.shape[1])
        top = np.argsort(-shares, axis=1, kind="stable")[:, :k]
        top_shares = np.take_along_axis(shares, top, axis=1)
        names = np.asarray(self.channels, dtype=object)[top]
        pad = [""] * (TOP_CHANNELS - k)

        def lines():  # one at a time: a block's events are never all formatted at once
            for i in range(len(length)):
                line = [self.count + i + 1, int(g["start"][i]), int(g["stop"][i]), int(length[i]),
                        int(g["n_flagged"][i]), f"{g['peak'][i]:.6g}", f"{g['severity'][i]:.6g}"]
                if self.labelled:
                    line += [str(g["first"][i]), str(g["last"][i])]
                yield [*line, *names[i], *pad, *(f"{s:.4f}" for s in top_shares[i]), *pad]

        self.writer.writerows(lines())


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
    storage_options: dict | None = None,
    window: str | Window | None = None,
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
        Where to write the events as CSV (:func:`event_columns`), each as
        soon as it is closed, so that they are never all in memory.
    storage_options : dict, optional
        fsspec options when ``X`` is a URL.
    window : str or Window, optional
        Drift windows (:func:`parse_window`): a row count, or a duration of
        the row coordinate (``"1D"``, ``"6h"``).  Each block adds, per window
        its rows fall in, the kernel-weighted scatter of those rows (p x p);
        a window's statistics (:func:`window_columns`) are computed as soon
        as the pass is past it, so memory stays flat in the rows.

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
    writer = None
    if events is not None:
        writer = csv.writer(events)
        writer.writerow(event_columns(row_label if coordinate is not None else None))
    fold = _Events(channels, max_gap, writer, coordinate is not None)
    if isinstance(window, str):
        window = parse_window(window)
    if window is not None and window.nanoseconds is not None:
        dtype = getattr(coordinate, "dtype", None)
        if dtype is None or dtype.kind != "M":
            raise ValueError(
                f"--window {window.text!r} is a duration, but the archive has no time coordinate; "
                "give a row count (e.g. --window 100000)"
            )
    drift = _Drift(model, window) if window is not None else None

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
    if drift is not None:
        drift.finish()

    cov = scatter / max(n_complete, 1)
    classical = np.clip(np.linalg.eigvalsh(cov)[::-1], 0, None)
    bin_rows = -(-np.arange(N_BINS) * n // N_BINS)  # first row r of bin b: r * N_BINS // n == b
    used = slice(None) if n > N_BINS else np.flatnonzero(_bins_with_rows(n))
    bin_rows, bin_max, bin_sum, bin_count = bin_rows[used], bin_max[used], bin_sum[used], bin_count[used]
    bin_flagged, bin_contrib, bin_quiet_sum = bin_flagged[used], bin_contrib[used], bin_quiet_sum[used]
    rows_in_bin = np.diff(np.append(-(-np.arange(N_BINS) * n // N_BINS), n))[used]
    missing_share = bin_missing[used] / np.maximum(rows_in_bin, 1)[:, None] if bin_missing.any() else None
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
        bin_share=bin_share,
        bin_quiet_mean=bin_quiet_mean,
        bin_contrib=bin_contrib,
        bin_count=bin_count,
        windows=None if drift is None else drift.table(),
        window_text="" if window is None else window.text,
        drift_reference_deg=np.nan if drift is None else drift.reference,
        drift_components=0 if drift is None else drift.k,
    )


def _bins_with_rows(n: int) -> np.ndarray:
    """1 for each of the ``N_BINS`` bins that holds a row of an ``n``-row archive (``n <= N_BINS``)."""
    return np.bincount(np.arange(n) * N_BINS // max(n, 1), minlength=N_BINS)


#: Columns of the heatmaps over time (groups of consecutive bins).
HEATMAP_COLUMNS = 300
#: Inches between two panels over time (room for the time axis' labels and the next title).
GAP = 0.8
#: Colours: the model (blue), classical PCA (orange), alarms (red).
_BLUE, _ORANGE, _RED, _GREY = "#2a6fb0", "#e07b39", "#c0392b", "#888888"


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
    _channel_heatmap(ax, rows[:, shown] * 100, xs, heads, [summary.channels[j] for j in shown], cmap="Greys",
                     norm=Normalize(0, 100), label="% missing",
                     title=f"outages: share of values missing (NaN), the {len(shown)} channels with gaps "
                     f"(of {len(summary.channels)})")


def _outage_channels(summary: ArchiveSummary) -> list[int]:
    """The channels with a missing value, by name."""
    order = _display_order(summary.channels)
    return [j for j in order if summary.bin_missing_share[:, j].any()]


def _display_order(channels: list[str]) -> np.ndarray:
    """Channels by name, so that a plant's or a unit's channels stand together."""
    return np.argsort(np.asarray(channels, dtype=str), kind="stable")


def _plot_contributions(ax, summary: ArchiveSummary, xs, heads) -> None:
    """Mean channel contribution to d² per row, per group of bins (log colour)."""
    from matplotlib.colors import LogNorm

    count = np.add.reduceat(np.nan_to_num(summary.bin_count).astype(float), heads)
    total = np.add.reduceat(np.nan_to_num(summary.bin_contrib) * summary.bin_count[:, None], heads, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count[:, None] > 0, total / count[:, None], np.nan)
    finite = mean[np.isfinite(mean) & (mean > 0)]
    top = float(np.quantile(finite, 0.999)) if len(finite) else 1.0
    norm = LogNorm(vmin=max(top * 1e-3, 1e-3), vmax=max(top, 1e-2), clip=True)
    order = _display_order(summary.channels)
    _channel_heatmap(ax, mean[:, order], xs, heads, [summary.channels[j] for j in order], cmap="magma_r", norm=norm,
                     label="mean contribution to d² per row",
                     title="which channel departs from the model, over time (reconstruction contributions)")


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


def _plot_drift(ax, summary: ArchiveSummary) -> None:
    w = summary.windows
    x, angle, limit, drift = w["window_start"], w["subspace_angle_deg"], w["drift_threshold_deg"], w["drift"] == 1
    ax.plot(x, angle, color=_BLUE, lw=1, marker="o", ms=3, label="largest principal angle to the model's subspace")
    ax.plot(x, limit, color="black", ls="--", lw=1, drawstyle="steps-post",
            label=f"drift threshold ({DRIFT_QUANTILE:.0%} of stationary windows below it)")
    ax.scatter(x[drift], angle[drift], s=36, color=_RED, zorder=3, label=f"drift ({int(drift.sum())} windows)")
    ax.set_ylabel("angle (degrees)")
    if np.any(np.isfinite(angle) & (angle > 0)):
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no window with enough weighted rows to estimate its subspace", transform=ax.transAxes,
                ha="center", va="center", color=_GREY)
    ax.set_title(f"drift of the correlation structure: windows of {summary.window_text}, "
                 f"subspace of the {summary.drift_components} leading components", loc="left")
    ax.legend(frameon=False, loc="upper left", ncol=3, fontsize=8)


def plot(summary: ArchiveSummary, path: str | os.PathLike, *, title: str = "", storage_options=None) -> None:
    """The PNG report of ``summary``; ``path`` may be a URL.

    Drawn on a :class:`matplotlib.figure.Figure` with its own Agg canvas, so
    the caller's matplotlib backend and pyplot state are left alone.  Every
    panel but the spectrum and the loadings shares one time axis: the robust
    distance (a band per bin, the bins with a flagged row as dots, the
    ranked events numbered), the share flagged, the drift windows (with
    ``window``), the channels' contributions as a heatmap (channels down,
    time across), the outages (when cells are missing); the events ranked
    by severity are listed at the bottom.
    """
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.gridspec import GridSpec

    from ._atomic import write_bytes

    style = {"font.size": 9, "axes.titlesize": 10, "axes.spines.top": False, "axes.spines.right": False}
    p = len(summary.channels)
    k = len(summary.robust_ratio)
    xs = summary.row_values if summary.row_values is not None else summary.bin_rows
    heads = _groups(len(xs))
    gaps = summary.bin_missing_share is not None
    drift = summary.windows is not None and len(summary.windows["window_start"]) > 0
    heat = max(1.2, 0.12 * p + 0.4)
    outage = max(0.8, 0.12 * len(_outage_channels(summary)) + 0.4) if gaps else 0.0
    # inches: the spectrum and loadings, room for the loadings' channel names, then the panels over time
    head, names = max(2.6, 0.04 * p + 2.0), 0.06 * max(len(c) for c in summary.channels) + 0.3 if p <= 80 else 0.5
    heights = [2.8, 1.4] + ([1.8] if drift else []) + [heat] + ([outage] if gaps else [])
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
        share = summary.n_flagged / max(summary.n_scored, 1)
        fig.suptitle(
            (title + ": " if title else "")
            + f"{summary.n_rows:,} rows x {p} channels, {summary.n_flagged:,} rows flagged ({share:.2%}) "
            f"in {summary.n_events:,} events",
            fontsize=13, x=0.12, ha="left",
        )
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

        row = 0
        time_axes = [fig.add_subplot(gs[row, :])]
        _plot_distance(time_axes[0], summary, xs)
        row += 1
        time_axes.append(fig.add_subplot(gs[row, :], sharex=time_axes[0]))
        _plot_share(time_axes[-1], summary, xs, heads)
        if drift:
            row += 1
            time_axes.append(fig.add_subplot(gs[row, :], sharex=time_axes[0]))
            _plot_drift(time_axes[-1], summary)
        row += 1
        time_axes.append(fig.add_subplot(gs[row, :], sharex=time_axes[0]))
        _plot_contributions(time_axes[-1], summary, xs, heads)
        if gaps:
            row += 1
            time_axes.append(fig.add_subplot(gs[row, :], sharex=time_axes[0]))
            _plot_outages(time_axes[-1], summary, xs, heads)
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
    write_bytes(path, png.getvalue(), storage_options=storage_options)
