"""A wide kernel pass at the price of its quadratic forms: the bulk's plain sums, kept from one pass.

A robust step's block costs two products of ``X.T @ X``'s size (:func:`._kernels.wide_block`): the
quadratic forms (a TRMM) and the weighted sums (a SYRK).  Yet a flat-top kernel gives most rows
weight 1, so its weighted sums are the plain sums of every row less the few rows it does not hold
whole::

    sum_k g_k y_k y_k^T = sum_{bulk} y_k y_k^T - sum_{bulk, g < 1} (1 - g_k) y_k y_k^T
                          + sum_{not bulk} g_k y_k y_k^T

(and the same for the weighted sum and the weight, by a column of ones).  The first pass that can
(:func:`box_for`) collects the bulk's plain sums with its SYRK; the runner keeps them
(:class:`._passes.PassRunner`), and every later pass computes the quadratic forms and only the
small corrections: one product instead of two.  The plain sums are moved to the later pass's
centre exactly (:func:`completed`).

The bulk is a box of the values (each within ``lo`` and ``hi``), not the rows near the current
fit: membership must be the same in every pass, and a test of the values as read is.  The box is
:data:`MARGIN` times as wide as the flat tops of the pass that collects, so nearly every row a
later kernel weighs is in it; a row beyond it (a gross outlier) is weighed by itself.  It also
bounds the cancellation: the rows subtracted lie within the box, whose squares are at most a few
thousand times the bulk's (a relative error near 1e-13), while a spike of 1e10 spreads is never in
the plain sums.

Where a block or sub-block is not served by the wide route in a later pass, its bulk rows' plain
sums are taken out of the corrections (:meth:`BlockBulk.add_unserved`); every bulk row is counted either way,
and the client checks the count against the kept sums (:func:`completed`): a pass that does not
match (a block that took another route) is made again without the bulk.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np
from scipy.linalg.lapack import dtrtri as _lapack_trtri

from . import _compiled
from ._blas import syrk_update
from ._block_rows import scaled, shifted
from ._stats import BlockStats, BulkBox, BulkSums, PassPlan, combine, from_sums

__all__ = ["KEEP_BULK", "MARGIN", "BlockBulk", "KeptBulk", "box_for", "collected", "completed", "inside"]

#: Keep the bulk's plain sums between a fit's wide kernel passes (``benchmarks/scaling.py``'s
#: ``BEFORE`` sets it off: every pass then weighs every row by its SYRK).
KEEP_BULK = True

#: The box's half-width per channel, in units of the widest flat top's reach along the channel
#: (``sqrt(2 z_J (A^-1)_ii)``: no row in a flat top lies further out).
MARGIN = 2.0


class KeptBulk(NamedTuple):
    """The bulk's plain sums a runner keeps (:class:`._passes.PassRunner`): the box, the sums about its
    origin, and the working unit and channel scales the rows were seen in (the sums hold for those)."""

    box: BulkBox
    plain: np.ndarray
    unit_exp: int
    scale: np.ndarray | None


def box_for(plan: PassPlan, kept: KeptBulk | None) -> BulkBox | None:
    """The bulk box of a wide flat-top kernel pass: the kept one (``kept``, this pass uses its
    plain sums), or a new one about ``plan.center`` that this pass collects; None where the
    pass's kernels have no triangular factor (the wide route weighs every row then)."""
    if kept is not None:
        return BulkBox(kept.box.lo, kept.box.hi, kept.box.origin, collect=False)
    try:
        L = np.linalg.cholesky((plan.kernels[0] + plan.kernels[0].T) / 2)
    except np.linalg.LinAlgError:
        return None
    Linv, info = _lapack_trtri(L, lower=1)  # diag(A^-1) = the column sums of squares of L^-1
    if info:
        return None
    reach = MARGIN * np.sqrt(2 * float(np.max(plan.offsets)) * np.einsum("ij,ij->j", Linv, Linv))
    if not np.all(np.isfinite(reach)):
        return None
    lo, hi = np.ldexp(plan.center - reach, plan.unit_exp), np.ldexp(plan.center + reach, plan.unit_exp)
    return BulkBox(lo, hi, np.asarray(plan.center, np.float64), collect=True)


def inside(X: np.ndarray, box: BulkBox) -> np.ndarray:
    """Mask of the rows of ``X`` (as the block function reads them) whose every value is in the box."""
    if _compiled.AVAILABLE and X.dtype in (np.float64, np.float32):
        out = np.empty(len(X), bool)
        _compiled.within(np.ascontiguousarray(X), box.lo, box.hi, out)
        return out
    return np.all((X >= box.lo) & (X <= box.hi), axis=1)


class BlockBulk:
    """One block's bulk sums while its sub-blocks come (:func:`._kernels.wide_block`).

    The plain sums grow by one in-place SYRK per sub-block (BLAS's ``dsyrk`` with ``beta = 1``:
    no p x p temporary); the rows each kernel does not hold whole, weighted, are gathered and
    multiplied once per block (:meth:`finish`): at p = 1000 a p x p product per sub-block of
    512 rows cost as much as the rows' own.
    """

    def __init__(self, n_kernels: int, p: int, collect: bool):
        self.plain = np.zeros((p + 1, p + 1), order="F") if collect else None
        self.less = [[] for _ in range(n_kernels)]  # rows whose sums come out of kernel j's
        self.more = [[] for _ in range(n_kernels)]  # rows out of the bulk, weighed by themselves
        self.n_rows, self.size = 0, p + 1

    def add_rows(self, Y: np.ndarray, G: np.ndarray, rows_in: np.ndarray) -> None:
        """Add a served sub-block: ``Y`` its working rows with a column of ones (overwritten where
        this block collects), ``G`` the kernels' weights (J x n), ``rows_in`` the bulk's rows."""
        for j, g in enumerate(G):
            below = np.flatnonzero(rows_in & (g < 1))  # bulk rows this kernel does not hold whole
            self.less[j].append(Y[below] * np.sqrt(1 - g[below])[:, None])
            beyond = np.flatnonzero(~rows_in & (g > 0))
            if len(beyond):
                self.more[j].append(Y[beyond] * np.sqrt(g[beyond])[:, None])
        if self.plain is not None:
            Y[~rows_in] = 0.0  # they add exact zeros to the plain sums
            self.plain = syrk_update(1.0, Y, self.plain)
        self.n_rows += int(rows_in.sum())

    def add_unserved(self, Xs: np.ndarray, rows_in: np.ndarray, plan: PassPlan) -> None:
        """Account for a sub-block the wide route did not serve (its rows weighed in full elsewhere):
        its bulk rows' plain sums come out of every kernel's, and go into the plain sums collected."""
        Y = np.empty((int(rows_in.sum()), len(plan.center) + 1))
        with np.errstate(over="ignore", invalid="ignore"):
            scaled(shifted(np.asarray(Xs[rows_in], np.float64), np.ldexp(plan.center, plan.unit_exp), Y[:, :-1]),
                   -plan.unit_exp)
        Y[:, -1] = 1.0
        if self.plain is not None:
            self.plain = syrk_update(1.0, Y, self.plain)
        for less in self.less:
            less.append(Y)
        self.n_rows += len(Y)

    def finish(self) -> BulkSums:
        """The block's :class:`._stats.BulkSums`: each kernel's corrections in one product per kind of row."""
        corrections = []
        for less, more in zip(self.less, self.more, strict=True):
            C = None
            for rows, sign in ((less, -1.0), (more, 1.0)):
                if rows:
                    C = syrk_update(sign, np.concatenate(rows), C)
            corrections.append(np.zeros((self.size, self.size)) if C is None else _mirrored(C))
        plain = None if self.plain is None else _mirrored(self.plain)
        return BulkSums(plain, np.stack(corrections), self.n_rows)


def _mirrored(C: np.ndarray) -> np.ndarray:
    """The symmetric matrix of upper triangle ``C``."""
    return np.triu(C) + np.triu(C, 1).T


def collected(stats: BlockStats, p: int) -> np.ndarray:
    """The bulk's plain sums a collecting pass gathered: zeros where no block was served (no bulk rows)."""
    plain = None if stats.bulk is None else stats.bulk.plain
    return np.zeros((p + 1, p + 1)) if plain is None else plain


def completed(stats: BlockStats, plan: PassPlan, kept: np.ndarray | None) -> BlockStats | None:
    """The pass's statistics with its bulk sums completed: the plain sums (this pass's, or ``kept``,
    moved from the box's origin to the plan's centre) plus each kernel's corrections, merged with
    the rows weighed in full.  None where a pass using ``kept`` met another count of bulk rows
    than the pass that collected them (a block took another route: the caller weighs every row)."""
    sums, p = stats.bulk, len(plan.center)
    if sums is None:
        sums = BulkSums(None, np.zeros((plan.n_kernels, p + 1, p + 1)), 0)
    if plan.bulk.collect:
        plain = collected(stats, p)
    else:
        if sums.n_rows != round(kept[p, p]):
            return None
        d = np.append(plan.center - plan.bulk.origin, 0.0)  # [y0; 1] -> [y0 - d; 1] = M [y0; 1]
        M = np.eye(p + 1)
        M[:p, p] = -d[:p]
        plain = M @ kept @ M.T
    W = plain[None] + sums.corrections
    J = plan.n_kernels
    part = from_sums(0, np.zeros(J), W[:, p, p].copy(), W[:, p, :p].copy(), W[:, :p, :p].copy(), plan.center)
    rest = replace(stats, bulk=None)
    if not np.any(rest.weight):  # every row in the bulk's sums: what combine would give, without its p x p work
        return replace(rest, log_scale=part.log_scale, weight=part.weight, mean=part.mean, scatter=part.scatter)
    return combine(rest, part)
