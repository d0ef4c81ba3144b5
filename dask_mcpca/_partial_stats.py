"""A kernel pass's statistics of rows with missing cells: weights from the observed cells, the E-step.

The numpy spelling of a ``"partial"`` pass's block (:func:`partial_stats`,
chosen by the router, :func:`._block.block_stats`, for rows with NaN cells)
and of a cellwise pass's completed rows (:func:`completed_sums`): each row is
weighed on its observed cells (:class:`._stats.PartialPlan`'s radii by count),
then either returned as sums of its observed cells for the client's EM (rows
of the plan's ``patterns``) or completed by its conditional expectation, the
conditional covariance of its missing cells added (the consistent E-step of
:mod:`._missing`).  The weighted sums are those of :mod:`._kernels`.
"""

from __future__ import annotations

import functools

import numpy as np

from . import _missing
from ._block_rows import Workspace, excluded_rows
from ._kernels import kernel_weights, weighted_sums
from ._stats import BlockStats, PassPlan, from_sums

__all__ = ["completed_sums", "estep_scales", "partial_stats"]


@functools.lru_cache(maxsize=8)
def _full_precision(scatter: bytes, p: int) -> np.ndarray | None:
    """:func:`._missing.full_precision`, once per pass's scatter in a process."""
    return _missing.full_precision(np.frombuffer(scatter, dtype=np.float64).reshape(p, p))


@functools.lru_cache(maxsize=256)
def _conditional_model(scatter: bytes, p: int, observed: bytes) -> _missing.ConditionalModel:
    """:func:`._missing.conditional_model`, once per pass's scatter and pattern in a process
    (every block of a pass asks for the same few)."""
    mask = np.frombuffer(observed, dtype=bool)
    return _missing.conditional_model(np.frombuffer(scatter, dtype=np.float64).reshape(p, p), mask)


@functools.lru_cache(maxsize=16)
def _estep_scales(offsets: bytes, shape: tuple, kernel_size2: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`._missing.estep_scales`, once per pass's radii in a process."""
    return _missing.estep_scales(np.frombuffer(offsets, dtype=np.float64).reshape(shape), kernel_size2)


def estep_scales(part_plan) -> tuple[np.ndarray, np.ndarray]:
    """The E-step's scales of a :class:`._stats.PartialPlan`'s kernels (:func:`._missing.estep_scales`):
    ``c_p`` per kernel, for the conditional covariances, and ``c_p / c_k`` per kernel and count,
    for the completed rows' second moments."""
    offsets = np.ascontiguousarray(part_plan.offsets, dtype=np.float64)
    return _estep_scales(offsets.tobytes(), offsets.shape, float(part_plan.kernel_size2))


def _completed_scatter(Y: np.ndarray, G: np.ndarray, ratio: np.ndarray, counts: np.ndarray):
    """``sum G``, ``sum G y`` and ``sum G (c_p / c_k) y y^T`` per kernel of completed rows judged
    on ``counts`` cells (the E-step's consistent second moments, :mod:`._missing`).

    One SYRK per kernel; with several kernels, the rows of weight 1 in each (inside every flat top)
    differ between kernels only by their count's ``c_p / c_k``: their ``y y^T`` are summed once per
    count, then scaled per kernel, and only the other rows get a SYRK per kernel."""
    ws = Workspace(np.float64)
    G2 = G * ratio[:, counts]
    shared = (G == 1.0).all(axis=0) if len(G) > 1 else np.zeros(len(Y), bool)
    rest = np.flatnonzero(~shared) if shared.any() else slice(None)
    scatter = np.stack([weighted_sums(Y[rest], g[None, rest], ws)[2][0] for g in G2])
    for k in np.unique(counts[shared]):
        scatter += ratio[:, k, None, None] * weighted_sums(Y[shared & (counts == k)], None, ws)[2][0]
    return G.sum(axis=1), G @ Y, scatter


def _partial_weights(part_plan, d2: np.ndarray, counts: np.ndarray, excluded: np.ndarray | None):
    """The weights of rows judged on ``counts`` cells each (:class:`._stats.PartialPlan`): kernel ``j`` gives
    ``exp(min(offsets[j, k] - d2 / (2 c^2), 0))``, rows ``excluded`` none; and the log-scales."""
    E = part_plan.offsets[:, counts] - d2[None, :] / (2 * part_plan.kernel_size2)
    if excluded is not None:
        E[:, excluded] = -np.inf
    return kernel_weights(E)


def completed_sums(plan: PassPlan, Y: np.ndarray, d2: np.ndarray, counts: np.ndarray, cond,
                   excluded: np.ndarray | None = None) -> BlockStats:
    """A pass's statistics of completed rows ``Y`` (working units, centred at ``plan.center``) whose
    distances ``d2`` were judged on ``counts`` cells each, with the conditional covariances of their
    completed cells (``cond``, a :class:`._missing.Conditional` of the same rows): the weights of
    :class:`._stats.PartialPlan`, the weighted sums, the covariance terms of the E-step.  Rows ``excluded``
    enter no sums.  (A cellwise pass's sums, :func:`._cells.cell_sums`.)"""
    G, log_scale = _partial_weights(plan.partial, d2, counts, excluded)
    if plan.cells is not None and np.isfinite(plan.cells.cutoff2):  # cells judged: not missing at random
        weight, wsum, scatter = weighted_sums(Y, G, Workspace(np.float64))
        scatter += cond.covariance_sums(G, Y.shape[1])
    else:  # missing cells only (a partial fit's start): the consistent E-step of partial_stats
        shrink, ratio = estep_scales(plan.partial)
        weight, wsum, scatter = _completed_scatter(Y, G, ratio, counts)
        scatter += cond.covariance_sums(G, Y.shape[1]) * shrink[:, None, None]
    return from_sums(len(Y), log_scale, weight, wsum, scatter, plan.center)


def partial_stats(
    X: np.ndarray, plan: PassPlan, observed: np.ndarray | None = None, codes: np.ndarray | None = None
) -> BlockStats:
    """A kernel pass's statistics of rows with missing cells (float64, as stored; overwritten):
    weights from the observed cells, then either sums of the observed cells for the client's EM
    (rows of the plan's ``patterns``) or the rows completed by the conditional expectation plus
    the conditional covariance of the missing cells (:class:`._stats.PartialPlan`).  Completed rows go
    through :func:`._missing.conditional` (the model's precision: a row with m gaps costs an
    m x m solve); only where the scatter is singular, through each pattern's own algebra.
    ``observed`` (``~isnan(X)``) and its pattern codes may be given."""
    part_plan = plan.partial
    n, p = X.shape
    J = plan.n_kernels
    observed = ~np.isnan(X) if observed is None else observed
    excluded = excluded_rows(X, plan) if plan.excluded or plan.excluded_rows else None
    Y = _to_working_units(X, plan)
    scatter64 = np.ascontiguousarray(part_plan.scatter, dtype=np.float64)
    theta = _full_precision(scatter64.tobytes(), p)
    grouped = np.ones(n, bool) if theta is None else _missing.rows_of_patterns(observed, part_plan.patterns, codes)
    groups = list(_missing.patterns(observed[grouped], None if codes is None else codes[grouped]))
    # The rows regrouped by pattern (in their order within one), each pattern then a slice; the
    # rows completed through the precision last, in their order.
    inner = np.flatnonzero(grouped)
    rest = np.flatnonzero(~grouped)
    order = np.concatenate([*(inner[rows] for _, rows in groups), rest])
    Y, observed = Y[order], observed[order]
    if excluded is not None:
        excluded = excluded[order]
    d2, counts = np.empty(n), np.empty(n, dtype=np.intp)
    slices = []  # (mask, rows, model, key) per pattern, rows a slice; key None: completed here
    done = np.ones(n, bool)  # rows completed here, in the main sums; the others go to the client's EM
    start = 0
    for mask, rows in groups:
        rows = slice(start, start + len(rows))
        start = rows.stop
        model = _conditional_model(scatter64.tobytes(), p, mask.tobytes())
        key = _missing.pattern_key(mask)
        Yo = Y[rows][:, model.observed]
        with np.errstate(over="ignore", invalid="ignore"):
            d2[rows] = model.d2(Yo)
            if key in part_plan.patterns:
                done[rows] = False
            else:
                key = None
                Y[rows, model.missing] = Yo @ model.regression.T
        counts[rows] = len(model.observed)
        slices.append((mask, rows, model, key))
    tail = slice(start, n)
    cond = None
    if start < n:
        cond = _missing.conditional(Y[tail], ~observed[tail], theta)
        d2[tail], Y[tail], counts[tail] = cond.d2, cond.completed, cond.n_observed
    with np.errstate(over="ignore", invalid="ignore"):  # overflow in working units: weight 0
        far = ~np.isfinite(d2) | (done & ~np.isfinite(Y @ np.ones(p)))  # the others' missing cells are NaN
    if far.any():
        d2[far] = np.inf
        Y[far] = 0.0
    G, log_scale = _partial_weights(part_plan, d2, counts, excluded)
    # The E-step's consistency (:mod:`._missing`): second moments times c_p / c_k, C times c_p.
    shrink, ratio = estep_scales(part_plan)
    gaps = {}
    for mask, rows, model, key in slices:
        if key is not None:
            g, Yo = G[:, rows], Y[rows][:, model.observed]
            r = ratio[:, len(model.observed)]
            second = np.stack([(Yo * (gj * rj)[:, None]).T @ Yo for gj, rj in zip(g, r, strict=True)])
            gaps[key] = _missing.GapSums(mask, g.sum(axis=1), g @ Yo, second)
    kept = slice(None) if done.all() else done
    weight, wsum, scatter = _completed_scatter(Y[kept], G[:, kept], ratio, counts[kept])
    for _, rows, model, key in slices:
        if len(model.missing) and key is None:
            cell = np.ix_(model.missing, model.missing)
            for j in range(J):
                scatter[j][cell] += (G[j, rows].sum() * shrink[j]) * model.residual
    if cond is not None:
        scatter += cond.covariance_sums(G[:, tail], p) * shrink[:, None, None]
    part = from_sums(n, log_scale, weight, wsum, scatter, plan.center)
    part.n_far = int(far.sum())
    part.n_partial = n
    part.gaps = gaps or None
    return part


def _to_working_units(X: np.ndarray, plan: PassPlan) -> np.ndarray:
    """``(X - centre) * 2**-unit_exp`` in place (X float64, the caller's copy), as
    ``ldexp(X - ldexp(centre, e), -e)``: the product by a power of two is exact, or rounds as
    ldexp does."""
    factor = np.ldexp(1.0, -plan.unit_exp)
    with np.errstate(over="ignore", invalid="ignore"):
        np.subtract(X, np.ldexp(plan.center, plan.unit_exp), out=X)
        if factor == 0.0 or not np.isfinite(factor):  # |unit_exp| beyond float64's exponents
            return np.ldexp(X, -plan.unit_exp)
        X *= factor
    return X
