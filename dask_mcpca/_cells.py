"""Cells you cannot trust: per-cell flags under a Gaussian model, and rows completed from their good cells.

A wide archive's glitches hit single cells, one channel of one row.  With p
channels and a share ``eps`` of bad cells, ``1 - (1 - eps)^p`` of the rows
hold one (63 % at p = 100, eps = 1 %): a fit that can only down-weight whole
rows has no clean majority left.  Here a cell is judged on its own, as in
DDC and cellMCD (Rousseeuw and Van den Bossche 2018; Raymaekers and
Rousseeuw 2023), and a flagged cell is treated as missing (MacroPCA, Hubert,
Rousseeuw and Van den Bossche 2019): the row keeps its other cells.

Everything comes from the model's precision matrix ``T = S^-1`` (mean 0:
rows are centred first; a rank-deficient scatter's round-off directions at the
variance floor, :func:`cell_precision`).  For a row ``y`` with missing (or flagged) cells
``M`` and observed cells ``O``, with ``y_M`` set to 0 and ``t0 = T y``:

- the missing cells' conditional expectation is ``u_M = -T_MM^-1 t0_M``
  and their conditional covariance ``T_MM^-1`` (Schur complement);
- for the completed row ``u`` (``u_O = y_O``), ``T u`` is ``S_OO^-1 y_O`` on
  the observed cells and 0 on the missing ones, and the squared distance on
  the observed cells is ``d^2_O = u^T T u``.

Only an ``|M| x |M|`` system is solved per row, not a ``|O| x |O|`` inverse
per pattern of observed cells: rows with a few bad cells each, all in other
places, cost one more product by ``T`` (:func:`._missing.conditional`, which
rows with missing cells share).

A cell's standardized residual is ``r_j = (S_OO^-1 y_O)_j / sqrt(T_jj)``:
how far the cell lies from what the row's other observed cells predict,
in units of its conditional spread given all other channels (``r_j^2`` is
at most the drop of ``d^2_O`` when the cell is left out, so a row close to
the model has no flagged cell).  :func:`flag_cells` flags, row by row, the
cells with ``r_j^2`` above ``cutoff2`` and at least ``GREEDY_SHARE^2`` of the
row's largest, then judges the rest again with those cells left out, so a
gross cell does not smear into the residuals of its row's clean cells.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._missing import conditional, equivalent_d2
from ._partial_stats import completed_sums
from ._power import direction_floors, spread_directions
from ._schedule import quantile_of
from ._start import precision

__all__ = [
    "breakdown_message",
    "breakdown_rows",
    "CELL_QUANTILE",
    "CellPlan",
    "cell_stats",
    "cell_sums",
    "judge",
    "Judged",
    "cell_cutoff2",
    "cell_precision",
    "flag_cells",
    "robust_columns",
]

#: A clean Gaussian cell is flagged with this probability's complement (two-sided): 0.1 %.
CELL_QUANTILE = 0.999

#: Within one round a row's cells are flagged only if their squared residual is at least this
#: share squared of the row's largest: a gross cell's smear into a clean cell of its row is a
#: partial correlation times its size, far below half of it.
GREEDY_SHARE = 0.5

#: Rounds of :func:`flag_cells` (each leaves the cells flagged so far out and judges the rest).
MAX_ROUNDS = 12


#: A row-wise fit warns when at least this share of the sample rows holds a flagged cell beyond
#: chance: a clean row of p cells holds one with probability ``1 - CELL_QUANTILE ** p`` (63 % at
#: p = 1000), so the share counted is ``1 - (1 - rows) / (1 - chance)``, the rows' glitches taken
#: independent of the clean cells' chance flags.  Where the sample expects fewer than
#: ``BREAKDOWN_MIN_CLEAN`` rows without a chance flag (p in the thousands), the rows cannot tell and
#: the row check is not made.
BREAKDOWN_ROW_SHARE = 0.5
BREAKDOWN_MIN_CLEAN = 20

#: A cellwise fit warns when at least this share of the sample's cells is flagged.
BREAKDOWN_CELL_SHARE = 0.25

#: Rows of the sample the breakdown check judges at most (:func:`breakdown_rows`).
BREAKDOWN_ROWS = 5000

#: The breakdown check judges the cells of at most ``BREAKDOWN_ROWS`` sample rows and at most this
#: many cells: 5,000 rows up to p = 100, 1,000 at p = 500.  Judging a cell costs a completion from its
#: row's other cells (p^2 per row and flagged cell): 5,000 rows were 0.2 of the client's work at
#: p = 1000 (issue 37).  The check compares a share of the rows with 50 % (``BREAKDOWN_ROW_SHARE``),
#: which 500 rows estimate within 2.3 points (one standard error).  From about p = 2,350 the row check
#: is not made: ``500,000 / p`` rows then expect fewer than ``BREAKDOWN_MIN_CLEAN`` rows without a
#: chance flag (``CELL_QUANTILE ** p`` of them).
BREAKDOWN_CELLS = 500_000

#: The breakdown check stops judging a row once more than this share of its cells is flagged
#: (:func:`flag_cells`'s ``give_up``): the row holds flagged cells, which is all the check
#: counts.  Rounds that went on to flag hundreds of a row's cells and complete it from the rest cost
#: ``m^3`` a row: 46 of a 63 s fit at p = 1000 whose 2 % of rows were off on every channel.
BREAKDOWN_GIVE_UP = 0.1


def breakdown_rows(sample: np.ndarray) -> np.ndarray:
    """The sample rows the breakdown check judges: at most ``BREAKDOWN_ROWS`` rows and
    ``BREAKDOWN_CELLS`` cells, evenly strided over the sample (the whole sample where it fits).  The
    sample is concatenated block by block, so a prefix would judge the start of the archive only."""
    n, p = sample.shape
    m = min(BREAKDOWN_ROWS, max(BREAKDOWN_CELLS // max(p, 1), 1))
    if m >= n:
        return sample
    return sample[(np.arange(m) * n) // m]


def breakdown_message(flags: np.ndarray, support: float, *, cellwise: bool) -> str | None:
    """The :class:`BreakdownWarning` message for a fit whose sample rows have cell ``flags`` under the
    fitted model and whose final step kept ``support`` of the rows' weight; None when it holds."""
    if not len(flags):
        return None
    rows, cells = float(flags.any(axis=1).mean()), float(flags.mean())
    chance = 1.0 - CELL_QUANTILE ** flags.shape[1]
    rows = 1.0 - (1.0 - rows) / (1.0 - chance) if (1.0 - chance) * len(flags) >= BREAKDOWN_MIN_CLEAN else 0.0
    if cellwise and cells >= BREAKDOWN_CELL_SHARE:
        return (f"MCPCA(cellwise=True): {cells:.0%} of the sample's cells lie far from what their rows' other "
                "cells predict, so the channels have no clean majority; check the units and the channels "
                "with most flags (cell_outliers), or leave the worst channels out")
    if not cellwise and rows >= BREAKDOWN_ROW_SHARE:
        return (f"MCPCA: {rows:.0%} of the sample rows hold a cell that the fitted model cannot explain (a "
                "value far from what the row's other channels predict, beyond the share a clean row holds by "
                f"chance at {flags.shape[1]} channels): a row-wise fit has no clean majority "
                "and its components may follow the glitches; fit with MCPCA(cellwise=True), which leaves "
                "such cells out and keeps the rest of the row")
    if np.isfinite(support) and support < 0.5:
        return (f"MCPCA: only {support:.0%} of the rows keep weight in the final step, so the fit rests on a "
                "minority of the data; if the data hold several operating states or units that differ by "
                "orders of magnitude, fit each state apart or standardise the channels")
    return None


def cell_cutoff2(quantile: float = CELL_QUANTILE) -> float:
    """The squared standardized residual above which a cell is flagged: ``chi2_1`` at ``quantile``."""
    return quantile_of("chi2", quantile, 1)


def cell_precision(scatter: np.ndarray) -> np.ndarray:
    """The precision a cellwise pass judges and completes cells with: ``S^-1``, each round-off direction
    of ``S`` given the variance floor of :func:`._power.direction_floors` (as the fitted model's
    precision gives it, :func:`._precision.floored_variances`).

    The completion ``u_M = -T_MM^-1 (T u)_M`` (module docstring) holds for the inverse only.  With the
    pseudo-inverse of a rank-deficient scatter (a channel that copies another, a total of others) it
    is wrong: ``T`` does not see the null direction, so a missing copy is completed to make the row
    lie in it (``-y`` for a copy of ``y``), and a row missing both copies meets a singular ``T_MM``
    whose inverse is round-off (conditional covariances of 1e11).  A floor variance there makes the
    null direction a constraint that the completion keeps (the copy of ``y`` completed to ``y``, with
    a conditional variance at the floor).  A full-rank scatter gets :func:`._start.precision`, bit for bit.
    """
    S = np.asarray(scatter, np.float64)
    if len(spread_directions(S)[0]) == len(S):
        return precision(S)
    w, V = np.linalg.eigh((S + S.T) / 2)
    w = np.maximum(w, 0.0)
    if not w.max(initial=0.0) > 0:
        return precision(S)
    floored = np.maximum(w, direction_floors(w, V, np.diag(S)))
    P = (V / floored) @ V.T
    return (P + P.T) / 2


@dataclass(frozen=True)
class CellPlan:
    """How a pass judges cells: the model's precision (working units) and the squared cutoff.

    ``missing_ok``: NaN cells are missing cells (``nan_policy="partial"``), else their rows are
    left out.  ``held``: ``(column, value)`` pairs of stuck sensors, in working units: such cells
    are left out as missing ones, and the row keeps its other cells.  (A saturated cell is kept at
    its limit in the fit: left out, it would be filled as if missing at random, which a reading cut
    at the top is not; measured, that moved a 50-channel fit 0.25 degrees further from the truth.)
    """

    precision: np.ndarray
    cutoff2: float
    missing_ok: bool = False
    held: tuple = ()

    def known_cells(self, raw: np.ndarray) -> np.ndarray:
        """Cells of ``raw`` rows (working units, not centred) that hold a stuck value."""
        out = np.zeros(raw.shape, bool)
        for column, value in self.held:
            out[:, int(column)] |= raw[:, int(column)] == value
        return out


def flag_cells(Y: np.ndarray, missing: np.ndarray, precision: np.ndarray, cutoff2: float,
               *, max_rounds: int = MAX_ROUNDS, start: np.ndarray | None = None,
               give_up: int | None = None) -> np.ndarray:
    """Cells of the centred rows ``Y`` that the model with ``precision`` cannot explain (boolean, Y's shape).

    Missing cells are never flagged.  Each round flags, in each row, the
    observed cells whose squared standardized residual (module docstring)
    exceeds ``cutoff2`` and is at least ``GREEDY_SHARE**2`` of the row's
    largest; the next round judges the row again with them left out.  A
    last check restores a flagged cell whose value the row's other good
    cells predict after all (its squared residual under the conditional
    model at most ``cutoff2``).  ``start``: cells taken as flagged before the
    first round (an earlier step's flags under a nearby model); the last check
    restores those the model now explains.  ``give_up``: a row with more cells flagged is judged no
    further (neither rounds nor the last check): it holds flagged cells, which is all the
    breakdown check asks (:func:`breakdown_flags`), and completing it from a few good cells would cost
    ``m^3`` a row for its ``m`` bad ones.
    """
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # far rows: inf, judged bad
        Y = np.asarray(Y, np.float64)
        missing = np.asarray(missing, bool)
        flags = np.zeros(Y.shape, bool) if start is None else np.asarray(start, bool) & ~missing
        if not np.isfinite(cutoff2):  # nothing is flagged: rows judged by their observed cells only
            return np.zeros(Y.shape, bool)
        diag = np.diag(precision)
        inv_sd = np.where(diag > 0, 1.0 / np.sqrt(np.where(diag > 0, diag, 1.0)), 0.0)
        active = np.arange(len(Y))
        for _ in range(max_rounds):
            if not len(active):
                break
            out = missing[active] | flags[active]
            cond = conditional(Y[active], out, precision)
            r2 = (cond.residual * inv_sd) ** 2
            r2[~np.isfinite(r2)] = 0.0
            top = r2.max(axis=1, initial=0.0)
            new = (r2 > cutoff2) & (r2 >= GREEDY_SHARE**2 * top[:, None]) & ~out
            changed = new.any(axis=1)
            flags[active[changed]] |= new[changed]
            active = active[changed]
            if give_up is not None:
                active = active[flags[active].sum(axis=1) <= give_up]
        judged = flags.any(axis=1)
        if give_up is not None:
            judged &= flags.sum(axis=1) <= give_up
        rows = np.flatnonzero(judged)
        if len(rows):
            cond = conditional(Y[rows], missing[rows] | flags[rows], precision)
            for group_rows, cols, cov in cond.groups:
                r = rows[group_rows]
                held = np.take_along_axis(Y[r], cols, axis=1)
                gap = held - np.take_along_axis(cond.completed[group_rows], cols, axis=1)
                fits = gap**2 <= cutoff2 * np.diagonal(cov, axis1=1, axis2=2)
                was_flagged = np.take_along_axis(flags[r], cols, axis=1)
                restore = fits & was_flagged
                if restore.any():
                    sub = flags[r]
                    np.put_along_axis(sub, cols, was_flagged & ~restore, axis=1)
                    flags[r] = sub
        return flags

def robust_columns(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each column's median and robust spread (MAD, else IQR / 1.349, else the standard deviation,
    else 1), NaN cells ignored: the univariate start of a cellwise fit."""
    X = np.asarray(X, np.float64)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
        med = np.nanmedian(X, axis=0)
        mad = 1.4826 * np.nanmedian(np.abs(X - med), axis=0)
        q1, q3 = np.nanpercentile(X, [25, 75], axis=0)
        sd = np.nanstd(X, axis=0)
    spread = np.where(mad > 0, mad, np.where(q3 - q1 > 0, (q3 - q1) / 1.349, np.where(sd > 0, sd, 1.0)))
    med = np.where(np.isfinite(med), med, 0.0)
    spread = np.where(np.isfinite(spread) & (spread > 0), spread, 1.0)
    return med, spread


def _frozen(raw: np.ndarray, plan) -> np.ndarray | None:
    """Rows (working units, not centred) equal to one of the plan's repeated rows (a frozen logger's
    records): they enter no kernel's sums.  None where the plan has none."""
    if not plan.excluded_rows:
        return None
    out = np.zeros(len(raw), bool)
    for row in plan.excluded_rows:
        out |= np.all(raw == np.asarray(row), axis=1)
    return out


@dataclass
class Judged:
    """Rows judged cell by cell under a model: their cell flags, completed rows and distances.

    ``rows`` are the positions of the rows judged in the block (the others hold an inf cell, no
    usable cell, or NaN where missing cells are not taken); ``Y`` the judged rows, centred in
    working units; ``flags`` the cells flagged; ``cond`` the rows completed from their good cells.
    """

    rows: np.ndarray
    Y: np.ndarray
    missing: np.ndarray
    flags: np.ndarray
    cond: Any
    n_rows: int
    raw: np.ndarray

    def equivalent_d2(self) -> np.ndarray:
        """Each judged row's squared distance on its good cells, mapped to p channels (inf: none)."""
        d2 = equivalent_d2(self.cond.d2, self.cond.n_observed, self.Y.shape[1])
        d2[~np.isfinite(d2)] = np.inf
        return d2


def judge(X: np.ndarray, center: np.ndarray, cells: CellPlan, *, unit_exp: int = 0,
          start: np.ndarray | None = None) -> Judged:
    """Judge the rows of ``X`` (as stored) cell by cell under the model of ``cells`` centred at ``center``
    (working units ``2**unit_exp``): :func:`flag_cells`, then the rows completed from their good cells.
    ``start``: flags to start from (a previous step's, one row per row of ``X``), else none."""
    X = np.asarray(X)
    with np.errstate(over="ignore", invalid="ignore"):
        raw = np.ldexp(np.asarray(X, np.float64), -unit_exp)  # exact: a power of two
        Y = np.ldexp(np.asarray(X, np.float64) - np.ldexp(center, unit_exp), -unit_exp)
    missing = np.isnan(Y)
    bad = np.isinf(Y).any(axis=1) | missing.all(axis=1)
    if not cells.missing_ok:
        bad |= missing.any(axis=1)
    missing |= cells.known_cells(raw)  # stuck cells: left out, the row keeps the rest
    bad |= missing.all(axis=1)
    rows = np.flatnonzero(~bad)
    Y, missing, raw = Y[rows], missing[rows], raw[rows]
    flags = flag_cells(Y, missing, cells.precision, cells.cutoff2, start=None if start is None else start[rows])
    return Judged(rows, Y, missing, flags, conditional(Y, missing | flags, cells.precision), len(X), raw)


def cell_sums(judged: Judged, plan):
    """The kernel sums of judged rows (:func:`judge`) under ``plan``'s kernels, as a block's
    :class:`._stats.BlockStats` (see :func:`cell_stats`)."""
    cond = judged.cond
    d2 = cond.d2.copy()
    U = cond.completed.copy()
    far = ~np.isfinite(d2) | ~np.isfinite(U).all(axis=1)
    d2[far] = np.inf
    U[far] = 0.0
    out = completed_sums(plan, U, d2, cond.n_observed, cond, _frozen(judged.raw, plan))
    out.n_nonfinite = int(judged.n_rows - len(judged.rows))
    out.n_far = int(far.sum())
    out.n_partial = int((judged.missing | judged.flags).any(axis=1).sum())
    out.cells_flagged = judged.flags.sum(axis=0).astype(np.int64)
    out.routes = {"cells": len(judged.rows)}
    return out


def cell_stats(X: np.ndarray, plan):
    """A kernel pass's statistics of one row block when cells are judged one by one (``plan.cells``).

    The rows are taken to working units; cells the model cannot explain
    (:func:`flag_cells`, under ``plan.cells``) and NaN cells (where the plan
    takes rows with missing cells, ``plan.cells.missing_ok``) are left out;
    each row is weighted by kernel ``j`` from its squared distance on its
    good cells, ``exp(min(offsets[j, k] - d^2_O / (2 c^2), 0))`` with the
    radius mapped to its ``k`` good cells (:class:`._stats.PartialPlan`), and
    enters the sums completed by the conditional expectation of its left-out
    cells, plus their conditional covariance (one EM step per pass).  Rows
    with an infinite cell, no good cell, or NaN where missing cells are not
    taken count as non-finite.  ``BlockStats.cells_flagged`` counts the
    flagged cells per channel.
    """
    return cell_sums(judge(X, plan.center, plan.cells, unit_exp=plan.unit_exp), plan)
