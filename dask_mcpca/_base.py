"""What a fitted :class:`~dask_mcpca.MCPCA` computes for rows: ``_BaseMCPCA``, the per-row public methods.

As scikit-learn's ``_BasePCA`` (``decomposition/_base.py``) holds
``transform``, ``inverse_transform``, ``get_covariance`` and
``get_precision`` apart from how a PCA is fitted, ``_BaseMCPCA`` holds the
public methods of a fitted model.  Here: the row mapping they all use
(``_map_rows``: a row-block function of :mod:`._model` over the rows,
eagerly for in-memory input, lazily for dask and stores, the result
labelled like the input by :mod:`._labels`), projections, the covariance
and precision, the log-likelihood and ``loadings_``.  Mixed in by job: the
outlier detector's distances, scores and flags (:mod:`._detector`) and the
per-channel outputs and :meth:`~MCPCA.score_rows` (:mod:`._channel_methods`).
:class:`~dask_mcpca.MCPCA` (:mod:`._estimator`) adds the parameters and
how a model is fitted.
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from . import _labels, _model, _modes
from ._channel_methods import ChannelMethodsMixin
from ._detector import OutlierDetectorMixin
from ._io import as_row_blocks
from ._passes import rows_before
from ._row_methods import check_n_features, fill_docstrings, map_in_order

__all__ = ["_BaseMCPCA"]


@fill_docstrings
class _BaseMCPCA(OutlierDetectorMixin, ChannelMethodsMixin, ClassNamePrefixFeaturesOutMixin, TransformerMixin,
                 BaseEstimator):
    """The per-row methods of a fitted model; :class:`~dask_mcpca.MCPCA` fits it.

    Not to be used directly: the fitted attributes these methods read
    (``components_``, ``mean_``, ``explained_variance_``, ...) are set by
    :meth:`MCPCA.fit`, :meth:`MCPCA.partial_fit` or :func:`dask_mcpca.load`.
    """

    @property
    def _n_features_out(self) -> int:
        """Columns of :meth:`transform` (for ``get_feature_names_out``: ``mcpca0``, ``mcpca1``, ...)."""
        return self.n_components_

    @property
    def loadings_(self):
        """The components as an ``xarray.DataArray`` of dims ``("component", channel)``.

        The channel dimension and its coordinate are those of the fit's input
        (``feature_dim_in_``, ``feature_names_in_``); ``"feature"`` and no
        coordinate when it had none.  Needs xarray (``pip install dask-mcpca[xarray]``).

        Examples
        --------
        >>> import numpy as np, xarray as xr
        >>> from dask_mcpca import MCPCA
        >>> X = xr.DataArray(np.random.default_rng(0).normal(size=(500, 3)) * [3.0, 1.0, 0.3],
        ...                  dims=("time", "channel"), coords={"channel": ["T1", "P1", "V1"]})
        >>> L = MCPCA(n_components=2).fit(X).loadings_
        >>> L.dims, list(L.channel.values)
        (('component', 'channel'), ['T1', 'P1', 'V1'])
        >>> str(abs(L.sel(component=0)).idxmax().item())
        'T1'
        """
        check_is_fitted(self, "components_")
        import xarray as xr

        dim = getattr(self, "feature_dim_in_", _labels.DEFAULT_FEATURE_DIM)
        coords = {_labels.COMPONENT_DIM: np.arange(self.n_components_)}
        names = getattr(self, "feature_names_in_", None)
        if names is not None:
            coords[dim] = names
        return xr.DataArray(self.components_, dims=(_labels.COMPONENT_DIM, dim), coords=coords, name="loadings")

    def _feature_columns(self, X: Any) -> tuple[str, Any]:
        """The channel dimension of per-channel outputs: its name and coordinate (None: none).

        Those of a DataArray ``X``; otherwise those of the fit's input.
        """
        if _labels.is_dataarray(X):
            dim = X.dims[1]
            return dim, (X.coords[dim].values if dim in X.coords else None)
        dim = getattr(self, "feature_dim_in_", _labels.DEFAULT_FEATURE_DIM)
        return dim, getattr(self, "feature_names_in_", None)

    # ---------------------------------------------------------- transforms
    def _map_rows(
        self, X, func, n_out: int | None, dtype=np.float64, *, columns=None, storage_options=None, nan_policy=None,
        frame_columns=None, in_order: bool = False, as_stored: bool = False, modes_ok: bool = False,
    ):
        """Apply ``func`` to row blocks: lazily for dask input, eagerly otherwise.

        A DataArray ``X`` gives a DataArray with its row coordinate (and
        ``columns``, the name and coordinate of a second dimension); a pandas
        DataFrame gives a Series or a DataFrame with its index (columns:
        ``frame_columns``, or ``X``'s for a per-channel result).
        ``nan_policy`` overrides the estimator's for this call.  ``in_order``: ``func(block, before)``
        also gets the rows before the block (:func:`._passes.rows_before`; None for numpy input),
        as stored; otherwise ``func`` gets them in the model's units (:func:`._model.model_rows`),
        unless ``as_stored``.  ``modes_ok``: ``func`` judges rows by their operating mode
        (:mod:`._modes`); other methods refuse a model with modes.
        """
        check_is_fitted(self, "components_")
        if not modes_ok:
            _modes.refuse(self, "this method")
        _labels.check_feature_names(self, X, reset=False)
        if not (in_order or as_stored) and getattr(self, "scale_", None) is not None:
            inner = func

            def func(b):
                return inner(_model.model_rows(self, b))

        out = self._map_row_blocks(X, func, n_out, dtype, storage_options, nan_policy=nan_policy, in_order=in_order)
        return _labels.like_rows(out, X, columns=columns, frame_columns=frame_columns)

    def _map_row_blocks(self, X, func, n_out: int | None, dtype, storage_options=None, *, nan_policy=None,
                        in_order: bool = False):
        X = as_row_blocks(X, storage_options=storage_options)
        check_n_features(self, X)
        policy = nan_policy or self.nan_policy
        if policy != "cells":  # "cells": ``func`` judges each cell itself, rows with NaN or inf included
            func = _model.nan_for_nonfinite_rows(func, policy, original=in_order, modes=_modes.has_modes(self))
        if isinstance(X, da.Array):
            if in_order and n_out is None:
                return map_in_order(X, func, dtype=dtype, meta=np.empty((0,), dtype))
            if in_order:  # n_out wide, each block with the rows before it (full-row blocks)
                return da.blockwise(func, "ik", X, "ij", rows_before(X, _model.CONTEXT_ROWS), "ij",
                                    new_axes={"k": n_out}, align_arrays=False, concatenate=True, dtype=dtype,
                                    meta=np.empty((0, 0), dtype))
            if n_out is None:
                return X.map_blocks(func, drop_axis=1, dtype=dtype)
            return X.map_blocks(func, chunks=(X.chunks[0], (n_out,)), dtype=dtype)
        return func(X)

    def transform(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """Project ``X`` on the components: ``(X - mean_) @ components_.T``.

        Parameters
        ----------
        {rows_in}

        Returns
        -------
        X_new : ndarray or dask array of shape ``(n_samples, n_components_)``
            A dask array (computed lazily, block by block) for dask or store input,
            a numpy array otherwise; for an ``xarray.DataArray`` ``X``, a DataArray
            of dims ``(row, "component")`` with ``X``'s row coordinates (time),
            lazy if ``X`` is.  For a pandas DataFrame ``X`` (or with
            ``set_output(transform="pandas")``), a DataFrame with ``X``'s index
            and columns ``get_feature_names_out()``.
            Rows with NaN or inf give NaN under ``nan_policy="omit"``; under
            ``"partial"``, a row with some NaN cells gives the scores of the
            row completed by :meth:`impute` (the conditional expectation of
            its missing cells given the observed ones); a model fitted with
            ``cellwise=True`` completes the cells :meth:`cell_outliers` flags
            the same way, a stuck sensor's cells among them (rows read in
            order, as time, with the rows before each block).

        Raises
        ------
        NonFiniteRowsError
            Rows hold NaN or inf and ``nan_policy="raise"`` (for dask input,
            when the result is computed).

        See Also
        --------
        inverse_transform : Back from scores to the data space.
        impute : The missing cells' conditional expectation.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(1000, 3)) * [3.0, 1.0, 0.3]
        >>> model = MCPCA(n_components=2).fit(X)
        >>> model.transform(X).shape
        (1000, 2)
        >>> import dask.array as da
        >>> Z = model.transform(da.from_array(X, chunks=(250, 3)))   # lazy
        >>> bool(np.allclose(Z.compute(), model.transform(X)))
        True
        """
        check_is_fitted(self, "components_")
        comps = self.components_
        columns = (_labels.COMPONENT_DIM, np.arange(len(comps)))
        cellwise = getattr(self, "cell_cutoff_", None) is not None  # completes stuck cells: reads rows in order
        project = (_model.ordered_projector if cellwise else _model.projector)(self, self.nan_policy)
        return self._map_rows(X, project, len(comps), columns=columns, storage_options=storage_options,
                              frame_columns=self.get_feature_names_out() if _labels.is_dataframe(X) else None,
                              in_order=cellwise)

    def inverse_transform(self, X: Any) -> np.ndarray | da.Array:
        """Map scores back to the data space: ``X @ components_ + mean_``.

        Parameters
        ----------
        X : array-like or dask array of shape ``(n_samples, n_components_)``
            Scores, as returned by :meth:`transform`.

        Returns
        -------
        X_original : ndarray or dask array of shape ``(n_samples, n_features_in_)``
            The projection of the original rows on the components' affine
            subspace; a dask array for dask input; for an ``xarray.DataArray``
            of scores, a DataArray with its row coordinates and the channel
            dimension and names of the fit; for a pandas DataFrame, a
            DataFrame with its index and the fit's channel names.

        See Also
        --------
        transform : From the data space to scores.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(1000, 3)) * [3.0, 1.0, 0.3]
        >>> model = MCPCA(n_components=2).fit(X)
        >>> X_back = model.inverse_transform(model.transform(X))
        >>> X_back.shape
        (1000, 3)
        >>> bool(np.abs(X_back - X)[:, 2].max() < 2.0)  # only the third, smallest axis is lost
        True
        """
        check_is_fitted(self, "components_")
        width = X.shape[-1] if getattr(X, "ndim", np.ndim(X)) == 2 else None
        if width != self.n_components_:
            shape = getattr(X, "shape", np.shape(X))
            raise ValueError(
                f"inverse_transform takes scores of shape (n_samples, {self.n_components_}) "
                f"(n_components_={self.n_components_}); got shape {tuple(shape)}"
            )
        scale = getattr(self, "scale_", None)
        scale = 1.0 if scale is None else scale  # scale="robust": from the model's units to the data's
        if _labels.is_dataarray(X):
            return _labels.like_rows((X.data @ self.components_ + self.mean_) * scale, X,
                                     columns=self._feature_columns(None))
        if isinstance(X, da.Array):
            return (X @ self.components_ + self.mean_) * scale
        out = (np.asarray(X) @ self.components_ + self.mean_) * scale
        if _labels.is_dataframe(X):  # pandas in, pandas out: the rows' index, the fit's channel names
            import pandas as pd

            names = getattr(self, "feature_names_in_", None)
            return pd.DataFrame(out, index=X.index, columns=names if names is not None else None)
        return out

    def score(self, X: Any, y: None = None, *, storage_options: dict | None = None) -> float:
        """Mean log-likelihood of the complete rows of ``X`` under the fitted Gaussian model.

        ``-(d^2 + n_features log(2 pi) + log det S) / 2`` averaged over the
        rows with every cell observed, ``d^2`` the robust distance
        (:meth:`mahalanobis`) and ``S`` = :meth:`get_covariance`: scikit-learn's
        ``PCA.score``, under the robust model, so that ``cross_val_score`` and
        grid searches (over ``n_components``, ``kernel_factor``) can rank
        models.  NaN when ``X`` has no complete row.

        Parameters
        ----------
        {rows_in}
        y : None
            Ignored.

        Returns
        -------
        float

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> X = np.random.default_rng(0).normal(size=(4000, 2))
        >>> round(MCPCA().fit(X).score(X), 1)  # -(2 + 2 log(2 pi)) / 2 for unit Gaussian rows
        -2.8
        """
        check_is_fitted(self, "components_")
        _modes.refuse(self, "this method")
        d2 = self.mahalanobis(X, storage_options=storage_options)
        counts = self.n_observed(X, storage_options=storage_options)
        if isinstance(d2, da.Array) or isinstance(counts, da.Array):
            d2, counts = da.compute(d2, counts)
        d2, counts = np.asarray(d2, np.float64), np.asarray(counts)
        complete = (counts == self.n_features_in_) & np.isfinite(d2)
        if not complete.any():
            return float("nan")
        logdet = np.linalg.slogdet(self.get_covariance())[1]
        if getattr(self, "scale_", None) is not None:  # the density of the rows in the data's units
            logdet += 2.0 * float(np.sum(np.log(self.scale_)))
        return float(-0.5 * (d2[complete].mean() + self.n_features_in_ * np.log(2 * np.pi) + logdet))

    def get_covariance(self) -> np.ndarray:
        """The fitted robust covariance: ``components_.T @ diag(explained_variance_) @ components_``
        plus ``noise_variance_`` in the discarded directions (floored at the fit's round-off level).

        Its inverse, :meth:`get_precision`, gives :meth:`mahalanobis`'s ``d^2 = y^T P y``.

        Returns
        -------
        cov : ndarray of shape (n_features, n_features)

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(5000, 2)) * [2.0, 0.5]
        >>> bool(np.allclose(MCPCA().fit(X).get_covariance(), [[4.0, 0.0], [0.0, 0.25]], atol=0.2))
        True
        """
        check_is_fitted(self, "components_")
        return _model.precision_power(self, -1.0)

    def get_precision(self) -> np.ndarray:
        """The inverse of :meth:`get_covariance`, whose quadratic form is :meth:`mahalanobis`'s ``d^2``.

        Returns
        -------
        precision : ndarray of shape (n_features, n_features)

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> model = MCPCA().fit(rng.normal(size=(2000, 3)))
        >>> bool(np.allclose(model.get_precision() @ model.get_covariance(), np.eye(3)))
        True
        """
        check_is_fitted(self, "components_")
        return _model.precision_power(self, 1.0)
