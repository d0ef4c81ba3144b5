"""Compiled loops (numba) for the usual blocks of a pass.

A robust step's block function, spelled in numpy, makes about a dozen sweeps
over each sub-block's rows (shift, scale, finiteness, ``Y A``, the row-wise
dot product, the exponents, the weights, the weighted rows, two GEMMs).  With
p = 10 those rows are too narrow for numpy's inner loops or BLAS to run at
speed, and on a machine whose cores both read and compute (2 cores here),
that work showed: a float32 robust-step pass cost 1.7 times a plain
``X.T @ X`` pass of the same store, when its reading alone cost 1.0.

Here the rows are laid out column by column once (``Yt``, p x n, the working
rows transposed), and every later loop runs along a row of ``Yt``: a
contiguous loop over rows that the compiler vectorises (8 float64 values per
instruction with AVX-512).

* :func:`flat_top_sums` does a whole block of the default solver's passes
  (kernels of one quadratic form, each with a flat top) in one sweep: per
  run of ``TILE`` rows, the working rows (transposed), their quadratic
  forms, the weights and the weighted sums, all in L1 cache.  Inside a flat
  top the weight is 1, so ``exp`` (scalar) is taken only for the few rows
  outside it; the kernel's log-scale is assumed 0 (a row inside the flat
  top) and checked after the sweep.
* :func:`transposed_quadratic_form` then :func:`transposed_weighted_sums`
  do the same in two sweeps over a sub-block, with numpy's SIMD ``exp`` and
  log-scale between them: for kernels without a flat top (the paper
  solver's), and for a sub-block none of whose rows is near a flat top;
* :func:`column_ranges` and :func:`transposed_rows`: a moments pass's column
  ranges and finiteness, then its rows in the sub-block's unit;
* :func:`sampled_rows`: the rows a pass draws into its row sample (the hash
  of the global row index that numpy's ``_block._row_uniforms`` spells).
* :func:`row_distances`: per complete row, the fitted model's squared
  distance and the channel of its largest contribution, in one sweep (the
  per-row methods and ``score``; :func:`._model.distances_and_top`): numpy's
  spelling made about ten sweeps over a block for them.

Every working row, quadratic form, weight and sum is float64, float32 rows
included (:func:`flat_top_sums` reads them as stored and widens them as it
shifts them; the other loops are given float64 rows), as in the numpy
spelling (:mod:`._kernels`, "Precision"): the two then differ only in the
order of float64 sums.  What the loops do not handle (a row that is not finite
in working units, a kernel that is not one quadratic form, a unit beyond
the dtype's normal powers of two) is done by the numpy spelling in
:mod:`._kernels`, which remains the reference (the router,
:func:`._block.choose_route`, says which serves a block): ``tests/test_compiled.py``
checks every spelling against the definitions written out plainly.  The
loops are compiled on first use and cached on disk (numba's
``cache=True``): about 4 s for a default fit's loops once per machine and
dtype (the one sweep, 1.9 s of it), then a 0.2 s load.

The loops' disk cache is :data:`CACHE_DIR` (where it lives and why:
:mod:`._numba_cache`).

With ``NUMBA_DISABLE_JIT=1`` the loops would run as Python (about 76 times
slower); :data:`AVAILABLE` is then False and the numpy spelling does every
block.

Same bits whatever numba's cache holds: the helpers of the sweeps
(:func:`_shift_run`, :func:`_quadratic_run`, :func:`_sums_run`) are inlined
into their callers by numba (``inline="always"``).  Compiled as functions of
their own, the process that compiled the loops called the helpers' separate
machine code, whose reassociated (vectorised) sums add in another order than
the copy optimised into the caller that numba writes to its cache, so that
process's float32 sums (then computed in float32) differed from every later process's in the last bits
(measured: up to 3e-8 degrees in a fit's components).  Inlined, the code that
runs is the code that is cached.

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

from ._numba_cache import cache_dir

__all__ = [
    "AVAILABLE",
    "CACHE_DIR",
    "column_ranges",
    "compiled",
    "complete_gaps",
    "flat_top_sums",
    "row_distances",
    "sampled_rows",
    "shifted_pair",
    "SPLITMIX_GOLDEN",
    "SPLITMIX_MIX1",
    "SPLITMIX_MIX2",
    "transposed_quadratic_form",
    "transposed_rows",
    "transposed_weighted_sums",
    "upper_doubled",
    "within",
]

#: Whether the compiled loops can run: numba imports and compiles (``NUMBA_DISABLE_JIT=1``
#: would run them as Python, 76 times slower than the numpy spelling's work: False then).
AVAILABLE = numba is not None and not numba.config.DISABLE_JIT


#: The folder of numba's cache of the compiled loops (see the module docstring); None: each
#: process compiles them.  Read once, when the package is imported.
CACHE_DIR = cache_dir() if AVAILABLE else None

#: Rows per run: a run's values of ``Yt`` (p x ``TILE``) stay in L1 cache.
TILE = 256

#: Rows read side by side by :func:`column_ranges`.
RANGE_ROWS = 16

#: Rows :func:`row_distances` takes side by side (a component read once for all of them).
DISTANCE_ROWS = 8

#: LLVM fast-math flags: reassociation (vectorised sums), contraction (FMA),
#: no signed zeros, reciprocal.  Not ``nnan``/``ninf``: infinities and NaN
#: keep their IEEE meaning.  A sum never shares its loop with a store: LLVM vectorises such a
#: loop behind a run-time alias check on the arrays' addresses and keeps an unvectorised copy,
#: whose sum rounds otherwise (tests/test_compiled.py reads the IR for it).
_FLAGS = {"reassoc", "contract", "nsz", "arcp"}


def compiled(fn=None, *, fastmath=True, inline=False):
    """``numba.njit`` without the GIL, with ``_FLAGS`` unless ``fastmath=False``, cached on disk
    in :data:`CACHE_DIR` (None: compiled in each process).  ``inline``: a helper that numba
    inlines into every caller (``inline="always"``) and never compiles on its own (see the
    module docstring: the same bits whatever the cache holds)."""
    if fn is None:
        return lambda f: compiled(f, fastmath=fastmath, inline=inline)
    if not AVAILABLE:
        return fn
    options = {"nogil": True, "fastmath": _FLAGS if fastmath else False}
    if inline:
        return numba.njit(inline="always", **options)(fn)
    if CACHE_DIR is None:
        return numba.njit(cache=False, **options)(fn)
    # numba reads its cache folder when the function is decorated: ours for our functions only
    saved, numba.config.CACHE_DIR = numba.config.CACHE_DIR, CACHE_DIR
    try:
        return numba.njit(cache=True, **options)(fn)
    except RuntimeError:  # pragma: no cover - "cannot cache function ...: no locator available"
        return numba.njit(cache=False, **options)(fn)
    finally:
        numba.config.CACHE_DIR = saved


def upper_doubled(A: np.ndarray) -> np.ndarray:
    """``A``'s upper triangle with the off-diagonal entries doubled: ``y^T A y = sum_{a<=b} U_ab y_a y_b``
    (float64, the loops' working dtype)."""
    A = np.asarray(A, dtype=np.float64)
    return np.ascontiguousarray(np.triu(A + A.T) - np.diag(np.diag(A)))


@compiled(inline=True)
def _shift_run(x, p, center, scale, Yt, col, t0, m):  # pragma: no cover - compiled (numba hides it from coverage)
    """``Yt[:, col:col+m]`` = rows ``t0 .. t0+m-1`` of ``x`` (an n x p array, flat), shifted by
    ``center`` and scaled, transposed: one rounding, then a power of two.

    Column by column: each loop reads one column of the run (a stride of p) and writes a
    contiguous row of ``Yt``.
    """
    for a in range(p):
        c = center[a]
        ya = Yt[a, col : col + m]
        base = t0 * p + a
        for t in range(m):
            ya[t] = (x[base + t * p] - c) * scale


@compiled(inline=True)
def _quadratic_run(Yt, U, q, col, m):  # pragma: no cover - compiled
    """``q[t] = sum_{a<=b} U_ab y_ta y_tb`` for the ``m`` rows of ``Yt`` (p x n) from column ``col``.

    Four products of a row of ``U`` per update of ``q`` (a quarter of the loads and stores of
    one per update; 25-30 % faster at p = 10), then the rest one by one.
    """
    p = Yt.shape[0]
    qq = q[col : col + m]
    for t in range(m):
        qq[t] = 0
    for a in range(p):
        ya = Yt[a, col : col + m]
        b = a
        while b + 3 < p:
            u0, u1, u2, u3 = U[a, b], U[a, b + 1], U[a, b + 2], U[a, b + 3]
            y0, y1 = Yt[b, col : col + m], Yt[b + 1, col : col + m]
            y2, y3 = Yt[b + 2, col : col + m], Yt[b + 3, col : col + m]
            for t in range(m):
                qq[t] += ya[t] * (u0 * y0[t] + u1 * y1[t] + u2 * y2[t] + u3 * y3[t])
            b += 4
        while b < p:
            u = U[a, b]
            yb = Yt[b, col : col + m]
            for t in range(m):
                qq[t] += u * (ya[t] * yb[t])
            b += 1


@compiled(inline=True)
def _sums_run(Yt, G, w, col, m, weight, wsum, scatter):  # pragma: no cover - compiled
    """Add one run's ``sum_k G_jk``, ``sum_k G_jk y_k`` and upper ``sum_k G_jk y_k y_k^T``
    (the ``m`` columns of ``Yt`` and ``G`` from ``col``; ``w``, J x ``TILE``, is scratch),
    to the float64 ``weight``, ``wsum`` and ``scatter``.

    A weight of 0 multiplies the row before its other value does, so a far row (finite, its
    products beyond the dtype's range) adds exactly 0 once its values are zeroed.
    """
    p = Yt.shape[0]
    J = G.shape[0]
    zero = Yt.dtype.type(0)
    for j in range(J):
        g = G[j, col : col + m]
        s = zero
        for t in range(m):
            s += g[t]
        weight[j] += s
    for a in range(p):
        ya = Yt[a, col : col + m]
        for j in range(J):
            g = G[j, col : col + m]
            wj = w[j]
            for t in range(m):
                wj[t] = g[t] * ya[t]
            s = zero
            for t in range(m):  # apart from the store (see _FLAGS)
                s += wj[t]
            wsum[j, a] += s
        for b in range(a, p):
            yb = Yt[b, col : col + m]
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


@compiled
def transposed_rows(X, center, scale, Yt):  # pragma: no cover - compiled
    """``Yt = ((X - center) * scale)^T`` (``X`` n x p in C order; ``Yt`` p x n; one float dtype)."""
    n, p = X.shape
    x = X.reshape(n * p)
    for t0 in range(0, n, TILE):
        _shift_run(x, p, center, scale, Yt, t0, t0, min(TILE, n - t0))


@compiled(fastmath=False)
def shifted_pair(X, center, scale, Y, Z):  # pragma: no cover - compiled
    """``Z = (X - center) * scale`` (float64) and the same rows in ``Y[:, :p]``, ``Y[:, p] = 1``.

    ``X`` (n x p, float64 or float32 as stored, widened here), ``Y`` (n x (p + 1)) and ``Z``
    (n x p): the wide kernel's working rows in one sweep (:func:`._kernels.wide_rows`), the
    shift one rounding and the scale a power of two, as numpy's ``_working_rows`` spells them.
    Without fast-math: the same bits as numpy's subtraction and multiplication.
    """
    n, p = X.shape
    for i in range(n):
        for j in range(p):
            v = (np.float64(X[i, j]) - center[j]) * scale
            Y[i, j] = v
            Z[i, j] = v
        Y[i, p] = 1.0


@compiled(fastmath=False)
def within(X, lo, hi, out):  # pragma: no cover - compiled
    """``out[i]``: whether every value of row ``i`` of ``X`` (as stored) lies in ``[lo, hi]`` (NaN
    does not); the bulk's rows of :mod:`._bulk`, in one read and no temporaries.  Without
    fast-math: NaN compares as IEEE says."""
    n, p = X.shape
    for i in range(n):
        ok = True
        for j in range(p):
            v = np.float64(X[i, j])
            if not (v >= lo[j] and v <= hi[j]):
                ok = False
                break
        out[i] = ok


@compiled
def transposed_quadratic_form(X, center, scale, U, Yt, q):  # pragma: no cover - compiled
    """``Yt = ((X - center) * scale)^T`` and ``q_k = sum_{a<=b} U_ab y_ka y_kb``.

    ``X`` (n x p, C order), ``center`` (p,), ``scale`` and ``U`` are float64,
    as are the outputs ``Yt`` (p x n) and ``q`` (n,).  The shift
    is one rounding and the scale a power of two, as in numpy's
    ``_working_rows``.
    """
    n, p = X.shape
    x = X.reshape(n * p)
    for t0 in range(0, n, TILE):
        m = min(TILE, n - t0)
        _shift_run(x, p, center, scale, Yt, t0, t0, m)
        _quadratic_run(Yt, U, q, t0, m)


@compiled
def flat_top_sums(X, center, scale, U, offsets, log_tiny, excluded, weight, wsum, scatter, top):  # pragma: no cover
    """A kernel pass over sub-block ``X`` (float64 or float32, as stored) in one sweep, for
    kernels that share the quadratic form ``U`` and each have a flat top (``offsets`` > 0): per
    run of ``TILE`` rows, the working rows (float64), their quadratic forms, the weights and the
    weighted sums, all in L1 cache.

    Adds, per kernel ``j``, ``sum_k g_jk``, ``sum_k g_jk y_k`` and the upper triangle of
    ``sum_k g_jk y_k y_k^T`` to ``weight``, ``wsum`` and ``scatter`` (float64), with the weights
    ``g_jk = exp(e_jk)``, ``e_jk = min(z_j - q_k / 2, 0)``, *not* divided by the kernel's
    log-scale ``max_k e_jk``, which is written to ``top[j]`` instead (-inf: no row has weight):
    a row inside the flat top has ``e = 0``, so in the usual sub-block ``top`` is 0 and a single
    sweep gives the two-sweep result.  Weights below ``exp(log_tiny)`` are 0.  The caller
    divides by ``exp(top)``, or, where ``top`` is so low that such weights would be lost,
    takes the two-sweep loops.

    ``excluded`` (n booleans, or none) marks rows that get weight 0.  A row whose quadratic
    form is not finite gets weight 0 and its working values are zeroed.  Returns the number of
    rows holding NaN or inf as stored, or -1 when a row finite as stored is not finite in
    working units (a far row), which the numpy spelling handles.  The exponential is the
    scalar ``exp``, taken only for the rows outside a flat top.
    """
    n, p = X.shape
    J = offsets.shape[0]
    x = X.reshape(n * p)
    zero, half = 0.0, 0.5
    tiny = np.float64(log_tiny)
    Yt = np.empty((p, TILE), np.float64)  # float32 rows are widened as they are shifted
    q = np.empty(TILE, np.float64)
    G = np.empty((J, TILE), np.float64)
    w = np.empty((J, TILE), np.float64)
    off = np.empty(J, np.float64)
    for j in range(J):
        off[j] = offsets[j]
        top[j] = -np.inf
    n_bad = 0
    for t0 in range(0, n, TILE):
        m = min(TILE, n - t0)
        _shift_run(x, p, center, scale, Yt, 0, t0, m)
        _quadratic_run(Yt, U, q, 0, m)
        for t in range(m):
            if not abs(q[t]) < np.inf:  # NaN or inf (comparisons keep their IEEE meaning here)
                stored, there = True, True
                for a in range(p):
                    stored = stored and abs(x[(t0 + t) * p + a]) < np.inf
                    there = there and abs(Yt[a, t]) < np.inf
                    Yt[a, t] = zero
                if stored and not there:
                    return -1
                if not stored:
                    n_bad += 1
                q[t] = np.inf
        if excluded.shape[0]:
            for t in range(m):
                if excluded[t0 + t]:
                    q[t] = np.inf
        for j in range(J):
            o, tj = off[j], top[j]
            g = G[j]
            for t in range(m):
                e = min(o - half * q[t], zero)
                tj = max(tj, e)
                if e == zero:
                    g[t] = 1
                elif e < tiny:
                    g[t] = zero
                else:
                    g[t] = np.exp(e)
            top[j] = tj
        _sums_run(Yt, G, w, 0, m, weight, wsum, scatter)
    return n_bad


#: The splitmix64 hash's constants (the golden-ratio increment, then the two multipliers), shared
#: by :func:`sampled_rows` and numpy's spelling of the same draw (``_block._row_uniforms``).
SPLITMIX_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
SPLITMIX_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
SPLITMIX_MIX2 = np.uint64(0x94D049BB133111EB)


@compiled
def sampled_rows(first, n, seed, rate):  # pragma: no cover - compiled
    """Indices ``k`` in ``0 .. n-1`` of the rows whose global index ``first + k`` draws a uniform
    number below ``rate``: the same splitmix64 hash as numpy's ``_block._row_uniforms``, without
    its three n-long temporaries."""
    out = np.empty(n, np.int64)
    m = 0
    start = np.uint64(first) + np.uint64(seed) * SPLITMIX_GOLDEN + SPLITMIX_GOLDEN
    for k in range(n):
        z = start + np.uint64(k)
        z = (z ^ (z >> np.uint64(30))) * SPLITMIX_MIX1
        z = (z ^ (z >> np.uint64(27))) * SPLITMIX_MIX2
        z ^= z >> np.uint64(31)
        if np.float64(z >> np.uint64(11)) * 2.0**-53 < rate:
            out[m] = k
            m += 1
    return out[:m]


@compiled(fastmath=False)  # reassociation would fold the finiteness check ((s + v) - v is s)
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


@compiled
def transposed_weighted_sums(Yt, G, weight, wsum, scatter):  # pragma: no cover - compiled
    """Add, per kernel ``j``, ``sum_k G_jk``, ``sum_k G_jk y_k`` and the upper triangle of
    ``sum_k G_jk y_k y_k^T`` to ``weight`` (J,), ``wsum`` (J, p) and ``scatter`` (J, p, p), float64.

    ``Yt`` (p x n) and ``G`` (J x n) share one float dtype; a run of
    ``TILE`` rows is summed in it, the runs in float64 (:func:`_sums_run`).
    """
    n = Yt.shape[1]
    w = np.empty((G.shape[0], TILE), Yt.dtype)
    for t0 in range(0, n, TILE):
        _sums_run(Yt, G, w, t0, min(TILE, n - t0), weight, wsum, scatter)


@compiled
def row_distances(X, center, scale, components, inv_var, inv_noise, top_matrix, d2, top):  # pragma: no cover
    """Per row of ``X`` (n x p, complete): its squared distance under a fitted model into
    ``d2`` (n,), and, when ``top`` has n entries, the channel whose reconstruction-based
    contribution is largest into ``top``.

    A row is shifted by ``center`` and scaled by ``scale`` (a power of two: exact), in
    float64, as :func:`._model.mahalanobis_d2` spells it in numpy: ``z = components y``,
    ``d2 = sum_a z_a^2 inv_var_a + max(|y|^2 - |z|^2, 0) inv_noise`` (``inv_noise`` 0: no
    residual term, as when every component is kept).  The contributions are
    ``(y top_matrix)_a^2`` up to one positive factor per row (``top_matrix`` is the
    unit-diagonal precision of :func:`._contributions.reconstruction_contributions` with
    its scaling folded in), so the first largest is the channel
    :meth:`MCPCA.channel_contributions` ranks first.  A row whose distance or a
    contribution is not finite (an overflow) gets ``d2`` NaN: the caller computes it again
    with the numpy spelling, which says what such a row's distance is.

    Rows go ``DISTANCE_ROWS`` at a time, so a component is read once per run of rows, not once
    per row (at p = 1000 the components are 8 MB); a short last run is padded with zero rows.
    Every row of a run goes through the same loops in the same order, so a row's result does
    not depend on its block or on its place in a run.
    """
    n, p = X.shape
    k = components.shape[0]
    with_top = top.shape[0] == n
    R = DISTANCE_ROWS
    y = np.zeros((R, p))
    yy = np.zeros(R)
    s = np.zeros(R)
    zz = np.zeros(R)
    for t0 in range(0, n, R):
        m = min(R, n - t0)
        for r in range(R):
            s[r] = 0.0
            zz[r] = 0.0
            acc = 0.0
            if r < m:
                for j in range(p):
                    y[r, j] = (X[t0 + r, j] - center[j]) * scale
                for j in range(p):  # apart from the store (see _FLAGS)
                    acc += y[r, j] * y[r, j]
            else:
                y[r, :] = 0.0
            yy[r] = acc
        for a in range(k):
            for r in range(R):
                z = 0.0
                for j in range(p):
                    z += components[a, j] * y[r, j]
                s[r] += z * z * inv_var[a]
                zz[r] += z * z
        for r in range(m):
            i = t0 + r
            si = s[r]
            if inv_noise > 0.0:
                res = yy[r] - zz[r]
                if res > 0.0:
                    si += res * inv_noise
                elif res != res:
                    si = np.nan
            if with_top:
                best, at, total = -1.0, 0, 0.0
                for a in range(p):
                    v = 0.0
                    for j in range(p):
                        v += y[r, j] * top_matrix[j, a]
                    v = v * v
                    total += v  # not finite if a contribution is not (or if their sum overflows)
                    if v > best:
                        best, at = v, a
                top[i] = at
                if not total < np.inf:
                    si = np.nan
            d2[i] = si if si < np.inf else np.nan


@compiled
def complete_gaps(U, rows, cols, precision, cov, ok):  # pragma: no cover - compiled
    """Rows ``rows`` of ``U`` (n x p, centred, 0 at their m missing cells ``cols``, r x m) completed
    in place under the model with ``precision`` T: ``u_M = -T_MM^-1 (T u)_M``, with ``T_MM^-1``, the
    missing cells' conditional covariance, into ``cov`` (r x m x m) (:func:`._missing.conditional`).

    Row by row, so a row's result does not depend on the others: ``(T u)_M`` from the m rows
    of T at its gaps, then a Cholesky factor of ``T_MM``, its inverse ``L^-1`` and
    ``T_MM^-1 = L^-T L^-1``.  ``ok[i]`` is False (the row untouched) where ``T_MM`` has no
    Cholesky factor (a semi-definite precision): the caller's numpy spelling takes those rows.
    """
    r_n, m = cols.shape
    p = U.shape[1]
    b = np.empty(m)
    L = np.zeros((m, m))
    Li = np.zeros((m, m))
    for i in range(r_n):
        r = rows[i]
        for a in range(m):
            s = 0.0
            for j in range(p):
                s += precision[cols[i, a], j] * U[r, j]
            b[a] = s
        good = True
        for a in range(m):
            for c in range(a + 1):
                s = precision[cols[i, a], cols[i, c]]
                for k in range(c):
                    s -= L[a, k] * L[c, k]
                if a == c:
                    if not s > 0.0:
                        good = False
                        break
                    L[a, a] = np.sqrt(s)
                else:
                    L[a, c] = s / L[c, c]
            if not good:
                break
        ok[i] = good
        if not good:
            continue
        for a in range(m):
            Li[a, a] = 1.0 / L[a, a]
            for c in range(a):
                s = 0.0
                for k in range(c, a):
                    s -= L[a, k] * Li[k, c]
                Li[a, c] = s / L[a, a]
        for a in range(m):
            for c in range(m):
                s = 0.0
                for k in range(max(a, c), m):
                    s += Li[k, a] * Li[k, c]
                cov[i, a, c] = s
        for a in range(m):
            s = 0.0
            for c in range(m):
                s += cov[i, a, c] * b[c]
            U[r, cols[i, a]] = -s
