"""The model's rules for rows: what the per-row methods of a fitted model compute, as functions of it.

As scikit-learn's ``decomposition/_base.py`` holds what a fitted PCA computes
apart from how it is fitted, the model's algebra lives apart from the fit, in
four modules, each a function of ``model``: anything with the fitted
attributes it reads (a fitted estimator, or a fit's
:class:`._fit_result.ModelView` while the fit is assembled).

- :mod:`._precision`: floored variances, the precision and its powers, the
  working unit, the model's units (:func:`._precision.model_rows`), the
  channel contributions;
- :mod:`._distances`: ``d^2``, the distance the outlier rule judges
  (:func:`._distances.calibrated_d2`), cells judged one by one;
- :mod:`._stuck`: cells a stuck sensor holds, read from rows in order;
- this module: the correntropy weight, the outlier flags and the repeated
  values and rows, the contamination cutoff, and the row-block functions of
  the per-row methods (:func:`row_outputs`, :func:`projector`, rows holding
  NaN or inf).

The report (:mod:`._report_block`) and the estimator's methods (:mod:`._base`)
use them; no one reaches into the estimator's private methods.  The
row-block functions take rows as stored; the others rows in the model's
units.  :mod:`._base` and :mod:`._modes` call :func:`._precision.precision_power`,
:func:`._precision.contributor`, :func:`._distances.mahalanobis_d2` and the
others through this module (``_model.precision_power``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _missing
from ._distances import (
    calibrated_d2,
    cell_flags,
    cell_flags_of_any_rows,
    distances_and_top,
    judge_cells,
    observed_counts,
)
from ._distances import mahalanobis_d2 as mahalanobis_d2  # for _modes (``_model.mahalanobis_d2``)
from ._exceptions import NonFiniteRowsError
from ._precision import contributor, model_rows, precision_power, top_channel
from ._repeated import held_out
from ._shift import FIXED_POINT, fault_cells, shared_product
from ._stuck import HOLD_WINDOW, isolated_top

__all__ = [
    "CONTEXT_ROWS",
    "ROW_OUTPUTS",
    "contamination_cutoff",
    "judged_counts",
    "judged_rows",
    "nan_for_nonfinite_rows",
    "outlier_flags",
    "projector",
    "ordered_projector",
    "repeated",
    "row_outputs",
    "unusable_rows",
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


#: Rows before each block that a row-block method reads to judge the block's rows in order
#: (:func:`._stuck.stuck_cells`; the last of them is :func:`._stuck.isolated_top`'s row before).
CONTEXT_ROWS = HOLD_WINDOW


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
    row, or a stuck cell (``stuck``, :func:`._stuck.stuck_cells`).

    Parameters
    ----------
    model : MCPCA or FitResult
        A fitted model.
    rows : ndarray of shape (n_rows, n_features_in_)
        Rows in float64, data units.
    d2 : ndarray of shape (n_rows,)
        Their :func:`._distances.calibrated_d2`.
    stuck : ndarray of bool, shape (n_rows, n_features_in_), optional
        Their stuck cells (None: none).

    Returns
    -------
    flags : ndarray of bool, shape (n_rows,)
    """
    flags = (d2 > model.outlier_cutoff_) | repeated(model, rows)
    return flags if stuck is None else flags | stuck.any(axis=1)


def judged_rows(model: Any, block, before, original=None, own=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A block's rows (as stored, in order; ``before``: the rows before it, :data:`CONTEXT_ROWS`) as
    :meth:`MCPCA.is_outlier`, ``predict`` and ``decision_function`` judge them: their
    :func:`._distances.calibrated_d2`, the flags of :func:`outlier_flags`, and the rows flagged whatever their
    distance (a repeated value or row, a stuck run).  ``original``: the block before its unusable rows were
    zeroed (:func:`nan_for_nonfinite_rows`), whose runs the stuck-run rule reads, as :func:`row_outputs` does:
    a zeroed row would restart every channel's run.  ``own``: a mode's rows, whose means the shift rule takes
    (:func:`._shift.shifted_cells`)."""
    rows = model_rows(model, np.asarray(block, np.float64))
    d2 = calibrated_d2(model, rows)
    stuck = fault_cells(model, block if original is None else original, before, d2, own)
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
    model (``cell_cutoff_``) not flagged either (:func:`._distances.cell_flags`)."""
    counts = observed_counts(block)
    if getattr(model, "cell_cutoff_", None) is not None:
        counts = counts - judge_cells(model, block).flags.sum(axis=1).astype(np.int16)
    return counts


def unusable_rows(block, nan_policy: str, *, modes: bool = False) -> np.ndarray:
    """Mask of the rows of ``block`` a per-row method cannot use: holding NaN or inf, except,
    under ``"partial"``, rows with some cells NaN (none inf).  Under ``"raise"`` such rows raise
    :class:`NonFiniteRowsError` instead; ``modes``: the model has modes, which refuse
    ``nan_policy='partial'``, so the error does not suggest it."""
    bad = np.zeros(len(block), bool)
    bad[_missing.nonfinite_rows(block)] = True
    if bad.any() and nan_policy == "partial":
        bad &= ~_missing.partial_rows(np.asarray(block))
    if bad.any() and nan_policy == "raise":
        n_bad = int(bad.sum())
        raise NonFiniteRowsError(  # a block does not know where it lies, nor what the other blocks hold
            f"in a block of {len(bad):,} rows (the first found; others may hold more), "
            f"{f'{n_bad:,} rows hold' if n_bad > 1 else '1 row holds'} NaN or inf; clean them, or fit with "
            "nan_policy='omit' to get NaN for such rows"
            + ("" if modes else ", or nan_policy='partial' to have rows with some cells missing used by their "
               "observed cells")
        )
    return bad


def nan_for_nonfinite_rows(func, nan_policy: str = "omit", *, original: bool = False, modes: bool = False):
    """Wrap a row-block function: rows holding NaN or inf give NaN (False for flags).

    Under ``nan_policy="raise"`` such rows raise :class:`NonFiniteRowsError`
    instead (for dask input, when the block is computed).  Under
    ``"partial"``, rows with some cells NaN (none inf) reach ``func`` as
    they are, which handles them by their observed cells; rows with every
    cell NaN, or an inf, give NaN.  ``original``: ``func`` also takes the
    block as it came (``original=``), where it reads rows in order.  ``modes``: as
    :func:`unusable_rows` takes it.
    """

    def wrapped(block, *context):
        bad = unusable_rows(block, nan_policy, modes=modes)
        if not bad.any():
            return func(block, *context)
        extra = {"original": block} if original else {}
        out = func(np.where(bad[:, None], 0.0, block), *context, **extra)
        out[bad] = np.nan if out.dtype.kind == "f" else 0
        return out

    return wrapped


def projector(model: Any, nan_policy: str):
    """The row-block function of :meth:`MCPCA.transform` on rows in the model's units: ``func(b, stuck=None)``.

    Under ``nan_policy="partial"`` a row with gaps is first completed by
    its missing cells' conditional expectation (:func:`._missing.completed`);
    a cellwise model completes its flagged cells the same way (as
    :meth:`MCPCA.impute` fills them), so one glitched cell does not move
    the row's scores: the cells of :meth:`MCPCA.cell_outliers`, those
    :func:`._distances.cell_flags` judges and ``stuck``, a stuck sensor's cells
    (:func:`._stuck.stuck_cells`, read from the rows as stored and in order;
    :func:`ordered_projector`).  A model not fitted with ``cellwise=True``
    projects every cell as given.
    """
    comps, mean = model.components_, model.mean_
    cellwise = getattr(model, "cell_cutoff_", None) is not None
    cov = precision_power(model, -1.0) if nan_policy == "partial" or cellwise else None

    def func(b, stuck=None):
        b = np.asarray(b, np.float64)
        Y = b - mean
        if cellwise:
            flags = cell_flags(model, b)
            Y[flags if stuck is None else flags | stuck] = np.nan
        if cov is not None and np.isnan(Y).any():
            Y = _missing.completed(Y, cov)
        return Y @ comps.T

    return func


def ordered_projector(model: Any, nan_policy: str):
    """:func:`projector` on a block as stored, read in order: ``func(block, before=None, original=None)``
    (``before``: the :data:`CONTEXT_ROWS` rows before it; ``original``: the block before its unusable rows were
    zeroed, :func:`nan_for_nonfinite_rows`), completing a stuck sensor's cells as a cellwise model's flagged
    cells (:meth:`MCPCA.transform` of a cellwise model)."""
    project = projector(model, nan_policy)

    def func(block, before=None, original=None):
        stuck = fault_cells(model, block if original is None else original, before)
        return project(model_rows(model, block), stuck)

    return func


def row_outputs(model: Any, outputs: tuple[str, ...], nan_policy: str, own=None):
    """The row-block function of :meth:`MCPCA.score_rows`: a dict of the ``outputs`` of one block.

    Rows holding NaN or inf are handled as each method's own block function handles them
    (:func:`nan_for_nonfinite_rows`; ``n_observed`` always under ``"partial"``).  ``own``: a mode's rows, as
    :func:`judged_rows` takes them.
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
        needs_faults = {"outlier", "top_channel", "cells"} & wanted or (cellwise and project is not None)
        # a cellwise model judges the block's cells once, for every output that reads them
        judged = judge_cells(model, block) if cellwise and wanted - {"scores", "contributions"} else None
        if judged is not None and "n_observed" in wanted and whole:  # no row masked out
            parts["n_observed"] = observed_counts(block) - judged.flags.sum(axis=1).astype(np.int16)
        # the shift rule's residuals, made once where it makes them: they rank the channels too
        product, n_prior = shared_product(model, original, before) if top_with_d2 and not cellwise else (None, 0)
        if {"weight", "outlier", "d2", "top_channel"} & wanted:
            d2, top = distances_and_top(model, block, top=top_with_d2, judged=judged, product_exp=FIXED_POINT,
                                        product=None if product is None else product[n_prior:])
            if "d2" in wanted:
                parts["d2"] = d2.copy()
            if {"weight", "outlier", "top_channel"} & wanted:
                calibrated = calibrated_d2(model, block, d2, judged=judged)
                if "weight" in wanted:
                    parts["weight"] = weight(model, calibrated)
        # the rules that read rows in order; the shift rule's means leave out the rows the distance flags
        stuck = fault_cells(model, original, before, calibrated, own, product) if needs_faults else None
        if calibrated is not None and {"outlier", "top_channel"} & wanted:
            flags = outlier_flags(model, np.asarray(block, np.float64), calibrated, stuck)
            if "outlier" in wanted:
                parts["outlier"] = flags
        if project is not None:
            parts["scores"] = project(block, stuck)  # a cellwise model completes the stuck cells too
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
        if "cells" in parts and bad.any():  # as cell_outliers judges them: an inf cell flagged, the rest on their own,
            # and a stuck sensor's cells (its run read from the rows as stored, as for the other rows)
            parts["cells"][bad] = (cell_flags_of_any_rows(model, block[bad])
                                   | fault_cells(model, original, before, own=own)[bad])
        if "n_observed" in outputs and "n_observed" not in parts:
            parts["n_observed"] = nan_for_nonfinite_rows(lambda b: judged_counts(model, b), "partial")(block)
        return parts

    return fused
