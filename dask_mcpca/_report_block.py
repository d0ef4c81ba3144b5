"""The report's per-block summary: what one row block owes :func:`._report.summarize`, in one task.

:func:`summarize_block` scores a block ``SLICE_ROWS`` rows at a time under
the fitted model and returns a small :class:`BlockSummary`: row counts, the
mean and scatter of the complete rows for the classical covariance (merged
slice by slice with :func:`._stats.merge_moments`, exact at any offset),
the robust distance decimated to ``N_BINS`` bins over the row axis
(largest, sum and count of d² per bin, the rows flagged, the mean d² of
the rows not flagged, each channel's summed contribution), the runs of
flagged rows with each channel's summed contribution, their severity and
the row coordinate (time) at both ends, and with ``window`` the
kernel-weighted sums of each drift window (:mod:`._drift`).  Nothing per
row is kept beyond one slice.  :func:`block_summaries` cuts an archive
into blocks and yields their summaries in row order, computed in dask
tasks with a bounded number in flight.  The client's fold of the
summaries is :mod:`._report`.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import _missing, _modes
from ._block_rows import shifted as _shifted
from ._contributions import contributions_with_gaps
from ._distances import calibrated_d2, judge_cells
from ._drift import Window, WindowSums, add_windows, window_sums
from ._model import CONTEXT_ROWS, outlier_flags
from ._passes import NonFiniteRowsError, rows_before
from ._precision import contribution_matrix, model_rows
from ._shift import FIXED_POINT, fault_cells, shared_product
from ._stats import merge_moments

__all__ = ["BlockSummary", "block_summaries", "summarize_block", "summarize_task", "N_BINS", "SLICE_ROWS"]

#: Bins of the robust-distance curve over the row axis.
N_BINS = 2000
#: Rows of a block processed at once (bounds the float64 working set of a task).
SLICE_ROWS = 65_536
#: A numpy archive is read in blocks of this many times ``SLICE_ROWS`` rows.
NUMPY_BLOCK_SLICES = 16
#: Block summaries in flight (computing or waiting to be folded in), per scheduler thread.
WINDOW_PER_THREAD = 2

#: A slice's scatter is formed as ``Y^T Y - m ybar ybar^T`` (no centred copy) when each column's
#: mean squared lies within this share of its mean square: at most one bit of the centred sums is
#: lost to cancellation.  Otherwise (the rows far from the model's centre) as ``D^T D``, ``D = Y - ybar``.
_CANCEL_SHARE = 0.5


@dataclass
class BlockSummary:
    """What one row block owes the report (small: no per-row arrays)."""

    start: int  # the block's first row among the rows reported (the archive's: ``first_row`` more)
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
    runs: np.ndarray  # (m, 2) [start, stop) in the archive of the runs of flagged rows, in row order
    run_peak: np.ndarray  # (m,) largest d^2 of the run
    run_contrib: np.ndarray  # (m, p) summed channel contributions of the run
    run_severity: np.ndarray  # (m,) summed decades of d^2 above the cutoff over the run's flagged rows
    labelled_bins: np.ndarray | None = None  # bins whose first row is in this block
    bin_labels: np.ndarray | None = None  # the row coordinate at those first rows
    run_labels: np.ndarray | None = None  # (m, 2) the row coordinate at the first and last row of each run
    n_complete: int = 0  # rows without a missing cell (those in sum_x, sum_xx)
    bin_missing: np.ndarray | None = None  # (width, p) missing (NaN) cells per bin and channel
    bin_cells: np.ndarray | None = None  # (width, p) flagged cells per bin and channel (a cellwise model's)
    bin_modes: np.ndarray | None = None  # (width, K) scored rows per bin and operating mode (a model with modes)
    windows: WindowSums | None = None  # the drift windows the block's rows fall in (``--window``)


class _Scored(NamedTuple):
    """One slice scored under the model (:func:`_score_slice`)."""

    X: np.ndarray  # the rows, in the model's units
    ok: np.ndarray  # rows scored
    complete: np.ndarray  # rows without a missing cell
    whole: bool  # every row complete (no masked copies were made)
    judged: object  # the cellwise judgement of the cells, or None
    d: np.ndarray  # the calibrated d^2 of each row
    flags: np.ndarray  # rows flagged (scored and beyond the cutoff)
    Y: np.ndarray  # the rows about the model's centre (0 for a row with a gap)
    contrib: np.ndarray  # each row's channel contributions (0 for a row not scored)
    mode: np.ndarray | None = None  # the mode that judged each row (a model with operating modes)
    Yw: np.ndarray | None = None  # Y with a cellwise model's flagged cells at their conditional expectation (None: Y)


class _Model(NamedTuple):
    """What scoring a slice reads of the model, computed once per block."""

    model: object
    centre: np.ndarray
    P: np.ndarray  # precision: d^2 = y^T P y
    cov: np.ndarray
    M: np.ndarray  # (y M)_j^2 = (P y)_j^2 / P_jj
    cellwise: bool
    own: object = None  # a mode's model: the mask of its mode's rows (:func:`._modes.mode_rows`)


def summarize_block(
    block: np.ndarray,
    start: int,
    n_total: int,
    model,
    labels: np.ndarray | None = None,
    window: Window | None = None,
    *,
    first_row: int = 0,
    before: np.ndarray | None = None,
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
        The block's first row among the rows reported (the bins are counted from there).
    n_total : int
        Rows reported (the bins span them).
    model : MCPCA
        Fitted.
    labels : array of shape (n,), optional
        The row coordinate (time) of the block's rows.
    window : Window, optional
        Drift windows: their weighted sums are added to the summary.
    first_row : int, default=0
        The archive's position of the first row reported: the runs, the drift windows (a row count's
        window ``k`` holds the archive's rows ``k * rows`` on) and the error below number rows from the
        archive's first, ``first_row + start`` being this block's first.
    before : array of shape (CONTEXT_ROWS, p), optional
        The :data:`._model.CONTEXT_ROWS` rows before the block, as stored (NaN where there are none; None:
        none), which the stuck-sensor rule reads (:func:`._stuck.stuck_cells`), as :meth:`MCPCA.is_outlier`
        reads them, so that a row's flag does not depend on how the rows are cut into blocks.

    Raises
    ------
    NonFiniteRowsError
        The block holds rows with NaN or inf and the model was fitted with
        ``nan_policy="raise"`` (as :meth:`MCPCA.is_outlier` raises).
    """
    n, p = block.shape
    cellwise = getattr(model, "cell_cutoff_", None) is not None
    modes = ([_scoring(sub, cellwise, _modes.mode_rows(model, i)) for i, sub in enumerate(model.mode_models_)]
             if _modes.has_modes(model) else None)
    m = _scoring(model, cellwise) if modes is None else None
    # with modes, rows as stored about the largest mode's centre (each mode scores them in its own units)
    centre = m.centre if modes is None else model.mode_means_[int(np.argmax(model.mode_weights_))]
    fold = _BlockFold(start, n, n_total, p, first_row=first_row, centre=centre, cellwise=cellwise, window=window,
                      two_c2=2 * float(model.kernel_scale_) ** 2, cutoff=float(model.outlier_cutoff_),
                      n_modes=0 if modes is None else len(modes),
                      window_mode=None if modes is None else int(np.argmax(model.mode_weights_)))
    for a in range(0, n, SLICE_ROWS):
        lab = None if labels is None else np.asarray(labels[a : a + min(SLICE_ROWS, n - a)])
        raw = np.asarray(block[a : a + SLICE_ROWS])  # as stored: the stuck-sensor rule reads its dtype's digits
        context = _slice_before(block, a, before)
        if modes is None:
            X = model_rows(model, np.asarray(raw, np.float64))  # scale="robust": X / scale_
            fold.add(_score_slice(m, X, first_row + start + a, raw, context), start + a, lab)
        else:
            X = np.asarray(raw, np.float64)
            fold.add(_score_by_mode(model, modes, centre, X, first_row + start + a, raw, context), start + a, lab)
    return fold.summary(labelled=labels is not None)


def _slice_before(block, a: int, before: np.ndarray | None) -> np.ndarray | None:
    """The :data:`CONTEXT_ROWS` rows before row ``a`` of ``block`` (``before``: those before its first row)."""
    if a == 0:
        return before
    if a >= CONTEXT_ROWS or before is None:
        return np.asarray(block[max(a - CONTEXT_ROWS, 0) : a])
    return np.concatenate([np.asarray(before)[a - CONTEXT_ROWS :], np.asarray(block[:a])])


def _scoring(model, cellwise: bool, own=None) -> _Model:
    """What scoring a slice reads of ``model`` (:class:`_Model`; ``own``: a mode's rows)."""
    return _Model(model, model.mean_, model.get_precision(), model.get_covariance(), contribution_matrix(model),
                  cellwise, own)


def _score_by_mode(model, modes: list[_Model], centre: np.ndarray, X: np.ndarray, first_row: int,
                   raw: np.ndarray | None = None, before: np.ndarray | None = None) -> _Scored:
    """Score the rows ``X`` (as stored) under ``model``, which has operating modes (``modes``: what scoring
    reads of each): each row by its mode (:func:`._modes.best_modes`), its distance that mode's rescaled to the
    model's ``outlier_cutoff_`` (as :func:`._modes.judged_rows` gives it), its flag and contributions the
    mode's; ``Y`` about ``centre``, as stored.  ``raw``, ``before``: as :func:`_score_slice`'s (each mode's
    stuck-sensor rule reads the rows before the slice, whatever their modes, as :func:`._modes.judged_rows`)."""
    scored = [_score_slice(m, model_rows(m.model, X), first_row, raw, before) for m in modes]
    first = scored[0]
    best = _modes.best_modes(model, np.where(first.ok[:, None], X, 0.0) if not first.whole else X)
    rows = np.arange(len(X))
    cutoff = float(model.outlier_cutoff_)
    d = np.stack([s.d * (cutoff / float(m.model.outlier_cutoff_)) for s, m in zip(scored, modes, strict=True)])
    d = d[best, rows]
    flags = np.stack([s.flags for s in scored])[best, rows]
    contrib = np.stack([s.contrib for s in scored])[best, rows]
    Y = _shifted(X, centre) if first.whole else np.where(first.complete[:, None], X - centre, 0.0)
    return _Scored(X, first.ok, first.complete, first.whole, None, d, flags, Y, contrib, best)


def block_summaries(rows, coordinate, model, window: Window | None, first_row: int = 0, context=None):
    """The archive's row blocks: their first rows, their sizes, and their summaries in row order (lazily).

    ``context``: the rows of the archive just before ``rows``' first (at most :data:`CONTEXT_ROWS`, as stored,
    in the model's channel order; None: none, ``rows`` start the archive), read by the first blocks' stuck-run
    rule as a full score reads them.

    A dask array's blocks are its chunks, summarized in dask tasks
    (:func:`_in_row_order`); a numpy array's are ``NUMPY_BLOCK_SLICES *
    SLICE_ROWS`` rows, summarized here.  The row coordinate is cut (or
    rechunked) to the same blocks.  ``first_row``: the archive's position of ``rows``' first
    (:func:`summarize_block`); the first rows returned count from ``rows``' first.
    """
    import dask
    import dask.array as da

    from ._progress import _active_client

    n = rows.shape[0]
    if isinstance(rows, da.Array):
        sizes = rows.chunks[0]
        data_blocks = rows.to_delayed().ravel()
    else:
        step = SLICE_ROWS * NUMPY_BLOCK_SLICES
        sizes = tuple(min(step, n - a) for a in range(0, n, step)) or (0,)
        data_blocks = None
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int)
    label_blocks = [None] * len(sizes)
    if coordinate is not None:
        if isinstance(coordinate, da.Array):
            label_blocks = coordinate.rechunk((sizes,)).to_delayed().ravel()
        else:
            label_blocks = [coordinate[s : s + m] for s, m in zip(starts, sizes, strict=True)]
    runs = _reads_runs(model)  # each block reads the CONTEXT_ROWS rows before it, as is_outlier does
    lead = 0 if context is None else context.shape[0]
    if data_blocks is None:
        joined = rows if not lead else np.concatenate([np.asarray(context, dtype=rows.dtype), rows])
        results = (
            summarize_block(rows[s : s + m], int(s), n, model, lab, window, first_row=first_row,
                            before=_numpy_before(joined, int(s) + lead) if runs else None)
            for s, m, lab in zip(starts, sizes, label_blocks, strict=True)
        )
    else:
        client = _active_client()
        befores = [None] * len(sizes)
        if runs:  # sliced from the blocks before (a task reads the end of its predecessor too), after context
            joined = rows if not lead else da.concatenate([da.asarray(context).astype(rows.dtype), rows])
            befores = rows_before(joined, CONTEXT_ROWS).to_delayed().ravel()[-len(sizes):]
        tasks = [
            dask.delayed(summarize_task, pure=True)(b, int(s), n, model, lab, window, first_row, bf)
            for b, s, lab, bf in zip(data_blocks, starts, label_blocks, befores, strict=True)
        ]
        results = _in_row_order(tasks, window=WINDOW_PER_THREAD * _scheduler_threads(client), client=client)
    return starts, sizes, results


def _numpy_before(rows, s: int) -> np.ndarray:
    """The :data:`CONTEXT_ROWS` rows of the in-memory ``rows`` before row ``s`` (NaN before the first)."""
    got = np.asarray(rows[max(s - CONTEXT_ROWS, 0) : s])
    if len(got) == CONTEXT_ROWS:
        return got
    pad = np.full((CONTEXT_ROWS - len(got), rows.shape[1]), np.nan, dtype=got.dtype if got.dtype.kind == "f" else float)
    return np.concatenate([pad, got.astype(pad.dtype, copy=False)])


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
    from dask.local import get_sync  # the "sync" scheduler as a function: found by name, dask imports distributed

    if client is None and dask.config.get("scheduler", None) in _SYNCHRONOUS:
        for task in tasks:
            yield dask.compute(task, scheduler=get_sync)[0]
        return
    pool = None
    if client is not None:
        submit = client.compute
    else:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=_scheduler_threads(None), thread_name_prefix="dask-mcpca-report")

        def submit(task):
            return pool.submit(lambda: dask.compute(task, scheduler=get_sync)[0])

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


def summarize_task(block, start: int, n_total: int, model, labels=None, window=None,
                   first_row: int = 0, before=None) -> BlockSummary:
    """:func:`summarize_block` in a dask task, with single-threaded BLAS (as a fit's passes)."""
    from ._passes import limit_blas_in_task

    limit_blas_in_task()
    return summarize_block(block, start, n_total, model, None if labels is None else np.asarray(labels), window,
                           first_row=first_row, before=None if before is None else np.asarray(before))


def _reads_runs(model) -> bool:
    """Whether the stuck-sensor rule can flag a cell of ``model`` (or of one of its modes): it judges only
    the channels continuous at the fit (``quantization_steps_`` 0).  Otherwise no block needs the rows
    before it."""
    models = getattr(model, "mode_models_", None) if _modes.has_modes(model) else None
    for sub in [model] if models is None else models:
        steps = getattr(sub, "quantization_steps_", None)
        if steps is not None and np.any(np.asarray(steps) == 0):
            return True
    return False


def _score_slice(m: _Model, X: np.ndarray, first_row: int, raw: np.ndarray | None = None,
                 before: np.ndarray | None = None) -> _Scored:
    """Score the rows ``X`` (the archive's from ``first_row``): distances, flags, contributions.

    ``raw``: the rows as stored, whose runs the stuck-sensor rule reads (:func:`._stuck.stuck_cells`)
    with ``before``, the :data:`CONTEXT_ROWS` rows before them (None: ``X``, no rows before).
    Rows with a gap are scored on their observed cells with
    ``nan_policy="partial"`` (as :meth:`MCPCA.is_outlier` does) and not
    scored otherwise; with ``nan_policy="raise"`` they are an error.
    """
    model, centre = m.model, m.centre
    bad = _missing.nonfinite_rows(X)
    complete = np.ones(len(X), bool)
    complete[bad] = False
    whole = not len(bad)  # the usual slice: every row complete, no masked copies below
    ok = complete if whole or model.nan_policy != "partial" else complete | _missing.partial_rows(X)
    if model.nan_policy == "raise" and not complete.all():
        first = first_row + int(np.flatnonzero(~complete)[0])
        raise NonFiniteRowsError(
            f"row {first:,} holds NaN or inf, and the model was fitted with nan_policy='raise'; "
            "refit with nan_policy='partial' (rows judged on their observed cells) or nan_policy='omit' (such rows "
            "not scored), or clean the rows"
        )
    Xs = X if whole else np.where(ok[:, None], X, 0.0)  # unused rows (every cell missing, an inf): the centre
    judged = judge_cells(model, Xs) if m.cellwise else None  # once, for the distance and the cells
    d = calibrated_d2(model, Xs, judged=judged)  # rows with gaps: on their observed cells, as is_outlier does
    # the shift rule's residuals (y M) 2^FIXED_POINT, made once where it makes them, are the contributions' product
    product, n_prior = shared_product(model, X if raw is None else raw, before, m.M)
    Y = _shifted(X, centre) if whole else np.where(complete[:, None], X - centre, 0.0)
    contrib = Y @ m.M if product is None else np.ldexp(product[n_prior:], -FIXED_POINT)  # a power of two: exact
    np.square(contrib, out=contrib)  # (P y)_j^2 / P_jj: reconstruction-based contributions (gaps below)
    stuck = fault_cells(model, X if raw is None else raw, before, d, m.own, product)  # the rows as stored, unusable too
    flags = ok & outlier_flags(model, Xs, d, stuck)
    if not whole:
        gaps = ok & ~complete
        contrib[~ok] = 0.0
        if gaps.any():
            contrib[gaps] = np.nan_to_num(contributions_with_gaps(X[gaps] - centre, m.P, m.cov))
    return _Scored(X, ok, complete, whole, judged, d, flags, Y, contrib, None, _completed_cells(m, Y, complete, judged))


def _completed_cells(m: _Model, Y: np.ndarray, complete: np.ndarray, judged) -> np.ndarray | None:
    """``Y`` with the flagged cells of a cellwise model's complete rows (``judged``) replaced by their
    conditional expectation given the row's other cells (:func:`._missing.completed`), as the cellwise
    distance, and so the kernel weight, sees the row; None where no such cell is flagged.

    A glitched cell keeps its row's weight near 1: entered as read, it would put its glitch, at full
    weight, into the drift windows' scatter (every window called drift over the model's own rows).
    A row with every cell flagged comes back NaN (:meth:`_BlockFold.add` leaves it out of the windows).
    """
    if judged is None:
        return None
    rows = complete & judged.flags.any(axis=1)
    if not rows.any():
        return None
    Yw = Y.copy()
    Yw[rows] = _missing.completed(np.where(judged.flags[rows], np.nan, Y[rows]), m.cov)
    return Yw


class _BlockFold:
    """A block's sums, slice by slice: moments, bins, runs and drift windows (:func:`summarize_block`)."""

    def __init__(self, start: int, n: int, n_total: int, p: int, *, first_row: int = 0, centre: np.ndarray,
                 cellwise: bool,
                 window: Window | None, two_c2: float, cutoff: float, n_modes: int = 0,
                 window_mode: int | None = None):
        self.centre = centre  # the model's: the slices' rows Y are about it
        # with modes, the drift windows watch the largest mode's rows (the model's centre, components and
        # kernel are its): a window mostly in other modes has too few of them and is not monitored
        self.window_mode = window_mode
        self.start, self.n, self.p, self.window, self.two_c2, self.cutoff = start, n, p, window, two_c2, cutoff
        self.first_row = first_row  # the archive's position of row 0 of the bins: runs and windows number from it
        self.scale = max(n_total, 1)
        self.first_bin = start * N_BINS // self.scale
        width = (start + max(n, 1) - 1) * N_BINS // self.scale - self.first_bin + 1
        self.bin_max = np.full(width, -np.inf)
        self.bin_sum, self.bin_count = np.zeros(width), np.zeros(width, dtype=np.int64)
        self.bin_flagged = np.zeros(width, dtype=np.int64)
        self.bin_quiet_sum = np.zeros(width)
        self.bin_contrib = np.zeros((width, p))
        self.bin_missing = np.zeros((width, p), dtype=np.int64)
        self.bin_cells = np.zeros((width, p), dtype=np.int64) if cellwise else None
        self.bin_modes = np.zeros((width, n_modes), dtype=np.int64) if n_modes else None
        self.mean, self.scatter = np.zeros(p), np.zeros((p, p))
        self.n_scored, self.n_flagged, self.n_complete = 0, 0, 0
        self.runs, self.peaks, self.contribs, self.severities, self.run_labels = [], [], [], [], []
        self.labelled_bins, self.bin_labels = [], []
        self.win: dict[int, list] = {}  # window id -> [first row, first label, rows, scored, flagged, sw, ...]

    def add(self, s: _Scored, first_row: int, lab: np.ndarray | None) -> None:
        """Fold in one scored slice, the rows reported from ``first_row`` (``lab``: their row coordinate)."""
        self._add_moments(s)
        self._add_bins(s, first_row, lab)
        at = self.first_row + first_row  # in the archive
        if self.window is not None:
            watched = s.complete if self.window_mode is None else s.complete & (s.mode == self.window_mode)
            Yw = s.Y
            if s.Yw is not None:  # a cellwise model's flagged cells at their conditional expectation
                Yw = s.Yw
                whole = np.isfinite(Yw).all(axis=1)
                watched, Yw = watched & whole, np.where(whole[:, None], Yw, 0.0)
            add_windows(self.win, self.window, at, lab, Yw, s.d, s.ok, s.complete, s.flags, self.two_c2, watched)
        self._add_runs(s, at, lab)

    def _add_moments(self, s: _Scored) -> None:
        """The complete rows' count, mean and scatter, merged in (:func:`._stats.merge_moments`)."""
        Yc = s.Y if s.whole else s.Y[s.complete]
        m_c = len(Yc)
        if m_c:
            mean_y = np.ones(m_c) @ Yc / m_c  # a product, not Yc.mean(axis=0)'s slow narrow reduction
            _, self.mean, self.scatter = merge_moments(self.n_complete, self.mean, self.scatter,
                                                       m_c, self.centre + mean_y, _centred_scatter(Yc, mean_y))
        self.n_scored += int(s.ok.sum())
        self.n_complete += m_c
        self.n_flagged += int(s.flags.sum())

    def _add_bins(self, s: _Scored, first_row: int, lab: np.ndarray | None) -> None:
        """The slice's rows added to their bins (and the row coordinate at each bin's first row)."""
        ok, d, flags = s.ok, s.d, s.flags
        first, at = _bin_heads(first_row, len(s.X), self.scale)
        at -= self.first_bin
        self.bin_max[at] = np.fmax(self.bin_max[at], np.maximum.reduceat(np.where(ok, d, -np.inf), first))
        self.bin_sum[at] += np.add.reduceat(np.where(ok, d, 0.0), first)
        self.bin_count[at] += np.add.reduceat(ok.astype(np.int64), first)
        self.bin_flagged[at] += np.add.reduceat(flags.astype(np.int64), first)
        self.bin_quiet_sum[at] += np.add.reduceat(np.where(ok & ~flags, d, 0.0), first)
        self.bin_contrib[at] += np.add.reduceat(s.contrib, first, axis=0)
        if not s.whole:
            self.bin_missing[at] += np.add.reduceat(np.isnan(s.X).astype(np.int64), first, axis=0)
        if self.bin_cells is not None:
            self.bin_cells[at] += np.add.reduceat((s.judged.flags & ok[:, None]).astype(np.int64), first, axis=0)
        if self.bin_modes is not None:
            mine = (s.mode[:, None] == np.arange(self.bin_modes.shape[1])) & ok[:, None]
            self.bin_modes[at] += np.add.reduceat(mine.astype(np.int64), first, axis=0)
        if lab is not None:
            head = first_row + first  # the first row of a bin is the one whose predecessor is in another bin
            own = (head == 0) | ((head - 1) * N_BINS // self.scale != at + self.first_bin)
            self.labelled_bins.append((at + self.first_bin)[own])
            self.bin_labels.append(lab[first[own]])

    def _add_runs(self, s: _Scored, first_row: int, lab: np.ndarray | None) -> None:
        """The slice's runs of flagged rows: where, their peak, severity and summed contributions."""
        r = _runs(s.flags)
        if not len(r):
            return
        flagged = np.flatnonzero(s.flags)
        heads = np.concatenate([[0], np.cumsum(r[:, 1] - r[:, 0])[:-1]])  # each run's first flagged row
        self.contribs.append(np.add.reduceat(s.contrib[flagged], heads, axis=0))
        self.peaks.append(np.maximum.reduceat(s.d[flagged], heads))
        with np.errstate(divide="ignore", invalid="ignore"):
            excess = np.nan_to_num(np.maximum(np.log10(s.d[flagged] / self.cutoff), 0.0), nan=0.0, posinf=np.inf)
        self.severities.append(np.add.reduceat(excess, heads))
        self.runs.append(r + first_row)
        if lab is not None:
            self.run_labels.append(np.column_stack([lab[r[:, 0]], lab[r[:, 1] - 1]]))

    def summary(self, *, labelled: bool) -> BlockSummary:
        """The block's :class:`BlockSummary` (``labelled``: the rows had a row coordinate)."""
        p = self.p
        return BlockSummary(
            start=int(self.start),
            n_rows=self.n,
            n_scored=self.n_scored,
            n_flagged=self.n_flagged,
            mean=self.mean,
            scatter=self.scatter,
            bins=np.arange(self.first_bin, self.first_bin + len(self.bin_max)),
            bin_max=np.where(np.isfinite(self.bin_max), self.bin_max, np.nan),
            bin_sum=self.bin_sum,
            bin_count=self.bin_count,
            bin_flagged=self.bin_flagged,
            bin_quiet_sum=self.bin_quiet_sum,
            bin_contrib=self.bin_contrib,
            runs=np.concatenate(self.runs) if self.runs else np.empty((0, 2), dtype=np.int64),
            run_peak=np.concatenate(self.peaks) if self.peaks else np.empty(0),
            run_contrib=np.concatenate(self.contribs) if self.contribs else np.empty((0, p)),
            run_severity=np.concatenate(self.severities) if self.severities else np.empty(0),
            labelled_bins=np.concatenate(self.labelled_bins) if labelled and self.labelled_bins else None,
            bin_labels=np.concatenate(self.bin_labels) if labelled and self.bin_labels else None,
            run_labels=np.concatenate(self.run_labels) if self.run_labels else None,
            n_complete=self.n_complete,
            bin_missing=self.bin_missing,
            bin_cells=self.bin_cells,
            bin_modes=self.bin_modes,
            windows=None if self.window is None else window_sums(self.win, p, labelled),
        )


def _runs(flags: np.ndarray) -> np.ndarray:
    """[start, stop) of the runs of True in ``flags``, shape (m, 2)."""
    edges = np.diff(np.concatenate([[0], flags.astype(np.int8), [0]]))
    return np.column_stack([np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)])


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
