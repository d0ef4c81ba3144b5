"""The kernels that compute a row block's statistics: the numpy spelling and the compiled loops.

Each kernel takes (a sub-block of) a row block as stored and a
:class:`._stats.PassPlan` and returns the block's :class:`._stats.BlockStats`,
counts included, with the mask of its rows finite as stored.  Which kernel
serves a block is decided by the router, :func:`._block.block_stats`; a
compiled kernel that meets rows it does not handle declines (returns None)
and the router hands the rows to the next route, down to :func:`numpy_part`,
which serves every block.

Two spellings
-------------
The usual sub-block (a kernel pass of one kernel matrix whose rows are finite
in working units or hold NaN or inf as stored, counted and left out; a
moments pass, its NaN or inf rows counted and left out; at most
``_block.COMPILED_MAX_FEATURES`` columns, beyond which BLAS's products are
faster) is done by the compiled loops of :mod:`._compiled`
(:func:`one_sweep`, :func:`two_sweeps`, :func:`compiled_moments`), which lay
the rows out transposed and vectorise along them; everything else by the
numpy spelling (:func:`numpy_part`, and :func:`partial_stats` for rows with
missing cells), which is also the reference they are tested against.  Both
give the same quantities; their sums differ in order only.

Precision
---------
Every row is shifted, weighted and multiplied in float64, float32 rows
included (read as stored, widened when they are shifted: the compiled loops
widen them in registers, the numpy spelling a sub-block at a time), and all
sums are float64.  float32 arithmetic would be faster (18.0 against 29.9 ms
per million rows of a robust step in memory), but its round-off depends on
the order of the sums, which differs between the two spellings and between
machines whose vector units differ in width: the noise components of a
float32 fit moved by up to 0.014 degrees between them (issue 23).  In
float64 the spellings agree to 1e-6 degrees, so a float32 store gives the
same model wherever it is fitted.  The cost, on a 20M x 10 float32 store
whose passes are bound by decompression, is measured in
``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy.linalg.blas import dtrmm as _blas_trmm

from . import _compiled, _missing
from ._stats import BlockStats, PassPlan, empty, from_sums

__all__ = [
    "one_sweep",
    "two_sweeps",
    "compiled_moments",
    "numpy_part",
    "partial_stats",
    "completed_sums",
    "Workspace",
    "GEMM_ROWS",
]

#: Exponent below which a weight is set to 0 (exp would be subnormal).
_LOG_TINY = -700.0

#: Rows per GEMM of the weighted sums: it keeps a GEMM's operands in cache.
GEMM_ROWS = 4096

#: From this many columns on, the numpy spelling forms a kernel's quadratic form
#: ``y^T A y`` as ``|L^T y|^2`` with ``A = L L^T`` (a triangular product in place, TRMM:
#: p^2 multiplications per row) instead of ``(Y A) . Y`` (a GEMM: 2 p^2), so that a
#: robust step's block costs two X^T X products, not three.  Narrower blocks take the
#: compiled loops (``_block.COMPILED_MAX_FEATURES``); below this the GEMM is kept, so
#: the numpy spelling of a narrow block is unchanged.  A kernel matrix that is not
#: positive definite (a singular scatter's pseudo-inverse) keeps the GEMM.  Measured
#: (one BLAS thread, 10,000 x 1,000 rows): 0.25-0.36 s against 0.62-1.0 s.
TRIANGULAR_MIN_FEATURES = 33


_NO_ROWS = np.zeros(0, bool)


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

    def take(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        size = int(np.prod(shape))
        buf = self._buffers.get(name)
        if buf is None or buf.size < size:
            buf = self._buffers[name] = np.empty(size, dtype=self.dtype)
        return buf[:size].reshape(shape)


def _sub_block_stats(
    Y: np.ndarray, shift: np.ndarray, plan: PassPlan, ws: Workspace | None = None
) -> BlockStats:
    """Moments of the finite rows ``Y = X - shift`` under each kernel.

    For kernel passes ``shift`` is the kernels' centre c; for a moments pass
    it is a row of the sub-block, so the raw sums below never cancel badly.
    Both are in the units of ``Y``, and so is the result (``unit_exp`` 0; the
    caller sets the counts, the unit and the ranges of a moments pass).
    The scatter is formed as ``sum g y y^T - w m m^T`` (no centred copy of
    the rows): ``y`` is measured from a point near the weighted mean.

    ``Y`` is float64 (:func:`_weighted_sums`).  Equal kernels share one
    quadratic form, and all kernels one weighted GEMM.  This is the numpy
    spelling; :func:`two_sweeps` does the usual case faster.
    """
    n, p = Y.shape
    if ws is None or ws.dtype != Y.dtype:
        ws = Workspace(Y.dtype)
    if plan.kernels is None:
        G = None
        log_scale = np.zeros(1)
    else:
        J = plan.n_kernels
        E = ws.take("exponents", (J, n))
        quad = ws.take("quad", (n,))
        offsets = np.zeros(J) if plan.offsets is None else plan.offsets
        wider = np.zeros(J, bool)  # same quadratic form as kernel j - 1, wider flat top
        for j, A in enumerate(plan.kernels):
            same = j > 0 and np.array_equal(A, plan.kernels[j - 1])
            wider[j] = same and offsets[j] >= offsets[j - 1]
            if not same:
                _quadratic_form(Y, A, quad, ws)  # y_k^T A y_k, reused by equal kernels
                # Overflow (inf, or inf - inf = NaN) only for rows far beyond
                # any kernel's reach: infinitely far, weight 0.
                quad[np.isnan(quad)] = np.inf
            _exponents(quad, offsets[j], out=E[j])
        G, log_scale = _weights(E)
        wider[1:] &= log_scale[:-1] == 0
    weight, wsum, scatter = _weighted_sums(Y, G, ws, wider=None if G is None else wider)
    return from_sums(n, log_scale, weight, wsum, scatter, shift)


def _quadratic_form(Y: np.ndarray, A: np.ndarray, out: np.ndarray, ws: Workspace) -> np.ndarray:
    """``y_k^T A y_k`` of each row of ``Y`` (float64) into ``out``: by the triangular factor
    of ``A`` in place on a copy of the rows where ``TRIANGULAR_MIN_FEATURES`` allows and ``A``
    has one, else ``(Y A) . Y``."""
    n, p = Y.shape
    Z = ws.take("YA", (n, p))
    L = _lower_factor(np.ascontiguousarray(A, dtype=np.float64).tobytes(), p) if p >= TRIANGULAR_MIN_FEATURES else None
    if L is None or Y.dtype != np.float64 or not n:
        np.matmul(Y, A.astype(Y.dtype), out=Z)
        return np.einsum("ij,ij->i", Z, Y, out=out)
    np.copyto(Z, Y)
    # Z (C order, n x p) is Z^T in Fortran order: L^T Z^T = (Z L)^T, in place.
    _blas_trmm(1.0, L, Z.T, side=0, lower=1, trans_a=1, overwrite_b=1)
    return np.einsum("ij,ij->i", Z, Z, out=out)


@functools.lru_cache(maxsize=4)
def _lower_factor(A: bytes, p: int) -> np.ndarray | None:
    """The lower Cholesky factor of kernel matrix ``A`` (bytes of a p x p float64 array) in
    Fortran order, once per pass's matrix in a process; None where ``A`` has none."""
    M = np.frombuffer(A, dtype=np.float64).reshape(p, p)
    try:
        L = np.linalg.cholesky((M + M.T) / 2)
    except np.linalg.LinAlgError:
        return None
    return np.asfortranarray(L) if np.all(np.isfinite(L)) else None


def _exponents(quad: np.ndarray, offset: float, out: np.ndarray) -> np.ndarray:
    """``e_k = z - 1/2 y_k^T A y_k`` into ``out`` (capped at 0 by :func:`_weights`)."""
    np.multiply(quad, -0.5, out=out)
    out += offset
    return out


def _weights(E: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weights ``exp(min(e, 0) - m_j)`` from the exponents ``E`` (J x n, overwritten), and ``m_j``.

    The cap at 0 is the flat top (for ``z = 0``, ``A`` is PSD and positive
    values are round-off); ``m_j = max_k min(e_jk, 0)`` is the kernel's
    log-scale, -inf when every row is infinitely far (weight 0).
    """
    np.minimum(E, 0.0, out=E)
    log_scale = E.max(axis=1).astype(np.float64) if E.shape[1] else np.full(len(E), -np.inf)
    live = np.isfinite(log_scale)
    if np.any(log_scale[live]):
        E[live] -= log_scale[live].astype(E.dtype)[:, None]
    # Weights below exp(LOG_TINY) would be subnormal, which slows the products
    # many times over; they are far below the round-off of the sums.
    E[E < _LOG_TINY] = -np.inf
    return np.exp(E, out=E), log_scale


def two_sweeps(
    Xs: np.ndarray, plan: PassPlan, U: np.ndarray, ws: Workspace
) -> tuple[BlockStats, np.ndarray | None] | None:
    """A kernel pass's statistics of sub-block ``Xs`` (its rows widened to float64) by the
    compiled loops (:mod:`._compiled`) in two sweeps (the quadratic forms, then the weighted
    sums), counts included, and the mask of the rows finite as stored (None: all are).  Declines
    (None) when a row finite as stored is not finite in working units (a far row), which the
    numpy spelling handles.

    The same quantities as :func:`_working_rows` then :func:`_sub_block_stats`: the rows are
    shifted by the centre, then scaled by the power of two; rows holding
    NaN or inf (as stored) and the plan's excluded rows get weight 0, and the former are counted
    in ``n_nonfinite``.  Sums differ from numpy's in their order only.  Kernels that all have a
    flat top (the default solver's) usually take one sweep instead (:func:`one_sweep`).
    """
    n, p = Xs.shape
    X = np.ascontiguousarray(Xs)
    center, scale = _shift_and_scale(plan)
    Yt, quad = ws.take("Yt", (p, n)), ws.take("quad", (n,))
    _compiled.transposed_quadratic_form(X, center, scale, U, Yt, quad)
    finite = None
    if not np.isfinite(quad).all():
        # A row whose quadratic form is not finite holds NaN or inf as stored (left out and
        # counted, as numpy does), overflows in working units (far: the numpy spelling's case),
        # or is finite there but so far out that its form overflows (inf, or inf - inf = NaN):
        # weight 0.  Either way its working values are zeroed, so that its products add exactly 0
        # whatever order the compiled sums multiply in (reassociation may form y_a y_b).
        out = ~np.isfinite(quad)
        finite_there = np.isfinite(Yt[:, out]).all(axis=0)
        stored = np.isfinite(Xs[out]).all(axis=1)
        if np.any(stored & ~finite_there):
            return None
        if not stored.all():
            finite = np.ones(n, bool)
            finite[np.flatnonzero(out)[~stored]] = False
        quad[out] = np.inf
        Yt[:, out] = 0
    J = plan.n_kernels
    E = ws.take("exponents", (J, n))
    offsets = np.zeros(J) if plan.offsets is None else plan.offsets
    for j in range(J):
        _exponents(quad, offsets[j], out=E[j])
    if plan.excluded or plan.excluded_rows:
        E[:, _excluded_rows(Xs, plan)] = -np.inf
    G, log_scale = _weights(E)
    part = from_sums(n, log_scale, *_compiled_sums(Yt, G), plan.center)
    part.n_nonfinite = 0 if finite is None else int(n - finite.sum())
    part.n_rows = n - part.n_nonfinite
    return part, finite


def one_sweep(
    X: np.ndarray, plan: PassPlan, U: np.ndarray, *, sub_block_rows: int
) -> tuple[BlockStats, np.ndarray | None] | None:
    """:func:`two_sweeps` in one sweep (:func:`._compiled.flat_top_sums`), for kernels that
    all have a flat top (the mask of finite rows only where the plan draws a row sample, its
    one use; None otherwise), over a sub-block or a whole block (its excluded rows found
    ``sub_block_rows`` at a time, so that no temporary is the size of the block).  Declines
    (None) a far row, or a kernel whose largest weight in the rows is below
    ``exp(_LOG_TINY / 2)`` (no row near its flat top), whose weights the two-sweep loops scale
    first so that none is lost.

    The sweep's weights are ``exp(e)``, not ``exp(e - m_j)``; dividing its sums by ``exp(m_j)``
    gives the two-sweep result, except for weights below ``exp(_LOG_TINY)``, which are 0 here
    and ``exp(e - m_j)`` there: at most ``exp(_LOG_TINY / 2)`` of the largest weight, far below
    the round-off of the sums.
    """
    n, p = X.shape
    J, tiny = plan.n_kernels, _LOG_TINY
    center, scale = _shift_and_scale(plan)
    excluded = _NO_ROWS
    if plan.excluded or plan.excluded_rows:  # by sub-blocks: a narrow store's block has millions of rows
        starts = range(0, n, sub_block_rows)
        excluded = np.concatenate([_excluded_rows(X[s : s + sub_block_rows], plan) for s in starts])
    weight, wsum, scatter, top = np.zeros(J), np.zeros((J, p)), np.zeros((J, p, p)), np.empty(J)
    n_bad = _compiled.flat_top_sums(X, center, scale, U, plan.offsets, tiny, excluded, weight, wsum, scatter, top)
    if n_bad < 0 or not np.all(top >= tiny / 2):
        return None
    if np.any(top):
        rescale = np.exp(-top)
        weight *= rescale
        wsum *= rescale[:, None]
        scatter *= rescale[:, None, None]
    part = from_sums(n, top, weight, wsum, _mirrored(scatter), plan.center)
    part.n_nonfinite = n_bad
    part.n_rows = n - n_bad
    # The mask of finite rows serves the row sample only: a robust step's block with gaps
    # (NaN rows) would otherwise scan all its values once more.
    return part, _finite_rows(X) if n_bad and plan.sample_rate > 0 else None


def _mirrored(scatter: np.ndarray) -> np.ndarray:
    """The compiled loops' upper triangles (J x p x p), completed in place."""
    scatter += np.triu(scatter, 1).transpose(0, 2, 1)
    return scatter


def _compiled_sums(Yt: np.ndarray, G: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per kernel, ``sum_k G_jk``, ``sum_k G_jk y_k`` and ``sum_k G_jk y_k y_k^T`` (float64) of the
    transposed working rows ``Yt`` by the compiled loops, which fill the upper triangle."""
    J, p = len(G), Yt.shape[0]
    weight, wsum, scatter = np.zeros(J), np.zeros((J, p)), np.zeros((J, p, p))
    _compiled.transposed_weighted_sums(Yt, G, weight, wsum, scatter)
    return weight, wsum, _mirrored(scatter)


def compiled_moments(Xs: np.ndarray, ws: Workspace) -> tuple[BlockStats, np.ndarray | None] | None:
    """A moments pass's statistics of sub-block ``Xs`` (its rows widened to float64) by the
    compiled loops, counts included, and the mask of its finite rows (None: all are); None when
    the sub-block's unit is not a normal power of two of the dtype, which the numpy spelling
    handles.

    The same quantities as the numpy spelling: rows holding NaN or inf are counted and left out;
    the unit is the power of two above the largest magnitude of the others and of the first
    row's finite values, the rows are measured from that first row (its NaN and inf read as 0)
    in that unit (one rounding, then the power of two), and the column ranges are those of the
    finite rows as stored.
    """
    n, p = Xs.shape
    dtype = Xs.dtype.type
    good, finite = np.ascontiguousarray(Xs), None
    lo, hi = np.empty(p, dtype), np.empty(p, dtype)
    if not _compiled.column_ranges(good, lo, hi):  # a NaN or inf: leave those rows out
        finite = _finite_rows(Xs)
        good = np.ascontiguousarray(Xs[finite])
        if not len(good):
            return None  # no finite row: the numpy spelling's empty result
        _compiled.column_ranges(good, lo, hi)
    first = _first_row(Xs)
    unit = max(_top_exponent(np.concatenate([lo, hi])), _top_exponent(first))
    first = first.astype(dtype)  # exact: a row as stored
    if abs(unit) >= np.finfo(dtype).maxexp - 1:
        return None
    m = len(good)
    Yt = ws.take("Yt", (p, m))
    _compiled.transposed_rows(good, first, dtype(2.0**-unit), Yt)
    G = ws.take("exponents", (1, m))
    G.fill(1)
    weight, wsum, scatter = _compiled_sums(Yt, G)
    weight[0] = m  # exact
    part = from_sums(m, np.zeros(1), weight, wsum, scatter, np.ldexp(first.astype(np.float64), -unit))
    part.col_min, part.col_max, part.unit_exp = lo.astype(np.float64), hi.astype(np.float64), unit
    part.n_nonfinite = n - m
    return part, finite


def _weighted_sums(
    Y: np.ndarray, G: np.ndarray | None, ws: Workspace, *, wider: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per kernel j: ``sum_k G_jk``, ``sum_k G_jk y_k`` and ``sum_k G_jk y_k y_k^T`` in float64.

    Runs of ``GEMM_ROWS`` rows (a short run keeps its operands in cache).  One kernel (the
    usual robust step) is a SYRK per run, ``(sqrt(g) y)^T (sqrt(g) y)``; several kernels are one GEMM per run,
    the rows weighted by each kernel side by side (n x Jp) times the rows.
    ``G=None``: unit weights, one kernel (a moments pass).

    A kernel marked ``wider`` has the quadratic form of kernel ``j - 1``
    and a wider flat top, and kernel ``j - 1`` has a row inside its flat top
    (its log-scale is 0), so ``G_j >= G_(j-1)`` and they differ only on the
    rows outside kernel ``j - 1``'s flat top (``G_(j-1) < 1``): its sums are
    kernel ``j - 1``'s plus those rows' ``G_j - G_(j-1)`` terms, which are
    non-negative (no cancellation).  The final kernel of a robust step is
    such a kernel, so a step costs one weighted SYRK and a small one.
    """
    n, p = Y.shape
    J = 1 if G is None else G.shape[0]
    weight, wsum, scatter = np.zeros(J), np.zeros((J, p)), np.zeros((J, p, p))
    own = np.arange(J) if wider is None else np.flatnonzero(~wider)
    W = ws.take("W", (min(n, GEMM_ROWS), len(own) * p))
    for start in range(0, n, GEMM_ROWS):
        y = Y[start : start + GEMM_ROWS]
        w = W[: len(y)]
        if G is None:
            wsum[0] += _column_reduce(np.add, y, dtype=np.float64)
            scatter[0] += y.T @ y
            continue
        if len(own) == 1:  # (sqrt(g) y)^T (sqrt(g) y): numpy makes it a SYRK, half the GEMM's work
            j = own[0]
            g = G[j, start : start + GEMM_ROWS]
            weight[j] += g.sum(dtype=np.float64)
            wsum[j] += g @ y
            np.multiply(y, np.sqrt(g)[:, None], out=w)
            scatter[j] += w.T @ w
        else:
            g = G[own, start : start + GEMM_ROWS]
            weight[own] += g.sum(axis=1, dtype=np.float64)
            wsum[own] += g @ y
            for k in range(len(own)):
                np.multiply(y, g[k][:, None], out=w[:, k * p : (k + 1) * p])
            scatter[own] += (w.T @ y).reshape(len(own), p, p)
    if G is None:
        weight[0] = n  # exact
    for j in np.flatnonzero(wider) if wider is not None else ():
        rows = np.flatnonzero(G[j - 1] < 1)  # outside kernel j - 1's flat top
        extra = G[j, rows] - G[j - 1, rows]
        weight[j], wsum[j], scatter[j] = weight[j - 1], wsum[j - 1], scatter[j - 1]
        for start in range(0, len(rows), GEMM_ROWS):
            yr, er = Y[rows[start : start + GEMM_ROWS]], extra[start : start + GEMM_ROWS]
            weight[j] += er.sum(dtype=np.float64)
            wsum[j] += er @ yr
            scatter[j] += (yr * er[:, None]).T @ yr
    return weight, wsum, scatter


def _finite_rows(Y: np.ndarray) -> np.ndarray | None:
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


def _top_exponent(Y: np.ndarray) -> int:
    """The exponent e of the power of two 2**e above every magnitude in ``Y`` (0 if all are 0)."""
    top = float(np.maximum(Y.max(), -Y.min())) if Y.size else 0.0  # max |Y| without a copy; NaN stays NaN
    return int(np.frexp(top)[1]) if top > 0 else 0


#: Rows side by side in :func:`_column_reduce` and :func:`_shifted`.
_GROUP = 16


def _column_reduce(ufunc: np.ufunc, X: np.ndarray, dtype=None) -> np.ndarray:
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


def _excluded_rows(X: np.ndarray, plan: PassPlan) -> np.ndarray:
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


def _working_rows(X: np.ndarray, plan: PassPlan, out: np.ndarray | None = None):
    """Rows of a kernel pass in working units, the mask of the rows that stay
    finite there (None: all do), and the centre as subtracted (working units,
    float64).

    ``X`` is as stored, float64 or float32; the working rows are float64.
    NaN and inf survive the shift: rows that stay finite were finite as stored.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        Y = _scaled(_shifted(X, np.ldexp(plan.center, plan.unit_exp), out), -plan.unit_exp)  # one rounding
        return Y, _finite_rows(Y), plan.center


def _shift_and_scale(plan: PassPlan) -> tuple[np.ndarray, float]:
    """What the compiled loops subtract from a row as stored (the kernels' centre in the data's
    units) and the power of two they then multiply by (the working unit)."""
    return np.ldexp(plan.center, plan.unit_exp), 2.0**-plan.unit_exp


def _shifted(X: np.ndarray, center: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
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


def _scaled(Y: np.ndarray, exp: int, out: np.ndarray | None = None) -> np.ndarray:
    """``Y * 2**exp`` into ``out`` (default: in place): a multiplication by a power of two,
    exact as ``np.ldexp`` (both round only a result that leaves the dtype's normal range) and
    several times faster."""
    out = Y if out is None else out
    if abs(exp) < np.finfo(Y.dtype).maxexp - 1:  # 2**exp itself is a normal number of Y's dtype
        return np.multiply(Y, Y.dtype.type(2.0**exp), out=out) if exp or out is not Y else Y
    return np.ldexp(Y, exp, out=out)


def _kernel_rows(Xs: np.ndarray, Y: np.ndarray, near, shift, finite, plan: PassPlan):
    """The rows a kernel pass weighs, from sub-block ``Xs`` (as stored) shifted into ``Y`` by
    :func:`_working_rows`: ``(Y, shift, n_far)``.

    Rows not finite as stored (``finite``; None: all are) and the plan's
    excluded rows are left out, then rows that overflow in working units
    (far: weight 0) are counted and left out.
    """
    keep = finite
    if plan.excluded or plan.excluded_rows:
        out = _excluded_rows(Xs, plan)
        keep = ~out if keep is None else keep & ~out
    if keep is not None:
        Y, near = Y[keep], None if near is None else near[keep]
    if near is not None and near.all():
        near = None  # the overflowing rows were the non-finite ones
    if near is None:
        return Y, shift, 0
    return Y[near], shift, int(len(near) - near.sum())


@functools.lru_cache(maxsize=8)
def _full_precision(scatter: bytes, p: int) -> np.ndarray | None:
    """:func:`._missing.full_precision`, once per pass's scatter in a process."""
    return _missing.full_precision(np.frombuffer(scatter, dtype=np.float64).reshape(p, p))


@functools.lru_cache(maxsize=256)
def _conditional_model(scatter: bytes, p: int, observed: bytes) -> _missing.ConditionalModel:
    """:func:`._missing.conditional_model`, once per pass's scatter and pattern in a process
    (every block of a pass asks for the same few)."""
    mask = np.frombuffer(observed, dtype=bool)
    return _missing.conditional_model(np.frombuffer(scatter, dtype=np.float64).reshape(p, p), mask)


@functools.lru_cache(maxsize=16)
def _estep_scales(offsets: bytes, shape: tuple, kernel_size2: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`._missing.estep_scales`, once per pass's radii in a process."""
    return _missing.estep_scales(np.frombuffer(offsets, dtype=np.float64).reshape(shape), kernel_size2)


def estep_scales(part_plan) -> tuple[np.ndarray, np.ndarray]:
    """The E-step's scales of a :class:`PartialPlan`'s kernels (:func:`._missing.estep_scales`):
    ``c_p`` per kernel, for the conditional covariances, and ``c_p / c_k`` per kernel and count,
    for the completed rows' second moments."""
    offsets = np.ascontiguousarray(part_plan.offsets, dtype=np.float64)
    return _estep_scales(offsets.tobytes(), offsets.shape, float(part_plan.kernel_size2))


def _completed_scatter(Y: np.ndarray, G: np.ndarray, ratio: np.ndarray, counts: np.ndarray):
    """``sum G``, ``sum G y`` and ``sum G (c_p / c_k) y y^T`` per kernel of completed rows judged
    on ``counts`` cells (the E-step's consistent second moments, :mod:`._missing`)."""
    G2 = G * ratio[:, counts]
    _, _, scatter = _weighted_sums(Y, G2, Workspace(np.float64))
    return G.sum(axis=1), G @ Y, scatter


def _partial_weights(part_plan, d2: np.ndarray, counts: np.ndarray, excluded: np.ndarray | None):
    """The weights of rows judged on ``counts`` cells each (:class:`PartialPlan`): kernel ``j`` gives
    ``exp(min(offsets[j, k] - d2 / (2 c^2), 0))``, rows ``excluded`` none; and the log-scales."""
    E = part_plan.offsets[:, counts] - d2[None, :] / (2 * part_plan.kernel_size2)
    if excluded is not None:
        E[:, excluded] = -np.inf
    return _weights(E)


def completed_sums(plan: PassPlan, Y: np.ndarray, d2: np.ndarray, counts: np.ndarray, cond,
                   excluded: np.ndarray | None = None) -> BlockStats:
    """A pass's statistics of completed rows ``Y`` (working units, centred at ``plan.center``) whose
    distances ``d2`` were judged on ``counts`` cells each, with the conditional covariances of their
    completed cells (``cond``, a :class:`._missing.Conditional` of the same rows): the weights of
    :class:`PartialPlan`, the weighted sums, the covariance terms of the E-step.  Rows ``excluded``
    enter no sums.  (A cellwise pass's sums, :func:`._cells.cell_sums`.)"""
    G, log_scale = _partial_weights(plan.partial, d2, counts, excluded)
    if plan.cells is not None and np.isfinite(plan.cells.cutoff2):  # cells judged: not missing at random
        weight, wsum, scatter = _weighted_sums(Y, G, Workspace(np.float64))
        scatter += cond.covariance_sums(G, Y.shape[1])
    else:  # missing cells only (a partial fit's start): the consistent E-step of partial_stats
        shrink, ratio = estep_scales(plan.partial)
        weight, wsum, scatter = _completed_scatter(Y, G, ratio, counts)
        scatter += cond.covariance_sums(G, Y.shape[1]) * shrink[:, None, None]
    return from_sums(len(Y), log_scale, weight, wsum, scatter, plan.center)


def partial_stats(
    X: np.ndarray, plan: PassPlan, observed: np.ndarray | None = None, codes: np.ndarray | None = None
) -> BlockStats:
    """A kernel pass's statistics of rows with missing cells (float64, as stored; overwritten):
    weights from the observed cells, then either sums of the observed cells for the client's EM
    (rows of the plan's ``patterns``) or the rows completed by the conditional expectation plus
    the conditional covariance of the missing cells (:class:`PartialPlan`).  Completed rows go
    through :func:`._missing.conditional` (the model's precision: a row with m gaps costs an
    m x m solve); only where the scatter is singular, through each pattern's own algebra.
    ``observed`` (``~isnan(X)``) and its pattern codes may be given."""
    part_plan = plan.partial
    n, p = X.shape
    J = plan.n_kernels
    observed = ~np.isnan(X) if observed is None else observed
    excluded = _excluded_rows(X, plan) if plan.excluded or plan.excluded_rows else None
    Y = _to_working_units(X, plan)
    scatter64 = np.ascontiguousarray(part_plan.scatter, dtype=np.float64)
    theta = _full_precision(scatter64.tobytes(), p)
    grouped = np.ones(n, bool) if theta is None else _missing.rows_of_patterns(observed, part_plan.patterns, codes)
    groups = list(_missing.patterns(observed[grouped], None if codes is None else codes[grouped]))
    # The rows regrouped by pattern (in their order within one), each pattern then a slice; the
    # rows completed through the precision last, in their order.
    inner = np.flatnonzero(grouped)
    rest = np.flatnonzero(~grouped)
    order = np.concatenate([*(inner[rows] for _, rows in groups), rest])
    Y, observed = Y[order], observed[order]
    if excluded is not None:
        excluded = excluded[order]
    d2, counts = np.empty(n), np.empty(n, dtype=np.intp)
    slices = []  # (mask, rows, model, key) per pattern, rows a slice; key None: completed here
    done = np.ones(n, bool)  # rows completed here, in the main sums; the others go to the client's EM
    start = 0
    for mask, rows in groups:
        rows = slice(start, start + len(rows))
        start = rows.stop
        model = _conditional_model(scatter64.tobytes(), p, mask.tobytes())
        key = _missing.pattern_key(mask)
        Yo = Y[rows][:, model.observed]
        with np.errstate(over="ignore", invalid="ignore"):
            d2[rows] = model.d2(Yo)
            if key in part_plan.patterns:
                done[rows] = False
            else:
                key = None
                Y[rows, model.missing] = Yo @ model.regression.T
        counts[rows] = len(model.observed)
        slices.append((mask, rows, model, key))
    tail = slice(start, n)
    cond = None
    if start < n:
        cond = _missing.conditional(Y[tail], ~observed[tail], theta)
        d2[tail], Y[tail], counts[tail] = cond.d2, cond.completed, cond.n_observed
    with np.errstate(over="ignore", invalid="ignore"):  # overflow in working units: weight 0
        far = ~np.isfinite(d2) | (done & ~np.isfinite(Y @ np.ones(p)))  # the others' missing cells are NaN
    if far.any():
        d2[far] = np.inf
        Y[far] = 0.0
    G, log_scale = _partial_weights(part_plan, d2, counts, excluded)
    # The E-step's consistency (:mod:`._missing`): second moments times c_p / c_k, C times c_p.
    shrink, ratio = estep_scales(part_plan)
    gaps = {}
    for mask, rows, model, key in slices:
        if key is not None:
            g, Yo = G[:, rows], Y[rows][:, model.observed]
            r = ratio[:, len(model.observed)]
            second = np.stack([(Yo * (gj * rj)[:, None]).T @ Yo for gj, rj in zip(g, r, strict=True)])
            gaps[key] = _missing.GapSums(mask, g.sum(axis=1), g @ Yo, second)
    kept = slice(None) if done.all() else done
    weight, wsum, scatter = _completed_scatter(Y[kept], G[:, kept], ratio, counts[kept])
    for _, rows, model, key in slices:
        if len(model.missing) and key is None:
            cell = np.ix_(model.missing, model.missing)
            for j in range(J):
                scatter[j][cell] += (G[j, rows].sum() * shrink[j]) * model.residual
    if cond is not None:
        scatter += cond.covariance_sums(G[:, tail], p) * shrink[:, None, None]
    part = from_sums(n, log_scale, weight, wsum, scatter, plan.center)
    part.n_far = int(far.sum())
    part.n_partial = n
    part.gaps = gaps or None
    return part


def _to_working_units(X: np.ndarray, plan: PassPlan) -> np.ndarray:
    """``(X - centre) * 2**-unit_exp`` in place (X float64, the caller's copy), as
    ``ldexp(X - ldexp(centre, e), -e)``: the product by a power of two is exact, or rounds as
    ldexp does."""
    factor = np.ldexp(1.0, -plan.unit_exp)
    with np.errstate(over="ignore", invalid="ignore"):
        np.subtract(X, np.ldexp(plan.center, plan.unit_exp), out=X)
        if factor == 0.0 or not np.isfinite(factor):  # |unit_exp| beyond float64's exponents
            return np.ldexp(X, -plan.unit_exp)
        X *= factor
    return X


def _first_row(Xs: np.ndarray) -> np.ndarray:
    """The point a moments sub-block is measured from, so that its sums never cancel badly: its
    first row (NaN and inf read as 0), float64."""
    return np.where(np.isfinite(Xs[0]), Xs[0], 0).astype(np.float64) if len(Xs) else np.zeros(Xs.shape[1])


def numpy_part(Xs: np.ndarray, plan: PassPlan, ws: Workspace) -> tuple[BlockStats, np.ndarray | None]:
    """Sub-block ``Xs``'s statistics in numpy, counts included, and the mask of its finite rows
    as stored (None: all are).  Serves any sub-block of any plan: the reference spelling."""
    n_seen, p = Xs.shape
    if plan.kernels is not None:
        # Shift the rows first: finite working rows prove the stored rows
        # finite, so the usual kernel pass scans its values once, not twice.
        Y, near, shift = _working_rows(Xs, plan, out=ws.take("Y", Xs.shape))
        finite = None if near is None else _finite_rows(Xs)
        Y, shift, n_far = _kernel_rows(Xs, Y, near, shift, finite, plan)
    else:
        finite = _finite_rows(Xs)  # on the values as stored
        good = Xs if finite is None else Xs[finite]
        first = _first_row(Xs)  # |Y| <= 2 in this unit
        unit = max(_top_exponent(good), _top_exponent(first))
        shift = np.ldexp(first, -unit).astype(Xs.dtype)
        Y = _scaled(good, -unit, out=ws.take("Y", good.shape))  # exact, barring float32 underflow
        Y -= shift
        shift = shift.astype(np.float64)  # as subtracted
        n_far = 0
    part = _sub_block_stats(Y, shift, plan, ws) if len(Y) else empty(plan, p)
    if plan.kernels is None and len(Y):
        part.col_min = _column_reduce(np.minimum, good).astype(np.float64)
        part.col_max = _column_reduce(np.maximum, good).astype(np.float64)
        part.unit_exp = unit
    n_bad = 0 if finite is None else int(n_seen - finite.sum())
    part.n_rows, part.n_nonfinite, part.n_far = n_seen - n_bad, n_bad, n_far
    return part, finite
