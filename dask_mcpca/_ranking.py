"""Which channel a row's largest contribution names, ranked faster than the compiled loop and vouched for.

:func:`._distances.distances_and_top` computes a block's distances in the compiled loop
(:func:`._compiled.row_distances`), which can also rank each row's channels by their reconstruction-based
contributions ``(y M)_a^2`` (``M`` = :func:`._precision.contribution_matrix`), one more p x p product a row at
the loop's speed.  From :data:`FAST_TOP_MIN_ROWS` complete rows on, the channels are ranked instead from one
product made at BLAS speed: a float32 product of the block's own (:func:`top_by_product`), or the float64
product the shift rule makes anyway (:func:`top_from_product`, :func:`._shift.residual_product`).  Each
bounds its rounding and hands back to the loop every row whose ranking it cannot vouch for (near ties, the
centre, rows far out), so the channel is the loop's, row for row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._compiled import compiled
from ._precision import contribution_matrix

__all__ = ["FAST_TOP_MIN_ROWS", "FLOAT32_ROOM", "ranks_in_float32", "top_by_product", "top_from_product",
           "top_matrix_of"]

#: Complete rows from which :func:`._distances.distances_and_top` ranks the channels from one product
#: (:func:`top_by_product`, :func:`top_from_product`) instead of in the compiled loop; fewer go through the loop.
FAST_TOP_MIN_ROWS = 64
#: Bound on a row's float32 products in :func:`top_by_product` (float32 reaches 3.4e38; the loop's sum of
#: squared contributions, in float64, stays finite far beyond).
FLOAT32_ROOM = 1e30


def top_matrix_of(model: Any) -> np.ndarray:
    """:func:`._precision.contribution_matrix` in Fortran order, for :func:`._compiled.row_distances`: its loop runs
    down a column (``top_matrix[j, a]`` over ``j``), which is then contiguous: 4.7x faster at p = 300
    (issue 37 point 4).  The distances do not read it; the channel ranked first (all the loop keeps of
    the contributions) was the same on every row checked (50,000 rows of the 300-channel benchmark
    store, and the tests' expected channels)."""
    return np.asfortranarray(contribution_matrix(model))


def ranks_in_float32(top_matrix: np.ndarray) -> bool:
    """Whether :func:`top_by_product` can rank with ``top_matrix``: finite, its diagonal (the channels' root
    precisions) within float32's range."""
    return bool(np.isfinite(top_matrix).all()) and float(np.abs(np.diag(top_matrix)).max(initial=0.0)) < FLOAT32_ROOM


def top_by_product(rows: np.ndarray, mean: np.ndarray, unit: int, top_matrix: np.ndarray):
    """The channel the compiled loop ranks first (:func:`._compiled.row_distances`: the first largest
    ``(y M)_a^2``, ``y`` the row about ``mean`` in the distances' unit ``2^unit``, ``M = top_matrix``) for
    complete ``rows``, from one float32 product (single-precision BLAS, about 4x the loop's float64 speed at
    p = 300), and the rows it cannot vouch for.

    ``M = P D^-1/2`` (:func:`._precision.contribution_matrix`), so with ``w = diag(M) = sqrt(diag(P))``,
    ``(x - mean) M = ((x - mean) w) C`` with ``C = D^-1/2 P D^-1/2`` (entries at most 1): both factors of
    order one whatever the channels' units, each product's rounding ``e <= (p + 4) u sum_j |z_j C_ja|
    <= (p + 4) u |z| max_a |C_a|`` (``z = (x - mean) w``, ``u`` float32's unit round-off, any order of
    summation; plus an absolute term below float32's normal range), the loop's float64 value far closer.
    Where the largest ``|(z C)_a|`` exceeds every other by more than twice that (doubled again as a margin),
    both rankings put the same channel first, strictly; the other rows (near ties, a row at the centre,
    rows whose products could leave float32's range or whose squared contributions could overflow the
    loop's float64 sum) are returned, for the loop to rank.
    """
    n, p = rows.shape
    w = np.diag(top_matrix).copy()
    w[w == 0] = 1.0  # an unseen channel: its row and column of M are 0
    C = top_matrix / w[:, None]
    Z = np.empty((n, p), np.float32)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):  # such rows are not vouched for below
        np.multiply(np.subtract(rows, mean, dtype=np.float64), w, out=Z, casting="unsafe")
        V = Z @ C.astype(np.float32)
        norms = np.sqrt(np.einsum("ij,ij->i", Z, Z, dtype=np.float64))
        np.abs(V, out=V)
        first = V.argmax(axis=1)
        at = (np.arange(n), first)
        best = V[at].astype(np.float64)
        V[at] = -1.0
        gap = best - V.max(axis=1)
        u, tiny = float(np.finfo(np.float32).eps) / 2, float(np.finfo(np.float32).tiny)
        column = float(np.sqrt((C**2).sum(axis=0)).max(initial=0.0))
        bound = (p + 4) * u * norms * column + tiny * (p + np.abs(C).sum(axis=0).max(initial=0.0) + np.sqrt(p) * norms)
        # the loop's contributions are 2^-unit times these: its sum of their squares stays within float64's range
        room = min(FLOAT32_ROOM, float(np.ldexp(1e150, unit)))
        sure = (gap > 4.0 * bound) & (norms * float(np.linalg.norm(C)) < room)
    return first.astype(np.int16), np.flatnonzero(~sure)


def top_from_product(rows: np.ndarray, mean: np.ndarray, unit: int, top_matrix: np.ndarray, product: np.ndarray,
                      exp: int):
    """:func:`top_by_product`'s ranking from ``product``, the rows' ``(y M) 2^exp`` already made in float64
    (``y`` the row about ``mean``, ``M = top_matrix``), by one compiled sweep (:func:`_rank_products`):
    the channel the loop ranks first, and the rows it cannot vouch for.

    Each of the product's values and the loop's (float64, any order of summation and FMA) is within
    ``b = (p + 4) u |z| max_a |C_a|`` of ``(y M)_a`` (``u = 2^-53``; ``z``, ``C``: :func:`top_by_product`'s, so
    ``sum_j |y_j M_ja| <= |z| |C_a|``), plus an absolute term at the edge of float64's normal range.  Where the
    largest ``|product_a|`` exceeds every other by more than ``4 b`` (times ``2^exp``), the loop's ranking
    puts the same channel first, strictly, and its squares too (the gap is many units of their rounding).
    Rows whose loop could overflow its float64 sum of squared contributions, and non-finite products, are
    returned, as are ties and the centre."""
    n, p = rows.shape
    w = np.diag(top_matrix).copy()
    w[w == 0] = 1.0  # an unseen channel: its row and column of M are 0
    C = top_matrix / w[:, None]
    first, gap, norm2 = np.empty(n, np.int16), np.empty(n), np.empty(n)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):  # such rows are not vouched for below
        _rank_products(product, rows, np.asarray(mean, np.float64), w, first, gap, norm2)
        norms = np.sqrt(norm2)
        u, tiny = float(np.finfo(np.float64).eps) / 2, float(np.finfo(np.float64).tiny)
        column = float(np.sqrt((C**2).sum(axis=0)).max(initial=0.0))
        bound = (p + 4) * u * norms * column + tiny * (p + np.abs(C).sum(axis=0).max(initial=0.0) + np.sqrt(p) * norms)
        # the loop's contributions are 2^-unit times (y M): its sum of their squares stays within float64's range
        sure = (gap > np.ldexp(4.0 * bound, exp)) & (norms * float(np.linalg.norm(C)) < float(np.ldexp(1e150, unit)))
    return first, np.flatnonzero(~sure)


@compiled(fastmath=False)
def _rank_products(V, rows, mean, w, first, gap, norm2):  # pragma: no cover - compiled
    """Per row ``i`` of ``V`` (n x p, float64): the first index of its largest ``|V_ia|`` into ``first[i]``,
    that largest less the next largest into ``gap[i]`` (NaN where a value is NaN or the largest is
    infinite; with one channel, the largest plus 1), and ``sum_j ((rows_ij - mean_j) w_j)^2`` into ``norm2[i]``."""
    n, p = V.shape
    for i in range(n):
        best = -1.0
        second = -1.0
        at = 0
        odd = False
        for a in range(p):
            v = abs(V[i, a])
            if v > best:
                second = best
                best = v
                at = a
            elif v > second:
                second = v
            elif v != v:
                odd = True
        s = 0.0
        for j in range(p):
            z = (rows[i, j] - mean[j]) * w[j]
            s += z * z
        first[i] = at
        gap[i] = np.nan if odd or not best < np.inf else best - second
        norm2[i] = s
