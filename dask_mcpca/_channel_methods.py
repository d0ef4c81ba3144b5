"""The per-channel methods of a fitted model: which channel is at fault, cells judged one by one, gaps filled.

``ChannelMethodsMixin`` holds :meth:`~MCPCA.channel_contributions`,
:meth:`~MCPCA.cell_outliers`, :meth:`~MCPCA.impute`,
:meth:`~MCPCA.n_observed` (the channels a row is judged on) and
:meth:`~MCPCA.score_rows`, several per-row outputs from one read of each
row block (:data:`ROW_OUTPUTS`).  Each maps a row-block function of
:mod:`._model` over the rows with ``_map_rows`` of
:class:`._base._BaseMCPCA`, which mixes this class in.
"""

from __future__ import annotations

from typing import Any, Literal

import dask.array as da
import numpy as np
from sklearn.utils.validation import check_is_fitted

from . import _labels, _missing, _model, _modes
from ._distances import cell_flags_of_any_rows
from ._io import as_row_blocks
from ._mode_rows import MODE_DTYPE, contributor_by_mode, row_outputs_by_mode
from ._passes import rows_before
from ._row_methods import check_n_features, fill_docstrings, map_in_order
from ._shift import fault_cells

__all__ = ["ROW_OUTPUTS", "ChannelMethodsMixin"]

#: What :meth:`MCPCA.score_rows` computes: name -> dtype (``mode``: :mod:`._mode_rows`).
ROW_OUTPUTS = {**_model.ROW_OUTPUTS, "mode": MODE_DTYPE}


def _picker(name: str):
    """A block function taking output ``name`` out of a block of :meth:`MCPCA.score_rows`'s dicts."""

    def pick(parts):
        return parts[name]

    return pick


def _frame_like(out: Any, X: Any) -> Any:
    """``out`` (n_samples x n_features) as a DataFrame with ``X``'s index and columns when ``X`` is one."""
    if _labels.is_dataframe(X):
        import pandas as pd

        return pd.DataFrame(np.asarray(out), index=X.index, columns=X.columns)
    return out


@fill_docstrings
class ChannelMethodsMixin:
    """Per-channel outputs of a fitted model for rows (mixed into :class:`._base._BaseMCPCA`)."""

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

        A cell of a sensor stuck since the fit is flagged too: a channel
        continuous at the fit that holds one value over a run of rows
        (:func:`dask_mcpca._stuck.stuck_cells`, the rule :meth:`is_outlier`
        flags its rows by), whose readings cannot be trusted however well
        the other cells predict them; and a cell of a channel shifted over
        its last rows: its residual given the other channels, averaged over
        the last 64 rows the row distance accepts, more than 5
        ``shift_scale_`` from 0 (:mod:`dask_mcpca._shift`).  Rows are read in order, as time, as
        :meth:`is_outlier` reads them (the first row has none before it);
        ``score_rows(X, outputs=("cells",))`` and ``dask-mcpca score``'s
        ``cells`` are these flags.

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
        _modes.refuse(self, "this method")
        _labels.check_feature_names(self, X, reset=False)
        blocks = as_row_blocks(X, storage_options=storage_options)
        check_n_features(self, blocks)

        def flags(block, before=None):  # rows as stored, in order: ``before`` the rows before the block
            judged = cell_flags_of_any_rows(self, _model.model_rows(self, block))
            return judged | fault_cells(self, block, before)

        if isinstance(blocks, da.Array):  # each block with the rows before it (a stuck run crosses blocks)
            out = da.blockwise(flags, "ij", blocks, "ij", rows_before(blocks, _model.CONTEXT_ROWS), "ij",
                               align_arrays=False, concatenate=True, dtype=bool, meta=np.empty((0, 0), bool))
        else:
            out = flags(blocks)
        return _frame_like(_labels.like_rows(out, X, columns=self._feature_columns(X)), X)

    def impute(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """``X`` with each missing (NaN or inf) cell replaced by its conditional expectation under the fitted model.

        For a row with observed cells ``O`` and missing cells ``M``:
        ``x_M = mean_M + S_MO S_OO^-1 (x_O - mean_O)``, with ``S`` =
        :meth:`get_covariance` (the best linear reconstruction from the
        observed channels; Tipping and Bishop 1999).  An infinite cell is
        no value and is filled like a missing one (:meth:`cell_outliers`
        flags it); a model fitted with ``cellwise=True`` fills the cells
        :meth:`cell_outliers` flags too, a stuck sensor's cells among them
        (rows read in order, as time, with the rows before each block, as
        :meth:`cell_outliers` reads them).  Other cells are returned
        unchanged; rows with no finite cell stay NaN.

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

        def func(b, before=None):  # rows as stored, in order: ``before`` the rows before the block
            b = np.asarray(b, np.float64)
            none = ~np.isfinite(b).any(axis=1)  # no finite cell: the row stays NaN
            y = _model.model_rows(self, np.where(none[:, None], 0.0, b))
            gaps = ~np.isfinite(b)
            if cellwise:  # cell_outliers' cells are left out too, and filled like missing ones
                gaps |= cell_flags_of_any_rows(self, np.where(np.isinf(b), np.nan, y)) | fault_cells(self, b, before)
            if not gaps.any():
                return b.copy()
            filled = _missing.completed(np.where(gaps, np.nan, y) - mean, cov) + mean
            if scale is not None:
                filled = filled * scale  # back to the data's units
            filled[none] = np.nan
            return np.where(gaps, filled, b)  # the good cells exactly as given

        out = self._map_rows(
            X, func, self.n_features_in_, columns=self._feature_columns(X), storage_options=storage_options,
            nan_policy="cells", as_stored=True, in_order=cellwise,
        )
        return _frame_like(out, X)

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
            (:meth:`cell_outliers`, boolean, n_features wide: a stuck sensor's
            cells included, read in order as ``"outlier"``) and ``"top_channel"``: the
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
        check_n_features(self, blocks)
        fused = row_outputs_by_mode(self, tuple(outputs), self.nan_policy)
        if not isinstance(blocks, da.Array):
            parts = fused(blocks)
        elif {"outlier", "top_channel", "cells"} & set(outputs) or (
                "scores" in outputs and getattr(self, "cell_cutoff_", None) is not None):
            # read in order: a stuck run (a cellwise model's scores complete its cells), the row before
            packed = map_in_order(blocks, fused, dtype=object, meta=np.empty((0,), object))
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

