"""What one row block owes a pass, and which kernel computes it: the router.

Every pass over the data, local or distributed, calls :func:`block_stats` once
per row block and merges the results with :func:`._stats.combine`.  Several
kernels (:mod:`._kernels`) can compute a block's statistics; which one does
is one explicit decision, :func:`choose_route`, made from the block's shape,
dtype and layout and the pass's plan, never from its values:

``"whole_block"``
    The default solver's kernels (one matrix, every kernel with a flat top)
    over a block stored contiguous, float64 or float32: one compiled sweep
    over the whole block as stored (:func:`._kernels.one_sweep`).
``"one_sweep"``
    The same sweep, one sub-block of ``SUB_BLOCK_ROWS`` rows at a time.
``"two_sweeps"``
    Kernels of one matrix: the compiled quadratic forms, then the compiled
    weighted sums (:func:`._kernels.two_sweeps`).
``"compiled_moments"``
    A moments pass (no kernels) by the compiled loops
    (:func:`._kernels.compiled_moments`).
``"wide"``
    A wide block's kernel pass (``WIDE_MIN_FEATURES`` columns or more,
    beyond the compiled loops) with flat-top kernels (the default
    solver's): BLAS's products on cache-sized sub-blocks
    (:func:`._kernels.wide_block`); its sub-blocks with NaN or far rows go
    to the numpy spelling and are merged (the block's rows counted as
    ``"wide"``).
``"numpy"``
    The numpy spelling (:func:`._kernels.numpy_part`): any plan, any rows;
    the reference the others are tested against.

:func:`choose_route` returns the routes a block tries, in order, and why.  A
compiled kernel declines rows it does not handle (a row far out in working
units; no row near a flat top, whose weights two sweeps keep): the whole
block then goes by sub-blocks, and a sub-block to the next route, down to
``"numpy"``.  The result records how many rows each route served
(``BlockStats.routes``; rows with missing cells that a ``"partial"`` plan
completes count under ``"partial"`` too).  Tests and benchmarks ask for a
route with ``block_stats(..., route=...)``: that route where it serves the
block, the numpy spelling elsewhere.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

import numpy as np

from . import _compiled, _missing
from ._block_rows import Workspace, finite_rows
from ._cells import cell_stats
from ._compiled import SPLITMIX_GOLDEN, SPLITMIX_MIX1, SPLITMIX_MIX2
from ._kernels import (
    compiled_moments,
    flat_tops,
    numpy_part,
    one_sweep,
    two_sweeps,
    wide_block,
)
from ._partial_stats import partial_stats
from ._stats import WIDE_FEATURES, BlockStats, PartialPlan, PassPlan, combine, empty

__all__ = [
    "PassPlan",
    "PartialPlan",
    "BlockStats",
    "block_stats",
    "combine",
    "choose_route",
    "Route",
    "ROUTES",
    "Routing",
]

#: Rows handled at once inside a block: bounds the temporaries of a task and
#: keeps them in cache (32,768 rows ran 10-25 % faster than 65,536 at p = 10).
SUB_BLOCK_ROWS = 32_768

#: Whether passes use the compiled loops of :mod:`._compiled` for their usual
#: sub-blocks (the numpy spelling does the rest, and all of it when False).
COMPILED = _compiled.AVAILABLE

#: The widest rows the compiled loops take.  Their p(p+1)/2 loops along the
#: rows lose to BLAS's blocked products as p grows (a two-kernel robust step
#: in memory, compiled / numpy: 0.41 at p = 10, 0.82 at 20, 0.98 at 30, 0.97
#: at 50, 1.06 at 100, 1.84 at 300).
COMPILED_MAX_FEATURES = 32

#: From this many columns on, a kernel pass that the compiled loops do not take goes by
#: :func:`._kernels.wide_block` (BLAS's products on sub-blocks that stay in cache, the sums of
#: the block's sub-blocks added as they come) where it serves the plan: a robust step on a
#: 33,333 x 300 block in memory, one BLAS thread, 2.5x ``X.T @ X`` of the block before, see
#: ``benchmarks/RESULTS.md`` (profile-wide).  Narrower blocks keep the numpy spelling's sub-blocks.
WIDE_MIN_FEATURES = WIDE_FEATURES  # its own name: benchmarks/scaling.py's BEFORE sets it

#: Values (rows x columns) of a sub-block of a wide kernel pass (:func:`._kernels.wide_block`), so that its
#: working rows and their triangular product (16 bytes a value) stay in cache between the sweeps:
#: 1,747 rows at p = 300.  A block of an 80 MB chunk in memory, one BLAS thread, robust step / ``X.T @ X``
#: for 2^18 .. 2^22 values: 2.38, 2.36, 2.46, 2.56, 2.68 at p = 100; 2.15, 2.12, 2.18, 2.27, 2.29 at
#: p = 300; at p = 1000 (rows 262 .. 4,194) 2.52, 2.38, 2.24, 2.18, 2.46: hence ``WIDE_MIN_ROWS``.
WIDE_SUB_BLOCK_VALUES = 2**19

#: The fewest rows of a wide pass's sub-block (BLAS's products lose speed on fewer).
WIDE_MIN_ROWS = 1024

#: Blocks the compiled sweep reads as stored, whole (native byte order); others are widened to
#: float64 a sub-block at a time first.
WHOLE_BLOCK_DTYPES = (np.dtype(np.float64), np.dtype(np.float32))

#: The kernels a block can take (see the module docstring).
Route = Literal["whole_block", "one_sweep", "two_sweeps", "compiled_moments", "wide", "numpy"]
ROUTES: tuple[Route, ...] = typing.get_args(Route)


@dataclass(frozen=True)
class Routing:
    """The routes a block tries, in order (the last is always ``"numpy"``), and why.

    ``kernel`` is the upper-triangle form of the pass's one kernel matrix that the compiled
    kernel passes take (None when none of them is a route).
    """

    routes: tuple[Route, ...]
    reason: str
    kernel: np.ndarray | None = None


def choose_route(X: np.ndarray, plan: PassPlan, *, route: Route | None = None) -> Routing:
    """The routes row block ``X`` takes under ``plan``, in the order they are tried, and why.

    Parameters
    ----------
    X : ndarray of shape (n_block, p)
        The row block as stored; only its shape, dtype and layout are read.
    plan : PassPlan
        The pass's kernels and options.
    route : Route, optional
        A route to take where it serves the block (the numpy spelling
        elsewhere), for tests and benchmarks; None: the usual choice.

    Returns
    -------
    Routing
    """
    if route is not None and route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES} or None; got {route!r}")
    X = np.asarray(X)
    usual, reason, kernel = _usual_routes(X, plan)
    if usual == ("numpy",) and X.shape[1] >= WIDE_MIN_FEATURES and plan.kernels is not None and flat_tops(plan):
        usual, reason = ("wide", "numpy"), f"{reason}; flat-top kernels: BLAS's products on cache-sized sub-blocks"
    if route is None:
        return Routing(usual, reason, kernel)
    if route in usual:
        return Routing((route, "numpy") if route != "numpy" else ("numpy",), f"{route!r} asked for", kernel)
    return Routing(("numpy",), f"{route!r} asked for, which cannot serve this block ({reason})", None)


def _usual_routes(X: np.ndarray, plan: PassPlan) -> tuple[tuple[Route, ...], str, np.ndarray | None]:
    """:func:`choose_route`'s usual choice: the routes, why, and the compiled kernel passes' matrix."""
    p = X.shape[1]
    if not COMPILED:
        return ("numpy",), "the compiled loops are off (no numba)", None
    if not 0 < p <= COMPILED_MAX_FEATURES:
        return ("numpy",), f"{p} columns, beyond COMPILED_MAX_FEATURES: BLAS's products are faster", None
    if plan.kernels is None:
        return ("compiled_moments", "numpy"), "a moments pass: the compiled moments loops", None
    if abs(plan.unit_exp) >= np.finfo(np.float64).maxexp - 1:
        return ("numpy",), f"the working unit 2**{plan.unit_exp} is not a normal float64", None
    A = plan.kernels[0]
    if not all(np.array_equal(B, A) for B in plan.kernels[1:]):
        return ("numpy",), "kernels of more than one matrix", None
    kernel = _compiled.upper_doubled(A)
    if not flat_tops(plan):
        return ("two_sweeps", "numpy"), "kernels of one matrix, not all with a flat top: two compiled sweeps", kernel
    if X.dtype not in WHOLE_BLOCK_DTYPES or not X.flags.c_contiguous or not len(X):
        why = "flat-top kernels of one matrix, the block not contiguous float64 or float32: one sweep per sub-block"
        return ("one_sweep", "two_sweeps", "numpy"), why, kernel
    why = "flat-top kernels of one matrix (the default solver's), the block contiguous float64 or float32"
    return ("whole_block", "one_sweep", "two_sweeps", "numpy"), why, kernel


def block_stats(X: np.ndarray, plan: PassPlan, row_offset: int = 0, *, route: Route | None = None) -> BlockStats:
    """Everything one row block contributes to a pass.

    Parameters
    ----------
    X : ndarray of shape (n_block, p)
        One row block, any float dtype; it is read once and shifted one
        sub-block at a time into float64 working rows (the whole block at
        once by the compiled sweep, which widens float32 rows in registers);
        the sums are float64 (the caller's array is never modified).
    plan : PassPlan
        The kernels and options of this pass.
    row_offset : int
        Global index of the block's first row (for the row sample).
    route : Route, optional
        The kernel to take where it serves the block, the numpy spelling
        elsewhere (:func:`choose_route`); None: the usual choice.  ``"numpy"``
        also draws the row sample in numpy.

    Returns
    -------
    BlockStats
        The block's counts and per-kernel sums; ``sample`` (as stored) when
        the plan asks for one; ``col_min`` and ``col_max`` (over finite rows,
        as stored) for a moments pass (no kernels); ``routes``, the rows each
        route served.
    """
    X = np.asarray(X)
    p = X.shape[1]
    if plan.cells is not None:  # cells judged one by one (a cellwise fit): one numpy route
        return cell_stats(X, plan)
    routing = choose_route(X, plan, route=route)
    routes, U = routing.routes, routing.kernel
    by_loops = COMPILED and route != "numpy"
    if routes[0] == "whole_block":
        with np.errstate(over="ignore", invalid="ignore"):
            whole = one_sweep(X, plan, U, sub_block_rows=SUB_BLOCK_ROWS)
        if whole is not None:  # the usual block of a default-solver pass
            result, finite = whole
            result.routes = {"whole_block": len(X)}
            if plan.sample_rate > 0:
                result.sample = _drawn(X, _sampled_mask(X, finite, plan), row_offset, plan, compiled=by_loops)
            return _with_partial_rows(result, X, plan)
        routes = routes[1:]
    ws = Workspace(np.float64)
    if routes[0] == "wide":  # BLAS's products on sub-blocks that stay in cache
        rows = max(WIDE_MIN_ROWS, min(SUB_BLOCK_ROWS, WIDE_SUB_BLOCK_VALUES // p))
        with np.errstate(over="ignore", invalid="ignore"):
            wide = wide_block(X, plan, ws, sub_block_rows=rows)
        routes = routes[1:]
        if wide is not None:
            wide.routes = {"wide": len(X)}
            if plan.sample_rate > 0:
                finite = finite_rows(X) if wide.n_nonfinite else None
                wide.sample = _drawn(X, _sampled_mask(X, finite, plan), row_offset, plan, compiled=by_loops)
            return _with_partial_rows(wide, X, plan)
    result = empty(plan, p)
    samples = []
    for start in range(0, X.shape[0], SUB_BLOCK_ROWS):
        sub = X[start : start + SUB_BLOCK_ROWS]
        Xs = np.asarray(sub, dtype=np.float64)  # float32 values are exact in float64
        with np.errstate(over="ignore", invalid="ignore"):  # far rows; the runner checks the result
            for taken in routes:
                done = _sub_block(taken, Xs, plan, U, ws)
                if done is not None:
                    break
        part, finite = done
        part.routes = {taken: len(Xs)}
        if plan.sample_rate > 0:
            samples.append(_drawn(Xs, _sampled_mask(Xs, finite, plan), row_offset + start, plan, compiled=by_loops))
        result = combine(result, part)
    if plan.sample_rate > 0:
        result.sample = np.concatenate([result.sample, *samples])
    return _with_partial_rows(result, X, plan)


def _sub_block(
    route: Route, Xs: np.ndarray, plan: PassPlan, U: np.ndarray | None, ws: Workspace
) -> tuple[BlockStats, np.ndarray | None] | None:
    """Sub-block ``Xs``'s statistics by ``route`` and the mask of its rows finite as stored
    (None: all are, or, in one sweep, no row sample is drawn); None where the route declines."""
    if route == "one_sweep":
        return one_sweep(np.ascontiguousarray(Xs), plan, U, sub_block_rows=SUB_BLOCK_ROWS)
    if route == "two_sweeps":
        return two_sweeps(Xs, plan, U, ws)
    if route == "compiled_moments":
        return compiled_moments(Xs, ws)
    return numpy_part(Xs, plan, ws)


def _with_partial_rows(result: BlockStats, X: np.ndarray, plan: PassPlan) -> BlockStats:
    """``result`` (the block's complete rows) merged with its rows that have some cells missing,
    when the plan takes them (``plan.partial``): they move from ``n_nonfinite`` to ``n_rows``."""
    if plan.partial is None or not result.n_nonfinite:
        return result
    X = np.asarray(X)
    with np.errstate(over="ignore", invalid="ignore"):
        maybe = np.flatnonzero(~np.isfinite(X @ np.ones(X.shape[1], X.dtype)))  # NaN, inf (or overflow)
    rows = X[maybe].astype(np.float64, copy=False)  # a copy (fancy indexing): the partial sums' own
    observed = ~np.isnan(rows)
    codes = _missing.pattern_codes(observed)
    keep = _missing.partial_rows(rows, observed, codes)
    if not keep.any():
        return result
    if not keep.all():
        rows, observed = rows[keep], observed[keep]
        codes = None if codes is None else codes[keep]
    part = partial_stats(rows, plan, observed, codes)
    part.routes = {"partial": len(rows)}
    merged = combine(result, part)
    merged.n_nonfinite -= len(rows)
    return merged


def _row_uniforms(rows: np.ndarray, seed: int) -> np.ndarray:
    """A uniform number in [0, 1) per global row index (splitmix64 hash)."""
    with np.errstate(over="ignore"):
        z = rows.astype(np.uint64) + np.uint64(seed) * SPLITMIX_GOLDEN
        z += SPLITMIX_GOLDEN
        z = (z ^ (z >> np.uint64(30))) * SPLITMIX_MIX1
        z = (z ^ (z >> np.uint64(27))) * SPLITMIX_MIX2
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _sampled_mask(Xs: np.ndarray, finite: np.ndarray | None, plan: PassPlan) -> np.ndarray | None:
    """The rows the row sample may draw: the finite ones, and with ``plan.sample_partial`` also
    those with some cells missing (None: all rows)."""
    if finite is None or not plan.sample_partial:
        return finite
    return finite | _missing.partial_rows(np.asarray(Xs))


def _drawn(Xs: np.ndarray, finite: np.ndarray | None, first: int, plan: PassPlan, *, compiled: bool) -> np.ndarray:
    """The row sample's rows of ``Xs`` (rows ``first ..`` of the data; ``finite``: the mask of
    its rows finite as stored, None: all are), as stored, exactly, in float64, by the compiled
    draw or numpy's hash (the same rows); drawn ``SUB_BLOCK_ROWS`` rows at a time, so that the
    draw's temporaries stay the size of a sub-block's when ``Xs`` is a whole block."""
    parts = [np.empty((0, Xs.shape[1]))]
    for start in range(0, len(Xs), SUB_BLOCK_ROWS):
        rows = Xs[start : start + SUB_BLOCK_ROWS]
        ok = None if finite is None else finite[start : start + SUB_BLOCK_ROWS]
        if compiled:
            keep = _compiled.sampled_rows(first + start, len(rows), plan.seed, plan.sample_rate)
            if ok is not None:
                keep = keep[ok[keep]]
        else:
            keep = _row_uniforms(np.arange(first + start, first + start + len(rows)), plan.seed) < plan.sample_rate
            if ok is not None:
                keep &= ok
        parts.append(np.array(rows[keep], dtype=np.float64))
    return np.concatenate(parts)
