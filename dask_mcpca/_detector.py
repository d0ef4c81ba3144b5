"""The outlier detector's methods of a fitted model: distances, scores, flags, labels and margins.

``OutlierDetectorMixin`` holds what scikit-learn's outlier detectors
(``EllipticEnvelope``) and PyOD's name: :meth:`~MCPCA.mahalanobis` (``d^2``),
:meth:`~MCPCA.score_samples` (the correntropy weight),
:meth:`~MCPCA.is_outlier`, :meth:`~MCPCA.predict`,
:meth:`~MCPCA.decision_function`, ``offset_`` and ``threshold_``.  Each maps
a row-block function of :mod:`._model` and :mod:`._modes` over the rows
with ``_map_rows`` of :class:`._base._BaseMCPCA`, which mixes this class in.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import dask.array as da
import numpy as np
from sklearn.utils.validation import check_is_fitted

from . import _model, _modes
from ._row_methods import fill_docstrings

__all__ = ["OutlierDetectorMixin"]


@fill_docstrings
class OutlierDetectorMixin:
    """Distances, scores and verdicts of a fitted model for rows (mixed into :class:`._base._BaseMCPCA`)."""

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

        def flags(block, before=None, original=None):
            return _modes.judged_rows(self, block, before, original)[1]

        return self._map_rows(X, flags, None, dtype=bool, storage_options=storage_options, in_order=True, modes_ok=True)

    # ------------------------------------------------ outlier-detector API
    def fit_predict(self, X: Any, y: None = None, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """Fit to ``X`` and label its rows: ``fit(X).predict(X)``.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Input kinds as for :meth:`fit`.
        y : None
            Ignored.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        Returns
        -------
        labels : ndarray or dask array of int64, shape (n_samples,)
            As :meth:`predict` returns them.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> X = np.random.default_rng(0).normal(size=(1000, 2))
        >>> labels = MCPCA(contamination=0.05).fit_predict(X)
        >>> float((labels == -1).mean())
        0.05
        """
        return self.fit(X, y, storage_options=storage_options).predict(X, storage_options=storage_options)

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

        def labels(block, before=None, original=None):
            return np.where(_modes.judged_rows(self, block, before, original)[1], -1, 1).astype(np.int64)

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

        def margin(block, before=None, original=None):
            d2, flags, held = _modes.judged_rows(self, block, before, original)
            out = _model.weight(self, d2) - offset
            out[flags & ~(out < 0) & held] = -offset  # a score of 0: a stuck value, which the fit gives no weight
            out[flags & ~(out < 0)] = -np.finfo(np.float64).tiny  # d2 above the cutoff, its score rounded to it
            return out

        return self._map_rows(X, margin, None, storage_options=storage_options, in_order=True, modes_ok=True)
