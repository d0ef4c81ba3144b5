"""A fitted model's distances: ``d^2``, the distance the outlier rule judges, and cells judged one by one.

The squared Mahalanobis distance ``d^2 = y^T P y`` of each row
(:func:`mahalanobis_d2`; with the channel of its largest contribution in the
same sweep, :func:`distances_and_top`, through the compiled loop where numba
runs), the distance the outlier rule judges (:func:`calibrated_d2`: mapped
for rows with gaps, the nearer of a row's quantization cells, saturated cells
judged as censored), and a block's cells judged one by one for a cellwise
model (:func:`judge_cells`).  Rows are in the model's units
(:func:`._precision.model_rows`); ``model`` is anything with the fitted
attributes read (a fitted estimator, or a fit's :class:`._fit_result.ModelView`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _cells, _compiled, _missing
from ._censored import charged_d2
from ._precision import (
    channel_variances,
    contributor,
    precision_power,
    top_channel,
    working_unit,
)
from ._ranking import FAST_TOP_MIN_ROWS, ranks_in_float32, top_by_product, top_from_product, top_matrix_of
from ._repeated import value_matches

#: From this many channels on, :func:`sample_d2` takes the numpy spelling (BLAS products) rather than the
#: compiled loop: on 20,000 rows, the same time at p = 100, half at p = 200, a third at p = 1000 (1.3 s of
#: a p = 1000 fit's client work, issue 37).
SAMPLE_GEMM_FEATURES = 128
#: Rows per product of :func:`sample_d2` (16 MB at p = 1000: its temporaries are reused, where all the
#: rows at once paid their page faults, twice the time).
SAMPLE_GEMM_ROWS = 2048

__all__ = [
    "SAMPLE_GEMM_FEATURES",
    "SAMPLE_GEMM_ROWS",
    "CellJudgement",
    "LIMIT_RTOL",
    "LIMIT_SPREAD_SHARE",
    "at_limits",
    "calibrated_d2",
    "breakdown_flags",
    "cell_flags",
    "cell_flags_of_any_rows",
    "censored_d2",
    "distances_and_top",
    "good_cell_d2",
    "judge_cells",
    "limit_tolerances",
    "mahalanobis_d2",
    "nearest_in_cells",
    "observed_counts",
    "sample_d2",
]


#: A cell is at a saturation limit when it lies within this share of the limit's magnitude: a float32 copy of a
#: recording holds the float32 rounding of the float64 limit the fit learned (half a float32 step, 2**-24 of the
#: value, plus the rounding of a division by ``scale_``), which an exact comparison missed (9 of 267 at-limit
#: rows flagged where the float64 recording had 1).  A continuous reading this close to a limit is at it.
LIMIT_RTOL = 2.0**-23

#: ... but never farther than this share of the channel's spread under the model: a channel near 1e5 whose
#: spread is 1e-3 took readings 8 spreads inside its limit for readings at it (2**-23 of 1e5 is 13 spreads),
#: judged them as censored, and missed a fault there.  A hundredth, not a thousandth: a float32 copy of a
#: channel near 1000 with spread 0.0175 holds its limit 3e-5 off (half a float32 step), beyond a
#: thousandth of the spread (85 of 600 rows at the limit flagged against 2).  A float32 copy keeps its
#: limit wherever float32's step is under 2 % of the channel's spread.
LIMIT_SPREAD_SHARE = 1e-2


def limit_tolerances(model: Any) -> np.ndarray:
    """How far from each of ``saturation_limits_`` (p x 2) a cell is at it: :data:`LIMIT_RTOL` of the limit,
    at most :data:`LIMIT_SPREAD_SHARE` of the channel's spread under the model (both in the model's units)."""
    spread = np.sqrt(channel_variances(model))
    with np.errstate(invalid="ignore"):
        return np.fmin(LIMIT_RTOL * np.abs(model.saturation_limits_), LIMIT_SPREAD_SHARE * spread[:, None])


def at_limits(block: np.ndarray, limits: np.ndarray, tolerances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cells of ``block`` at their channel's lower and upper saturation limit (``limits``, p x 2, NaN where
    none; both in the model's units), within ``tolerances`` (:func:`limit_tolerances`)."""
    with np.errstate(invalid="ignore"):
        return tuple(np.abs(block - limits[:, i]) <= tolerances[:, i] for i in (0, 1))


def mahalanobis_d2(model: Any, block) -> np.ndarray:
    """Squared Mahalanobis distance ``y^T P y`` of each row under the fitted model.

    Computed in units of the fitted spread (a power of two: exact), so
    squares overflow only for rows ~1e150 spreads away; their distance,
    inf or NaN after an overflow, is inf.  Rows with NaN cells get the
    distance on their observed cells (:func:`._missing.observed_d2`), NaN
    if none is observed; a cellwise model's rows, the distance on their
    good cells (:func:`good_cell_d2`, not mapped).

    Parameters
    ----------
    model : MCPCA or FitResult
        A fitted model.
    block : array-like of shape (n_rows, n_features_in_)
        Rows in the data's units.

    Returns
    -------
    d2 : ndarray of shape (n_rows,)
    """
    return distances_and_top(model, block)[0]


def sample_d2(model: Any, rows) -> np.ndarray:
    """:func:`mahalanobis_d2` of in-memory sample rows whose distances calibrate a cutoff (a quantile,
    which their round-off moves by round-off): from ``SAMPLE_GEMM_FEATURES`` channels on, the numpy
    spelling (:func:`_numpy_d2`, ``SAMPLE_GEMM_ROWS`` rows at a time), which agrees with the compiled
    loop to round-off (2e-15 relative at p = 1000) at a third of its cost; else :func:`mahalanobis_d2`
    itself.  The per-row methods keep the compiled loop, whose bits do not depend on a row's block."""
    rows = np.asarray(rows)
    if (rows.ndim != 2 or rows.shape[1] < SAMPLE_GEMM_FEATURES or not len(rows)
            or getattr(model, "cell_cutoff_", None) is not None):
        return mahalanobis_d2(model, rows)
    return np.concatenate([_numpy_d2(model, rows[start : start + SAMPLE_GEMM_ROWS])
                           for start in range(0, len(rows), SAMPLE_GEMM_ROWS)])


def distances_and_top(model: Any, block, *, top: bool = False, judged: CellJudgement | None = None,
                      product: np.ndarray | None = None, product_exp: int = 0) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`mahalanobis_d2` of each row, and (``top``) the index of its largest reconstruction-based
    contribution (int16, as :func:`._precision.top_channel` of :meth:`MCPCA.channel_contributions`; -1 where no
    cell is observed).

    Complete rows go through the compiled loop (:func:`._compiled.row_distances`) where numba
    runs; rows with NaN or inf cells, rows whose distance overflows, and every row where numba
    does not run (``NUMBA_DISABLE_JIT=1``) through the numpy spelling.  Which spelling serves a
    row depends on the row alone, never on its block, so every method and every chunking gives
    a complete row the same bits; a row with NaN cells is completed in a batched solve whose
    rounding may depend on its block (1e-13 relative at most in the reviews' checks).  From
    ``FAST_TOP_MIN_ROWS`` complete rows on, the loop computes the distances alone and the
    channels are ranked by one float32 product (:func:`._ranking.top_by_product`), which hands back to
    the loop every row whose ranking it cannot vouch for: the channel is the loop's, row for row
    (at p = 300, 105 instead of 155 ms a 12,500-row block).  ``product``: the block's rows' ``y M`` times
    ``2^product_exp`` in float64 (``M`` = :func:`._precision.contribution_matrix`), where the caller has it (the
    shift rule's residuals, :func:`._shift.residual_product`): the channels are then ranked from it, in one
    compiled sweep (:func:`._ranking.top_from_product`), and not by a product of their own.
    """
    block = np.asarray(block)
    if block.dtype not in (np.float32, np.float64):
        block = block.astype(np.float64)
    if getattr(model, "cell_cutoff_", None) is not None:  # a cellwise model: the distance on the good cells
        tops = top_channel(contributor(model, "reconstruction")(block)) if top else None
        return (judge_cells(model, block) if judged is None else judged).d2.copy(), tops
    n = len(block)
    d2, tops = np.empty(n), np.empty(n if top else 0, np.int16)
    numpy_rows = np.arange(n)
    if _compiled.AVAILABLE and n and block.ndim == 2:
        lam, noise, unit = working_unit(model)
        bad = _missing.nonfinite_rows(block)
        good = np.delete(numpy_rows, bad)
        complete = np.ascontiguousarray(block[good] if len(bad) else block)
        if not complete.flags.writeable:  # one compiled specialization per dtype: C order, writable
            complete = complete.copy()
        part_d2, part_top = np.empty(len(complete)), np.empty(len(complete) if top else 0, np.int16)
        inv_noise = 1.0 / np.ldexp(noise, -2 * unit) if model.n_components_ < model.n_features_in_ else 0.0
        top_matrix = top_matrix_of(model) if top else np.empty((0, 0))
        shared = product is not None and np.isfinite(top_matrix).all()
        ranked = top and len(complete) >= FAST_TOP_MIN_ROWS and (shared or ranks_in_float32(top_matrix))

        mean = np.array(model.mean_, np.float64, order="C")  # the loop's operands, formed once
        components = np.array(model.components_, np.float64, order="C")
        inv_var = np.array(1.0 / np.ldexp(lam, -2 * unit), np.float64, order="C")
        scale = float(np.ldexp(1.0, -unit))

        def loop(rows, d2_out, top_out):
            with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
                _compiled.row_distances(rows, mean, scale, components, inv_var, float(inv_noise), top_matrix,
                                        d2_out, top_out)

        if ranked:  # the distances alone (the same compiled code: top_out empty), the channels from one product
            loop(complete, part_d2, np.empty(0, np.int16))
            if shared:
                part_top[:], unsure = top_from_product(complete, model.mean_, unit, top_matrix,
                                                        product[good] if len(bad) else product, product_exp)
            else:
                part_top[:], unsure = top_by_product(complete, model.mean_, unit, top_matrix)
            if len(unsure):  # near ties, rows far out: the loop's own ranking
                sub_d2, sub_top = np.empty(len(unsure)), np.empty(len(unsure), np.int16)
                loop(np.ascontiguousarray(complete[unsure]), sub_d2, sub_top)
                part_top[unsure] = sub_top
                # the same code gave the other rows' d2 above, bit for bit; a row whose contributions
                # overflow gets NaN here, so the numpy spelling below computes its d2 and channel
                part_d2[unsure[np.isnan(sub_d2)]] = np.nan
        else:
            loop(complete, part_d2, part_top)
        d2[good] = part_d2
        if top:
            tops[good] = part_top
        numpy_rows = np.sort(np.concatenate([bad, good[np.isnan(part_d2)]]))
    if len(numpy_rows):
        rows = block[numpy_rows]
        d2[numpy_rows] = _numpy_d2(model, rows)
        if top:
            tops[numpy_rows] = top_channel(contributor(model, "reconstruction")(rows))
    return d2, (tops if top else None)


def _numpy_d2(model: Any, block) -> np.ndarray:
    """:func:`mahalanobis_d2` spelled in numpy: the reference, and the rows the compiled loop leaves."""
    lam, noise, unit = working_unit(model)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        Y = np.ldexp(np.asarray(block, np.float64) - model.mean_, -unit)
        Z = Y @ model.components_.T
        d2 = (Z**2) @ (1.0 / np.ldexp(lam, -2 * unit))
        if model.n_components_ < model.n_features_in_:
            resid = np.einsum("ij,ij->i", Y, Y) - np.einsum("ij,ij->i", Z, Z)
            d2 += np.maximum(resid, 0.0) / np.ldexp(noise, -2 * unit)
    nan = np.flatnonzero(np.isnan(d2))  # NaN cells make NaN distances (so does an overflow: inf - inf)
    gaps = np.zeros(len(d2), bool)
    gaps[nan[np.isnan(Y[nan]).any(axis=1)]] = True
    d2[nan] = np.inf
    if gaps.any():
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            part, _ = _missing.observed_d2(Y[gaps], np.ldexp(precision_power(model, -1.0), -2 * unit))
        part[np.isnan(part) & (~np.isnan(Y[gaps])).any(axis=1)] = np.inf
        d2[gaps] = part
    return d2


def nearest_in_cells(model: Any, block) -> np.ndarray:
    """Each value of a quantized channel moved towards ``mean_`` by up to half a quantization step.

    A reading of a channel with step ``s`` says only that the value lies in
    ``[x - s/2, x + s/2]``; the point of that cell nearest the centre is
    ``mean + sign(y) max(|y| - s/2, 0)`` for ``y = x - mean``.  Continuous
    channels (step 0) and NaN cells are unchanged.

    Parameters
    ----------
    model : MCPCA or FitResult
        Reads ``quantization_steps_`` (none: the rows unchanged) and ``mean_``.
    block : array-like of shape (n_rows, n_features_in_)
        Rows in the data's units.

    Returns
    -------
    ndarray of shape (n_rows, n_features_in_), float64
    """
    steps = getattr(model, "quantization_steps_", None)
    block = np.asarray(block, np.float64)
    if steps is None or not np.any(steps):
        return block
    Y = block - model.mean_
    with np.errstate(invalid="ignore"):
        return model.mean_ + np.sign(Y) * np.maximum(np.abs(Y) - steps / 2, 0.0)


def calibrated_d2(model: Any, block, d2: np.ndarray | None = None, *,
                  judged: CellJudgement | None = None) -> np.ndarray:
    """The distance the outlier rule judges: ``d^2`` calibrated for gaps and quantization cells.

    For rows with missing cells, ``d^2`` on the observed cells mapped to the
    n_features-channel distance with the same chi-square upper-tail
    probability (:func:`._missing.equivalent_d2`), so that one cutoff,
    ``outlier_cutoff_``, serves every row at the same false-alarm rate.

    With quantized channels (``quantization_steps_``), the distance of the
    row's quantization cells: a reading says only that the value lies within
    half a step of it, so the row is judged by the nearer to the centre of
    two points of its cells, the reading itself and the reading with each
    quantized value moved towards ``mean_`` by up to half a step
    (:func:`nearest_in_cells`; the nearer of the two, since with correlated
    channels, or channels bound by an exact relation such as one-hot
    columns, moving each value alone can lead away from the bulk).

    Parameters
    ----------
    model : MCPCA or FitResult
        A fitted model.
    block : array-like of shape (n_rows, n_features_in_)
        Rows in the data's units; NaN cells are gaps.
    d2 : ndarray of shape (n_rows,), optional
        :func:`mahalanobis_d2` of ``block``, when the caller has it already.
    judged : CellJudgement, optional
        :func:`judge_cells` of ``block``, when the caller has it already (a cellwise model).

    Returns
    -------
    d2 : ndarray of shape (n_rows,)
        What :meth:`MCPCA.is_outlier` compares with ``outlier_cutoff_`` and
        :meth:`MCPCA.score_samples` turns into a weight.

    Examples
    --------
    >>> import numpy as np
    >>> from dask_mcpca import MCPCA
    >>> from dask_mcpca._distances import calibrated_d2
    >>> from dask_mcpca._model import outlier_flags
    >>> model = MCPCA().fit(np.random.default_rng(0).normal(size=(1000, 3)))
    >>> rows = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 30.0]])
    >>> d2 = calibrated_d2(model, rows)
    >>> outlier_flags(model, rows, d2)
    array([False,  True])
    """
    if getattr(model, "cell_cutoff_", None) is not None:  # a cellwise fit: rows judged on their good cells
        return (judge_cells(model, block) if judged is None else judged).mapped_d2()
    d2 = mahalanobis_d2(model, block) if d2 is None else d2
    steps = getattr(model, "quantization_steps_", None)
    if steps is not None and np.any(steps):
        d2 = np.fmin(d2, mahalanobis_d2(model, nearest_in_cells(model, block)))
    counts = observed_counts(block)
    if not np.all(counts == model.n_features_in_):
        d2 = _missing.equivalent_d2(d2, counts, model.n_features_in_)
    limits = getattr(model, "saturation_limits_", None)
    if limits is not None and not np.isnan(limits).all():
        d2 = censored_d2(model, block, d2)
    return d2


def censored_d2(model: Any, block, d2: np.ndarray) -> np.ndarray:
    """``d2`` (calibrated, n_features channels) with each saturated cell judged as censored.

    A cell at its channel's saturation limit (``saturation_limits_``) says only that the quantity
    lay at or beyond the limit.  Where the row's other cells predict that (the limit within
    ``sqrt(cell cutoff)`` conditional standard deviations of their prediction, or beyond it), the
    cell is censored: the row is judged with the quantity at its most plausible value beyond the
    limit, less what any reading beyond the limit costs on its own (:mod:`._censored`), the nearer
    of that and the distance with the reading taken as it is (as for quantized cells).  A reading
    at the limit that the other cells place well inside the range is kept, so a sensor stuck at
    its limit while the others move is still seen.
    """
    block = np.asarray(block, np.float64)
    limits = model.saturation_limits_
    tolerances = limit_tolerances(model)
    at_low, at_high = at_limits(block, limits, tolerances)
    rows = np.flatnonzero((at_low | at_high).any(axis=1))
    if not len(rows):
        return d2
    Y, prec = _centred_in_spread(model, block[rows])
    censored = at_low[rows] | at_high[rows]
    consistent = _censored_fits(model, block[rows], _missing.conditional(Y, np.isnan(Y) | censored, prec), censored,
                                at_high[rows])
    some = consistent.any(axis=1)
    if not some.any():
        return d2
    sub = rows[some]
    cond = _missing.conditional(Y[some], np.isnan(Y[some]) | consistent[some], prec)
    upper = at_high[sub]
    charged, counts = charged_d2(model, Y[some], cond, consistent[some], upper)
    judged = _missing.equivalent_d2(charged, counts, block.shape[1])
    out = np.array(d2, dtype=np.float64, copy=True)
    out[sub] = np.fmin(out[sub], judged)
    return out


@dataclass
class CellJudgement:
    """A block's rows judged cell by cell under a fitted model (:func:`judge_cells`).

    ``flags``: the cells judged bad (:meth:`MCPCA.cell_outliers`); ``d2``: each row's squared
    distance on the cells it is judged on (not mapped; inf where it overflows, NaN where no cell is
    left) and ``n_judged`` their number: neither missing, nor flagged, nor stuck, nor at a
    saturation limit.
    """

    flags: np.ndarray
    d2: np.ndarray
    n_judged: np.ndarray

    def mapped_d2(self) -> np.ndarray:
        """``d2`` mapped to all channels at the same chi-square probability (what the cutoff judges)."""
        return _missing.equivalent_d2(self.d2, self.n_judged, self.flags.shape[1])


def judge_cells(model: Any, block) -> CellJudgement:
    """Judge the cells of ``block`` (data units) under the fitted model, once for every per-cell output.

    Judged in units of the fitted spread; a NaN cell is missing, never flagged; an inf cell is
    flagged.  A stuck cell (one of ``repeated_values_``) is flagged and left out; a cell at a
    saturation limit is left out, and flagged where the row's good cells place the quantity well
    inside the range (:func:`_censored_fits`; else it is judged as censored, :mod:`._censored`).
    A row whose every cell is flagged or held has distance inf.  The others are flagged by
    :func:`._cells.flag_cells` at ``cell_cutoff_`` (else :func:`._cells.cell_cutoff2`).
    """
    block = np.asarray(block, np.float64)
    Y, prec, inf, held, (at_low, upper) = _judged_cells(model, block)
    at_limit = at_low | upper
    missing = np.isnan(Y) | held | at_limit
    flags = _cells.flag_cells(Y, missing, prec, _cell_cutoff(model))
    cond = _missing.conditional(Y, missing | flags, prec)
    bad = flags | inf | held
    d2, n_judged = cond.d2, cond.n_observed
    if at_limit.any():  # a reading at a limit is bad where the good cells place the quantity well inside
        fits = _censored_fits(model, block, cond, at_limit, upper)
        bad |= at_limit & ~fits
        d2, n_judged = charged_d2(model, Y, cond, fits, upper)
    d2[np.isnan(d2) & ((n_judged > 0) | bad.any(axis=1))] = np.inf  # no good cell left: nothing explains it
    return CellJudgement(bad, d2, n_judged)


def _judged_cells(model: Any, block: np.ndarray):
    """``block``'s rows in units of the fitted spread (inf cells made NaN), the precision in those units,
    the inf cells, the cells holding a learned stuck value, and the cells at a lower and an upper limit."""
    Y, prec = _centred_in_spread(model, block)
    inf = np.isinf(Y)
    Y[inf] = np.nan
    held, limits = _known_cells(model, block)
    return Y, prec, inf, held, limits


def _cell_cutoff(model: Any) -> float:
    return getattr(model, "cell_cutoff_", None) or _cells.cell_cutoff2()


def breakdown_flags(model: Any, block) -> np.ndarray:
    """The cell flags the breakdown check counts (:func:`._cells.breakdown_message`): :func:`cell_flags`'
    rule, except that a row with more than ``BREAKDOWN_GIVE_UP`` of its cells flagged is judged no further
    (it holds flagged cells either way) and a cell at a saturation limit is left out, not judged."""
    block = np.asarray(block, np.float64)
    Y, prec, inf, held, (at_low, upper) = _judged_cells(model, block)
    missing = np.isnan(Y) | held | at_low | upper
    give_up = int(_cells.BREAKDOWN_GIVE_UP * block.shape[1])
    return _cells.flag_cells(Y, missing, prec, _cell_cutoff(model), give_up=give_up) | inf | held


def cell_flags(model: Any, block) -> np.ndarray:
    """Cells of ``block`` that the fitted model cannot explain, boolean (:func:`judge_cells`)."""
    return judge_cells(model, block).flags


def cell_flags_of_any_rows(model: Any, block) -> np.ndarray:
    """:func:`cell_flags` of rows that may hold no finite cell: an inf cell is flagged, a NaN one is not, in
    every row (``MCPCA.cell_outliers``)."""
    block = np.asarray(block, np.float64)
    some = np.isfinite(block).any(axis=1)
    if some.all():
        return cell_flags(model, block)
    flags = np.isinf(block)
    if some.any():
        flags[some] = cell_flags(model, block[some])
    return flags


def _known_cells(model: Any, block: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Cells holding a stuck value the fit learned (``repeated_values_``), and cells at a channel's lower
    and upper saturation limit (``saturation_limits_``, :func:`at_limits`)."""
    held = np.zeros(block.shape, bool)
    learned = getattr(model, "repeated_values_", None)
    for column, value in () if learned is None else learned:
        held[:, int(column)] |= value_matches(block[:, int(column)], value)
    limits = getattr(model, "saturation_limits_", None)
    if limits is None:
        return held, (np.zeros(block.shape, bool), np.zeros(block.shape, bool))
    return held, at_limits(block, limits, limit_tolerances(model))


def _censored_fits(model: Any, block: np.ndarray, cond, at_limit: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Of the cells ``at_limit`` (``upper``: those at an upper limit), those whose channel the row's other
    cells predict (``cond``, the rows completed with those cells left out) at the limit or beyond it,
    within ``sqrt(cell cutoff)`` conditional standard deviations: a censored reading the model explains
    (see :func:`censored_d2`)."""
    unit = working_unit(model)[2]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        z = (np.ldexp(block - model.mean_, -unit) - cond.completed) / np.sqrt(cond.variances())
    reach = np.sqrt(_cells.cell_cutoff2())
    return at_limit & np.where(upper, z <= reach, z >= -reach)


def good_cell_d2(model: Any, block, *, mapped: bool = True) -> np.ndarray:
    """Each row's squared distance on its good cells (:func:`judge_cells`), mapped to n_features
    channels at the same chi-square probability (``mapped=False``: on the good cells, as
    :func:`mahalanobis_d2` gives a row with gaps its distance on the observed ones); NaN where no
    cell is good."""
    judged = judge_cells(model, block)
    return judged.mapped_d2() if mapped else judged.d2


def _centred_in_spread(model: Any, block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows centred at ``mean_`` in units of the fitted spread (a power of two, exact), and the
    model's precision in those units."""
    unit = working_unit(model)[2]
    with np.errstate(over="ignore", invalid="ignore"):
        Y = np.ldexp(block - model.mean_, -unit)
    return Y, np.ldexp(precision_power(model, 1.0), 2 * unit)


def observed_counts(block) -> np.ndarray:
    """Cells not NaN per row of an in-memory block (int16)."""
    block = np.asarray(block, np.float64)
    counts = np.full(len(block), block.shape[1], np.int16)
    gaps = _missing.nonfinite_rows(block, nan_only=True)
    counts[gaps] = (~np.isnan(block[gaps])).sum(axis=1)
    return counts
