"""A fit with operating modes, on the estimator: the modes' models set, and each row's mode.

``ModesMixin`` (mixed into :class:`~dask_mcpca.MCPCA`) sets what a fit with
``modes`` found (``_set_modes``: a single-mode model per mode, the largest
mode's attributes on the estimator, the modes' own attributes) and tells a
row's mode (:meth:`~MCPCA.predict_mode`).  How the modes are found and
fitted is :mod:`._fit_modes`; the rule that sends a row to a mode, :mod:`._modes`.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any

import dask.array as da
import numpy as np
from sklearn.base import clone
from sklearn.utils.validation import check_is_fitted

from . import _modes
from ._fit_modes import ModesResult
from ._update import UPDATE_ATTRIBUTES

__all__ = ["MODE_ATTRIBUTES", "ModesMixin", "RUNTIME_PARAMS"]

#: What a fit with ``modes`` sets beside the usual attributes (removed by a refit).
MODE_ATTRIBUTES = ("mode_models_", "n_modes_", "modes_", "mode_weights_", "mode_means_", "mode_channels_",
                   "_mode_finder")
#: The estimator's parameters read at run time, not fitted: its modes' models take them from it on ``partial_fit``.
RUNTIME_PARAMS = ("nan_policy", "progress")


class ModesMixin:
    """The operating modes' part of :class:`~dask_mcpca.MCPCA`: a fit's modes set, and each row's mode."""

    def _set_modes(self, result: ModesResult) -> None:
        """Set a fit with several modes: a single-mode model per mode (:meth:`_adopt_modes`) and the
        passes of the whole fit."""
        models = []
        for one in result.results:
            model = clone(self).set_params(modes=None)
            model._set_fitted(one)
            models.append(model)
        self._adopt_modes(models, result.weights)
        self.modes_ = result.labels
        self.n_passes_ = result.n_passes
        self.n_partial_reads_ = result.n_partial_reads

    def _update_modes(self, X) -> None:
        """:meth:`partial_fit` of a model with modes: each new row goes to its mode (:meth:`predict_mode`,
        one pass) and each mode with new rows is updated by them (:meth:`partial_fit` of its model, one
        pass each); the shares follow the rows seen (:meth:`_adopt_modes`).  ``X``: full-row blocks.

        Each mode's model is updated with the estimator's run-time parameters (:data:`RUNTIME_PARAMS`, which
        ``set_params`` may have changed since the fit), and on a copy: the modes change together or, where
        one mode's update raises, not at all.

        The rows are sent to the modes as :meth:`predict_mode` does, without its check of the channel names:
        ``X`` is the rows :meth:`partial_fit` checked and then read into unnamed blocks, which would warn
        "X does not have valid feature names" of a model fitted on named channels."""
        codes = self._map_row_blocks(X, partial(_modes.best_modes, self), None, np.int64)  # predict_mode's rule
        codes = np.asarray(codes.compute() if isinstance(codes, da.Array) else codes)
        runtime = {name: getattr(self, name) for name in RUNTIME_PARAMS}
        models, passes, n_samples = [], 1, 0
        for m, model in enumerate(self.mode_models_):
            model = copy.deepcopy(model).set_params(**runtime)
            mine = codes == m
            if mine.any():
                model.partial_fit(X[mine])
                passes, n_samples = passes + 1, n_samples + model.n_samples_  # the rows kept (omit skips some)
            models.append(model)
        self._adopt_modes(models, [m.n_samples_seen_ for m in models])
        self.n_samples_, self.n_passes_ = int(n_samples), passes

    def _adopt_modes(self, models: list, weights) -> None:
        """The modes' models and shares on the estimator (see ``n_modes_``): the largest mode's fitted
        attributes and robust state, but not its update sums (each mode keeps its own) nor its ``scale_``
        (each mode has its own; rows are judged as stored); then the rule that sends rows to modes,
        built again."""
        self.mode_models_, self.n_modes_ = models, len(models)
        weights = np.asarray(weights, np.float64)
        self.mode_weights_ = weights / weights.sum()
        largest = models[int(np.argmax(self.mode_weights_))]
        for name, value in vars(largest).items():
            if name.endswith("_") and not name.startswith("_") and name not in (*UPDATE_ATTRIBUTES, "scale_"):
                setattr(self, name, value)
        # a loaded model's modes hold no robust state (it is not saved), nor do modes an update left untouched
        self._robust_state = getattr(largest, "_robust_state", None)
        self._robust_unit = getattr(largest, "_robust_unit", None)
        self.mode_means_ = np.stack([m.mean_ * getattr(m, "scale_", 1.0) for m in models])
        vars(self).pop("_mode_finder", None)
        self.mode_channels_ = _modes.finder(self).channels

    def predict_mode(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """The operating mode of each row: the index into ``modes_`` of the most likely mode.

        Decided on the channels that tell the modes apart (``mode_channels_``: for some pair of modes,
        the centre moves by 2 pooled SDs or the spread by 3x), by each mode's robust Gaussian and its
        share of the rows, so that a fault on another channel does not send a row to a mode whose
        wider spread would explain it.  Every row is judged (:meth:`is_outlier`, :meth:`predict`,
        :meth:`decision_function`) against this mode.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Input kinds as for :meth:`fit`.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        Returns
        -------
        modes : ndarray or dask array of int64, shape (n_samples,)
            0 for every row of a model fitted without modes.  -1 (no mode) for a row that cannot be judged,
            as ``score_rows``'s ``mode`` gives it: a row holding NaN or inf under ``nan_policy="omit"`` (all
            NaN, or any cell); under ``"raise"`` such rows raise :class:`NonFiniteRowsError`.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = np.concatenate([rng.normal(size=(600, 3)), rng.normal(size=(400, 3)) + [10, -8, 6]])
        >>> model = MCPCA(modes="auto").fit(X)
        >>> model.n_modes_, np.bincount(model.predict_mode(X)).tolist()
        (2, [600, 400])
        """
        check_is_fitted(self, "components_")
        # nan_policy="cells": the rows with NaN or inf reach modes_of_rows, which gives them -1 (NO_MODE)
        return self._map_rows(X, partial(_modes.modes_of_rows, self, nan_policy=self.nan_policy), None,
                              dtype=np.int64, storage_options=storage_options, nan_policy="cells", as_stored=True,
                              modes_ok=True)
