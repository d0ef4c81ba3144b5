"""Rows judged with cells at a saturation limit: the quantity lay at or beyond the limit.

A sensor clipped at its range limit reads the limit whenever the quantity lies beyond it
(``saturation_limits_``).  Such a cell is *censored*: the row's other cells are measured, the
censored quantity ``t`` is known only to lie beyond the limit ``L``.  A row with censored cells
``S`` (observed cells ``O``; rows centred, in units of the fitted spread) is judged by

    ``d2 = min over t beyond L of d2(y_O, t)  -  min over t beyond L of d2(t)``

- ``d2(y_O, t)``: the squared distance of the row with its censored cells at ``t`` (its other missing
  cells integrated out): ``d2(y_O) + (t - t_hat)^T V^-1 (t - t_hat)``, with ``t_hat`` and ``V``
  the conditional mean and covariance of the censored cells given the observed ones;
- ``d2(t) = t^T C_SS^-1 t``: the censored cells' own distance under the model's marginal law.

The first term takes the quantity at its most plausible value beyond the limit; the second takes
away what *any* reading beyond the limit costs on its own (0 for a limit on the near side of the
centre), so being at the limit, ordinary for a channel that saturates, is not counted against the
row, while a row whose other cells place the quantity far beyond the limit (a process excursion
along the channel's direction) is charged for the distance past it.  This is ``-2 log`` of the
row's density among the rows that saturate, profiled over ``t``, up to a constant; the row is
judged on its observed cells and its censored ones (``n_observed + |S|`` channels).  Where the
clipped channel follows the factors, the rows that saturate lie in the factors' tail: judged on
their other cells alone they were flagged 3.4 times as often as the other clean rows
(benchmarks/CELLWISE.md).

Both minima are convex quadratic programs over a box (each ``t_i`` on its limit's far side), solved
exactly by trying every set of cells held at their limits (:func:`least_beyond`; 2^m sets for m
censored cells, up to :data:`MAX_CENSORED`).  A row with more censored cells is judged on its other
cells alone (the censored ones left out, as missing ones).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from ._precision import working_unit

__all__ = ["MAX_CENSORED", "charged_d2", "least_beyond"]

#: Censored cells in one row beyond which the row is judged on its other cells alone: the exact
#: solution tries 2^m sets of cells held at their limits (16 for 4).
MAX_CENSORED = 4


def least_beyond(A: np.ndarray, c: np.ndarray, limit: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """``min (t - c)^T A (t - c)`` over ``t`` with ``t_i >= limit_i`` where ``upper``, else ``t_i <= limit_i``.

    Parameters
    ----------
    A : ndarray of shape (r, m, m)
        Positive definite matrices, one per row.
    c, limit : ndarray of shape (r, m)
        The unconstrained minimiser and the limits.
    upper : ndarray of bool, shape (r, m)
        Which limits are upper ones (``t`` at or above them).

    Returns
    -------
    ndarray of shape (r,)
        The least value, exact: the minimiser of a convex quadratic over a box holds some set of
        coordinates at their limits and is the unconstrained minimiser in the others, so the least
        value over every set whose minimiser is feasible is the minimum.
    """
    r, m = c.shape
    sign = np.where(upper, 1.0, -1.0)
    best = np.full(r, np.inf)
    with np.errstate(over="ignore", invalid="ignore"):
        for held in itertools.product((False, True), repeat=m):
            held = np.array(held)
            free = ~held
            t = np.where(held, limit, c)
            if held.any() and free.any():  # the free cells' minimiser given the held ones
                shift = np.einsum("rij,rj->ri", A[:, free][:, :, held], (limit - c)[:, held])
                t[:, free] = c[:, free] - np.linalg.solve(A[:, free][:, :, free], shift[..., None])[..., 0]
            feasible = np.all(sign[:, free] * (t - limit)[:, free] >= 0.0, axis=1)  # held cells: at the limit
            d = t - c
            value = np.einsum("ri,rij,rj->r", d, A, d)
            best = np.where(feasible & (value < best), value, best)
    return best


def charged_d2(model: Any, Y: np.ndarray, cond, censored: np.ndarray,
               upper: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's squared distance with its censored cells judged as censored, and the channels it judges.

    Parameters
    ----------
    model : MCPCA or ModelView
        The fitted model (``components_`` and its floored variances in its working unit,
        :func:`._precision.working_unit`).
    Y : ndarray of shape (n, p)
        The rows, centred, in the working unit; a censored cell holds its limit.
    cond : _missing.Conditional
        The rows completed with their censored (and missing) cells left out.
    censored, upper : ndarray of bool, shape (n, p)
        The censored cells, and which of them are at an upper limit.

    Returns
    -------
    d2 : ndarray of shape (n,)
        See the module docstring; ``cond.d2`` for rows without censored cells, or with more than
        :data:`MAX_CENSORED`.
    counts : ndarray of shape (n,)
        ``cond.n_observed``, plus the censored cells of the rows judged with them.
    """
    d2 = np.array(cond.d2, dtype=np.float64, copy=True)
    counts = np.array(cond.n_observed, copy=True)
    if not censored.any():
        return d2, counts
    lam, noise, unit = working_unit(model)
    lam, noise = np.ldexp(lam, -2 * unit), np.ldexp(noise, -2 * unit)
    C = model.components_
    for rows, cols, cov in cond.groups:
        mask = censored[rows[:, None], cols]
        m_row = mask.sum(axis=1)
        for m in np.unique(m_row[(m_row > 0) & (m_row <= MAX_CENSORED)]):
            sel = np.flatnonzero(m_row == m)
            r = rows[sel]
            pos = np.nonzero(mask[sel])[1].reshape(len(sel), m)  # the censored cells among the row's gaps
            ch = np.take_along_axis(cols[sel], pos, axis=1)
            given = cov[sel][np.arange(len(sel))[:, None, None], pos[:, :, None], pos[:, None, :]]
            Cs = C[:, ch]  # (k, r, m): the model's marginal covariance of the censored channels
            marginal = np.einsum("kri,k,krj->rij", Cs, lam, Cs)
            if model.n_components_ < model.n_features_in_:
                marginal += noise * (np.eye(m) - np.einsum("kri,krj->rij", Cs, Cs))
            limit, up = Y[r[:, None], ch], upper[r[:, None], ch]
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                beyond = least_beyond(_inverse(given), cond.completed[r[:, None], ch], limit, up)
                own = least_beyond(_inverse(marginal), np.zeros_like(limit), limit, up)
                value = d2[r] + beyond - own
            ok = np.isfinite(value)
            d2[r[ok]] = np.maximum(value[ok], 0.0)
            counts[r[ok]] += m
    return d2, counts


def _inverse(S: np.ndarray) -> np.ndarray:
    """Inverses of a stack of covariances; NaN for a singular one (its rows keep their distance)."""
    try:
        return np.linalg.inv(S)
    except np.linalg.LinAlgError:
        return np.stack([_one_inverse(s) for s in S]) if len(S) else S


def _one_inverse(S: np.ndarray) -> np.ndarray:
    try:
        return np.linalg.inv(S)
    except np.linalg.LinAlgError:
        return np.full(S.shape, np.nan)
