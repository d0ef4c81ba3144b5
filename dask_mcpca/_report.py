"""A report for any fitted archive, without the generator's truth: one streaming pass.

:func:`summarize` reads the archive once, one task per row block, each task
returning a small :class:`._report_block.BlockSummary` (:mod:`._report_block`:
row counts, the classical moments, the robust distance decimated to
``N_BINS`` bins over the row axis, the runs of flagged rows, the drift
windows' sums).  ``dask-mcpca report`` opens an xarray archive without the
index of its row coordinate, so the time labels are read with the rows
they label, never all at once.

This module is the fold on the client. It takes the summaries in row order
(:func:`._report_block.block_summaries`, with at most ``WINDOW_PER_THREAD``
blocks per scheduler thread in flight), and folds each one in before the
next (:class:`_ArchiveFold`; the classical moments with
:func:`._stats.merge_moments`): runs at most ``max_gap`` rows apart become
one event (also across block borders); an event is kept only while it is one
of the ``MAX_EVENTS`` most severe (the CSV lists those, the worst first, and
the PNG the first ``EVENTS_SHOWN``; with ``max_events=0`` the CSV lists
every event in row order, each written as soon as a later run, or the end,
closes it); a drift window is closed as soon as the pass is past it. Memory
is flat in the number of rows: a block holds at most about ``BLOCK_VALUES``
values of the archive (whole store chunks, one chunk at least), the client
holds one open event, at most twice ``MAX_EVENTS`` kept ones, the open drift
windows (p x p each), ``N_BINS``-sized arrays, a p x p sum and a few numbers
per block and per window. (The runs of one block are kept until it is folded
in: at most one per two rows of the block, all rows flagged alternately.)

:func:`plot` (:mod:`._report_plot`) draws the PNG; ``dask-mcpca report``
calls :func:`summarize` with the CSV open and then :func:`plot`.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, TextIO

import numpy as np

from ._drift import (
    Window,
    WindowFold,
    calibrate,
    checked_window,
    drift_components,
    parse_window,
    window_columns,
    write_windows,
)
from ._io import as_row_blocks
from ._labels import is_dataarray
from ._report_block import N_BINS, BlockSummary, block_summaries, summarize_block
from ._stats import merge_moments

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

#: Channels named per event (the largest shares of its summed contributions).
TOP_CHANNELS = 3
#: Values (rows x columns) of the archive in one block of the report (whole
#: store chunks, at least one): 32 MiB of float32, 64 MiB of float64.
BLOCK_VALUES = 8 * 2**20
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
    bin_rows: np.ndarray  # first row of each bin, in the archive (``summarize``'s ``first_row`` on)
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
    modes: list[str] | None = None  # the model's operating modes (labels), None without modes
    mode_weights: np.ndarray | None = None  # their shares of the fitted rows
    bin_mode_share: np.ndarray | None = None  # (bins, K) share of each bin's scored rows judged by each mode

    def mode_shares(self, heads: np.ndarray) -> np.ndarray:
        """(groups, K): the share of the scored rows judged by each operating mode, per group of bins, the
        groups starting at the bins ``heads`` (NaN: no row scored)."""
        count = np.add.reduceat(self.bin_count.astype(float), heads)
        rows = np.add.reduceat(np.nan_to_num(self.bin_mode_share) * self.bin_count[:, None], heads, axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count[:, None] > 0, rows / count[:, None], np.nan)

    def top_channels(self, event: Event, k: int = TOP_CHANNELS) -> list[tuple[str, float]]:
        order = np.argsort(-event.shares, kind="stable")[:k]
        return [(self.channels[j], float(event.shares[j])) for j in order]


def event_columns(row_label: str | None) -> list[str]:
    """The header of the events CSV; ``row_label`` names the row coordinate (None: there is none).

    Columns: event, start_row, stop_row (exclusive; positions in the archive, ``summarize``'s
    ``first_row`` on), rows, flagged_rows,
    peak_d2 (the largest, over the event's flagged rows, of the calibrated distance that
    :meth:`MCPCA.is_outlier` compares with ``outlier_cutoff_``, :func:`._distances.calibrated_d2`:
    ``-2 kernel_scale_² log(weight)`` of ``score_rows``' weight; not ``mahalanobis``/``score``'s
    ``d2`` where they differ: a row with gaps mapped to p channels, quantized channels' cells, a
    cellwise model's good cells, a mode's distance rescaled to the model's cutoff), severity (the
    decades of d² above the cutoff, ``log10(d² /
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
    first_row: int = 0,
    context: Any = None,
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
        ``[start, stop)`` of the rows the model was fitted on, numbered as
        the report numbers them (``first_row`` on; ``dask-mcpca report``
        passes the model's ``archive_rows_``): the windows inside them
        calibrate the drift threshold.  Without them, the spread of all the
        windows and the model's own level do.
    first_row : int, default=0
        The position in the archive of ``X``'s first row (``dask-mcpca
        report --rows``/``--time`` passes the selection's): every row number
        reported (the events' ``start_row``/``stop_row``, the windows'
        ``first_row``, ``bin_rows``, ``block_starts``, a NaN row's error) is
        ``first_row`` plus the position in ``X``, as ``score`` records its
        rows; a window of a row count holds the archive's rows from a
        multiple of it, as a duration's starts at a multiple since 1970.
    context : input of the same kind as ``X``, optional
        The archive's rows just before ``X``'s first (at most
        :data:`._model.CONTEXT_ROWS`), read by the stuck-run rule and not
        reported: ``X``'s first rows are judged as in a full score of the
        archive (``dask-mcpca report --rows``/``--time`` passes them, as
        ``score --append`` reads them).

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
    from ._passes import single_threaded_blas
    from ._progress import PassProgress

    X = _in_model_order(model, X)
    rows = as_row_blocks(X, storage_options=storage_options, block_values=BLOCK_VALUES)
    if rows.shape[1] != model.n_features_in_:
        raise ValueError(f"X has {rows.shape[1]} features, but the model expects {model.n_features_in_}")
    if max_events < 0:
        raise ValueError(f"max_events must be 0 (every event) or positive; got {max_events}")
    n, p = rows.shape
    coordinate = _row_coordinate(X)
    row_label = str(X.dims[0]) if is_dataarray(X) else "row"
    channels = _channel_names(model, X)
    writer = None
    if events is not None:
        writer = csv.writer(events)
        writer.writerow(event_columns(row_label if coordinate is not None else None))
    events_fold = _Events(channels, max_gap, writer, coordinate is not None, max_events)
    window = checked_window(window, coordinate)
    drift = WindowFold(model, window, reference_rows) if window is not None else None
    if context is not None:
        context = as_row_blocks(_in_model_order(model, context), storage_options=storage_options,
                                block_values=BLOCK_VALUES)
    starts, sizes, results = block_summaries(rows, coordinate, model, window, first_row, context=context)
    n_modes = model.n_modes_ if getattr(model, "mode_models_", None) is not None else 0
    fold = _ArchiveFold(n, p, len(sizes), cellwise=getattr(model, "cell_cutoff_", None) is not None, n_modes=n_modes)
    runner = SimpleNamespace(n_rows=n, n_blocks=len(sizes), n_passes=0)
    with single_threaded_blas(), PassProgress(runner, "report", enabled=progress) as bar:
        for i, s in enumerate(results):
            fold.add(i, s)
            if drift is not None:
                drift.add(s.windows)
            events_fold.add(s)
            bar.advance(1)
    events_fold.finish()
    windows = None
    if drift is not None:
        drift.finish()
        windows = drift.table()
    return ArchiveSummary(
        n_rows=n,
        n_scored=fold.n_scored,
        n_flagged=fold.n_flagged,
        cutoff=float(model.outlier_cutoff_),
        channels=channels,
        components=model.components_,
        robust_ratio=np.asarray(model.explained_variance_ratio_),
        classical_ratio=fold.classical_ratio(),
        block_starts=starts + first_row,
        block_share=fold.block_share,
        n_events=events_fold.count,
        worst_events=events_fold.worst(),
        row_label=row_label,
        has_row_coordinate=coordinate is not None,
        windows=windows,
        window_text="" if window is None else window.text,
        drift_threshold=np.nan if drift is None else drift.threshold,
        drift_calibration="" if drift is None else drift.calibration,
        drift_components=0 if drift is None else drift.k,
        modes=[str(v) for v in model.modes_] if n_modes else None,
        mode_weights=np.asarray(model.mode_weights_) if n_modes else None,
        **fold.curves(first_row),
    )


class _ArchiveFold:
    """The block summaries' counts, classical moments and bins, folded in row order on the client."""

    def __init__(self, n: int, p: int, n_blocks: int, *, cellwise: bool, n_modes: int = 0):
        self.n = n
        self.bin_modes = np.zeros((N_BINS, n_modes), dtype=np.int64) if n_modes else None
        self.mean, self.scatter, self.n_scored, self.n_flagged, self.n_complete = np.zeros(p), np.zeros((p, p)), 0, 0, 0
        self.bin_flagged, self.bin_contrib = np.zeros(N_BINS, dtype=np.int64), np.zeros((N_BINS, p))
        self.bin_quiet_sum = np.zeros(N_BINS)
        self.bin_missing = np.zeros((N_BINS, p), dtype=np.int64)
        self.bin_cells = np.zeros((N_BINS, p), dtype=np.int64) if cellwise else None
        self.bin_max = np.full(N_BINS, np.nan)
        self.bin_sum, self.bin_count = np.zeros(N_BINS), np.zeros(N_BINS, dtype=np.int64)
        self.bin_labels = None
        self.block_share = np.zeros(n_blocks)

    def add(self, i: int, s: BlockSummary) -> None:
        """Fold in the summary ``s`` of the ``i``-th block."""
        if s.n_complete:
            _, self.mean, self.scatter = merge_moments(self.n_complete, self.mean, self.scatter,
                                                       s.n_complete, s.mean, s.scatter)
        self.n_scored += s.n_scored
        self.n_flagged += s.n_flagged
        self.n_complete += s.n_complete
        if s.bin_missing is not None:
            self.bin_missing[s.bins] += s.bin_missing
        if self.bin_cells is not None and s.bin_cells is not None:
            self.bin_cells[s.bins] += s.bin_cells
        if self.bin_modes is not None and s.bin_modes is not None:
            self.bin_modes[s.bins] += s.bin_modes
        self.bin_flagged[s.bins] += s.bin_flagged
        self.bin_quiet_sum[s.bins] += s.bin_quiet_sum
        self.bin_contrib[s.bins] += s.bin_contrib
        self.bin_max[s.bins] = np.fmax(self.bin_max[s.bins], s.bin_max)
        self.bin_sum[s.bins] += s.bin_sum
        self.bin_count[s.bins] += s.bin_count
        if s.bin_labels is not None and len(s.bin_labels):
            if self.bin_labels is None:
                self.bin_labels = np.empty(N_BINS, dtype=s.bin_labels.dtype)
            self.bin_labels[s.labelled_bins] = s.bin_labels
        self.block_share[i] = s.n_flagged / max(s.n_scored, 1)

    def classical_ratio(self) -> np.ndarray:
        """The classical covariance's explained-variance ratios, from the complete rows."""
        cov = self.scatter / max(self.n_complete, 1)
        classical = np.clip(np.linalg.eigvalsh(cov)[::-1], 0, None)
        return classical / classical.sum() if classical.sum() > 0 else classical

    def curves(self, first_row: int = 0) -> dict[str, Any]:
        """The per-bin curves of :class:`ArchiveSummary`, over the bins that hold a row, by field name
        (``bin_rows`` numbered from ``first_row``)."""
        n = self.n
        bin_rows = -(-np.arange(N_BINS) * n // N_BINS)  # first row r of bin b: r * N_BINS // n == b
        used = slice(None) if n > N_BINS else np.flatnonzero(_bins_with_rows(n))
        bin_count, bin_flagged = self.bin_count[used], self.bin_flagged[used]
        rows_in_bin = np.diff(np.append(bin_rows, n))[used]
        missing_share = (self.bin_missing[used] / np.maximum(rows_in_bin, 1)[:, None]
                         if self.bin_missing.any() else None)
        cells_share = None if self.bin_cells is None else self.bin_cells[used] / np.maximum(rows_in_bin, 1)[:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            bin_mean = np.where(bin_count > 0, self.bin_sum[used] / bin_count, np.nan)
            bin_share = np.where(bin_count > 0, bin_flagged / bin_count, np.nan)
            quiet = bin_count - bin_flagged
            bin_quiet_mean = np.where(quiet > 0, self.bin_quiet_sum[used] / np.maximum(quiet, 1), np.nan)
            bin_contrib = np.where(bin_count[:, None] > 0,
                                   self.bin_contrib[used] / np.maximum(bin_count, 1)[:, None], np.nan)
            mode_share = None if self.bin_modes is None else np.where(
                bin_count[:, None] > 0, self.bin_modes[used] / np.maximum(bin_count, 1)[:, None], np.nan)
        return {
            "bin_rows": bin_rows[used] + first_row, "bin_max": self.bin_max[used], "bin_mean": bin_mean,
            "row_values": None if self.bin_labels is None else self.bin_labels[used],
            "bin_missing_share": missing_share, "bin_cells_share": cells_share, "bin_share": bin_share,
            "bin_quiet_mean": bin_quiet_mean, "bin_contrib": bin_contrib, "bin_count": bin_count,
            "bin_mode_share": mode_share,
        }


def _bins_with_rows(n: int) -> np.ndarray:
    """1 for each of the ``N_BINS`` bins that holds a row of an ``n``-row archive (``n <= N_BINS``)."""
    return np.bincount(np.arange(n) * N_BINS // max(n, 1), minlength=N_BINS)
