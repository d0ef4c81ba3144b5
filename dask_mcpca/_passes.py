"""One pass over the data: the per-block kernel everywhere, merged by a tree.

A :class:`PassRunner` owns the data of one fit and counts its passes.  For a
dask array, a pass is one task per row block (read + :func:`block_stats`,
fused by the graph optimiser), merged by a tree of :func:`combine` tasks
``split_every`` wide, computed once on the active scheduler: ``dask.compute``
locally, or ``client.compute`` when a ``distributed.Client`` exists (so the
progress line can count finished blocks; see :class:`._progress.PassProgress`).
For a numpy array, the same kernel runs over row slices directly, with no
task graph.
"""

from __future__ import annotations

from dataclasses import replace
from functools import reduce

import dask
import dask.array as da
import numpy as np
from threadpoolctl import ThreadpoolController, threadpool_limits

from . import _block, _bulk
from ._block import block_stats
from ._exceptions import NonFiniteRowsError, NumericalRangeError
from ._kernels import wide_plan
from ._no_complete_rows import gap_counts, no_complete_rows_message
from ._progress import PassProgress
from ._scale import in_model_units
from ._stats import WIDE_FEATURES, BlockStats, PassPlan, combine

__all__ = [
    "PARTIAL_HINT",
    "kept_runs",
    "nonfinite_rows_message",
    "PARTIAL_MIN_BLOCKS",
    "PARTIAL_MIN_BLOCKS_WIDE",
    "PassRunner",
    "PassResult",
    "single_threaded_blas",
    "spread_blocks",
    "tree_reduce",
    "limit_blas_in_task",
]

#: Rows per slice when numpy input is processed without a graph.
NUMPY_BLOCK_ROWS = 262_144

#: Width of the tree reduction (partial results merged per combine task).
SPLIT_EVERY = 8

#: A store of at least this many row blocks draws the robust start's row
#: sample from a spread of its blocks (:func:`spread_blocks`) instead of a
#: full pass; fewer blocks are read fully.
PARTIAL_MIN_BLOCKS = 16

#: From ``WIDE_FEATURES`` columns on (:mod:`._stats`; beyond ``_block.COMPILED_MAX_FEATURES``), a
#: store of at least ``PARTIAL_MIN_BLOCKS_WIDE`` row blocks draws the sample
#: from a spread too: 4 of its 7-15 blocks, which see more of the archive than the 4 of 16-32
#: that ``benchmarks/spread.py`` found as good as a full first pass.  Why wide rows only: a wide
#: store of 80 MB chunks has few blocks (7 at 200k rows x 300 columns, 10 at 1M x 100), and the
#: full first read was 0.3 of such a fit's time (``benchmarks/scaling.py``, issue 37); narrow
#: fits of 7-15 blocks keep their full first read and their bits.
PARTIAL_MIN_BLOCKS_WIDE = 7

#: The spread: this share of the blocks, at least ``SPREAD_MIN_BLOCKS`` and
#: at most ``SPREAD_MAX_BLOCKS`` of them.  The minimum was 8 until 2026-11-27: on
#: 16-32 blocks it cost 0.25-0.5 of a pass (now 4 blocks; 5-8 on 33-63, as
#: an eighth gives).  ``benchmarks/spread.py`` (20
#: blocks, 10 seeds) found 4 as good as 8 and as a full first pass for
#: bias runs, stuck stretches and regimes clustered in time (the same
#: angles; 0.03-0.08 points more false alarms on two cases).  Stuck values
#: do not depend on the spread: :func:`._robust.fit_robust` finds them in a
#: sample of the whole archive drawn in the first full pass.
SPREAD_SHARE = 0.125
SPREAD_MIN_BLOCKS = 4
SPREAD_MAX_BLOCKS = 32


def spread_blocks(n_blocks: int, n_features: int = 0) -> np.ndarray | None:
    """Row blocks to read for the row sample, evenly spread; None: read all (a full pass).

    A store of fewer than ``PARTIAL_MIN_BLOCKS`` blocks is read fully, or of fewer than
    ``PARTIAL_MIN_BLOCKS_WIDE`` where ``n_features`` is at least ``WIDE_FEATURES``.

    Block ``i`` of ``m`` is the middle block of the ``i``-th of ``m`` equal
    runs of blocks, so that a time-ordered archive is sampled at ``m`` evenly
    spaced times: an operating regime or a run of faults that lasts longer
    than ``n_blocks / m`` blocks is in the sample.
    """
    least = PARTIAL_MIN_BLOCKS_WIDE if n_features >= WIDE_FEATURES else PARTIAL_MIN_BLOCKS
    if n_blocks < least:
        return None
    m = min(SPREAD_MAX_BLOCKS, max(SPREAD_MIN_BLOCKS, int(np.ceil(SPREAD_SHARE * n_blocks))))
    return np.unique(((np.arange(m) + 0.5) * n_blocks / m).astype(int))


#: The end of a fit's refusal of rows holding NaN or inf under ``nan_policy="raise"`` (a fit with modes,
#: which refuses ``"partial"``, takes it out: :func:`._fit_modes._naming`).
PARTIAL_HINT = ", or nan_policy='partial' to fit rows with some cells missing by their observed cells"


def nonfinite_rows_message(n_bad: int, n_rows: int) -> str:
    """A fit's refusal of ``n_bad`` of ``n_rows`` rows holding NaN or inf under ``nan_policy="raise"``."""
    return (f"{n_bad} of {n_rows} rows hold NaN or inf; clean them, or pass nan_policy='omit' to leave such rows "
            f"out of the fit{PARTIAL_HINT}")


#: The merged statistics of one pass: the blocks' :class:`._stats.BlockStats`
#: merged by the tree, the same type as what each block returns.
PassResult = BlockStats


def _check_finite(stats: BlockStats, label: str) -> None:
    """Every kernel of a pass has a positive, finite weight and a finite mean and scatter."""
    for j in range(len(stats.weight)):
        if not stats.weight[j] > 0:
            raise NumericalRangeError(
                f"pass {label!r}: kernel {j} gave every row weight 0 (every row's distance overflows "
                "float64); the data's values span more than float64 can hold in one fit"
            )
        for what, value in (("mean", stats.mean), ("scatter", stats.scatter)):
            if not np.all(np.isfinite(value[j])):
                raise NumericalRangeError(
                    f"pass {label!r}: the weighted {what} of kernel {j} is not finite in float64 (rows of "
                    "magnitude near the float64 limit carry weight); rescale the data or remove those rows"
                )


_BLAS = None
_WORKER_LIMIT = None


def _controller() -> ThreadpoolController:
    """One controller per process: scanning the loaded libraries costs milliseconds."""
    global _BLAS
    if _BLAS is None:
        _BLAS = ThreadpoolController()
    return _BLAS


def single_threaded_blas():
    """Context manager: the BLAS libraries of this process use one thread.

    ``MCPCA.fit`` runs inside it.  Dask already runs one task per core, and
    the p x p work on the client is tiny: measured here on 2 cores, nested
    BLAS threads made one pass 20-40x slower and a 20000 x 10 product 40x
    slower when the other core was busy.
    """
    return _controller().limit(limits=1, user_api="blas")


def limit_blas_in_task() -> None:
    """Make BLAS single-threaded in the process running a dask task, once for the process's life.

    In the client's process (threaded scheduler) ``fit`` has already limited
    BLAS.  In a worker process the limit is set once, for the life of the
    process, rather than entered and left per task: the limit is global to
    the process, so per-task restores race between the worker's threads.
    """
    global _WORKER_LIMIT
    if _WORKER_LIMIT is None and any(
        info["num_threads"] > 1 for info in _controller().select(user_api="blas").info()
    ):
        _WORKER_LIMIT = threadpool_limits(limits=1, user_api="blas")


def rows_before(blocks: da.Array, n: int) -> da.Array:
    """For each row block of ``blocks``, the ``n`` rows before its first (NaN before the first row of
    ``blocks``): ``n`` rows per block.

    Sliced from the blocks a computation reads, so no block is read twice; a slice may reach back
    over several short blocks.  Where the blocks' sizes are unknown, each block gets NaN rows:
    its rows are judged without the rows before it.
    """
    p, counts = blocks.shape[1], blocks.chunks[0]
    pad = da.full((n, p), np.nan, dtype=blocks.dtype, chunks=(n, p))
    if any(np.isnan(c) for c in counts):
        return da.concatenate([pad] * len(counts)).rechunk(((n,) * len(counts), (p,)))
    padded = da.concatenate([pad, blocks])
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int)
    return da.concatenate([padded[s : s + n] for s in starts]).rechunk(((n,) * len(counts), (p,)))


def held_block_stats(block, plan: PassPlan, row_offset: int, held: np.ndarray) -> BlockStats:
    """:func:`block_stats` of ``block`` with the rows ``held`` (a mask) given no weight: left out of the
    sums and counted in ``n_rows``.  For passes that draw no row sample (the sample is drawn by row)."""
    if not held.any():
        return block_stats(block, plan, row_offset)
    if plan.sample_rate > 0:
        raise ValueError("rows are held out of a pass only where it draws no row sample")
    stats = block_stats(np.asarray(block)[~held], plan, row_offset)
    stats.n_rows += int(held.sum())
    return stats


def _block_task(block, plan: PassPlan, row_offset: int, before=None, hold_out=None, scale=None,
                keep: tuple = ()) -> BlockStats:
    """:func:`block_stats` inside a dask task, with single-threaded BLAS (:func:`limit_blas_in_task`);
    with ``hold_out``, the rows ``hold_out(block, before)`` flags (read as stored) get no weight
    (:func:`held_block_stats`); with ``scale``, the pass sees each channel divided by it
    (:func:`._scale.in_model_units`); ``keep``: runs ``(start, stop)`` of the block's rows, as stored,
    that go into the result's ``segments``."""
    limit_blas_in_task()
    if hold_out is None:
        stats = block_stats(in_model_units(block, scale), plan, row_offset)
    else:
        held = hold_out(block, before)
        stats = held_block_stats(in_model_units(block, scale), plan, row_offset, held)
    stats.segments = kept_runs(block, keep)
    return stats


def kept_runs(block, keep) -> tuple:
    """The runs ``keep`` (``(start, stop)`` pairs) of ``block``'s rows, as stored, in float64: a pass's ``segments``."""
    return tuple(np.array(block[a:b], np.float64) for a, b in keep)


def tree_reduce(parts: list, split_every: int = SPLIT_EVERY, merge=None):
    """``parts`` (delayed) merged by a tree of ``merge(*parts)`` tasks ``split_every`` wide (default: the
    :class:`BlockStats` of a pass, :func:`._stats.combine`); a lone part is carried up unwrapped."""
    merge = _combine_many if merge is None else merge
    while len(parts) > 1:
        parts = [
            dask.delayed(merge, pure=True)(*parts[i : i + split_every])
            if len(parts[i : i + split_every]) > 1
            else parts[i]
            for i in range(0, len(parts), split_every)
        ]
    return parts[0]


def _combine_many(*parts: BlockStats) -> BlockStats:
    return reduce(combine, parts)


class PassRunner:
    """Runs and counts passes over one data set.

    Parameters
    ----------
    X : ndarray or dask.array.Array
        Full-row blocks, from :func:`dask_mcpca._io.as_row_blocks`.
    nan_policy : {"raise", "omit", "partial"}
    progress : bool
        Show a bar per pass.
    hold_out : callable, optional
        ``hold_out(block, before) -> mask`` of the block's rows to give no weight, ``before`` the
        ``context`` rows before the block (NaN before the first): a rule that reads rows in order
        (:func:`dask_mcpca._stuck.stuck_cells`).  For passes that draw no row sample.
    context : int
        Rows before each block that ``hold_out`` reads.
    names : array-like of str, optional
        The channels' names, for messages (``feature_names_in_``); columns by number without.
    keep_bulk : bool, default=True
        Full wide kernel passes keep the bulk's plain sums for the next (:mod:`._bulk`); False for a
        runner that makes one such pass (collecting would cost it a few percent for nothing) or whose
        rows are another runner's choice (a mode's).
    """

    def __init__(self, X, *, nan_policy: str = "raise", progress: bool = False, hold_out=None, context: int = 0,
                 names=None, keep_bulk: bool = True):
        self.X = X
        self.names = names
        self.hold_out, self.context = hold_out, context
        self.nan_policy = nan_policy
        self.progress = progress
        self.n_passes = 0
        self.n_partial_reads = 0  # reads of some blocks only (the row sample's)
        self.n_blocks_read = 0  # blocks read by them
        self.n_usable_rows = None  # finite rows seen by the last full pass
        self.n_rows, self.n_features = X.shape
        self.is_dask = isinstance(X, da.Array)
        self.n_blocks = len(X.chunks[0]) if self.is_dask else -(-self.n_rows // NUMPY_BLOCK_ROWS)
        self._blocks = None
        #: Kernel passes see ``X * 2**-unit_exp`` (set by the fit after the first pass).
        self.unit_exp = 0
        #: Every pass sees each channel divided by this (``scale="robust"``; set by the fit after the first read).
        self.scale = None
        self.keep_bulk = keep_bulk
        self._bulk: _bulk.KeptBulk | None = None  # kept from a wide pass (:mod:`._bulk`)

    def stored_units(self) -> np.ndarray | None:
        """Per channel, the factor from the fit's working units back to the values as stored:
        ``scale * 2**unit_exp`` with ``scale="robust"``, where a value's decimal spelling (a round set
        point) is lost in the division; None without scales, where the working units are the stored
        values times a power of two (:func:`._repeated.find_repeated` reads a spelling through it)."""
        return None if self.scale is None else np.ldexp(np.asarray(self.scale, np.float64), self.unit_exp)

    def _dask_blocks(self):
        if self._blocks is None:
            self._blocks = list(self.X.to_delayed(optimize_graph=True)[:, 0])
        return self._blocks

    def block_rows(self) -> np.ndarray:
        """Rows of each row block of ``X`` (not ``n_rows``, which a mode's runner sets to its own rows)."""
        if self.is_dask:
            return np.asarray(self.X.chunks[0])
        return np.diff(np.minimum(np.arange(self.n_blocks + 1) * NUMPY_BLOCK_ROWS, len(self.X)))

    def run(self, plan: PassPlan, *, label: str = "", blocks: np.ndarray | None = None,
            runs: dict | None = None) -> PassResult:
        """Make one full pass with ``plan`` and return its merged statistics.

        ``blocks`` (indices of row blocks) reads only those: a partial read,
        counted in ``n_partial_reads`` and ``n_blocks_read``, not in ``n_passes``.
        ``runs`` (block -> ``((start, stop), ...)`` within it, :func:`._shift.run_plan`): those rows, as
        stored, come back in the result's ``segments``, in row order.

        A kernel pass runs in this runner's working units (``unit_exp``) and
        its result is checked: a kernel without weight, or a non-finite mean
        or scatter, raises :class:`NumericalRangeError` naming the pass.
        """
        if plan.kernels is not None:
            plan = replace(plan, unit_exp=self.unit_exp)
            if blocks is None and self._keeps_bulk(plan):
                kept = self._bulk
                if kept is not None and (kept.unit_exp != self.unit_exp or kept.scale is not self.scale):
                    kept = None  # the rows were seen in other units: collect again
                plan = replace(plan, bulk=_bulk.box_for(plan, kept))
        chosen = range(self.n_blocks) if blocks is None else [int(b) for b in blocks]
        with PassProgress(self, label, enabled=self.progress, total=len(chosen)) as bar:
            stats = self._sums(plan, chosen, bar, runs or {})
            if plan.bulk is not None:
                stats = self._bulk_completed(plan, stats, chosen, bar, runs or {})
        if blocks is None:
            self.n_passes += 1
            self.n_usable_rows = int(stats.n_rows)
        else:
            self.n_partial_reads += 1
            self.n_blocks_read += len(chosen)
        if stats.n_nonfinite and self.nan_policy == "raise":
            raise NonFiniteRowsError(nonfinite_rows_message(stats.n_nonfinite, self.n_rows))
        if stats.n_rows == 0:
            if self.nan_policy == "partial":  # a dead channel, or gaps in every row: one more read tells which
                raise ValueError(no_complete_rows_message(gap_counts(self.X), self.names))
            raise ValueError("no rows left to fit: every row holds NaN or inf")
        if plan.kernels is not None:
            _check_finite(stats, label)
        return stats

    def _keeps_bulk(self, plan: PassPlan) -> bool:
        """Whether this full kernel pass weighs the bulk's rows by plain sums kept between passes
        (:mod:`._bulk`): a wide flat-top pass that takes rows whole, over this runner's own rows."""
        return (_bulk.KEEP_BULK and self.keep_bulk and plan.cells is None
                and self.n_features >= _block.WIDE_MIN_FEATURES and wide_plan(plan, self.n_features, self.X.dtype))

    def _bulk_completed(self, plan: PassPlan, stats: BlockStats, chosen, bar, keep: dict) -> BlockStats:
        """``stats`` with the bulk's sums completed (:func:`._bulk.completed`); the plain sums kept
        where this pass collected them.  A pass whose count of bulk rows does not match the kept sums'
        is made again, every row weighed in full (counted as another pass), and the sums are dropped."""
        done = _bulk.completed(stats, plan, None if plan.bulk.collect else self._bulk.plain)
        if done is not None:
            if plan.bulk.collect:
                self._bulk = _bulk.KeptBulk(plan.bulk, _bulk.collected(stats, self.n_features), self.unit_exp,
                                            self.scale)
            return done
        self._bulk = None
        self.n_passes += 1
        bar.restart()
        return self._sums(replace(plan, bulk=None), chosen, bar, keep)

    def _sums(self, plan: PassPlan, chosen, bar, keep: dict) -> BlockStats:
        """The merged :class:`BlockStats` of the row blocks ``chosen`` under ``plan`` (``bar`` counts them),
        with the runs ``keep[i]`` of block ``i`` in its ``segments``."""
        offsets = np.concatenate([[0], np.cumsum(self.block_rows())[:-1]])
        if self.is_dask:
            plan_d = dask.delayed(plan, pure=True)
            all_blocks = self._dask_blocks()
            if self.hold_out is None:
                parts = [dask.delayed(_block_task, pure=True)(all_blocks[i], plan_d, int(offsets[i]),
                                                              None, None, self.scale, keep.get(i, ()))
                         for i in chosen]
            else:  # both from the unoptimised graph, whose keys they share: each block is read once
                read = self.X.to_delayed(optimize_graph=False)[:, 0]
                before = rows_before(self.X, self.context).to_delayed(optimize_graph=False)[:, 0]
                parts = [dask.delayed(_block_task, pure=True)(read[i], plan_d, int(offsets[i]), before[i],
                                                              self.hold_out, self.scale, keep.get(i, ()))
                         for i in chosen]
            stats = bar.compute(tree_reduce(parts), blocks=parts)
        else:
            stats = None
            for i in chosen:
                start = int(offsets[i])
                block = self.X[start : start + NUMPY_BLOCK_ROWS]
                if self.hold_out is None:
                    part = block_stats(in_model_units(block, self.scale), plan, start)
                else:
                    before = self.X[max(start - self.context, 0) : start]
                    before = np.concatenate([np.full((self.context - len(before), self.n_features), np.nan),
                                             before])
                    held = self.hold_out(block, before)
                    part = held_block_stats(in_model_units(block, self.scale), plan, start, held)
                part.segments = kept_runs(block, keep.get(i, ()))
                stats = part if stats is None else combine(stats, part)
                bar.advance(1)
        return stats
