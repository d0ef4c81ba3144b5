"""What a fitted :class:`~dask_mcpca.MCPCA` computes for rows: ``_BaseMCPCA``, the per-row public methods.

As scikit-learn's ``_BasePCA`` (``decomposition/_base.py``) holds
``transform``, ``inverse_transform``, ``get_covariance`` and
``get_precision`` apart from how a PCA is fitted, ``_BaseMCPCA`` holds the
public methods of a fitted model: projections, the covariance and
precision, distances, weights, flags, labels, contributions and
:meth:`~MCPCA.score_rows`.  Each maps a row-block function of
:mod:`._model` over the rows (eagerly for in-memory input, lazily for dask
and stores) and labels the result like the input (:mod:`._labels`).
:class:`~dask_mcpca.MCPCA` (:mod:`._estimator`) adds the parameters and
how a model is fitted.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

import dask.array as da
import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from . import _labels, _missing, _model, _modes
from ._io import as_row_blocks
from ._mode_rows import MODE_DTYPE, contributor_by_mode, row_outputs_by_mode
from ._passes import rows_before

__all__ = ["ROW_OUTPUTS", "_BaseMCPCA"]

#: What :meth:`MCPCA.score_rows` computes: name -> dtype (``mode``: :mod:`._mode_rows`).
ROW_OUTPUTS = {**_model.ROW_OUTPUTS, "mode": MODE_DTYPE}


def _picker(name: str):
    """A block function taking output ``name`` out of a block of :meth:`MCPCA.score_rows`'s dicts."""

    def pick(parts):
        return parts[name]

    return pick


def _in_order(X: da.Array, func, **kwargs) -> da.Array:
    """``func(block, before)`` over the row blocks of ``X``, ``before`` the rows before each block
    (:func:`._passes.rows_before`): for row-block methods that read rows in order (a stuck sensor's run)."""
    before = rows_before(X, _model.CONTEXT_ROWS)
    return da.blockwise(func, "i", X, "ij", before, "ij", align_arrays=False, concatenate=True, **kwargs)


def _frame_like(out: Any, X: Any) -> Any:
    """``out`` (n_samples x n_features) as a DataFrame with ``X``'s index and columns when ``X`` is one."""
    if _labels.is_dataframe(X):
        import pandas as pd

        return pd.DataFrame(np.asarray(out), index=X.index, columns=X.columns)
    return out



#: The per-row methods' shared docstring parts, filled in by :func:`_fill_docstrings`
#: (``{rows_in}``: the X and storage_options parameters; ``{rows_out}``: what comes back).
_ROWS_IN = """X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Shape (n_samples, n_features), the features of the fit; input
            kinds as for :meth:`fit`.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`."""
_ROWS_OUT = """A dask array (computed lazily, block by block) for dask or store input,
            a numpy array otherwise; for an ``xarray.DataArray`` ``X``, a DataArray
            with ``X``'s row dimension and coordinates (time), lazy if ``X`` is;
            for a pandas DataFrame, a Series with its index."""


def _fill_docstrings(cls: type) -> type:
    """Put the shared parts into the docstrings of ``cls``'s methods (text, not ``str.format``:
    the docstrings hold other braces)."""
    for member in vars(cls).values():
        func = member.fget if isinstance(member, property) else member
        doc = getattr(func, "__doc__", None)
        if doc and "{rows_" in doc:
            func.__doc__ = doc.replace("{rows_in}", _ROWS_IN).replace("{rows_out}", _ROWS_OUT)
    return cls


@_fill_docstrings
class _BaseMCPCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
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
        if X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input"
            )
        func = _model.nan_for_nonfinite_rows(func, nan_policy or self.nan_policy)
        if isinstance(X, da.Array):
            if in_order:  # per-row outputs only
                return _in_order(X, func, dtype=dtype, meta=np.empty((0,), dtype))
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
            its missing cells given the observed ones).

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
        return self._map_rows(X, _model.projector(self, self.nan_policy), len(comps), columns=columns,
                              storage_options=storage_options,
                              frame_columns=self.get_feature_names_out() if _labels.is_dataframe(X) else None)

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

    def n_observed(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """Number of observed (not NaN) cells in each row: the channels a row is judged on.

        Under ``nan_policy="partial"`` a row's distance, score and flag use
        these cells only; a row holding inf counts 0 (it is not used).  A
        model fitted with ``cellwise=True`` judges rows on their good cells:
        its count leaves out the cells :meth:`cell_outliers` flags too.

        Parameters
        ----------
        {rows_in}

        Returns
        -------
        counts : ndarray or dask array of int16, shape (n_samples,)

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> model = MCPCA().fit(np.random.default_rng(0).normal(size=(500, 3)))
        >>> model.n_observed(np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, np.nan]]))
        array([2, 0], dtype=int16)
        """
        return self._map_rows(X, lambda b: _model.judged_counts(self, b), None, dtype=np.int16,
                              storage_options=storage_options, nan_policy="partial")

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

    def impute(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """``X`` with each missing (NaN) cell replaced by its conditional expectation under the fitted model.

        For a row with observed cells ``O`` and missing cells ``M``:
        ``x_M = mean_M + S_MO S_OO^-1 (x_O - mean_O)``, with ``S`` =
        :meth:`get_covariance` (the best linear reconstruction from the
        observed channels; Tipping and Bishop 1999).  Observed cells are
        returned unchanged; rows with every cell missing stay NaN.

        Parameters
        ----------
        {rows_in}

        Returns
        -------
        X_filled : ndarray or dask array of shape (n_samples, n_features)
            Lazy for dask or store input; a DataArray or DataFrame (index
            kept) for such input.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> t = rng.normal(size=(4000, 1))
        >>> X = np.hstack([t, 2 * t, -t]) + 0.01 * rng.normal(size=(4000, 3))
        >>> model = MCPCA(nan_policy="partial").fit(X)
        >>> np.round(model.impute(np.array([[1.0, np.nan, np.nan]])), 1)
        array([[ 1.,  2., -1.]])
        """
        check_is_fitted(self, "components_")
        mean, cov = self.mean_, self.get_covariance()
        cellwise = getattr(self, "cell_cutoff_", None) is not None

        scale = getattr(self, "scale_", None)

        def func(b):
            b = np.asarray(b, np.float64)
            y = _model.model_rows(self, b)
            gaps = np.isnan(b)
            if cellwise:  # flagged cells are left out too, and filled like missing ones
                gaps |= _model.cell_flags(self, y)
            if not gaps.any():
                return b.copy()
            filled = _missing.completed(np.where(gaps, np.nan, y) - mean, cov) + mean
            if scale is not None:
                filled = filled * scale  # back to the data's units
            return np.where(gaps, filled, b)  # the good cells exactly as given

        out = self._map_rows(
            X, func, self.n_features_in_, columns=self._feature_columns(X), storage_options=storage_options,
            nan_policy="partial", as_stored=True,
        )
        return _frame_like(out, X)

    def cell_outliers(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """Cells the fitted model cannot explain: True where a cell is judged bad.

        A cell is bad when it lies far from what the row's other good cells
        predict under the fitted model: its standardized residual
        ``r_j = (S_OO^-1 y_O)_j / sqrt(P_jj)`` (``S`` = :meth:`get_covariance`,
        ``P`` = :meth:`get_precision`, ``O`` the row's good cells) has
        ``r_j^2`` above ``cell_cutoff_`` (the chi-square(1) 99.9 % quantile
        when the model was not fitted with ``cellwise=True``).  Cells are
        judged greedily, the largest first, so a gross cell does not make its
        row's clean cells look bad (:mod:`dask_mcpca._cells`).  A missing
        (NaN) cell is not flagged; an infinite one is.

        Parameters
        ----------
        {rows_in}

        Returns
        -------
        flags : ndarray or dask array of bool, shape (n_samples, n_features)
            Lazy for dask or store input; a DataArray or DataFrame (index
            kept) for such input.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> t = rng.normal(size=(4000, 1))
        >>> X = np.hstack([t, 2 * t, -t, t]) + 0.1 * rng.normal(size=(4000, 4))
        >>> model = MCPCA(cellwise=True).fit(X)
        >>> model.cell_outliers(np.array([[1.0, 2.0, -1.0, 1.0], [1.0, 2.0, 5.0, 1.0]]))
        array([[False, False, False, False],
               [False, False,  True, False]])
        """
        check_is_fitted(self, "components_")
        out = self._map_rows(
            X, lambda b: _model.cell_flags(self, b), self.n_features_in_, dtype=bool,
            columns=self._feature_columns(X), storage_options=storage_options, nan_policy="partial",
        )
        return _frame_like(out, X)

    def mahalanobis(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """Squared robust Mahalanobis distance of each row under the fitted model.

        ``d^2 = sum_j z_j^2 / explained_variance_[j]`` over the components,
        plus the squared residual over ``noise_variance_`` when components were
        discarded.

        Parameters
        ----------
        {rows_in}

        Returns
        -------
        d2 : ndarray or dask array of shape (n_samples,)
            {rows_out}
            NaN for rows with NaN or inf under ``nan_policy="omit"``; under ``"partial"``,
            a row with some NaN cells gets its distance on the observed cells
            (chi-square with as many degrees of freedom as observed cells for a
            Gaussian row; NaN when none is observed).

        Raises
        ------
        NonFiniteRowsError
            Rows hold NaN or inf and ``nan_policy="raise"``.

        See Also
        --------
        score_samples : The correntropy weight ``exp(-d^2 / (2 c^2))``.
        is_outlier : ``d^2`` above ``outlier_cutoff_``.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(1000, 3)) * [3.0, 1.0, 0.3]
        >>> model = MCPCA(n_components=2).fit(X)
        >>> d2 = model.mahalanobis(X)
        >>> bool(abs(np.median(d2) / 2.37 - 1) < 0.2)   # about chi-square(3)'s median
        True
        """
        return self._map_rows(X, partial(_modes.mahalanobis_d2, self), None, storage_options=storage_options,
                              modes_ok=True)

    def score_samples(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """Correntropy weight of each row, in [0, 1]: ``exp(-d^2 / (2 c^2))``.

        ``d^2`` is the squared robust Mahalanobis distance under the fitted
        components and variances (the discarded directions share
        ``noise_variance_``) and ``c = kernel_scale_``.  Low scores are
        outlying rows.

        Parameters
        ----------
        {rows_in}

        Returns
        -------
        scores : ndarray or dask array of shape (n_samples,)
            {rows_out}
            NaN for rows with NaN or inf under ``nan_policy="omit"``; under ``"partial"``,
            a row with some NaN cells is scored by its observed cells, its
            distance first mapped to n_features channels at the same
            chi-square probability (so scores of rows with and without gaps
            compare).

        Raises
        ------
        NonFiniteRowsError
            Rows hold NaN or inf and ``nan_policy="raise"``.

        See Also
        --------
        mahalanobis : The ``d^2`` these weights come from.
        is_outlier : Scores below ``outlier_threshold_``.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(1000, 3)) * [3.0, 1.0, 0.3]
        >>> model = MCPCA(n_components=2).fit(X)
        >>> w = model.score_samples(np.vstack([X[:5], [[50.0, 50.0, 50.0]]]))
        >>> bool(((w[:5] > 0.01) & (w[:5] <= 1)).all()), bool(w[5] < 1e-10)
        (True, True)
        """
        check_is_fitted(self, "components_")
        return self._map_rows(X, lambda b: _model.weight(self, _modes.calibrated_d2(self, b)), None,
                              storage_options=storage_options, modes_ok=True)

    def is_outlier(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """True for rows whose ``d^2`` exceeds ``outlier_cutoff_``, or that hold a repeated value or row.

        Equivalently ``score_samples(X) < outlier_threshold_``, or the row
        holds one of ``repeated_values_`` (a stuck sensor's value) or equals
        one of ``repeated_rows_`` (a frozen logger's record), which the fit
        gave no weight, or holds a sensor stuck since the fit: rows are
        read in order, and a channel continuous at the fit, moving by far
        more than the resolution it is written at, that holds one value in
        ``STUCK_RUN`` (10) consecutive rows is stuck from the tenth on,
        unless it repeated values in the 1,024 rows before (a slow sensor
        logged faster than it updates; :func:`dask_mcpca._model.stuck_cells`).

        Parameters
        ----------
        {rows_in}

        Returns
        -------
        flags : ndarray or dask array of bool, shape (n_samples,)
            {rows_out}
            False for rows with NaN or inf under ``nan_policy="omit"``; under
            ``"partial"``, a row with k < n_features observed cells is flagged
            when its distance on them exceeds the chi-square(k) quantile at
            the probability of ``outlier_cutoff_`` under chi-square(n_features):
            the same false-alarm rate for a Gaussian row, whatever k.

        Raises
        ------
        NonFiniteRowsError
            Rows hold NaN or inf and ``nan_policy="raise"``.

        See Also
        --------
        score_samples : The weight compared with ``outlier_threshold_``.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(1000, 3)) * [3.0, 1.0, 0.3]
        >>> model = MCPCA(n_components=2).fit(X)
        >>> model.is_outlier([[0.0, 0.0, 0.0], [0.0, 0.0, 30.0]])
        array([False,  True])
        """
        check_is_fitted(self, "components_")

        def flags(block, before=None):
            return _modes.judged_rows(self, block, before)[1]

        return self._map_rows(X, flags, None, dtype=bool, storage_options=storage_options, in_order=True, modes_ok=True)

    def channel_contributions(
        self,
        X: Any,
        *,
        method: Literal["reconstruction", "whitened", "product", "residual"] = "reconstruction",
        storage_options: dict | None = None,
    ) -> np.ndarray | da.Array:
        """Each channel's part in each row's robust distance: which channel makes a row an outlier.

        With ``y = x - mean_`` and P the fitted precision (the inverse of the
        robust covariance in the metric of :meth:`mahalanobis`, so that
        ``d^2 = y^T P y``):

        - ``"reconstruction"`` (default): ``c_j = (P y)_j^2 / P_jj``, the
          reconstruction-based contribution (Alcala and Qin 2009): how much
          ``d^2`` drops when channel j alone is replaced by its conditional
          expectation given all the others
          (:func:`dask_mcpca._contributions.reconstruction_contributions`).
          They are >= 0 and do not depend on the channels' units; a large
          enough fault on one channel is always named that channel (unless
          another channel is an exact copy of it that nothing else predicts);
          they do not sum to ``d^2``.  ``"residual"`` is the same method
          under its former name.
        - ``"whitened"`` (the default in 0.1.0): ``c_j = (P^(1/2) y)_j^2``,
          the squared coordinates of the row whitened by the symmetric root
          of P; >= 0 and summing to ``d^2``, but they depend on the channels'
          units and spread a fault over correlated channels.
        - ``"product"``: ``c_j = y_j (P y)_j``; they sum to ``d^2`` but may be
          negative (a channel that pulls the row back towards the bulk) and
          depend on the units too.

        Single-channel faults (spike, stuck, drift, bias; 8 channels with
        random loadings, near-collinear sensor pairs, or units 1e6 apart):
        ``"reconstruction"`` names the faulty channel in 96-100 % of the
        flagged rows (85 % for a stuck sensor of a near-duplicate pair, which
        only the other channels can tell apart), ``"whitened"`` in 55-100 %
        (benchmarks/ATTRIBUTION.md).
        Faults of two channels at once (the demo's swapped channels) are
        not what it is built for: the two largest are the swapped channels
        for about 65 % of the flagged swapped rows, against 96 % with
        ``"whitened"`` (``benchmarks/archives.py``).

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Shape (n_samples, n_features), the features of the fit.
        method : {"reconstruction", "whitened", "product", "residual"}, default="reconstruction"
            The decomposition, as above.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        A model fitted with ``modes`` gives each row the contributions under
        the mode that judges it (:meth:`predict_mode`).

        Returns
        -------
        contributions : ndarray or dask array of shape (n_samples, n_features)
            A dask array (lazy) for dask or store input, numpy otherwise; for
            an ``xarray.DataArray`` ``X``, a DataArray with ``X``'s dims and
            coordinates; for a pandas DataFrame, a DataFrame with its index
            and columns.  NaN for rows with NaN or inf under ``nan_policy="omit"``;
            under ``"partial"``, a row with some NaN cells gets, by
            ``"reconstruction"``, its observed channels' contributions under
            their marginal model and NaN for each missing cell (the other
            methods give NaN for such rows).

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(2000, 4)) @ rng.normal(size=(4, 4))
        >>> model = MCPCA().fit(X)
        >>> row = X[:1].copy()
        >>> row[0, 2] += 40.0                                    # channel 2 goes wrong
        >>> c = model.channel_contributions(row)
        >>> int(c.argmax()), bool(c.max() <= model.mahalanobis(row)[0])
        (2, True)
        >>> w = model.channel_contributions(row, method="whitened")  # sums to d^2
        >>> bool(np.isclose(w.sum(), model.mahalanobis(row)[0]))
        True
        """
        check_is_fitted(self, "components_")
        modes = _modes.has_modes(self)
        out = self._map_rows(
            X, contributor_by_mode(self, method) if modes else _model.contributor(self, method), self.n_features_in_,
            columns=self._feature_columns(X), storage_options=storage_options, as_stored=modes, modes_ok=True,
        )
        if _labels.is_dataframe(X):
            import pandas as pd

            return pd.DataFrame(np.asarray(out), index=X.index, columns=X.columns)
        return out

    def score_rows(
        self,
        X: Any,
        *,
        outputs: tuple[str, ...] = tuple(ROW_OUTPUTS),
        storage_options: dict | None = None,
    ) -> dict:
        """Several per-row outputs at once, each row block read and its distance computed once.

        Each output equals the method it is named after; computed together,
        one function per row block makes them all (the distance ``d^2`` once,
        where :meth:`score_samples`, :meth:`is_outlier` and
        :meth:`mahalanobis` called apart compute it once each).

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Shape (n_samples, n_features), the features of the fit; input
            kinds as for :meth:`fit`.
        outputs : tuple of str
            Names from :data:`ROW_OUTPUTS`: ``"scores"`` (:meth:`transform`),
            ``"weight"`` (:meth:`score_samples`), ``"outlier"``
            (:meth:`is_outlier`), ``"d2"`` (:meth:`mahalanobis`),
            ``"contributions"`` (:meth:`channel_contributions`),
            ``"n_observed"`` (:meth:`n_observed`), ``"cells"``
            (:meth:`cell_outliers`, boolean, n_features wide) and ``"top_channel"``: the
            channel at fault (int16; -1 where the contributions are all
            NaN): the channel with the largest contribution, except in a
            flagged row that holds a stuck value, learned by the fit
            (``repeated_values_``) or equal to the row before on a channel
            continuous at the fit, whose reconstruction alone explains the
            flag: that channel (:func:`dask_mcpca._model.isolated_top`).
            Rows are taken in order, as time; the first row has none before
            it (``score --append`` scores from the row before the new ones).
            ``"mode"`` (int16): the operating mode that judges the row, an
            index into ``modes_`` (:meth:`predict_mode`; -1 for a row no
            mode judges, one holding NaN or inf); 0 for every row of a model
            fitted without modes.  With modes, every other output is the
            row's mode's (``"scores"``, whose components differ from mode to
            mode, is refused).
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        Returns
        -------
        dict
            Name -> array, as the named method returns it (lazy for dask or
            store input; DataArrays for an ``xarray.DataArray``; numpy
            otherwise).

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> X = np.random.default_rng(0).normal(size=(500, 3))
        >>> model = MCPCA().fit(X)
        >>> rows = model.score_rows(X, outputs=("d2", "outlier", "top_channel"))
        >>> bool(np.array_equal(rows["d2"], model.mahalanobis(X))), rows["top_channel"].dtype
        (True, dtype('int16'))
        """
        check_is_fitted(self, "components_")
        unknown = [o for o in outputs if o not in ROW_OUTPUTS]
        if unknown or not outputs:
            raise ValueError(f"outputs={list(outputs)!r} is invalid; expected names from {list(ROW_OUTPUTS)}")
        if "scores" in outputs:
            _modes.refuse(self, "score_rows(outputs=('scores', ...)) (each mode has its own components)")
        _labels.check_feature_names(self, X, reset=False)
        blocks = as_row_blocks(X, storage_options=storage_options)
        if blocks.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {blocks.shape[1]} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input"
            )
        fused = row_outputs_by_mode(self, tuple(outputs), self.nan_policy)
        if not isinstance(blocks, da.Array):
            parts = fused(blocks)
        elif {"outlier", "top_channel", "cells"} & set(outputs):  # read in order: a stuck run, the row before
            packed = _in_order(blocks, fused, dtype=object, meta=np.empty((0,), object))
        else:
            packed = blocks.map_blocks(fused, drop_axis=1, dtype=object, meta=np.empty((0,), object))
        k, p = self.n_components_, self.n_features_in_
        channels = self._feature_columns(X)
        columns = {"scores": (_labels.COMPONENT_DIM, np.arange(k)), "contributions": channels, "cells": channels}
        result = {}
        for name in outputs:
            dtype, width = ROW_OUTPUTS[name], {"scores": k, "contributions": p, "cells": p}.get(name)
            if isinstance(blocks, da.Array):
                pick = _picker(name)
                out = packed.map_blocks(pick, dtype=dtype, meta=np.empty((0,) * (1 + (width is not None)), dtype),
                                        **({} if width is None else {"new_axis": 1, "chunks": (blocks.chunks[0],
                                                                                               (width,))}))
            else:
                out = parts[name]
            if _labels.is_dataframe(X) and name in ("contributions", "cells"):
                import pandas as pd

                result[name] = pd.DataFrame(np.asarray(out), index=X.index, columns=X.columns)
                continue
            frame = self.get_feature_names_out() if name == "scores" and _labels.is_dataframe(X) else None
            result[name] = _labels.like_rows(out, X, columns=columns.get(name), frame_columns=frame)
        return result

    # ------------------------------------------------ outlier-detector API
    @property
    def offset_(self) -> float:
        """scikit-learn's name for ``outlier_threshold_``: ``decision_function = score_samples - offset_``."""
        check_is_fitted(self, "outlier_threshold_")
        return self.outlier_threshold_

    @property
    def threshold_(self) -> float:
        """PyOD's name for ``outlier_cutoff_``: the calibrated ``d^2`` above which a row is an outlier."""
        check_is_fitted(self, "outlier_cutoff_")
        return self.outlier_cutoff_

    def predict(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """+1 for inliers, -1 for outliers (scikit-learn's outlier detectors' convention).

        ``-1`` exactly where :meth:`is_outlier` is True (``d^2`` above
        ``outlier_cutoff_``, set by ``contamination``, or a repeated value or
        row), where :meth:`decision_function` is negative.

        Parameters
        ----------
        {rows_in}

        Returns
        -------
        labels : ndarray or dask array of int64, shape (n_samples,)
            Lazy for dask or store input; a DataArray (row coordinates kept)
            for a DataArray, a Series (index kept) for a DataFrame.  0 for
            rows with NaN or inf under ``nan_policy="omit"`` (no verdict).

        See Also
        --------
        is_outlier : The same verdict as booleans.
        decision_function : The margin from the cutoff.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> model = MCPCA().fit(rng.normal(size=(1000, 3)) * [3.0, 1.0, 0.3])
        >>> model.predict([[0.0, 0.0, 0.0], [0.0, 0.0, 30.0]])
        array([ 1, -1])
        """
        check_is_fitted(self, "components_")

        def labels(block, before=None):
            return np.where(_modes.judged_rows(self, block, before)[1], -1, 1).astype(np.int64)

        return self._map_rows(X, labels, None, dtype=np.int64, storage_options=storage_options, in_order=True,
                              modes_ok=True)

    def decision_function(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """``score_samples(X) - offset_``: negative exactly for the rows :meth:`is_outlier` flags.

        As scikit-learn's ``EllipticEnvelope``: ``offset_`` is
        ``outlier_threshold_``, the score at ``outlier_cutoff_``, so rows
        with ``d^2`` above the cutoff get a negative value, rows within it
        one >= 0.  A row flagged because it holds a repeated value or equals
        a repeated row, which the fit gave no weight, gets ``-offset_`` (the
        value of a score of 0) where its distance alone would give a value
        >= 0.

        Parameters
        ----------
        {rows_in}

        Returns
        -------
        decision : ndarray or dask array of shape (n_samples,)
            In ``[-offset_, 1 - offset_]``; lazy for dask or store input; a
            DataArray or Series for such input.  NaN for rows with NaN or inf
            under ``nan_policy="omit"``.

        See Also
        --------
        predict : -1 where this is negative.
        score_samples : The score this is shifted from.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(1000, 3)) * [3.0, 1.0, 0.3]
        >>> model = MCPCA().fit(X)
        >>> d = model.decision_function(X)
        >>> bool(np.array_equal(d < 0, model.is_outlier(X)))
        True
        >>> bool(np.allclose(d, model.score_samples(X) - model.offset_))
        True
        """
        check_is_fitted(self, "components_")
        offset = self.outlier_threshold_

        def margin(block, before=None):
            d2, flags, held = _modes.judged_rows(self, block, before)
            out = _model.weight(self, d2) - offset
            out[flags & ~(out < 0) & held] = -offset  # a score of 0: a stuck value, which the fit gives no weight
            out[flags & ~(out < 0)] = -np.finfo(np.float64).tiny  # d2 above the cutoff, its score rounded to it
            return out

        return self._map_rows(X, margin, None, storage_options=storage_options, in_order=True, modes_ok=True)
