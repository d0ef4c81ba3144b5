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
numpy spelling (:func:`numpy_part`, and :func:`._partial_stats.partial_stats` for
rows with missing cells), which is also the reference they are tested against.  Both
give the same quantities; their sums differ in order only.

A wide block's kernel pass (``_block.WIDE_MIN_FEATURES`` columns or more) is spelled in BLAS's
products, :func:`wide_block`: per sub-block of ``_block.WIDE_SUB_BLOCK_VALUES`` values (in
cache), one compiled sweep for the working rows, a triangular product (TRMM) for the quadratic
forms and one SYRK for the weighted sums, each about one ``X.T @ X`` of the rows (numpy's
``X.T @ X`` is itself a SYRK), so the block costs about two; sub-blocks it does not serve go to
:func:`numpy_part`.  Where the plan carries the bulk's box (:mod:`._bulk`, a fit's later passes),
the SYRK is of the few rows a flat top does not hold whole, and the block costs about one.

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
``benchmarks/RESULTS.md``.  Not a weight changes where the wide route (from ``_screen.SCREEN_FEATURES``
columns) takes a row's float32 form whose worst-case error bound places it inside the first flat
top (weight 1; :mod:`._screen`), and computes the float64 form of every other row.
"""

from __future__ import annotations

import functools

import numpy as np

from . import _blas, _bulk, _compiled, _screen
from ._block_rows import Workspace, column_reduce, excluded_rows, finite_rows, scaled, shifted, top_exponent
from ._stats import WIDE_FEATURES, BlockStats, PassPlan, combine, empty, from_sums

__all__ = [
    "GEMM_ROWS",
    "compiled_moments",
    "flat_tops",
    "kernel_weights",
    "numpy_part",
    "one_sweep",
    "two_sweeps",
    "weighted_sums",
    "wide_block",
    "wide_plan",
]

#: Exponent below which a weight is set to 0 (exp would be subnormal).
_LOG_TINY = -700.0

#: Rows per GEMM of the weighted sums: it keeps a GEMM's operands in cache.
GEMM_ROWS = 4096

# From ``WIDE_FEATURES`` columns on (:mod:`._stats`), the numpy spelling forms a kernel's quadratic form
# ``y^T A y`` as ``|L^T y|^2`` with ``A = L L^T`` (a triangular product in place, TRMM:
# p^2 multiplications per row) instead of ``(Y A) . Y`` (a GEMM: 2 p^2), so that a
# robust step's block costs two X^T X products, not three.  Narrower blocks take the
# compiled loops (``_block.COMPILED_MAX_FEATURES``); below this the GEMM is kept, so
# the numpy spelling of a narrow block is unchanged.  A kernel matrix that is not
# positive definite (a singular scatter's pseudo-inverse) keeps the GEMM.  Measured
# (one BLAS thread, 10,000 x 1,000 rows): 0.25-0.36 s against 0.62-1.0 s.


_NO_ROWS = np.zeros(0, bool)

#: The stored dtypes :func:`wide_block` reads as they are (widened in its first sweep).
_WIDE_DTYPES = (np.dtype(np.float64), np.dtype(np.float32))


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

    ``Y`` is float64 (:func:`weighted_sums`).  Equal kernels share one
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
        G, log_scale = kernel_weights(E)
        wider[1:] &= log_scale[:-1] == 0
    weight, wsum, scatter = weighted_sums(Y, G, ws, wider=None if G is None else wider)
    return from_sums(n, log_scale, weight, wsum, scatter, shift)


def _quadratic_form(Y: np.ndarray, A: np.ndarray, out: np.ndarray, ws: Workspace) -> np.ndarray:
    """``y_k^T A y_k`` of each row of ``Y`` (float64) into ``out``: by the triangular factor
    of ``A`` in place on a copy of the rows where ``WIDE_FEATURES`` allows and ``A``
    has one, else ``(Y A) . Y``."""
    n, p = Y.shape
    Z = ws.take("YA", (n, p))
    L = _lower_factor(np.ascontiguousarray(A, dtype=np.float64).tobytes(), p) if p >= WIDE_FEATURES else None
    if L is None or Y.dtype != np.float64 or not n:
        np.matmul(Y, A.astype(Y.dtype), out=Z)
        return np.einsum("ij,ij->i", Z, Y, out=out)
    np.copyto(Z, Y)
    # Z (C order, n x p) is Z^T in Fortran order: L^T Z^T = (Z L)^T, in place.
    _blas.trmm_rows(L, Z)
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
    """``e_k = z - 1/2 y_k^T A y_k`` into ``out`` (capped at 0 by :func:`kernel_weights`)."""
    np.multiply(quad, -0.5, out=out)
    out += offset
    return out


def kernel_weights(E: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
        E[:, excluded_rows(Xs, plan)] = -np.inf
    G, log_scale = kernel_weights(E)
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
        excluded = np.concatenate([excluded_rows(X[s : s + sub_block_rows], plan) for s in starts])
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
    return part, finite_rows(X) if n_bad and plan.sample_rate > 0 else None


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
        finite = finite_rows(Xs)
        good = np.ascontiguousarray(Xs[finite])
        if not len(good):
            return None  # no finite row: the numpy spelling's empty result
        _compiled.column_ranges(good, lo, hi)
    first = _first_row(Xs)
    unit = max(top_exponent(np.concatenate([lo, hi])), top_exponent(first))
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


def weighted_sums(
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
            wsum[0] += column_reduce(np.add, y, dtype=np.float64)
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


def wide_block(X: np.ndarray, plan: PassPlan, ws: Workspace, *, sub_block_rows: int) -> BlockStats | None:
    """A kernel pass's statistics of a wide row block (``WIDE_FEATURES`` columns or
    more) by BLAS's products, ``sub_block_rows`` rows at a time; None where the plan is not one
    it serves (the caller's sub-block loop then takes the block).

    The same quantities as :func:`numpy_part`, with its work fused (:func:`_wide_sums`): per
    sub-block, one sweep for the working rows, the triangular product for their quadratic
    forms, one SYRK for the first kernel's three sums; the sums of the block's sub-blocks are
    added as they come (one centre, one log-scale of 0), and completed once.  A sub-block it
    does not serve (a row with NaN or inf, or far; a kernel with no row in its flat top) goes
    to :func:`numpy_part` and is merged.  Serves kernels of one positive definite matrix, each with a
    flat top (:func:`flat_tops`: without one every sub-block would go to :func:`numpy_part`), whose
    later kernels have wider flat tops (the default solver's; the plan's excluded values and rows
    get weight 0), without a ``"partial"`` plan, in a working unit that is a normal float64; the block
    float64 or float32 (read as stored, widened in the first sweep).  Sums differ from
    :func:`numpy_part`'s in their order only (and ``sqrt(g)^2`` for ``g``).
    """
    n, p = X.shape
    if not n or not wide_plan(plan, p, X.dtype):
        return None
    A, J = plan.kernels[0], plan.n_kernels
    offsets = np.asarray(plan.offsets, dtype=np.float64)
    L = _lower_factor(key := np.ascontiguousarray(A, dtype=np.float64).tobytes(), p)
    if L is None:
        return None
    bulk, screen = None if plan.bulk is None else _bulk.BlockBulk(J, p, plan.bulk.collect), _screen.Screen.of(L, key)
    S = extra = None  # with the bulk's sums, the block's sums go there
    if bulk is None:
        S = np.zeros((p + 1, p + 1))  # [scatter, wsum; wsum^T, weight] of the first kernel
        extra = (np.zeros(J), np.zeros((J, p)), np.zeros((J, p, p)))  # the wider kernels' own terms
    others, served = [], 0
    for start in range(0, n, sub_block_rows):
        sub = X[start : start + sub_block_rows]
        rows_in = None if bulk is None else _bulk.inside(sub, plan.bulk)
        if _wide_sums(sub, plan, L, offsets, ws, S, extra, bulk=bulk, rows_in=rows_in, screen=screen):
            served += len(sub)
        else:
            others.append(numpy_part(np.asarray(sub, dtype=np.float64), plan, ws)[0])
            if bulk is not None:
                bulk.add_unserved(sub, rows_in, plan)
    result = empty(plan, p)
    if bulk is not None:  # the served rows are in the bulk sums, completed by the client
        result.n_rows, result.bulk = served, bulk.finish()
    elif served:
        weight, wsum, scatter = np.zeros(J), np.zeros((J, p)), np.zeros((J, p, p))
        weight[0], wsum[0], scatter[0] = S[p, p], S[p, :p], S[:p, :p]
        for j in range(1, J):
            weight[j] = weight[j - 1] + extra[0][j]
            wsum[j] = wsum[j - 1] + extra[1][j]
            scatter[j] = scatter[j - 1] + extra[2][j]
        result = from_sums(served, np.zeros(J), weight, wsum, scatter, plan.center)
        result.n_rows, result.n_nonfinite, result.n_far = served, 0, 0
    for part in others:
        result = combine(result, part)
    return result


def wide_plan(plan: PassPlan, p: int, dtype) -> bool:
    """Whether :func:`wide_block` serves ``plan``'s blocks of ``p`` columns stored as ``dtype``
    (a block may still decline: its kernel matrix without a triangular factor)."""
    if (plan.kernels is None or not flat_tops(plan) or p < WIDE_FEATURES or plan.partial is not None
            or np.dtype(dtype) not in _WIDE_DTYPES or abs(plan.unit_exp) >= np.finfo(np.float64).maxexp - 1):
        return False
    A = plan.kernels[0]
    return not np.any(plan.offsets[1:] < plan.offsets[:-1]) and all(np.array_equal(B, A) for B in plan.kernels[1:])


def flat_tops(plan: PassPlan) -> bool:
    """Whether every kernel of the plan has a flat top (``offsets > 0``: the default solver's)."""
    return plan.offsets is not None and bool(np.all(plan.offsets > 0))


def _wide_sums(Xs, plan: PassPlan, L: np.ndarray, offsets: np.ndarray, ws: Workspace, S: np.ndarray, extra, *,
               bulk=None, rows_in=None, screen=None) -> bool:
    """Add sub-block ``Xs``'s sums to ``S`` and ``extra`` (:func:`wide_block`); False, adding
    nothing, where a row is not finite in working units or its quadratic form overflows, or a
    kernel has no row in its flat top.

    One sweep shifts and scales the rows (float32 widened as read) into the working rows ``Y``,
    with a column of ones, and into a copy ``Z`` (:func:`._compiled.shifted_pair`); the
    triangular product ``Z L`` (TRMM, ``A = L L^T``) in place gives the quadratic forms
    ``|L^T y|^2``; the rows outside the first kernel's flat top (weight g below 1: a few
    percent) are multiplied by ``sqrt(g)`` in place, and one SYRK ``Y^T Y`` of the ``p + 1``
    columns gives the first kernel's scatter, weighted sum (the column of ones) and weight.  A
    wider kernel's own terms are those rows' ``g_j - g_(j-1)`` terms (non-negative), as in
    :func:`weighted_sums`, by the same SYRK on those rows weighted by their square roots.
    With ``bulk`` (the plan's bulk sums, :mod:`._bulk`; ``rows_in`` the bulk's rows), the sums go
    there instead: the bulk's plain sums where this pass collects them, and each kernel's corrections.
    """
    n, p = Xs.shape
    J = len(offsets)
    center, scale = _shift_and_scale(plan)
    Y, Z = ws.take("Y1", (n, p + 1)), ws.take("YA", (n, p))
    if _compiled.AVAILABLE:
        _compiled.shifted_pair(Xs, center, scale, Y, Z)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            scaled(shifted(Xs, center, Z), int(-plan.unit_exp))
        Y[:, :p], Y[:, p] = Z, 1.0
    if screen is None:
        _blas.trmm_rows(L, Z)  # Z L, in place, without the GIL (see _quadratic_form)
        with np.errstate(over="ignore", invalid="ignore"):
            quad = np.einsum("ij,ij->i", Z, Z, out=ws.take("quad", (n,)))
    else:  # single precision's forms where they place a row inside the first flat top (_screen)
        quad = screen.quad_forms(Z, L, 2.0 * offsets[0], ws)
    if not np.all(np.isfinite(quad)):
        return False  # a row with NaN or inf, or far: numpy_part counts it and leaves it out
    E = ws.take("exponents", (J, n))
    for j in range(J):
        _exponents(quad, offsets[j], out=E[j])
    if plan.excluded or plan.excluded_rows:
        E[:, excluded_rows(Xs, plan)] = -np.inf  # weight 0: their products add exact zeros
    G, log_scale = kernel_weights(E)
    if np.any(log_scale != 0):
        return False
    if bulk is not None:
        bulk.add_rows(Y, G, rows_in)
        return True
    outside = np.flatnonzero(G[0] < 1)
    rows = Y[outside]  # a copy: the rows as they were (and their 1), for the wider kernels
    Y[outside] *= np.sqrt(G[0, outside])[:, None]
    S += Y.T @ Y  # numpy's SYRK: (p + 1)(p + 2) / 2 products per row
    for j in range(1, J):
        out = G[j - 1, outside] < 1  # outside kernel j - 1's flat top
        w = rows[out] * np.sqrt(G[j, outside[out]] - G[j - 1, outside[out]])[:, None]  # g_j >= g_(j-1)
        T = w.T @ w  # the same SYRK on those rows: their weight, weighted sum and scatter
        extra[0][j] += T[p, p]
        extra[1][j] += T[p, :p]
        extra[2][j] += T[:p, :p]
    return True


def _working_rows(X: np.ndarray, plan: PassPlan, out: np.ndarray | None = None):
    """Rows of a kernel pass in working units, the mask of the rows that stay
    finite there (None: all do), and the centre as subtracted (working units,
    float64).

    ``X`` is as stored, float64 or float32; the working rows are float64.
    NaN and inf survive the shift: rows that stay finite were finite as stored.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        Y = scaled(shifted(X, np.ldexp(plan.center, plan.unit_exp), out), -plan.unit_exp)  # one rounding
        return Y, finite_rows(Y), plan.center


def _shift_and_scale(plan: PassPlan) -> tuple[np.ndarray, float]:
    """What the compiled loops subtract from a row as stored (the kernels' centre in the data's
    units) and the power of two they then multiply by (the working unit)."""
    return np.ldexp(plan.center, plan.unit_exp), 2.0**-plan.unit_exp


def _kernel_rows(Xs: np.ndarray, Y: np.ndarray, near, shift, finite, plan: PassPlan):
    """The rows a kernel pass weighs, from sub-block ``Xs`` (as stored) shifted into ``Y`` by
    :func:`_working_rows`: ``(Y, shift, n_far)``.

    Rows not finite as stored (``finite``; None: all are) and the plan's
    excluded rows are left out, then rows that overflow in working units
    (far: weight 0) are counted and left out.
    """
    keep = finite
    if plan.excluded or plan.excluded_rows:
        out = excluded_rows(Xs, plan)
        keep = ~out if keep is None else keep & ~out
    if keep is not None:
        Y, near = Y[keep], None if near is None else near[keep]
    if near is not None and near.all():
        near = None  # the overflowing rows were the non-finite ones
    if near is None:
        return Y, shift, 0
    return Y[near], shift, int(len(near) - near.sum())


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
        finite = None if near is None else finite_rows(Xs)
        Y, shift, n_far = _kernel_rows(Xs, Y, near, shift, finite, plan)
    else:
        finite = finite_rows(Xs)  # on the values as stored
        good = Xs if finite is None else Xs[finite]
        first = _first_row(Xs)  # |Y| <= 2 in this unit
        unit = max(top_exponent(good), top_exponent(first))
        shift = np.ldexp(first, -unit).astype(Xs.dtype)
        Y = scaled(good, -unit, out=ws.take("Y", good.shape))  # exact, barring float32 underflow
        Y -= shift
        shift = shift.astype(np.float64)  # as subtracted
        n_far = 0
    part = _sub_block_stats(Y, shift, plan, ws) if len(Y) else empty(plan, p)
    if plan.kernels is None and len(Y):
        part.col_min = column_reduce(np.minimum, good).astype(np.float64)
        part.col_max = column_reduce(np.maximum, good).astype(np.float64)
        part.unit_exp = unit
    n_bad = 0 if finite is None else int(n_seen - finite.sum())
    part.n_rows, part.n_nonfinite, part.n_far = n_seen - n_bad, n_bad, n_far
    return part, finite
