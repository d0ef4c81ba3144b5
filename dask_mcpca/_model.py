"""The model's algebra: what a fitted model computes for rows, as functions of its attributes.

As scikit-learn's ``decomposition/_base.py`` holds what a fitted PCA computes
apart from how it is fitted, this module holds the rules of a fitted
:class:`~dask_mcpca.MCPCA`: the floored variances, the precision and its
powers, the squared Mahalanobis distance ``d^2 = y^T P y``, the distance the
outlier rule judges (calibrated for rows with gaps and for quantization
cells), the correntropy weight, the outlier flags, the repeated values and
rows, the channel contributions, and the row-block functions of the per-row
methods.  Every function takes ``model``: anything with the fitted attributes
it reads (``components_``, ``explained_variance_``, ``noise_variance_``,
``mean_``, ``n_components_``, ``n_features_in_``, ``kernel_scale_``,
``outlier_cutoff_``, ``quantization_steps_``, ``repeated_values_``,
``repeated_rows_``): a fitted estimator, or the fit's own result while it is
being built (:class:`._fit.FitResult`).  The report (:mod:`._report`) and the
estimator's methods (:mod:`._base`) use them; no one reaches into the
estimator's private methods.

Units: a model fitted with ``scale="robust"`` works in the data's units
divided by ``scale_`` (:func:`model_rows`).  The functions here take rows
in the model's units, except those that read rows as stored, in order
(:func:`stuck_cells`, :func:`held_cells`, :func:`isolated_top`: a run
and its digits are judged on the stored values), which divide only what
they compare with the learned values; the row-block functions of the
per-row methods (:func:`row_outputs`, and :mod:`._base`) take rows as
stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _cells, _compiled, _missing
from ._contributions import channel_scales, contributions_with_gaps
from ._exceptions import NonFiniteRowsError
from ._power import variance_floor
from ._repeated import HOLD_WINDOW, held_out, stuck_runs, value_matches
from ._scale import in_model_units

__all__ = [
    "CONTRIBUTION_METHODS",
    "ROW_OUTPUTS",
    "calibrated_d2",
    "cell_flags",
    "censored_d2",
    "contamination_cutoff",
    "contribution_matrix",
    "contributor",
    "floored_variances",
    "good_cell_d2",
    "held_cells",
    "judged_rows",
    "isolated_top",
    "judged_counts",
    "judge_cells",
    "CellJudgement",
    "mahalanobis_d2",
    "model_rows",
    "nan_for_nonfinite_rows",
    "unusable_rows",
    "nearest_in_cells",
    "observed_counts",
    "outlier_flags",
    "precision_power",
    "projector",
    "repeated",
    "row_outputs",
    "stuck_cells",
    "CONTEXT_ROWS",
    "top_channel",
    "weight",
]

#: What :meth:`MCPCA.score_rows` computes: name -> dtype.
ROW_OUTPUTS = {
    "scores": np.float64,
    "weight": np.float64,
    "outlier": np.bool_,
    "d2": np.float64,
    "contributions": np.float64,
    "n_observed": np.int16,
    "top_channel": np.int16,
    "cells": np.bool_,
}

#: The methods of :meth:`MCPCA.channel_contributions` (``"residual"``: ``"reconstruction"``'s former name).
CONTRIBUTION_METHODS = ("reconstruction", "whitened", "product", "residual")


def model_rows(model: Any, block):
    """Rows as stored in the model's units: divided by ``scale_`` (``scale="robust"``), else as given."""
    return in_model_units(block, getattr(model, "scale_", None))


def _model_cells(model: Any, values: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """Cells ``values`` (as stored) of the channels ``columns`` in the model's units."""
    scale = getattr(model, "scale_", None)
    return values if scale is None else np.asarray(values, np.float64) / scale[columns]


# ----------------------------------------------------------- variances, precision
def floored_variances(model: Any) -> tuple[np.ndarray, float]:
    """The fitted variances and noise variance, floored at the fit's round-off level.

    The floor is :func:`._power.variance_floor` of the largest variance:
    a direction in which the data never varied counts a row's deviation
    along it, consistently, as a huge distance when it is beyond round-off
    and as nothing when it is round-off.

    Parameters
    ----------
    model : MCPCA or FitResult
        Reads ``explained_variance_``, ``noise_variance_``, ``n_features_in_``.

    Returns
    -------
    lam : ndarray of shape (n_components_,)
    noise : float
    """
    lam = model.explained_variance_
    top = max(float(lam.max(initial=0.0)), model.noise_variance_)
    floor = variance_floor(top, model.n_features_in_) if top > 0 else np.finfo(float).tiny
    return np.maximum(lam, floor), max(model.noise_variance_, floor)


def precision_power(model: Any, power: float) -> np.ndarray:
    """``P^power`` of the precision P whose quadratic form is the model's ``d^2``.

    ``power=1`` is :meth:`MCPCA.get_precision`, ``-1`` :meth:`MCPCA.get_covariance`,
    ``0.5`` the symmetric root that whitens a row.

    Parameters
    ----------
    model : MCPCA or FitResult
        A fitted model.
    power : float
        The power of the precision.

    Returns
    -------
    ndarray of shape (n_features_in_, n_features_in_)
    """
    lam, noise = floored_variances(model)
    C = model.components_
    P = (C.T * lam**-power) @ C
    if model.n_components_ < model.n_features_in_:
        P += noise**-power * (np.eye(model.n_features_in_) - C.T @ C)
    return P


# ------------------------------------------------------------------ distances
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


def distances_and_top(model: Any, block, *, top: bool = False,
                      judged: CellJudgement | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`mahalanobis_d2` of each row, and (``top``) the index of its largest reconstruction-based
    contribution (int16, as :func:`top_channel` of :meth:`MCPCA.channel_contributions`; -1 where no
    cell is observed), in one sweep over the rows.

    Complete rows go through the compiled loop (:func:`._compiled.row_distances`) where numba
    runs; rows with NaN or inf cells, rows whose distance overflows, and every row where numba
    does not run (``NUMBA_DISABLE_JIT=1``) through the numpy spelling.  Which spelling serves a
    row depends on the row alone, never on its block, so every method and every chunking gives
    a row the same bits.
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
        lam, noise, unit = _working_unit(model)
        bad = _missing.nonfinite_rows(block)
        good = np.delete(numpy_rows, bad)
        complete = np.ascontiguousarray(block[good] if len(bad) else block)
        if not complete.flags.writeable:  # one compiled specialization per dtype: C order, writable
            complete = complete.copy()
        part_d2, part_top = np.empty(len(complete)), np.empty(len(complete) if top else 0, np.int16)
        inv_noise = 1.0 / np.ldexp(noise, -2 * unit) if model.n_components_ < model.n_features_in_ else 0.0
        with np.errstate(over="ignore", invalid="ignore", under="ignore", divide="ignore"):
            _compiled.row_distances(complete, np.array(model.mean_, np.float64, order="C"),
                                    float(np.ldexp(1.0, -unit)), np.array(model.components_, np.float64, order="C"),
                                    np.array(1.0 / np.ldexp(lam, -2 * unit), np.float64, order="C"),
                                    float(inv_noise), _top_matrix(model) if top else np.empty((0, 0)),
                                    part_d2, part_top)
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


def _top_matrix(model: Any) -> np.ndarray:
    """:func:`contribution_matrix` in Fortran order, for :func:`._compiled.row_distances`: its loop runs
    down a column (``top_matrix[j, a]`` over ``j``), which is then contiguous: 4.7x faster at p = 300
    (issue 37 point 4).  The distances do not read it; the channel ranked first (all the loop keeps of
    the contributions) was the same on every row checked (50,000 rows of the 300-channel benchmark
    store, and the tests' expected channels)."""
    return np.asfortranarray(contribution_matrix(model))


def contribution_matrix(model: Any) -> np.ndarray:
    """``M`` with ``(y M)_a^2 = (P y)_a^2 / P_aa``, channel a's reconstruction-based contribution of a
    complete centred row ``y`` (:func:`._contributions.reconstruction_contributions`'s unit-diagonal
    precision, its rows scaled back): ``P``'s columns divided by ``sqrt(P_aa)``, unseen channels 0."""
    P = precision_power(model, 1.0)
    root, seen = channel_scales(P)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        M = P / root[None, :]
    M[~seen, :] = 0.0
    M[:, ~seen] = 0.0
    return np.ascontiguousarray(M)


def _working_unit(model: Any) -> tuple[np.ndarray, float, int]:
    """The floored variances, the noise variance and the power of two the distances are computed in
    (the exponent of the largest spread: scaling by it is exact, and squares stay far from overflow)."""
    lam, noise = floored_variances(model)
    return lam, noise, int(np.frexp(np.sqrt(lam.max(initial=noise)))[1])


def _numpy_d2(model: Any, block) -> np.ndarray:
    """:func:`mahalanobis_d2` spelled in numpy: the reference, and the rows the compiled loop leaves."""
    lam, noise, unit = _working_unit(model)
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
    >>> from dask_mcpca._model import calibrated_d2, outlier_flags
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
    cell counts as missing and the row is judged on its other cells (the nearer of the two
    distances, as for quantized cells); a reading at the limit that the other cells place well
    inside the range is kept, so a sensor stuck at its limit while the others move is still seen.
    """
    block = np.asarray(block, np.float64)
    limits = model.saturation_limits_
    at_low, at_high = block == limits[:, 0], block == limits[:, 1]
    rows = np.flatnonzero((at_low | at_high).any(axis=1))
    if not len(rows):
        return d2
    Y, prec = _centred_in_spread(model, block[rows])
    censored = at_low[rows] | at_high[rows]
    consistent = _censored_fits(model, block[rows], _missing.conditional(Y, np.isnan(Y) | censored, prec), censored)
    some = consistent.any(axis=1)
    if not some.any():
        return d2
    sub = rows[some]
    cond = _missing.conditional(Y[some], np.isnan(Y[some]) | consistent[some], prec)
    judged = _missing.equivalent_d2(cond.d2, cond.n_observed, block.shape[1])
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
    inside the range (:func:`_censored_fits`).  The others are flagged by
    :func:`._cells.flag_cells` at ``cell_cutoff_`` (else :func:`._cells.cell_cutoff2`).
    """
    block = np.asarray(block, np.float64)
    Y, prec = _centred_in_spread(model, block)
    inf = np.isinf(Y)
    Y[inf] = np.nan
    held, at_limit = _known_cells(model, block)
    missing = np.isnan(Y) | held | at_limit
    flags = _cells.flag_cells(Y, missing, prec, getattr(model, "cell_cutoff_", None) or _cells.cell_cutoff2())
    cond = _missing.conditional(Y, missing | flags, prec)
    bad = flags | inf | held
    if at_limit.any():  # a reading at a limit is bad where the good cells place the quantity well inside
        bad |= at_limit & ~_censored_fits(model, block, cond, at_limit)
    d2 = cond.d2
    d2[np.isnan(d2) & (cond.n_observed > 0)] = np.inf
    return CellJudgement(bad, d2, cond.n_observed)


def cell_flags(model: Any, block) -> np.ndarray:
    """Cells of ``block`` that the fitted model cannot explain, boolean (:func:`judge_cells`)."""
    return judge_cells(model, block).flags


def _known_cells(model: Any, block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cells holding a stuck value the fit learned (``repeated_values_``), and cells at a channel's
    saturation limit (``saturation_limits_``)."""
    held = np.zeros(block.shape, bool)
    learned = getattr(model, "repeated_values_", None)
    for column, value in () if learned is None else learned:
        held[:, int(column)] |= value_matches(block[:, int(column)], value)
    limits = getattr(model, "saturation_limits_", None)
    at_limit = (block == limits[:, 0]) | (block == limits[:, 1]) if limits is not None else np.zeros(block.shape, bool)
    return held, at_limit


def _censored_fits(model: Any, block: np.ndarray, cond, at_limit: np.ndarray) -> np.ndarray:
    """Of the cells ``at_limit``, those whose channel the row's other cells predict (``cond``, the rows
    completed with those cells left out) at the limit or beyond it, within ``sqrt(cell cutoff)``
    conditional standard deviations: a censored reading the model explains (see :func:`censored_d2`)."""
    unit = _working_unit(model)[2]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        z = (np.ldexp(block - model.mean_, -unit) - cond.completed) / np.sqrt(cond.variances())
    reach = np.sqrt(_cells.cell_cutoff2())
    upper = block == model.saturation_limits_[:, 1]
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
    unit = _working_unit(model)[2]
    with np.errstate(over="ignore", invalid="ignore"):
        Y = np.ldexp(block - model.mean_, -unit)
    return Y, np.ldexp(precision_power(model, 1.0), 2 * unit)


# ------------------------------------------------------ weights and flags
def weight(model: Any, d2):
    """The correntropy weight ``exp(-d^2 / (2 c^2))`` of distances ``d2``, ``c = kernel_scale_``.

    Any array type; NaN stays NaN.
    """
    return np.exp(-d2 / (2 * model.kernel_scale_**2))


def repeated(model: Any, rows: np.ndarray) -> np.ndarray:
    """True for the rows (float64, data units) holding a repeated value or equal to a repeated row.

    Parameters
    ----------
    model : MCPCA or FitResult
        Reads ``repeated_values_`` and ``repeated_rows_`` (absent: none).
    rows : ndarray of shape (n_rows, n_features_in_)

    Returns
    -------
    ndarray of bool, shape (n_rows,)
    """
    return held_out(rows, getattr(model, "repeated_values_", None), getattr(model, "repeated_rows_", None))


def outlier_flags(model: Any, rows: np.ndarray, d2: np.ndarray, stuck: np.ndarray | None = None) -> np.ndarray:
    """The outlier rule of :meth:`MCPCA.is_outlier`: ``d2`` above ``outlier_cutoff_``, a repeated value or
    row, or a stuck cell (``stuck``, :func:`stuck_cells`).

    Parameters
    ----------
    model : MCPCA or FitResult
        A fitted model.
    rows : ndarray of shape (n_rows, n_features_in_)
        Rows in float64, data units.
    d2 : ndarray of shape (n_rows,)
        Their :func:`calibrated_d2`.
    stuck : ndarray of bool, shape (n_rows, n_features_in_), optional
        Their stuck cells (None: none).

    Returns
    -------
    flags : ndarray of bool, shape (n_rows,)
    """
    flags = (d2 > model.outlier_cutoff_) | repeated(model, rows)
    return flags if stuck is None else flags | stuck.any(axis=1)


def judged_rows(model: Any, block, before) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A block's rows (as stored, in order; ``before``: the rows before it, :data:`CONTEXT_ROWS`) as
    :meth:`MCPCA.is_outlier`, ``predict`` and ``decision_function`` judge them: their
    :func:`calibrated_d2`, the flags of :func:`outlier_flags`, and the rows flagged whatever their
    distance (a repeated value or row, a stuck run)."""
    stuck = stuck_cells(model, block, before)
    rows = model_rows(model, np.asarray(block, np.float64))
    d2 = calibrated_d2(model, rows)
    held = repeated(model, rows) | stuck.any(axis=1)
    return d2, (d2 > model.outlier_cutoff_) | held, held


def contamination_cutoff(model: Any, rows: np.ndarray, contamination: float) -> float:
    """The ``1 - contamination`` quantile of the calibrated distances of ``rows`` (data units).

    Rows flagged as repeated count as infinitely far, so that a share
    ``contamination`` of ``rows`` is flagged; with no finite row, the
    model's ``outlier_cutoff_``.
    """
    rows = np.asarray(rows, np.float64)
    rows = rows[np.isfinite(rows).all(axis=1)]
    if not len(rows):
        return model.outlier_cutoff_
    d2 = calibrated_d2(model, rows)
    d2[repeated(model, rows)] = np.inf
    with np.errstate(invalid="ignore"):
        cutoff = float(np.quantile(d2, 1.0 - contamination))
    if np.isnan(cutoff):  # between a finite distance and inf: past every finite one
        cutoff = float(np.max(d2[np.isfinite(d2)], initial=np.inf))
    return max(cutoff, np.finfo(np.float64).tiny)


# ------------------------------------------------------ row-block functions
def judged_counts(model: Any, block) -> np.ndarray:
    """The cells each row of an in-memory block is judged on (int16): those not NaN, and for a cellwise
    model (``cell_cutoff_``) not flagged either (:func:`cell_flags`)."""
    counts = observed_counts(block)
    if getattr(model, "cell_cutoff_", None) is not None:
        counts = counts - judge_cells(model, block).flags.sum(axis=1).astype(np.int16)
    return counts


def observed_counts(block) -> np.ndarray:
    """Cells not NaN per row of an in-memory block (int16)."""
    block = np.asarray(block, np.float64)
    counts = np.full(len(block), block.shape[1], np.int16)
    gaps = _missing.nonfinite_rows(block, nan_only=True)
    counts[gaps] = (~np.isnan(block[gaps])).sum(axis=1)
    return counts


def top_channel(contributions: np.ndarray) -> np.ndarray:
    """Index of each row's largest contribution (int16); -1 where they are all NaN."""
    top = np.argmax(contributions, axis=1).astype(np.int16)  # a NaN would be taken as the largest
    gaps = _missing.nonfinite_rows(contributions, nan_only=True)
    if len(gaps):
        c = contributions[gaps]
        top[gaps] = np.argmax(np.where(np.isnan(c), -np.inf, c), axis=1)
        top[gaps[np.isnan(c).all(axis=1)]] = -1
    return top


#: Shortest decimal digits (round-trip, :func:`_digits`) of a value whose exact repeat from one row to the
#: next is taken as a stuck sensor's, by the dtype the rows are stored in: near the dtype's full precision,
#: which a measurement on a coarser grid (integers, a fixed number of decimals, an ADC's steps written in
#: decimal) does not need, and which a continuous value repeats by chance about once in 1e12 (float64) or
#: 1e6 (float32) rows.
FULL_DIGITS = {np.dtype(np.float64): 13, np.dtype(np.float32): 7}


def _digits(values: np.ndarray) -> np.ndarray:
    """Significant decimal digits of each value's shortest round-trip spelling in its dtype (0 for 0)."""
    out = np.zeros(values.shape, int)
    for i, v in enumerate(values.ravel()):
        if v != 0 and np.isfinite(v):
            mantissa = np.format_float_scientific(v, unique=True, trim="-").split("e")[0]
            out.flat[i] = len(mantissa.lstrip("-").replace(".", "").lstrip("0"))
    return out


def held_cells(model: Any, rows: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Cells of ``rows`` (data units, as stored) that hold a stuck value: one of ``repeated_values_``,
    or, on a channel continuous at the fit (``quantization_steps_`` 0), exactly the value of the row
    before (``before``, the same shape; NaN where there is none), where that value needs near its
    dtype's full precision (:data:`FULL_DIGITS`).

    A continuous measurement repeats its exact value with probability near 0; a quantized channel,
    or one written on a coarser grid (integers, rounded decimals, the values of a real recording
    logged to 6 decimals), often, so there only the values the fit learned count.
    """
    steps = getattr(model, "quantization_steps_", None)
    continuous = np.ones(rows.shape[1], bool) if steps is None else np.asarray(steps) == 0
    held = (rows == before) & continuous
    if held.any():  # spelled once per distinct value: a stuck stretch holds one value in many rows
        at = np.nonzero(held)
        values, which = np.unique(rows[at], return_inverse=True)
        held[at] = _full_precision(values, rows.dtype)[which.ravel()]
    learned = getattr(model, "repeated_values_", None)
    for column, value in () if learned is None else learned:  # learned in the model's units
        j = int(column)
        held[:, j] |= value_matches(_model_cells(model, rows[:, j], j), value)
    return held


#: Rows before each block that a row-block method reads to judge the block's rows in order
#: (:func:`stuck_cells`; the last of them is :func:`isolated_top`'s row before).
CONTEXT_ROWS = HOLD_WINDOW


#: Digits of a value that a stuck run may hold (:func:`stuck_cells`): one fewer than :data:`FULL_DIGITS`, as
#: about one float32 value in ten is spelled in 6 digits; a run's repeats are evidence enough, with the hold
#: rule (:func:`._repeated.stuck_runs`), against a channel on a coarser grid, whose values repeat often.
RUN_DIGITS = {dtype: digits - 1 for dtype, digits in FULL_DIGITS.items()}


def _full_precision(values: np.ndarray, dtype, digits: dict | None = None) -> np.ndarray:
    """True for the ``values`` whose shortest spelling in ``dtype`` needs near its full precision
    (``digits``: by dtype; :data:`FULL_DIGITS` by default)."""
    digits = FULL_DIGITS if digits is None else digits
    return _digits(values) >= digits.get(np.dtype(dtype), digits[np.dtype(np.float64)])


def stuck_cells(model: Any, block, before) -> np.ndarray:
    """Cells of ``block`` (rows in order, as stored) that a sensor stuck since the fit holds.

    A channel continuous at the fit (``quantization_steps_`` 0), that moved by far more than it is
    written to before (:func:`_moving_channels`), holding one value, not at a saturation limit
    (``saturation_limits_``), in :data:`._repeated.STUCK_RUN` consecutive rows, having repeated no
    other value in the :data:`._repeated.HOLD_WINDOW` rows before (:func:`._repeated.stuck_runs`).
    The fit's row sample learns a value stuck in the fitted rows (``repeated_values_``); this
    rule finds one that sticks later, for monitoring.  Quantized channels, values on a coarser grid
    (an idle device's zeros, a set point) and a saturated reading are not judged by it.

    ``before``: the :data:`CONTEXT_ROWS` rows before the block (NaN where there are none), or None.
    """
    block = np.asarray(block)
    steps = getattr(model, "quantization_steps_", None)
    if steps is None or block.dtype.kind != "f":
        return np.zeros(block.shape, bool)
    cells, began = stuck_runs(block, before, np.asarray(steps) == 0, starts=True)
    if cells.any():
        at = np.nonzero(cells)
        keep = _moving_channels(block, before, at, began[at])
        limits = getattr(model, "saturation_limits_", None)
        if limits is not None:
            values = _model_cells(model, block[at], at[1])  # limits are in the model's units
            keep &= (values != limits[at[1], 0]) & (values != limits[at[1], 1])
        cells[at[0][~keep], at[1][~keep]] = False
    return cells


#: Values of a channel before a run that say how it moves and how finely it is written (:func:`_moving_channels`).
WRITTEN_VALUES = 32

#: A channel whose typical change from one row to the next is at least this many times the resolution it is
#: written at (the last digit of its values' shortest spelling) repeats a value exactly with probability
#: about 1 / (this ratio) a row, so nine repeats in a row (:data:`._repeated.STUCK_RUN`) are not chance.
RESOLUTION_RATIO = 10.0


#: A run whose value is written this many times more coarsely than the channel's values before it is a set
#: point (an idle device's 20.5), not a reading that stuck (:func:`_moving_channels`).
SET_POINT_RATIO = 1000.0


def _resolution(values: np.ndarray, dtype) -> np.ndarray:
    """The power of ten of each value's last significant digit in its shortest spelling in ``dtype``."""
    values = np.asarray(values, dtype)
    with np.errstate(divide="ignore"):
        return 10.0 ** (np.floor(np.log10(np.abs(values.astype(np.float64)))) - _digits(values) + 1)


def _moving_channels(block: np.ndarray, before, at: tuple[np.ndarray, np.ndarray], began: np.ndarray) -> np.ndarray:
    """Whether each run of the cells ``at`` (rows, columns of ``block``; its run began at row ``began``)
    is on a channel that moves by much more than it is written to: the median change between
    consecutive rows of its last :data:`WRITTEN_VALUES` values before the run is at least
    :data:`RESOLUTION_RATIO` times their median resolution (:func:`_resolution`), those values taken
    within the cell's window of :data:`._repeated.HOLD_WINDOW` rows (so that no verdict depends on the
    chunking).  Where fewer than two lie there (a run longer than the window), the run's own value
    must need near its dtype's full precision (:data:`RUN_DIGITS`).  A channel written on a grid as
    coarse as its movement (a slow temperature in tenths of a degree) is left to the fit's rules;
    a recording logged to six decimals whose values move by far more is judged.  A run of a value
    written :data:`SET_POINT_RATIO` times more coarsely than the values before it is a set point.
    """
    rows, cols = at
    head = np.full((0, block.shape[1]), np.nan, block.dtype) if before is None else np.asarray(before, block.dtype)
    X = np.concatenate([head[-HOLD_WINDOW:], block])
    offset = len(X) - len(block)
    start = began + offset  # in X
    lowest = np.maximum(rows + offset - HOLD_WINDOW, 0)  # the cell's window
    first = np.maximum(start - WRITTEN_VALUES, lowest)
    keep = np.zeros(len(rows), bool)
    groups, which = np.unique(np.stack([cols, first, start]), axis=1, return_inverse=True)
    for g, (col, a, b) in enumerate(groups.T):
        values = X[a:b, col]
        steps = np.abs(np.diff(values.astype(np.float64)))
        steps = steps[np.isfinite(steps)]
        written = values[np.isfinite(values) & (values != 0)]
        if len(steps) and len(written):
            resolution = np.median(_resolution(written, block.dtype))
            moving = (np.median(steps) >= RESOLUTION_RATIO * resolution
                      and _resolution(X[b : b + 1, col], block.dtype)[0] < SET_POINT_RATIO * resolution)
        else:  # the run began before the window: its own value
            moving = _full_precision(X[b : b + 1, col], block.dtype, RUN_DIGITS)[0]
        keep[which.ravel() == g] = moving
    return keep


def isolated_top(model: Any, block, before, d2, calibrated, flags, top, contributions=None) -> np.ndarray:
    """The channel at fault of each row: ``top`` (its largest reconstruction-based contribution),
    except in a flagged row holding a stuck cell (:func:`held_cells`) that explains the flag (in a
    row with missing cells, judged on its observed ones).

    A cell explains the flag when reconstructing it alone brings the row's ``d2`` under
    ``outlier_cutoff_`` (``d2`` minus its contribution, which is the row's ``d^2`` with that cell
    at its best value), or when the row is flagged by a repeated value or row only (its
    ``calibrated`` distance under the cutoff).  Of such cells, the one with the largest
    contribution is named.  The contributions are a likelihood ratio per row; the held value
    is evidence across rows: a sensor stuck beside a near-copy of itself is told from the copy
    by its repeats, where a single row cannot tell them apart.

    ``before``: the row before the block's first (NaN, or None: none); ``contributions``: the
    block's, if already computed.  ``top`` is changed in place and returned.
    """
    idx = np.flatnonzero(flags)
    if not len(idx):
        return top
    block = np.asarray(block)
    if block.dtype not in FULL_DIGITS:
        block = block.astype(np.float64)
    rows = block[idx]
    previous = block[np.maximum(idx - 1, 0)]  # one gather; the block's first row has the row before it
    if idx[0] == 0:
        previous[0] = np.nan if before is None else np.asarray(before, block.dtype).reshape(-1)
    held = held_cells(model, rows, previous)
    if len(_missing.nonfinite_rows(rows)):  # a held cell is a value; a row with inf names none
        held &= np.isfinite(rows) & ~np.isinf(rows).any(axis=1)[:, None]
    rows = model_rows(model, np.asarray(rows, np.float64))
    some = np.flatnonzero(held.any(axis=1))
    if not len(some):
        return top
    at = idx[some]
    c = contributions[at] if contributions is not None else contributor(model, "reconstruction")(rows[some])
    cutoff = model.outlier_cutoff_
    rest = d2[at, None] - c  # the row's d^2 with the cell at its best value (on its observed cells)
    counts = observed_counts(rows[some])
    if (counts < rows.shape[1]).any():  # on the p-channel scale of the cutoff, as calibrated_d2 maps it
        shape = rest.shape
        rest = _missing.equivalent_d2(rest.ravel(), np.repeat(counts, shape[1]), rows.shape[1]).reshape(shape)
    with np.errstate(invalid="ignore"):
        explains = held[some] & ((rest <= cutoff) | (calibrated[at] <= cutoff)[:, None])
    named = explains.any(axis=1)
    top[at[named]] = np.argmax(np.where(explains[named], c[named], -np.inf), axis=1)
    return top


def unusable_rows(block, nan_policy: str) -> np.ndarray:
    """Mask of the rows of ``block`` a per-row method cannot use: holding NaN or inf, except,
    under ``"partial"``, rows with some cells NaN (none inf).  Under ``"raise"`` such rows raise
    :class:`NonFiniteRowsError` instead."""
    bad = np.zeros(len(block), bool)
    bad[_missing.nonfinite_rows(block)] = True
    if bad.any() and nan_policy == "partial":
        bad &= ~_missing.partial_rows(np.asarray(block))
    if bad.any() and nan_policy == "raise":
        raise NonFiniteRowsError(
            f"{int(bad.sum())} of {len(bad)} rows hold NaN or inf; clean them, or fit with "
            "nan_policy='omit' to get NaN for such rows, or nan_policy='partial' to have rows with some cells "
            "missing used by their observed cells"
        )
    return bad


def nan_for_nonfinite_rows(func, nan_policy: str = "omit"):
    """Wrap a row-block function: rows holding NaN or inf give NaN (False for flags).

    Under ``nan_policy="raise"`` such rows raise :class:`NonFiniteRowsError`
    instead (for dask input, when the block is computed).  Under
    ``"partial"``, rows with some cells NaN (none inf) reach ``func`` as
    they are, which handles them by their observed cells; rows with every
    cell NaN, or an inf, give NaN.
    """

    def wrapped(block, *context):
        bad = unusable_rows(block, nan_policy)
        if not bad.any():
            return func(block, *context)
        out = func(np.where(bad[:, None], 0.0, block), *context)
        out[bad] = np.nan if out.dtype.kind == "f" else 0
        return out

    return wrapped


def projector(model: Any, nan_policy: str):
    """The row-block function of :meth:`MCPCA.transform`.

    Under ``nan_policy="partial"`` a row with gaps is first completed by
    its missing cells' conditional expectation (:func:`._missing.completed`).
    """
    comps, mean = model.components_, model.mean_
    cov = precision_power(model, -1.0) if nan_policy == "partial" else None

    def func(b):
        Y = np.asarray(b, np.float64) - mean
        if cov is not None and np.isnan(Y).any():
            Y = _missing.completed(Y, cov)
        return Y @ comps.T

    return func


def contributor(model: Any, method: str):
    """The row-block function of :meth:`MCPCA.channel_contributions` by ``method``."""
    if method not in CONTRIBUTION_METHODS:
        raise ValueError(
            f"method={method!r} is invalid; expected 'reconstruction', 'whitened', 'product' or 'residual'"
        )
    mean = model.mean_
    if method in ("reconstruction", "residual"):
        P, cov = precision_power(model, 1.0), precision_power(model, -1.0)

        def func(b):  # a row with gaps ("partial"): on its observed channels, NaN for a missing cell
            return contributions_with_gaps(np.asarray(b, np.float64) - mean, P, cov)
    elif method == "whitened":
        root = precision_power(model, 0.5)

        def func(b):
            return ((np.asarray(b, np.float64) - mean) @ root) ** 2
    else:
        P = precision_power(model, 1.0)

        def func(b):
            Y = np.asarray(b, np.float64) - mean
            return Y * (Y @ P)

    return func


def row_outputs(model: Any, outputs: tuple[str, ...], nan_policy: str):
    """The row-block function of :meth:`MCPCA.score_rows`: a dict of the ``outputs`` of one block.

    Rows holding NaN or inf are handled as each method's own block function handles them
    (:func:`nan_for_nonfinite_rows`; ``n_observed`` always under ``"partial"``).
    """
    project = projector(model, nan_policy) if "scores" in outputs else None
    contribute = contributor(model, "reconstruction") if "contributions" in outputs else None
    wanted = set(outputs)
    top_with_d2 = "top_channel" in wanted and contribute is None  # from the distances' sweep
    policy = nan_policy

    cellwise = getattr(model, "cell_cutoff_", None) is not None

    def distances(block, before, original, whole):
        parts = {}
        top = d2 = calibrated = flags = None
        stuck = stuck_cells(model, original, before) if {"outlier", "top_channel", "cells"} & wanted else None
        # a cellwise model judges the block's cells once, for every output that reads them
        judged = judge_cells(model, block) if cellwise and wanted - {"scores", "contributions"} else None
        if judged is not None and "n_observed" in wanted and whole:  # no row masked out
            parts["n_observed"] = observed_counts(block) - judged.flags.sum(axis=1).astype(np.int16)
        if {"weight", "outlier", "d2", "top_channel"} & wanted:
            d2, top = distances_and_top(model, block, top=top_with_d2, judged=judged)
            if "d2" in wanted:
                parts["d2"] = d2.copy()
            if {"weight", "outlier", "top_channel"} & wanted:
                calibrated = calibrated_d2(model, block, d2, judged=judged)
                if "weight" in wanted:
                    parts["weight"] = weight(model, calibrated)
                if {"outlier", "top_channel"} & wanted:
                    flags = outlier_flags(model, np.asarray(block, np.float64), calibrated, stuck)
                    if "outlier" in wanted:
                        parts["outlier"] = flags
        if project is not None:
            parts["scores"] = project(block)
        if "cells" in wanted:
            parts["cells"] = (judged.flags if judged is not None else cell_flags(model, block)) | stuck
        c = None
        if contribute is not None:
            c = contribute(block)
            parts["contributions"] = c
            if "top_channel" in wanted:
                top = top_channel(c)
        if "top_channel" in wanted:
            last = None if before is None else before[-1:]
            parts["top_channel"] = isolated_top(model, original, last, d2, calibrated, flags, top, c)
        return parts

    def fused(block, before=None):
        """The outputs of ``block`` (as stored); ``before``: the :data:`CONTEXT_ROWS` rows before it, or None."""
        original, block = block, model_rows(model, block)
        if not len(_missing.nonfinite_rows(block)):  # complete rows, as most blocks hold: no masks to make
            parts = distances(block, before, original, True)
            if "n_observed" in outputs and "n_observed" not in parts:
                parts["n_observed"] = judged_counts(model, block)
            return parts
        bad = unusable_rows(block, policy)
        parts = distances(np.where(bad[:, None], 0.0, block) if bad.any() else block, before, original,
                          not bad.any())
        for name, out in parts.items():
            if bad.any():
                out[bad] = np.nan if out.dtype.kind == "f" else (-1 if name == "top_channel" else 0)
        if "n_observed" in outputs and "n_observed" not in parts:
            parts["n_observed"] = nan_for_nonfinite_rows(lambda b: judged_counts(model, b), "partial")(block)
        return parts

    return fused
