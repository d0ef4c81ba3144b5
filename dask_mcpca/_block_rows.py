"""A row block's rows as every kernel reads them: finite or not, scaled, shifted, left out, reduced.

Helpers the kernels share (the numpy spelling and the compiled loops'
wrappers, :mod:`._kernels`; the rows with missing cells,
:mod:`._partial_stats`) and the report's block summary uses: the mask of the
rows finite as stored (:func:`finite_rows`), the power of two above a block's
magnitudes (:func:`top_exponent`), a shift and a power-of-two scaling of
rows as numpy spells them fastest (:func:`shifted`, :func:`scaled`), column
reductions (:func:`column_reduce`), the rows a plan leaves out
(:func:`excluded_rows`), and the scratch arrays of one block's sub-blocks
(:class:`Workspace`).
"""

from __future__ import annotations

import numpy as np

from ._stats import PassPlan

__all__ = ["Workspace", "column_reduce", "excluded_rows", "finite_rows", "scaled", "shifted", "top_exponent"]

#: Rows side by side in :func:`column_reduce` and :func:`shifted`.
_GROUP = 16


class Workspace:
    """Scratch arrays for the sub-blocks of one block, allocated once and reused.

    A kernel pass makes several sub-block-sized temporaries (the working
    rows, ``Y A``, the exponents, the weighted rows); allocating them afresh
    for every sub-block makes the allocator map and unmap megabytes each time,
    and the page faults cost as much as the arithmetic (measured: 10-25 % of
    a block).  ``take(name, shape)`` returns a view of a buffer that grows
    only when a larger shape is asked for.
    """

    def __init__(self, dtype: type):
        self.dtype = np.dtype(dtype)
        self._buffers: dict[str, np.ndarray] = {}

    def take(self, name: str, shape: tuple[int, ...], dtype: type | None = None) -> np.ndarray:
        """A view of buffer ``name`` of ``shape``, of the workspace's dtype or ``dtype``."""
        size, dtype = int(np.prod(shape)), self.dtype if dtype is None else np.dtype(dtype)
        buf = self._buffers.get(name)
        if buf is None or buf.size < size or buf.dtype != dtype:
            buf = self._buffers[name] = np.empty(size, dtype=dtype)
        return buf[:size].reshape(shape)


def finite_rows(Y: np.ndarray) -> np.ndarray | None:
    """Mask of rows without NaN/inf, or None when all are finite (the usual case).

    ``Y`` is the data as stored (cast to float64), never a difference or a
    scaled copy, which can overflow for finite rows such as 1e308 and -1e308.
    """
    # A NaN or inf anywhere makes the grand total non-finite, so a finite total
    # proves every row finite.  The total is a contiguous reduction, ~18x cheaper
    # than per-row sums over p columns; overflow only sends us to the exact mask.
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, huge totals
        if np.isfinite(Y.sum()):
            return None
    return np.isfinite(Y).all(axis=1)


def top_exponent(Y: np.ndarray) -> int:
    """The exponent e of the power of two 2**e above every magnitude in ``Y`` (0 if all are 0)."""
    top = float(np.maximum(Y.max(), -Y.min())) if Y.size else 0.0  # max |Y| without a copy; NaN stays NaN
    return int(np.frexp(top)[1]) if top > 0 else 0


def column_reduce(ufunc: np.ufunc, X: np.ndarray, dtype=None) -> np.ndarray:
    """``ufunc.reduce(X, axis=0)``, reduced ``_GROUP`` rows side by side first.

    numpy reduces a narrow C-ordered array over its rows with an inner loop of
    p elements, 5-10x slower than over the rows of the same data viewed as
    ``_GROUP * p`` columns; the results differ only in the order of the sums.
    """
    n, p = X.shape
    m = n - n % _GROUP
    if m == 0 or p == 0:
        return ufunc.reduce(X, axis=0, dtype=dtype)
    out = ufunc.reduce(ufunc.reduce(X[:m].reshape(-1, _GROUP * p), axis=0, dtype=dtype).reshape(_GROUP, p), axis=0)
    return ufunc(out, ufunc.reduce(X[m:], axis=0, dtype=dtype)) if m < n else out


def excluded_rows(X: np.ndarray, plan: PassPlan) -> np.ndarray:
    """Rows holding one of the plan's excluded values, or equal to one of its excluded rows
    (compared exactly, in working units).

    ``X`` is as stored (float32 or float64); it is compared in float64,
    where float32 values and their power-of-two scaling are exact.  An
    excluded row is matched on the first column, then whole on the rows that
    match there.
    """
    hit = np.zeros(len(X), bool)
    for column, value in plan.excluded:
        hit |= np.ldexp(np.asarray(X[:, column], dtype=np.float64), -plan.unit_exp) == value
    if plan.excluded_rows:
        first = np.ldexp(np.asarray(X[:, 0], dtype=np.float64), -plan.unit_exp)
        for row in plan.excluded_rows:
            maybe = np.flatnonzero(first == row[0])
            whole = np.ldexp(np.asarray(X[maybe], dtype=np.float64), -plan.unit_exp)
            hit[maybe[(whole == row).all(axis=1)]] = True
    return hit


def shifted(X: np.ndarray, center: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``X - center`` (into ``out``), ``_GROUP`` rows side by side: numpy broadcasts a
    p-vector over a narrow array with an inner loop of p elements, 1.2x (float64) to 2x
    (float32) slower than over the same rows viewed ``_GROUP * p`` wide; the values are the same."""
    n, p = X.shape
    out = np.empty(X.shape, np.result_type(X, center)) if out is None else out
    m = n - n % _GROUP
    if not (X.flags.c_contiguous and out.flags.c_contiguous) or m == 0 or p == 0:
        return np.subtract(X, center, out=out)
    np.subtract(X[:m].reshape(-1, _GROUP * p), np.tile(center, _GROUP), out=out[:m].reshape(-1, _GROUP * p))
    np.subtract(X[m:], center, out=out[m:])
    return out


def scaled(Y: np.ndarray, exp: int, out: np.ndarray | None = None) -> np.ndarray:
    """``Y * 2**exp`` into ``out`` (default: in place): a multiplication by a power of two,
    exact as ``np.ldexp`` (both round only a result that leaves the dtype's normal range) and
    several times faster."""
    out = Y if out is None else out
    if abs(exp) < np.finfo(Y.dtype).maxexp - 1:  # 2**exp itself is a normal number of Y's dtype
        return np.multiply(Y, Y.dtype.type(2.0**exp), out=out) if exp or out is not Y else Y
    return np.ldexp(Y, exp, out=out)
