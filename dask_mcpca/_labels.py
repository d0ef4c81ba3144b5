"""Names in, names out: feature names from DataFrames and DataArrays, row coordinates kept.

A sensor archive has channel names and a time axis.  scikit-learn records the
column names of a pandas DataFrame in ``feature_names_in_``; this module does
the same for an ``xarray.DataArray`` of dims ``(row, channel)`` (the channel
coordinate), and wraps what the estimator computes per row back into a
DataArray that keeps the row coordinate (time) and every coordinate along it,
with a ``component`` or channel dimension where one applies.  Wrapping never
computes: a dask result stays a dask array inside the DataArray.

Everything here looks at the input's type by module name, so neither pandas
nor xarray is imported unless the input is one.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

__all__ = [
    "COMPONENT_DIM",
    "DEFAULT_FEATURE_DIM",
    "is_dataarray",
    "is_dataframe",
    "feature_names_of",
    "check_feature_names",
    "like_rows",
]

#: Dimension of the components in outputs (``transform``, ``loadings_``).
COMPONENT_DIM = "component"
#: Name of the feature dimension when the input did not name one (a DataFrame, numpy).
DEFAULT_FEATURE_DIM = "feature"


def is_dataarray(X: Any) -> bool:
    """Whether ``X`` is an ``xarray.DataArray`` (without importing xarray)."""
    return type(X).__name__ == "DataArray" and type(X).__module__.startswith("xarray")


def is_dataframe(X: Any) -> bool:
    """Whether ``X`` is a pandas DataFrame (without importing pandas)."""
    return type(X).__name__ == "DataFrame" and type(X).__module__.startswith("pandas")


def feature_names_of(X: Any) -> np.ndarray | None:
    """The column names of a DataFrame, or the channel coordinate of a 2-D DataArray.

    Returns an object array of str, or None when ``X`` has no names, or names
    that are not all strings (scikit-learn's rule: then there are none).

    Examples
    --------
    >>> import xarray as xr, numpy as np
    >>> X = xr.DataArray(np.zeros((2, 3)), dims=("time", "channel"), coords={"channel": ["a", "b", "c"]})
    >>> feature_names_of(X)
    array(['a', 'b', 'c'], dtype=object)
    >>> feature_names_of(np.zeros((2, 3))) is None
    True
    """
    if is_dataarray(X):
        if X.ndim != 2 or X.dims[1] not in X.coords:
            return None
        names = np.asarray(X.coords[X.dims[1]].values, dtype=object)
    elif is_dataframe(X):
        names = np.asarray(X.columns, dtype=object)
    else:
        return None
    if len(names) and all(isinstance(n, str) for n in names):
        return names
    return None


def _sklearn_check_feature_names(estimator, X, *, reset: bool) -> None:
    try:  # scikit-learn >= 1.7
        from sklearn.utils.validation import _check_feature_names
    except ImportError:  # pragma: no cover - scikit-learn 1.6 keeps it on BaseEstimator
        estimator._check_feature_names(X, reset=reset)
    else:  # pragma: no cover - depends on the installed scikit-learn
        _check_feature_names(estimator, X, reset=reset)


def check_feature_names(estimator, X: Any, *, reset: bool) -> None:
    """Set (``reset=True``, in ``fit``) or check ``feature_names_in_`` and ``feature_dim_in_``.

    DataFrames and other inputs go through scikit-learn's own check (its
    messages and warnings); a DataArray's channel coordinate is set or
    compared here, with the same messages and warnings (a DataArray without
    a channel coordinate has no feature names).  ``feature_dim_in_`` records the
    name of a DataArray's channel dimension, for the fitted ``loadings_`` and
    the per-channel outputs.
    """
    if not is_dataarray(X):
        _sklearn_check_feature_names(estimator, X, reset=reset)
        if reset and hasattr(estimator, "feature_dim_in_"):
            del estimator.feature_dim_in_
        return
    names = feature_names_of(X)
    if reset:
        for attr in ("feature_names_in_", "feature_dim_in_"):
            if hasattr(estimator, attr):
                delattr(estimator, attr)
        if X.ndim == 2:
            estimator.feature_dim_in_ = str(X.dims[1])
        if names is not None:
            estimator.feature_names_in_ = names
        return
    fitted = getattr(estimator, "feature_names_in_", None)
    if (fitted is None) != (names is None):  # scikit-learn's warnings, for a DataArray's channel coordinate
        who = type(estimator).__name__
        warnings.warn(
            f"X does not have valid feature names, but {who} was fitted with feature names" if names is None
            else f"X has feature names, but {who} was fitted without feature names",
            UserWarning,
            stacklevel=3,
        )
    if fitted is None or names is None:
        return
    if len(fitted) != len(names) or np.any(fitted != names):
        unseen = sorted(set(names) - set(fitted))
        missing = sorted(set(fitted) - set(names))
        detail = "".join(
            f"\n{what}:\n- " + "\n- ".join(map(str, items)) for what, items in
            (("Feature names unseen at fit time", unseen), ("Feature names seen at fit time, yet now missing", missing))
            if items
        )
        raise ValueError(
            "The feature names should match those that were passed during fit." + (detail or
            "\nFeature names must be in the same order as they were in fit.")
        )


def _row_coords(X) -> dict:
    """The coordinates of DataArray ``X`` that lie along its first (row) dimension only."""
    row = X.dims[0]
    return {name: c for name, c in X.coords.items() if c.dims == (row,)}


def like_rows(out: Any, X: Any, *, columns: tuple[str, Any] | None = None, frame_columns: Any = None) -> Any:
    """``out`` (one value or one row per row of ``X``) as a DataArray or pandas object like ``X``, or as it is.

    Parameters
    ----------
    out : numpy or dask array of shape (n,) or (n, m)
        Computed (or lazily to be computed) from the rows of ``X``.
    X : any
        The input.  A DataArray gives a DataArray: ``out`` gets ``X``'s row
        dimension and every coordinate along it (time).  A pandas DataFrame
        gives a Series (1-D ``out``) or a DataFrame (2-D) with ``X``'s index.
        Anything else returns ``out`` unchanged.
    columns : (dim, values), optional
        Name and coordinate of ``out``'s second dimension (``("component",
        range(k))``, or the channel dimension and names); None for 1-D ``out``.
        ``values`` None gives the dimension without a coordinate.
    frame_columns : sequence, optional
        Column labels of a DataFrame result; by default ``X``'s columns when
        ``out`` has as many columns as ``X``, else ``columns``'s values.

    Returns
    -------
    xarray.DataArray, pandas.Series, pandas.DataFrame, or ``out`` unchanged

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> X = pd.DataFrame({"a": [1.0, 2.0], "b": [3.0, 4.0]}, index=pd.to_datetime(["2024-01-01", "2024-01-02"]))
    >>> like_rows(np.array([0.5, 7.0]), X)
    2024-01-01    0.5
    2024-01-02    7.0
    dtype: float64
    >>> list(like_rows(np.zeros((2, 2)), X).columns)
    ['a', 'b']
    """
    if is_dataframe(X):
        return _like_frame_rows(out, X, columns, frame_columns)
    if not is_dataarray(X):
        return out
    import xarray as xr

    dims = (X.dims[0],) if columns is None else (X.dims[0], columns[0])
    coords = _row_coords(X)
    if columns is not None and columns[1] is not None:
        coords[columns[0]] = np.asarray(columns[1])
    return xr.DataArray(out, dims=dims, coords=coords)


def _like_frame_rows(out: Any, X: Any, columns: tuple[str, Any] | None, frame_columns: Any) -> Any:
    """``out`` as a pandas Series (1-D) or DataFrame (2-D) with the index of DataFrame ``X``."""
    import pandas as pd

    if hasattr(out, "compute"):  # a pandas input is in memory: so is what it gives
        out = out.compute()
    values = np.asarray(out)
    if values.ndim == 1:
        return pd.Series(values, index=X.index)
    if frame_columns is None:
        frame_columns = X.columns if values.shape[1] == X.shape[1] else (None if columns is None else columns[1])
    return pd.DataFrame(values, index=X.index, columns=frame_columns)
