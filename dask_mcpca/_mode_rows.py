"""Per-row outputs of a model with operating modes: each row's from the mode that judges it.

A model fitted with ``modes`` (:mod:`._modes`) holds one ordinary model
per mode (``mode_models_``).  A row is judged by the mode that explains it
best (:func:`._modes.best_modes`); here :meth:`MCPCA.score_rows` and
:meth:`MCPCA.channel_contributions` take each row's outputs from that
mode's own row-block function (:func:`._model.row_outputs`,
:func:`._model.contributor`), run on the whole block so that the rules
that read rows in order (a stuck run, the row before) see the same rows
as for a model without modes.  A model without modes gets its outputs
unchanged, and ``mode`` 0 for every row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _model, _modes

__all__ = ["MODE_DTYPE", "NO_MODE", "contributor_by_mode", "row_outputs_by_mode"]

#: The dtype of the ``mode`` output (an index into ``modes_``).
MODE_DTYPE = np.int16
#: The ``mode`` of a row no mode judges (a row holding NaN or inf).
NO_MODE = _modes.NO_MODE


def row_outputs_by_mode(model: Any, outputs: tuple[str, ...], nan_policy: str):
    """The row-block function of :meth:`MCPCA.score_rows` for ``outputs`` (which may name ``"mode"``).

    Without modes: :func:`._model.row_outputs`, with ``mode`` 0 (:data:`NO_MODE` for a row holding NaN or
    inf).  With modes: each row's outputs are
    its mode's (``d2`` its mode's Mahalanobis distance, ``weight`` its :meth:`MCPCA.score_samples`, the
    flag, the contributions and the channel at fault its mode's); ``mode`` is :data:`NO_MODE` for a row
    no mode judges.  ``"scores"`` (each mode has its own components) is not among them.
    """
    wanted = tuple(o for o in outputs if o not in ("mode", "weight"))
    want_mode = "mode" in outputs
    if not _modes.has_modes(model):
        inner = _model.row_outputs(model, tuple(o for o in outputs if o != "mode"), nan_policy)

        def plain(block, before=None):
            parts = inner(block, before) if len(outputs) > want_mode else {}
            if want_mode:  # the one mode, NO_MODE where the row cannot be judged (as predict_mode gives it)
                parts["mode"] = np.where(_model.unusable_rows(block, nan_policy), NO_MODE, 0).astype(MODE_DTYPE)
            return parts

        return plain
    fused = [_model.row_outputs(sub, wanted, nan_policy, _modes.mode_rows(model, m)) if wanted else None
             for m, sub in enumerate(model.mode_models_)]

    def by_mode(block, before=None):
        bad = _model.unusable_rows(block, nan_policy, modes=True)
        clean = np.where(bad[:, None], 0.0, block) if bad.any() else block
        best = _modes.best_modes(model, clean).astype(MODE_DTYPE)
        best[bad] = NO_MODE
        parts = {}
        if wanted:
            present = np.unique(best[best != NO_MODE]).tolist() or [0]
            for m in present:
                mine = fused[m](block, before)
                if not parts:  # the first mode's outputs, rows of no mode included (NaN, False, -1 there)
                    parts = mine
                    continue
                rows = best == m
                for name, out in mine.items():
                    parts[name][rows] = out[rows]
        if "weight" in outputs:
            d2 = _modes.judged_rows(model, clean, before)[0]
            parts["weight"] = np.where(bad, np.nan, _model.weight(model, d2))
        if want_mode:
            parts["mode"] = best
        return {name: parts[name] for name in outputs}

    return by_mode


def contributor_by_mode(model: Any, method: str):
    """The row-block function of :meth:`MCPCA.channel_contributions` of a model with modes, for rows as stored:
    each row's contributions under its mode's model (:func:`._model.contributor`, the rows in that mode's units)."""
    contributors = [_model.contributor(sub, method) for sub in model.mode_models_]

    def by_mode(block):
        block = np.asarray(block, np.float64)
        best = _modes.best_modes(model, block)
        out = np.full(block.shape, np.nan)
        for m, (sub, contribute) in enumerate(zip(model.mode_models_, contributors, strict=True)):
            mine = best == m
            if mine.any():
                out[mine] = contribute(_model.model_rows(sub, block[mine]))
        return out

    return by_mode
