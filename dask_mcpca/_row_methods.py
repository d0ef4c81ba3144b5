"""What the per-row methods of a fitted model share: their docstrings' common parts, rows read in order.

The per-row methods live in three classes by job, combined in
:class:`._base._BaseMCPCA`: projections and the model's covariance
(:mod:`._base`), the outlier detector's distances, scores and flags
(:mod:`._detector`), and the per-channel outputs (:mod:`._channel_methods`).
Each class fills its docstrings' ``{rows_in}`` and ``{rows_out}`` with
:func:`fill_docstrings`; the methods that read rows in order (a stuck
sensor's run) map their block function with :func:`map_in_order`; rows of
another width than the fit's are refused by :func:`check_n_features`.
"""

from __future__ import annotations

import dask.array as da

from . import _model
from ._passes import rows_before

__all__ = ["ROWS_IN", "ROWS_OUT", "check_n_features", "fill_docstrings", "map_in_order"]

#: The per-row methods' shared docstring parts, filled in by :func:`fill_docstrings`
#: (``{rows_in}``: the X and storage_options parameters; ``{rows_out}``: what comes back).
ROWS_IN = """X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Shape (n_samples, n_features), the features of the fit; input
            kinds as for :meth:`fit`.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`."""
ROWS_OUT = """A dask array (computed lazily, block by block) for dask or store input,
            a numpy array otherwise; for an ``xarray.DataArray`` ``X``, a DataArray
            with ``X``'s row dimension and coordinates (time), lazy if ``X`` is;
            for a pandas DataFrame, a Series with its index."""


def fill_docstrings(cls: type) -> type:
    """Put the shared parts into the docstrings of ``cls``'s methods (text, not ``str.format``:
    the docstrings hold other braces)."""
    for member in vars(cls).values():
        func = member.fget if isinstance(member, property) else member
        doc = getattr(func, "__doc__", None)
        if doc and "{rows_" in doc:
            func.__doc__ = doc.replace("{rows_in}", ROWS_IN).replace("{rows_out}", ROWS_OUT)
    return cls


def map_in_order(X: da.Array, func, **kwargs) -> da.Array:
    """``func(block, before)`` over the row blocks of ``X``, ``before`` the rows before each block
    (:func:`._passes.rows_before`): for row-block methods that read rows in order (a stuck sensor's run)."""
    before = rows_before(X, _model.CONTEXT_ROWS)
    return da.blockwise(func, "i", X, "ij", before, "ij", align_arrays=False, concatenate=True, **kwargs)


def check_n_features(estimator, X) -> None:
    """Refuse row blocks ``X`` whose width is not the fit's ``n_features_in_`` (scikit-learn's message)."""
    if X.shape[1] != estimator.n_features_in_:
        raise ValueError(
            f"X has {X.shape[1]} features, but {type(estimator).__name__} is expecting "
            f"{estimator.n_features_in_} features as input"
        )
