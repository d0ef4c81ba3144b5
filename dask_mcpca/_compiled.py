"""Compiled loops (numba) for the usual sub-block of a pass.

A robust step's block function, spelled in numpy, makes about a dozen sweeps
over each sub-block's rows (shift, scale, finiteness, ``Y A``, the row-wise
dot product, the exponents, the weights, the weighted rows, two GEMMs).  With
p = 10 those rows are too narrow for numpy's inner loops or BLAS to run at
speed, and on a machine whose cores both read and compute (2 cores here),
that work showed: a float32 robust-step pass cost 1.7 times a plain
``X.T @ X`` pass of the same store, when its reading alone cost 1.0.

Here the rows are laid out column by column once (``Yt``, p x n, the working
rows transposed), and every later loop runs along a row of ``Yt``: a
contiguous loop over rows that the compiler vectorises (16 float32 or 8
float64 values per instruction with AVX-512).

* :func:`transposed_quadratic_form` shifts, scales and transposes the rows
  and gives each row's quadratic form ``y^T A y``, from the upper triangle of
  ``A`` (p(p+1)/2 products per row): a kernel pass;
* :func:`column_ranges` and :func:`transposed_rows`: a moments pass's column
  ranges and finiteness, then its rows in the sub-block's unit;
* :func:`transposed_weighted_sums` gives, per kernel ``j``, ``sum_k g_jk``,
  ``sum_k g_jk y_k`` and the upper triangle of ``sum_k g_jk y_k y_k^T``,
  in runs of ``TILE`` rows whose results add in float64, as the numpy
  spelling's GEMMs of ``GEMM_ROWS`` rows do (:mod:`._block`).

The exponents and ``exp`` between them stay in numpy (its SIMD ``exp``).
What the loops do not handle (a row that is not finite in working units, a
kernel that is not one quadratic form, a unit beyond the dtype's normal
powers of two) is done by the numpy spelling in :mod:`._block`, which
remains the reference: ``tests/test_compiled.py`` checks both against the
definitions written out plainly.  The loops are compiled on first use and
cached on disk (numba's ``cache=True``): about a second once per machine and
dtype, then a load.

Floating point: the flags allow reassociation (so that sums over rows can be
vectorised) and fused multiply-adds, never the assumption that values are
finite: a row far out, whose quadratic form overflows to inf, still gets
weight exactly 0, as in numpy.  The finiteness check is compiled without
them (reassociation would fold it away).
"""

from __future__ import annotations

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; the numpy spelling still works without it
    numba = None

__all__ = [
    "AVAILABLE",
    "column_ranges",
    "transposed_quadratic_form",
    "transposed_rows",
    "transposed_weighted_sums",
    "upper_doubled",
]

#: Whether the compiled loops can run (numba imports).
AVAILABLE = numba is not None

#: Rows per run: a run's values of ``Yt`` (p x ``TILE``) stay in L1 cache, and
#: float32 products are summed in float32 within a run only (bounding their
#: round-off), then added in float64.
TILE = 256

#: Rows read side by side by :func:`column_ranges`.
RANGE_ROWS = 16

#: LLVM fast-math flags: reassociation (vectorised sums), contraction (FMA),
#: no signed zeros, reciprocal.  Not ``nnan``/``ninf``: infinities and NaN
#: keep their IEEE meaning.
_FLAGS = {"reassoc", "contract", "nsz", "arcp"}


def _compiled(fn=None, *, fastmath=True):
    """``numba.njit`` without the GIL, with ``_FLAGS`` unless ``fastmath=False``, cached on disk
    where numba finds a writable cache folder (else compiled in each process: numba refuses
    ``cache=True`` at decoration when neither the package's ``__pycache__`` nor the user's
    cache folder can be written, as in a read-only image run by a service user)."""
    if fn is None:
        return lambda f: _compiled(f, fastmath=fastmath)
    if not AVAILABLE:
        return fn
    flags = _FLAGS if fastmath else False
    try:
        return numba.njit(nogil=True, fastmath=flags, cache=True)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return numba.njit(nogil=True, fastmath=flags, cache=False)(fn)


def upper_doubled(A: np.ndarray, dtype) -> np.ndarray:
    """``A``'s upper triangle with the off-diagonal entries doubled: ``y^T A y = sum_{a<=b} U_ab y_a y_b``."""
    A = np.asarray(A, dtype=dtype)
    return np.ascontiguousarray(np.triu(A + A.T) - np.diag(np.diag(A)))


@_compiled
def _transpose_run(X, center, scale, Yt, t0, m):  # pragma: no cover - compiled (numba hides it from coverage)
    """``Yt[:, t0:t0+m] = ((X[t0:t0+m] - center) * scale)^T``: one rounding, then a power of two."""
    p = X.shape[1]
    for t in range(m):
        for a in range(p):
            Yt[a, t0 + t] = (X[t0 + t, a] - center[a]) * scale


@_compiled
def transposed_rows(X, center, scale, Yt):  # pragma: no cover - compiled
    """``Yt = ((X - center) * scale)^T`` (``X`` n x p in C order; ``Yt`` p x n; one float dtype)."""
    n = X.shape[0]
    for t0 in range(0, n, TILE):
        _transpose_run(X, center, scale, Yt, t0, min(TILE, n - t0))


@_compiled
def transposed_quadratic_form(X, center, scale, U, Yt, q):  # pragma: no cover - compiled
    """``Yt = ((X - center) * scale)^T`` and ``q_k = sum_{a<=b} U_ab y_ka y_kb``.

    ``X`` (n x p, C order), ``center`` (p,), ``scale`` and ``U`` share one
    float dtype, as do the outputs ``Yt`` (p x n) and ``q`` (n,).  The shift
    is one rounding and the scale a power of two, as in numpy's
    ``_working_rows``.
    """
    n, p = X.shape
    for t0 in range(0, n, TILE):
        m = min(TILE, n - t0)
        _transpose_run(X, center, scale, Yt, t0, m)
        qq = q[t0 : t0 + m]
        for t in range(m):
            qq[t] = 0
        for a in range(p):
            ya = Yt[a, t0 : t0 + m]
            for b in range(a, p):
                u = U[a, b]
                yb = Yt[b, t0 : t0 + m]
                for t in range(m):
                    qq[t] += u * (ya[t] * yb[t])


@_compiled(fastmath=False)  # reassociation would fold the finiteness check ((s + v) - v is s)
def column_ranges(X, lo, hi):  # pragma: no cover - compiled
    """Each column's smallest and largest value into ``lo`` and ``hi`` (p,); False if a value is NaN or inf.

    ``X`` (n x p, C order) is read as ``RANGE_ROWS`` rows side by side, so
    that the loop is long and contiguous (and vectorised without any
    reassociation); ``lo`` and ``hi`` are meaningful only when True is
    returned.
    """
    n, p = X.shape
    width = RANGE_ROWS * p
    x = X.reshape(n * p)
    low = np.full(width, np.inf, X.dtype)
    high = np.full(width, -np.inf, X.dtype)
    check = np.zeros(width, X.dtype)  # v * 0 summed per lane: 0 if every value is finite, else NaN
    for start in range(0, n * p, width):
        run = x[start : start + width]
        for k in range(run.shape[0]):
            v = run[k]
            low[k] = min(low[k], v)
            high[k] = max(high[k], v)
            check[k] += v * 0
    finite = True
    for k in range(width):
        finite = finite and check[k] == 0
    for a in range(p):
        lo[a], hi[a] = np.inf, -np.inf
        for r in range(RANGE_ROWS):
            lo[a] = min(lo[a], low[r * p + a])
            hi[a] = max(hi[a], high[r * p + a])
    return finite


@_compiled
def transposed_weighted_sums(Yt, G, weight, wsum, scatter):  # pragma: no cover - compiled
    """Add, per kernel ``j``, ``sum_k G_jk``, ``sum_k G_jk y_k`` and the upper triangle of
    ``sum_k G_jk y_k y_k^T`` to ``weight`` (J,), ``wsum`` (J, p) and ``scatter`` (J, p, p), float64.

    ``Yt`` (p x n) and ``G`` (J x n) share one float dtype; a run of
    ``TILE`` rows is summed in it, the runs in float64.  A weight of 0
    multiplies the row before its other value does, so a far row (finite,
    its products beyond the dtype's range) adds exactly 0.
    """
    p, n = Yt.shape
    J = G.shape[0]
    zero = Yt.dtype.type(0)
    w = np.empty((J, TILE), Yt.dtype)
    for t0 in range(0, n, TILE):
        m = min(TILE, n - t0)
        for j in range(J):
            g = G[j, t0 : t0 + m]
            s = zero
            for t in range(m):
                s += g[t]
            weight[j] += s
        for a in range(p):
            ya = Yt[a, t0 : t0 + m]
            for j in range(J):
                g = G[j, t0 : t0 + m]
                wj = w[j]
                s = zero
                for t in range(m):
                    v = g[t] * ya[t]
                    wj[t] = v
                    s += v
                wsum[j, a] += s
            for b in range(a, p):
                yb = Yt[b, t0 : t0 + m]
                if J == 2:  # the usual robust step: both kernels from one load of the rows
                    w0, w1 = w[0], w[1]
                    s0, s1 = zero, zero
                    for t in range(m):
                        s0 += w0[t] * yb[t]
                        s1 += w1[t] * yb[t]
                    scatter[0, a, b] += s0
                    scatter[1, a, b] += s1
                else:
                    for j in range(J):
                        wj = w[j]
                        s = zero
                        for t in range(m):
                            s += wj[t] * yb[t]
                        scatter[j, a, b] += s
