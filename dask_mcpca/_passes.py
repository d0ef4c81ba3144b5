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

from dataclasses import dataclass, replace
from functools import reduce

import dask
import dask.array as da
import numpy as np
from threadpoolctl import ThreadpoolController, threadpool_limits

from ._block import PassPlan, block_stats, combine
from ._progress import PassProgress

__all__ = [
    "PassRunner",
    "PassResult",
    "NonFiniteRowsError",
    "NumericalRangeError",
    "single_threaded_blas",
    "limit_blas_in_task",
]

#: Rows per slice when numpy input is processed without a graph.
NUMPY_BLOCK_ROWS = 262_144

#: Width of the tree reduction (partial results merged per combine task).
SPLIT_EVERY = 8


@dataclass
class PassResult:
    """The merged statistics of one pass (see :mod:`dask_mcpca._block`)."""

    n_rows: int
    n_nonfinite: int
    log_scale: np.ndarray
    weight: np.ndarray
    mean: np.ndarray
    scatter: np.ndarray
    sample: np.ndarray | None = None
    col_min: np.ndarray | None = None  # moments pass only: each column's range over finite rows
    col_max: np.ndarray | None = None
    n_far: int = 0  # finite rows that overflow in working units: weight 0 (kernel passes)
    unit_exp: int = 0  # mean and scatter are in units of 2**unit_exp (of the working units)

    def in_units(self, unit_exp: int) -> PassResult:
        """This result with its mean and scatter in units of ``2**unit_exp`` (exact; may overflow to inf)."""
        d = self.unit_exp - unit_exp
        with np.errstate(over="ignore"):
            return replace(self, mean=np.ldexp(self.mean, d), scatter=np.ldexp(self.scatter, 2 * d), unit_exp=unit_exp)

    def covariance(self, j: int = 0, *, about: np.ndarray | None = None) -> np.ndarray:
        """Weighted covariance of kernel ``j``: about its weighted mean, or about ``about``."""
        scatter = self.scatter[j] if about is None else self.scatter_about(about, j)
        return scatter / self.weight[j]

    def scatter_about(self, center: np.ndarray, j: int = 0) -> np.ndarray:
        """``X^T G X`` about ``center`` (up to the pass's common factor); inf where it overflows."""
        d = self.mean[j] - center
        with np.errstate(over="ignore", invalid="ignore"):
            return self.scatter[j] + self.weight[j] * np.outer(d, d)


class NonFiniteRowsError(ValueError):
    """Raised when rows hold NaN or inf and ``nan_policy="raise"``."""


class NumericalRangeError(ValueError):
    """A quantity of the fit is not representable in float64 (it overflows or underflows).

    Raised with the pass or the quantity named, instead of an error from
    inside numpy or a non-finite result; the message says what to change.
    """


def _check_finite(stats: dict, label: str) -> None:
    """Every kernel of a pass has a positive, finite weight and a finite mean and scatter."""
    for j in range(len(stats["weight"])):
        if not stats["weight"][j] > 0:
            raise NumericalRangeError(
                f"pass {label!r}: kernel {j} gave every row weight 0 (every row's distance overflows "
                "float64); the data's values span more than float64 can hold in one fit"
            )
        for what in ("mean", "scatter"):
            if not np.all(np.isfinite(stats[what][j])):
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


def _block_task(block, plan: PassPlan, row_offset: int) -> dict:
    """:func:`block_stats` inside a dask task, with single-threaded BLAS (:func:`limit_blas_in_task`)."""
    limit_blas_in_task()
    return block_stats(block, plan, row_offset)


def _tree_reduce(parts: list, split_every: int):
    while len(parts) > 1:
        parts = [
            dask.delayed(_combine_many, pure=True)(*parts[i : i + split_every])
            if len(parts[i : i + split_every]) > 1
            else parts[i]
            for i in range(0, len(parts), split_every)
        ]
    return parts[0]


def _combine_many(*parts):
    return reduce(combine, parts)


class PassRunner:
    """Runs and counts passes over one data set.

    Parameters
    ----------
    X : ndarray or dask.array.Array
        Full-row blocks, from :func:`dask_mcpca._io.as_row_blocks`.
    nan_policy : {"raise", "omit"}
    progress : bool
        Show a bar per pass.
    """

    def __init__(self, X, *, nan_policy: str = "raise", progress: bool = False):
        self.X = X
        self.nan_policy = nan_policy
        self.progress = progress
        self.n_passes = 0
        self.n_rows, self.n_features = X.shape
        self.is_dask = isinstance(X, da.Array)
        self.n_blocks = len(X.chunks[0]) if self.is_dask else -(-self.n_rows // NUMPY_BLOCK_ROWS)
        self._blocks = None
        #: Kernel passes see ``X * 2**-unit_exp`` (set by the fit after the first pass).
        self.unit_exp = 0

    def _dask_blocks(self):
        if self._blocks is None:
            self._blocks = list(self.X.to_delayed(optimize_graph=True)[:, 0])
        return self._blocks

    def run(self, plan: PassPlan, *, label: str = "") -> PassResult:
        """Make one full pass with ``plan`` and return its merged statistics.

        A kernel pass runs in this runner's working units (``unit_exp``) and
        its result is checked: a kernel without weight, or a non-finite mean
        or scatter, raises :class:`NumericalRangeError` naming the pass.
        """
        if plan.kernels is not None:
            plan = replace(plan, unit_exp=self.unit_exp)
        with PassProgress(self, label, enabled=self.progress) as bar:
            if self.is_dask:
                plan_d = dask.delayed(plan, pure=True)
                offsets = np.concatenate([[0], np.cumsum(self.X.chunks[0])[:-1]])
                parts = [
                    dask.delayed(_block_task, pure=True)(b, plan_d, int(off))
                    for off, b in zip(offsets, self._dask_blocks(), strict=True)
                ]
                stats = bar.compute(_tree_reduce(parts, SPLIT_EVERY), blocks=parts)
            else:
                stats = None
                for start in range(0, self.n_rows, NUMPY_BLOCK_ROWS):
                    part = block_stats(self.X[start : start + NUMPY_BLOCK_ROWS], plan, start)
                    stats = part if stats is None else combine(stats, part)
                    bar.advance(1)
        self.n_passes += 1
        if stats["n_nonfinite"] and self.nan_policy == "raise":
            raise NonFiniteRowsError(
                f"{stats['n_nonfinite']} of {self.n_rows} rows hold NaN or inf; "
                "clean them, or pass nan_policy='omit' to leave such rows out of the fit"
            )
        if stats["n_rows"] == 0:
            raise ValueError("no rows left to fit: every row holds NaN or inf")
        if plan.kernels is not None:
            _check_finite(stats, label)
        return PassResult(**stats)
