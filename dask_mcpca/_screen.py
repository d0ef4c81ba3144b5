"""Wide rows' quadratic forms at single-precision speed, where single precision can vouch for the weight.

A flat-top kernel gives weight exactly 1 to every row whose quadratic form
``q = |L^T y|^2`` is at most twice the kernel's offset (:func:`._kernels.kernel_weights`):
most rows of a robust step.  For those rows the pass needs the fact, not the
value.  So :meth:`Screen.quad_forms` computes every row's form by BLAS's
single-precision triangular product (half the time of the double one at
p = 1000), bounds its error, and takes a row as inside the flat top when its
form plus the bound lies below the edge; every other row (near the edge,
beyond it, or not finite in single precision) has its form computed in double
precision as before.

The bound is a worst-case one (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., section 3.1: ``|fl(x^T y) - x^T y| <= gamma_n |x|^T |y|``
with ``gamma_n = n u / (1 - n u)``, for any order of summation and with fused
multiply-adds), with the inputs' rounding to single precision, underflow,
and the double-precision form's own error added (underflow taken as gradual,
IEEE's default: where a process flushes subnormals to zero, as code built with
``-ffast-math`` may set, the absolute errors are larger, which matters only
for an edge below about ``p * 1e-38``).  The bound is loose: at p = 1000 in
``benchmarks/bulk_block.py``'s blocks it is about 27 where the edge is 1,090
and the actual error about 1e-3, so 3-10 % of the rows (those beyond the edge
and those near it) are computed twice.  So every weight
is the one the double-precision form gives (the rows inside get exactly 1
either way); what can differ is the last bits of the forms of the rows
computed again, which BLAS now multiplies as a run of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _blas
from ._block_rows import Workspace

__all__ = ["Screen", "SCREEN_FEATURES"]

#: From this many columns a wide pass screens its rows' forms in single precision (below it the
#: forms cost little next to the rows' other sweeps; measured in ``benchmarks/bulk_block.py``).
SCREEN_FEATURES = 64

#: Screens kept by :meth:`Screen.of` (a pass's kernel matrices: one or two a pass), by their key.
CACHED = 4
_CACHE: dict = {}

_U32 = 2.0**-24  # single precision's unit round-off
_U64 = 2.0**-53
_TINY32 = 2.0**-149  # single precision's smallest subnormal: the absolute error of an underflow


def _abs_norm(M: np.ndarray, iterations: int = 30) -> float:
    """An upper bound on ``||M||_2`` of a non-negative matrix ``M``: the Collatz-Wielandt bound
    ``rho(B) <= max_i (B x)_i / x_i``, valid for ``B = M^T M`` (non-negative) and any positive ``x``,
    at an ``x`` near ``B``'s Perron vector (power iteration; the bound holds whatever its convergence),
    with room for the rounding of ``B x``; never above the Frobenius norm."""
    x = np.ones(len(M))
    for _ in range(iterations):
        x = M.T @ (M @ x)
        top = x.max()
        if not top > 0 or not np.isfinite(top):
            break
        x /= top
    x = np.where(np.isfinite(x), x, 0.0) + 1e-6  # positive: the bound holds, a little looser
    rho = float(np.max((M.T @ (M @ x)) / x)) * (1.0 + 4.0 * _gamma(len(M), _U64))
    frobenius = float(np.sqrt(np.einsum("ij,ij->", M, M))) * (1.0 + _gamma(M.size, _U64))  # its sum's error
    return min(float(np.sqrt(rho)) * (1.0 + 1e-12), frobenius)


def _gamma(n: int, u: float) -> float:
    return n * u / (1.0 - n * u)


@dataclass(frozen=True)
class Screen:
    """A kernel's lower factor ``L`` in single precision, with an upper bound on ``|| |L| ||_2``."""

    L32: np.ndarray
    norm: float

    @classmethod
    def of(cls, L: np.ndarray, key: bytes | None = None) -> Screen | None:
        """The screen of factor ``L`` (float64, Fortran order); None where the rows are too narrow
        for it to pay, or ``L`` does not fit in single precision.  ``key``: bytes that name ``L``
        (its kernel matrix's), under which the last :data:`CACHED` screens are kept, so that a pass's
        blocks in one process make one (18 ms at p = 1000)."""
        p = len(L)
        if p < SCREEN_FEATURES or (p + 3) * _U32 >= 0.01:
            return None
        if key is None:
            return cls._made(L)
        screen = _CACHE.get((key, p), _CACHE)
        if screen is _CACHE:  # not kept (another thread may be making it too: the same screen)
            screen = _CACHE[key, p] = cls._made(L)
            for old in list(_CACHE)[:-CACHED]:
                _CACHE.pop(old, None)
        return screen

    @classmethod
    def _made(cls, L: np.ndarray) -> Screen | None:
        with np.errstate(over="ignore"):
            L32 = np.asfortranarray(L, dtype=np.float32)
        if not np.all(np.isfinite(L32)):
            return None
        return cls(L32, _abs_norm(np.abs(L)))

    def quad_forms(self, Z: np.ndarray, L: np.ndarray, edge: float, ws: Workspace) -> np.ndarray:
        """``|L^T z|^2`` of each row of ``Z`` (n x p, float64, C order; left as it is), in the
        workspace's ``"quad"``: the double-precision form for every row that single precision
        cannot place below ``edge`` with certainty, and for the others their single-precision
        form (below ``edge``, so that a flat top of edge ``2 * offset`` gives them weight 1)."""
        n, p = Z.shape
        Z32 = ws.take("Z32", (n, p), np.float32)
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            np.copyto(Z32, Z, casting="same_kind")  # beyond single precision's range: inf, computed again
            norm2 = np.einsum("ij,ij->i", Z32, Z32).astype(np.float64)  # |y32|^2
            _blas.trmm_rows(self.L32, Z32)
            q32 = np.einsum("ij,ij->i", Z32, Z32).astype(np.float64)
            sure = q32 + self._bound(q32, norm2, p) < edge  # NaN, inf: False
        quad = ws.take("quad", (n,))
        quad[:] = q32
        redo = np.flatnonzero(~sure)
        if len(redo):
            rows = ws.take("redo", (len(redo), p))
            np.take(Z, redo, axis=0, out=rows)
            _blas.trmm_rows(L, rows)
            with np.errstate(over="ignore", invalid="ignore"):
                quad[redo] = np.einsum("ij,ij->i", rows, rows)
        return quad

    def _bound(self, q32: np.ndarray, norm2: np.ndarray, p: int) -> np.ndarray:
        """An upper bound on ``|q32 - q64|``, ``q64`` the double-precision form, per row, from the
        single-precision form ``q32`` and the single-precision ``|y|^2`` ``norm2`` (both as computed)."""
        g32, g64 = _gamma(p, _U32), _gamma(p + 3, _U64)
        # |y|, from its single-precision square: the sum's error, the rounding of y, the underflows
        y = np.sqrt((norm2 + p * _TINY32) / (1.0 - g32)) / (1.0 - _U32) + np.sqrt(p) * _TINY32
        # |z32 - L^T y| (y32 = fl(y), L32 = fl(L), the product's error, underflows), plus the double form's
        e = (_gamma(p + 3, _U32) + g64) * self.norm * y + _TINY32 * (self.norm * np.sqrt(p) + p * np.sqrt(p) + p * y)
        exact = (q32 + p * _TINY32) / (1.0 - g32)  # |z32|^2, from its computed sum
        summed = (g32 * q32 + p * _TINY32) / (1.0 - g32)  # exact - q32, without its cancellation
        # |q32 - |z32|^2| + ||z32|^2 - |z64|^2| + |q64 - |z64|^2|
        return (summed + (2.0 * np.sqrt(exact) + e) * e + g64 * (np.sqrt(exact) + e) ** 2) * (1.0 + 1e-10)
