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


@dataclass
class BlockSummary:
    """What one row block owes the report (small: no per-row arrays)."""

    start: int
    n_rows: int
    n_scored: int
    n_flagged: int
    sum_x: np.ndarray  # (p,) over the scored rows
    sum_xx: np.ndarray  # (p, p)
    bins: np.ndarray  # global bin index of each entry below
    bin_max: np.ndarray  # largest d^2 in the bin (NaN: no scored row, or an infinite one)
    bin_sum: np.ndarray  # sum of d^2 in the bin
    bin_count: np.ndarray  # scored rows in the bin
    runs: np.ndarray  # (m, 2) global [start, stop) of the runs of flagged rows, in row order
    run_peak: np.ndarray  # (m,) largest d^2 of the run
    run_contrib: np.ndarray  # (m, p) summed channel contributions of the run
    labelled_bins: np.ndarray | None = None  # bins whose first row is in this block
    bin_labels: np.ndarray | None = None  # the row coordinate at those first rows
    run_labels: np.ndarray | None = None  # (m, 2) the row coordinate at the first and last row of each run
    n_complete: int = 0  # rows without a missing cell (those in sum_x, sum_xx)
    bin_missing: np.ndarray | None = None  # (width, p) missing (NaN) cells per bin and channel


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
    block: np.ndarray, start: int, n_total: int, model, labels: np.ndarray | None = None
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
    """
    n, p = block.shape
    scale = max(n_total, 1)
    first_bin = start * N_BINS // scale
    width = (start + max(n, 1) - 1) * N_BINS // scale - first_bin + 1
    bin_max = np.full(width, -np.inf)
    bin_sum, bin_count = np.zeros(width), np.zeros(width, dtype=np.int64)
    sum_x, sum_xx, n_scored, n_flagged, n_complete = np.zeros(p), np.zeros((p, p)), 0, 0, 0
    bin_missing = np.zeros((width, p), dtype=np.int64)
    runs, peaks, contribs, run_labels, labelled_bins, bin_labels = [], [], [], [], [], []
    mean = model.mean_
    P, cov = model._precision(1.0), model._precision(-1.0)  # precision and covariance of d^2
    for a in range(0, n, SLICE_ROWS):
        X = np.asarray(block[a : a + SLICE_ROWS], np.float64)
        complete = np.isfinite(X).all(axis=1)
        ok = complete | (_missing.partial_rows(X) if model.nan_policy == "partial" else False)
        Xs = np.where(ok[:, None], X, 0.0)  # unused rows (every cell missing, an inf) are scored as the centre
        d = model._calibrated_d2(Xs)  # rows with gaps: on their observed cells, as is_outlier judges them
        flags = ok & model._flags(Xs, d)
        Xc = np.where(complete[:, None], X, 0.0)  # rows with a gap add nothing to the sums
        sum_x += Xc.sum(axis=0)
        sum_xx += Xc.T @ Xc
        n_scored += int(ok.sum())
        n_complete += int(complete.sum())
        n_flagged += int(flags.sum())

        rows = np.arange(start + a, start + a + len(X))
        bins = rows * N_BINS // scale
        first = np.flatnonzero(np.diff(bins, prepend=-1))  # bins are contiguous
        at = bins[first] - first_bin
        bin_max[at] = np.fmax(bin_max[at], np.maximum.reduceat(np.where(ok, d, -np.inf), first))
        bin_sum[at] += np.add.reduceat(np.where(ok, d, 0.0), first)
        bin_count[at] += np.add.reduceat(ok.astype(np.int64), first)
        if not complete.all():
            bin_missing[at] += np.add.reduceat(np.isnan(X).astype(np.int64), first, axis=0)
        if labels is not None:
            head = rows[first]  # the first row of a bin is the one whose predecessor is in another bin
            own = (head == 0) | ((head - 1) * N_BINS // scale != bins[first])
            labelled_bins.append(bins[first][own])
            bin_labels.append(np.asarray(labels[a + first[own]]))

        r = _runs(flags)
        if len(r):
            flagged = np.flatnonzero(flags)
            heads = np.concatenate([[0], np.cumsum(r[:, 1] - r[:, 0])[:-1]])  # each run's first flagged row
            shares = np.nan_to_num(contributions_with_gaps(X[flagged] - mean, P, cov))  # a missing cell: 0
            contribs.append(np.add.reduceat(shares, heads, axis=0))
            peaks.append(np.maximum.reduceat(d[flagged], heads))
            runs.append(r + start + a)
            if labels is not None:
                run_labels.append(np.column_stack([labels[a + r[:, 0]], labels[a + r[:, 1] - 1]]))
    bin_max = np.where(np.isfinite(bin_max), bin_max, np.nan)
    return BlockSummary(
        start=int(start),
        n_rows=n,
        n_scored=n_scored,
        n_flagged=n_flagged,
        sum_x=sum_x,
        sum_xx=sum_xx,
        bins=np.arange(first_bin, first_bin + width),
        bin_max=bin_max,
        bin_sum=bin_sum,
        bin_count=bin_count,
        runs=np.concatenate(runs) if runs else np.empty((0, 2), dtype=np.int64),
        run_peak=np.concatenate(peaks) if peaks else np.empty(0),
        run_contrib=np.concatenate(contribs) if contribs else np.empty((0, p)),
        labelled_bins=np.concatenate(labelled_bins) if labels is not None and labelled_bins else None,
        bin_labels=np.concatenate(bin_labels) if labels is not None and bin_labels else None,
        run_labels=np.concatenate(run_labels) if run_labels else None,
        n_complete=n_complete,
        bin_missing=bin_missing,
    )


def _summarize_task(block, start: int, n_total: int, model, labels=None) -> BlockSummary:
    """:func:`summarize_block` in a dask task, with single-threaded BLAS (as a fit's passes)."""
    from ._passes import limit_blas_in_task

    limit_blas_in_task()
    return summarize_block(block, start, n_total, model, None if labels is None else np.asarray(labels))


@dataclass
class Event:
    """A run of flagged rows (or several within ``max_gap`` rows): where, how bad, which channels."""

    start: int
    stop: int
    n_flagged: int
    peak_d2: float
    shares: np.ndarray  # (p,) each channel's share of the event's summed contributions
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
    largest_events: list[Event]  # the EVENTS_SHOWN longest (ties: the earlier), in row order
    row_label: str = "row"
    row_values: Any = None  # the row coordinate (time) at bin_rows, or None
    has_row_coordinate: bool = False
    bin_missing_share: np.ndarray | None = None  # (bins, p) share of each bin's cells missing, per channel

    def top_channels(self, event: Event, k: int = TOP_CHANNELS) -> list[tuple[str, float]]:
        order = np.argsort(-event.shares, kind="stable")[:k]
        return [(self.channels[j], float(event.shares[j])) for j in order]


def event_columns(row_label: str | None) -> list[str]:
    """The header of the events CSV; ``row_label`` names the row coordinate (None: there is none).

    Columns: event, start_row, stop_row (exclusive), rows, flagged_rows,
    peak_d2, the first and last row's coordinate (``first_time``,
    ``last_time``) when the archive has a row coordinate, and the
    ``TOP_CHANNELS`` channels most responsible with their shares of the
    event's summed contributions.
    """
    header = ["event", "start_row", "stop_row", "rows", "flagged_rows", "peak_d2"]
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

    def largest(self) -> list[Event]:
        return sorted((e for *_, e in self._largest), key=lambda e: e.start)

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
        # the batch's EVENTS_SHOWN longest (ties: the earlier) compete with those kept
        for i in np.lexsort((g["start"], -length))[:EVENTS_SHOWN]:
            event = Event(  # shares copied: a view would keep the whole batch's array alive
                int(g["start"][i]), int(g["stop"][i]), int(g["n_flagged"][i]), float(g["peak"][i]), shares[i].copy(),
                g["first"][i] if self.labelled else None, g["last"][i] if self.labelled else None,
            )
            item = (int(length[i]), -event.start, self.count + int(i), event)
            if len(self._largest) < EVENTS_SHOWN:
                heapq.heappush(self._largest, item)
            elif item[:2] > self._largest[0][:2]:
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
                        int(g["n_flagged"][i]), f"{g['peak'][i]:.6g}"]
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

    Returns
    -------
    ArchiveSummary
    """
    import dask
    import dask.array as da

    from ._passes import single_threaded_blas
    from ._progress import PassProgress, _active_client

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

    sum_x, sum_xx, n_scored, n_flagged, n_complete = np.zeros(p), np.zeros((p, p)), 0, 0, 0
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
                summarize_block(rows[s : s + m], int(s), n, model, lab)
                for s, m, lab in zip(starts, sizes, label_blocks, strict=True)
            )
        else:
            tasks = [
                dask.delayed(_summarize_task, pure=True)(b, int(s), n, model, lab)
                for b, s, lab in zip(data_blocks, starts, label_blocks, strict=True)
            ]
            results = _in_row_order(tasks, window=WINDOW_PER_THREAD * _scheduler_threads(client), client=client)
        for i, s in enumerate(results):
            n_scored += s.n_scored
            n_flagged += s.n_flagged
            n_complete += s.n_complete
            if s.bin_missing is not None:
                bin_missing[s.bins] += s.bin_missing
            sum_x += s.sum_x
            sum_xx += s.sum_xx
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

    mean = sum_x / max(n_complete, 1)
    cov = sum_xx / max(n_complete, 1) - np.outer(mean, mean)
    classical = np.clip(np.linalg.eigvalsh(cov)[::-1], 0, None)
    bin_rows = -(-np.arange(N_BINS) * n // N_BINS)  # first row r of bin b: r * N_BINS // n == b
    used = slice(None) if n > N_BINS else np.flatnonzero(_bins_with_rows(n))
    bin_rows, bin_max, bin_sum, bin_count = bin_rows[used], bin_max[used], bin_sum[used], bin_count[used]
    rows_in_bin = np.diff(np.append(-(-np.arange(N_BINS) * n // N_BINS), n))[used]
    missing_share = bin_missing[used] / np.maximum(rows_in_bin, 1)[:, None] if bin_missing.any() else None
    with np.errstate(invalid="ignore", divide="ignore"):
        bin_mean = np.where(bin_count > 0, bin_sum / bin_count, np.nan)
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
        largest_events=fold.largest(),
        row_label=row_label,
        row_values=None if bin_labels is None else bin_labels[used],
        has_row_coordinate=coordinate is not None,
        bin_missing_share=missing_share,
    )


def _bins_with_rows(n: int) -> np.ndarray:
    """1 for each of the ``N_BINS`` bins that holds a row of an ``n``-row archive (``n <= N_BINS``)."""
    return np.bincount(np.arange(n) * N_BINS // max(n, 1), minlength=N_BINS)


def _describe_event(summary: ArchiveSummary, e: Event) -> str:
    top = ", ".join(f"{c} {s:.0%}" for c, s in summary.top_channels(e))
    where = f"rows {e.start:,}-{e.stop - 1:,}"
    if summary.has_row_coordinate:
        where = f"{str(e.first_label)[:19]} - {str(e.last_label)[:19]}"
    return f"{where} ({e.stop - e.start:,} rows), peak d² {e.peak_d2:.3g}: {top}"


def _plot_outages(ax, summary: ArchiveSummary, xs) -> None:
    """Share of each channel's cells missing (NaN) per bin, as a heatmap over the row axis."""
    share = summary.bin_missing_share.T * 100
    x = np.arange(share.shape[1]) if summary.row_values is not None else xs
    im = ax.imshow(share, aspect="auto", interpolation="nearest", cmap="Greys", vmin=0, vmax=100,
                   extent=(float(x[0]), float(x[-1]) + 1, len(summary.channels) - 0.5, -0.5))
    ax.set_yticks(np.arange(len(summary.channels)), summary.channels, fontsize=7 if len(summary.channels) > 16 else 8)
    ax.set_xlabel("bin" if summary.row_values is not None else summary.row_label)
    ax.set_title("outages: share of each channel's values missing (NaN) per bin")
    ax.figure.colorbar(im, ax=ax, fraction=0.02, label="% missing")


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
        gaps = summary.bin_missing_share is not None
        fig = plt.figure(figsize=(14, 13 if gaps else 10), dpi=100)
        ratios = [1.0, 1.1, 0.9] + ([0.9] if gaps else [])
        gs = GridSpec(len(ratios), 2, figure=fig, height_ratios=ratios, hspace=0.55, wspace=0.25, top=0.9)
        share = summary.n_flagged / max(summary.n_scored, 1)
        fig.suptitle(
            (title + "\n" if title else "")
            + f"{summary.n_rows:,} rows x {p} channels: {summary.n_flagged:,} rows flagged ({share:.2%}) "
            f"in {summary.n_events:,} events",
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
        lines = [_describe_event(summary, e) for e in summary.largest_events]
        ax.set_title(f"largest events, with the channels most responsible ({summary.n_events:,} in all)")
        ax.text(0, 1, "\n".join(lines) or "no flagged rows", va="top", family="monospace", fontsize=8)
        if gaps:
            _plot_outages(fig.add_subplot(gs[3, :]), summary, xs)
        png = io.BytesIO()
        fig.savefig(png, format="png", bbox_inches="tight")
        plt.close(fig)
    write_bytes(path, png.getvalue(), storage_options=storage_options)
