"""``partial_fit``: a fitted model updated by new rows only, in one pass, from the sums it keeps.

``PartialFitMixin`` (mixed into :class:`~dask_mcpca.MCPCA`) checks the new
rows against the fit and hands them to :func:`._update.update_rows`, which
weighs them by the kept robust state and merges their sums with the kept
ones; the estimator copies the result onto itself as ``fit`` does.
"""

from __future__ import annotations

import warnings
from typing import Any

from . import _labels, _modes
from ._exceptions import NoUsableRowsWarning
from ._fitted_params import check_fitted_params
from ._io import as_row_blocks
from ._params import check_params
from ._passes import single_threaded_blas
from ._row_methods import check_n_features
from ._update import UPDATE_ATTRIBUTES, update_rows

__all__ = ["PartialFitMixin"]


class PartialFitMixin:
    """:meth:`~MCPCA.partial_fit` and the sums it keeps, for :class:`~dask_mcpca.MCPCA`."""

    def partial_fit(self, X: Any, y: None = None, *, storage_options: dict | None = None) -> PartialFitMixin:
        """Fit on the first call; on later calls, update the model from the new rows ``X`` only, in one pass.

        The first call (an unfitted model) is :meth:`fit`.  A fitted model
        keeps, for the default solver, the weighted sums of every row it has
        seen (``update_*`` attributes, saved by :meth:`save`): for the core
        and the final kernel, the total weight (with its log-scale), the
        weighted mean and the weighted covariance, in the fit's working unit,
        and the robust state whose kernels weigh new rows.  An update:

        1. reads the new rows once, weighting each by the current state's
           core and final kernels (``update_location_``,
           ``update_scatter_``, the radii of ``update_radii_``; rows holding
           a ``repeated_values_`` value or equal to a ``repeated_rows_`` row
           get none), as the next re-weighting pass of a fit would;
        2. merges their sums with the kept ones by the pairwise formula of
           Chan, Golub and LeVeque;
        3. sets ``mean_``, ``components_``, the variances and
           ``covariance_`` from the merged final kernel, as ``fit`` does
           (consistent at the Gaussian), and the next state from the merged
           core kernel; the merged sums are kept for the next update.

        Every row thus keeps the weight the model gave it when it arrived.
        For rows like those fitted this is the weight a refit would give
        them (a fit is a fixed point of that re-weighting), so updates by
        appended chunks give ``fit`` on all the rows within sampling noise
        (``benchmarks/MONITORING.md``).  The outlier cutoff
        (``outlier_cutoff_``, ``contamination``), the kernels' radii and the
        repeated values and rows are kept: they are calibrated on the fit's
        row sample, and recalibrating them on a day's rows would let that
        day's own faults (or a new regime) set what counts as normal.
        ``n_samples_`` and ``n_passes_`` then say what the update read (the
        new rows, 1 pass); ``n_samples_seen_`` counts every row in the sums.

        With ``center="mean"`` the centre is the plain mean of every row
        seen, as ``fit`` on them sets it: the new rows' plain mean and count
        (a moments pass over them first: 2 passes) are merged with the kept
        ones (``update_location_``, ``n_samples_seen_``) by the same pairwise
        formula, and the merged covariances are taken about that mean.

        **New rows of which none can be used** (each holds NaN or inf under
        ``nan_policy="omit"``, e.g. one channel dead for the whole chunk; or
        no observed cell under ``"partial"``: a logger offline for the
        period) leave the model as it was, and ``partial_fit`` warns
        (:class:`~dask_mcpca.NoUsableRowsWarning`, a
        ``UserWarning``); they are not counted in ``n_samples_seen_``.
        Under ``nan_policy="raise"`` such rows raise, as any row with NaN.

        **A change of regime is not followed.**  Rows of a new operating
        regime lie far from the model, get little or no weight and are
        flagged; the model stays on the old regime.  When most of the new
        rows lie beyond the model's final kernel (their weighted share is
        below one half, so most would be flagged), ``partial_fit`` warns
        (``UserWarning``).  To follow the change, refit: ``fit`` on the
        rows of the new regime, or on the whole archive with
        ``warm_start=True`` (which re-reads it and recalibrates everything).

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            The new rows, shape (n_samples, n_features) with the fit's
            features; input kinds as for :meth:`fit`.
        y : None
            Ignored; present for scikit-learn's API.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        Returns
        -------
        self : MCPCA
            The fitted or updated estimator.

        Raises
        ------
        ValueError
            ``set_params`` changed a parameter that defines the fitted model
            (``scale``, ``center``, ``solver``, ``cellwise``,
            ``n_components``, ``kernel_factor``; ``nan_policy`` and
            ``progress`` may change): set it back, or refit; ``X`` has other
            features than the fit; or the model keeps no sums
            to update (``solver="paper"``, data with fewer rows than
            ``n_features + 2``, a model saved before ``partial_fit`` existed):
            refit it.

        See Also
        --------
        fit : A fit on all the rows (a refit follows a change of regime).

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(20000, 3)) * [3.0, 1.0, 0.3]
        >>> model = MCPCA().partial_fit(X[:10000])             # the first call fits
        >>> for day in np.array_split(X[10000:], 4):            # then one pass over each new chunk
        ...     model = model.partial_fit(day)
        >>> model.n_samples_, model.n_passes_, model.n_samples_seen_
        (2500, 1, 20000)
        >>> full = MCPCA().fit(X)
        >>> bool(np.allclose(model.explained_variance_, full.explained_variance_, rtol=0.02))
        True
        """
        if not hasattr(self, "components_"):
            return self.fit(X, y, storage_options=storage_options)
        check_params(self)
        check_fitted_params(self, "partial_fit")  # set_params since the fit: not the model it updates
        _labels.check_feature_names(self, X, reset=False)
        X = as_row_blocks(X, storage_options=storage_options)
        check_n_features(self, X)
        if X.shape[0] < 1:
            raise ValueError(f"Found array with 0 sample(s) (shape={X.shape}) while a minimum of 1 is required "
                             f"by {type(self).__name__}.partial_fit")
        modes = _modes.has_modes(self)  # each mode keeps its own sums
        if not modes and not hasattr(self, "update_location_"):
            raise ValueError(
                f"{type(self).__name__}.partial_fit: this model keeps no sums to update (fitted with "
                f"solver={self.solver!r}, on fewer rows than n_features + 2, resumed from a checkpoint of a "
                "finished fit, which ran no pass to sum, or saved by a version without partial_fit); refit it "
                "with fit (without that checkpoint), then update it with partial_fit"
            )
        if not modes:
            with single_threaded_blas():
                result = update_rows(X, self)
            if result is None:  # no usable row: a no-op (a logger offline for the period), said once
                warnings.warn(
                    f"{type(self).__name__}.partial_fit: none of the {X.shape[0]} new rows can be used (each "
                    + ("has no observed cell" if self.nan_policy == "partial" else "holds NaN or inf")
                    + f", nan_policy={self.nan_policy!r}); the model is left as it was and these rows are not "
                    "counted in n_samples_seen_; update it again when rows with readings arrive",
                    NoUsableRowsWarning,
                    stacklevel=2,
                )
                return self
        vars(self).pop("archive_rows_", None)  # the command line sets it again (it knows the archive)
        vars(self).pop("archive_samples_", None)
        if modes:  # each mode by its new rows: a pass to send them, then one per mode
            with single_threaded_blas():
                self._update_modes(X)
            return self
        self._set_fitted(result)
        return self

    def _forget_update_sums(self) -> None:
        """Remove the sums kept for :meth:`partial_fit` (a refit sets them anew, or has none)."""
        for name in UPDATE_ATTRIBUTES:
            if name in vars(self):
                delattr(self, name)
