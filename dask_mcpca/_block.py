"""What one row block owes a pass: correntropy weights, weighted moments, small sums.

Every pass over the data, local or distributed, calls :func:`block_stats` once
per row block and merges the results with :func:`combine`.  The result of a
block, of a merge and of the whole pass is one type, :class:`BlockStats`: a
few p x p matrices and counts, never rows of the data, except for an optional
row sample that is bounded by design.

Weights
-------
A pass evaluates ``J`` kernels at once.  Kernel ``j`` is a symmetric p x p
matrix ``A_j`` and gives row ``x`` the exponent

    e_j(x) = -1/2 (x - c)^T A_j (x - c)

and the correntropy weight ``g_j(x) = exp(e_j(x))``.  With
``A = M^T M / sigma^2`` and ``M = I - P - v v^T`` this is the paper's
``[G_sigma]_kk`` (eqs. (8) and (13)); with ``A = Sigma^{-1} / s^2`` it is the
Mahalanobis kernel of eq. (1).  An optional offset ``z_j >= 0`` makes the
weight ``exp(min(z_j + e_j(x), 0))``: flat inside an ellipsoid, Gaussian
outside (the default solver's final efficiency step, :mod:`._robust`).

No underflow
------------
For a small kernel size, ``exp(e)`` is 0.0 in float64 for every row.  A block
therefore keeps a log-scale ``m = max_k e_k`` per kernel and accumulates
``exp(e_k - m)``; :func:`combine` rescales two partial results to their common
maximum, as a log-sum-exp does.  The weights of a pass are thus known up to one
common positive factor, which no estimate depends on.

Working units
-------------
A fit's passes see the data in working units ``X * 2**-unit_exp``
(``PassPlan.unit_exp``, chosen by the fit from the first pass's row
sample): scaling by a power of two is exact in floating point, so the bulk
of any data, whatever its magnitude, has a spread near 1 and its squares
neither overflow nor underflow.  A block subtracts the kernels' centre in
the data's own units (one rounding, as without scaling) and then scales.
A row that is finite as stored but whose deviation, or exponent, overflows
in working units is more than ~1e150 spreads from the centre: it gets
weight exactly 0 and is still a finite row (``n_far`` counts them).  A
moments pass (no kernels) cannot know the fit's unit yet: each sub-block
uses its own, the power of two above its largest magnitude, so its moments
cannot overflow, and the result's ``unit_exp`` says in which unit the
merged mean and scatter are (:func:`combine` rescales to the larger one).

Two spellings
-------------
The usual sub-block (a kernel pass of one kernel matrix whose rows are finite
in working units or hold NaN or inf as stored, counted and left out; a
moments pass, its NaN or inf rows counted and left out; at most ``COMPILED_MAX_FEATURES``
columns, beyond which BLAS's products are faster) is done by the compiled
loops of
:mod:`._compiled`, which lay the rows out transposed and vectorise along
them; everything else by the numpy spelling below, which is also the
reference they are tested against (``COMPILED = False`` uses it alone).
Both give the same quantities; their sums differ in order only.

Moments
-------
Weighted moments are kept as (total weight, weighted mean, scatter about that
mean) and merged with the pairwise formula of Chan, Golub and LeVeque, so no
large uncentred sum is ever formed.

Precision
---------
float32 rows are shifted, weighted and multiplied in float32 (twice the
arithmetic rate and half the bytes of float64), in runs of rows (256 in the
compiled loops, ``GEMM_ROWS`` in the numpy spelling) whose results are added
in float64, as are all sums across runs, sub-blocks and blocks: a float32 fit
gives the float64 fit of the same values to float32 round-off
(``tests/test_mcpca.py``).  The float32 rows are in
working units too (the centre, rounded to float32 in the data's units, is
subtracted, then the power of two applied); finiteness is still judged on
the values as stored.  A sub-block whose float32 working rows would overflow
where float64 ones do not (a finite row becoming inf), or a kernel beyond
float32's range, is done in float64, so ``n_far`` and the weights are those
of the float64 pass.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import numpy as np

from . import _compiled, _missing

__all__ = ["PassPlan", "PartialPlan", "BlockStats", "block_stats", "combine"]

#: Rows handled at once inside a block: bounds the temporaries of a task and
#: keeps them in cache (32,768 rows ran 10-25 % faster than 65,536 at p = 10).
SUB_BLOCK_ROWS = 32_768

#: Whether passes use the compiled loops of :mod:`._compiled` for their usual
#: sub-blocks (the numpy spelling does the rest, and all of it when False).
COMPILED = _compiled.AVAILABLE

#: The widest rows the compiled loops take.  Their p(p+1)/2 loops along the
#: rows lose to BLAS's blocked products as p grows (a two-kernel robust step
#: in memory, compiled / numpy: 0.41 at p = 10, 0.82 at 20, 0.98 at 30, 0.97
#: at 50, 1.06 at 100, 1.84 at 300).
COMPILED_MAX_FEATURES = 32

#: ``unit_exp`` of an empty moments result: any unit, its weight is 0.
_NO_UNIT = -(2**20)


@dataclass(frozen=True)
class PartialPlan:
    """How a kernel pass weighs rows with missing cells (``nan_policy="partial"``).

    A row with observed cells ``O`` (k of them) gets, for kernel j, the
    weight ``exp(min(offsets[j, k] - d2_O / (2 kernel_size2), 0))``, where
    ``d2_O = y_O^T S_OO^-1 y_O`` is its squared distance on the observed
    cells under ``scatter`` (:mod:`._missing`) and ``offsets[j, k]`` is the
    kernel's flat-top radius mapped to k channels at the same chi-square
    probability; it then enters the sums as the row completed by the
    conditional expectation of its missing cells, plus the conditional
    covariance of those cells (the E-step of a weighted EM fit).

    Parameters
    ----------
    scatter : ndarray of shape (p, p)
        The model's covariance, in the pass's working units.
    kernel_size2 : float
        ``c^2`` of the kernels' fall-off (d^2 units).
    offsets : ndarray of shape (J, p + 1)
        ``offsets[j, k]``: kernel j's exponent offset for rows with k observed cells.
    patterns : tuple of bytes
        Patterns of observed cells (:func:`._missing.pattern_key`) whose rows
        are not completed in the pass: their weighted sums of observed cells
        come back per pattern (``BlockStats.gaps``) and the client completes
        them by EM to convergence (:func:`._missing.em_moments`).
    """

    scatter: np.ndarray
    kernel_size2: float
    offsets: np.ndarray
    patterns: tuple = ()


@dataclass(frozen=True)
class PassPlan:
    """The small, picklable parameters of one pass.

    Parameters
    ----------
    center : ndarray of shape (p,)
        Reference point ``c`` of the kernels.
    kernels : ndarray of shape (J, p, p) or None
        Kernel matrices ``A_j``; None gives unit weights (a moments pass).
    offsets : ndarray of shape (J,) or None
        Exponent offsets ``z_j >= 0`` (None: all 0).  Kernel ``j`` then gives
        the weight ``exp(min(z_j + e_j(x), 0))``: 1 inside the ellipsoid
        ``(x - c)^T A_j (x - c) <= 2 z_j`` and Gaussian beyond it.
    excluded : tuple of (int, float) pairs
        ``(column, value)``: a row whose ``column`` holds exactly ``value`` (in
        working units) enters no kernel's sums: a repeated value, such as a
        stuck sensor's (see :mod:`._robust`).
    excluded_rows : tuple of p-tuples of floats
        Whole rows (working units): a row equal to one, compared exactly,
        enters no kernel's sums: a frozen logger's record.  Each costs a
        comparison of the first column per row, and of the whole row where
        that matches; :mod:`._robust` passes at most 16.
    unit_exp : int
        The pass sees ``X * 2**-unit_exp`` (working units; see the module
        docstring); ``center``, ``kernels``, ``excluded`` and
        ``excluded_rows`` are in those units.  Ignored by a moments pass,
        which picks its own units.
    sample_rate : float
        Probability with which each row is kept in the returned row sample.
    seed : int
        Seed of the row sample.  Whether a row is drawn depends only on the
        seed and the row's global index, so the sample does not depend on the
        chunking.

    partial : PartialPlan or None
        Rows with some NaN cells (none inf, at least one observed) enter the
        sums by their observed cells (``nan_policy="partial"``; see
        :class:`PartialPlan`); None leaves them out.
    sample_partial : bool
        The row sample also draws rows with some cells NaN (none inf, at
        least one observed), for the in-memory stage of a ``"partial"`` fit.

    Rows holding NaN or inf never enter the sums (except the ``partial``
    rows above); they are counted in ``n_nonfinite`` and the caller decides
    (``nan_policy``).
    """

    center: np.ndarray
    kernels: np.ndarray | None = None
    offsets: np.ndarray | None = None
    excluded: tuple = ()
    excluded_rows: tuple = ()
    unit_exp: int = 0
    sample_rate: float = 0.0
    seed: int = 0
    partial: PartialPlan | None = None
    sample_partial: bool = False
    n_kernels: int = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "n_kernels", 1 if self.kernels is None else len(self.kernels))
        if self.offsets is not None:
            offsets = np.asarray(self.offsets, dtype=np.float64)
            if self.kernels is None or offsets.shape != (self.n_kernels,) or not np.all(offsets >= 0):
                raise ValueError(f"offsets must be {self.n_kernels} values >= 0, one per kernel; got {self.offsets!r}")
            object.__setattr__(self, "offsets", offsets)
        excluded = tuple((int(c), float(v)) for c, v in self.excluded)
        if any(not 0 <= c < len(self.center) for c, _ in excluded) or (excluded and self.kernels is None):
            raise ValueError(f"excluded must be (column, value) pairs of a kernel pass; got {self.excluded!r}")
        object.__setattr__(self, "excluded", excluded)
        rows = tuple(tuple(float(v) for v in row) for row in self.excluded_rows)
        if any(len(row) != len(self.center) for row in rows) or (rows and self.kernels is None):
            raise ValueError(f"excluded_rows must be rows of {len(self.center)} values of a kernel pass")
        object.__setattr__(self, "excluded_rows", rows)
        if self.partial is not None and (self.kernels is None or self.partial.offsets.shape != (
                self.n_kernels, len(self.center) + 1)):
            raise ValueError(f"partial must give each of a kernel pass's kernels {len(self.center) + 1} offsets")


@dataclass(slots=True)
class BlockStats:
    """What a row block, a merge of blocks or a whole pass contributes: counts and small sums.

    ``J`` is the plan's number of kernels (1 for a moments pass), ``p`` the
    number of columns.  "Working units" are those of the rows the pass sees,
    ``X * 2**-plan.unit_exp`` for a kernel pass and ``X`` as stored for a
    moments pass; ``mean`` and ``scatter`` are in units of ``2**unit_exp``
    of them, where ``unit_exp`` is 0 for a kernel pass and the power of two
    a moments pass chose so that its sums cannot overflow (see the module
    docstring; :meth:`in_units` maps them to any other).  The weights are
    known up to one positive factor per kernel, ``exp(log_scale[j])``, which
    the sums share.  Merged by :func:`combine`; plain numpy fields, so it
    pickles between dask workers.

    Attributes
    ----------
    n_rows : int
        Rows without NaN or inf (judged as stored), including far rows and
        rows left out for a plan's excluded values.
    n_nonfinite : int
        Rows holding NaN or inf; they enter no sum.
    log_scale : ndarray of shape (J,)
        ``m_j``, the largest exponent ``e_j`` of a row (the module
        docstring): the weights summed are ``exp(e_j - m_j)``, so
        ``weight * exp(log_scale)`` is the true total weight.  ``-inf``
        when no row has a weight (its sums are then 0).
    weight : ndarray of shape (J,)
        ``sum_k exp(e_jk - m_j)``: each kernel's total weight divided by
        ``exp(m_j)``; the row count for a moments pass (unit weights).
    mean : ndarray of shape (J, p)
        Each kernel's weighted mean, in units of ``2**unit_exp`` working units.
    scatter : ndarray of shape (J, p, p)
        ``sum_k exp(e_jk - m_j) (y_k - mean_j)(y_k - mean_j)^T``: the weighted
        scatter about that mean, in the square of ``mean``'s unit.
    sample : ndarray of shape (n_sample, p) or None
        The finite rows drawn for the row sample, as stored (data units,
        float64); None when the plan asks for none.  (``MCPCA``'s fit maps
        its copy of the first pass's result to working units, sample too.)
    col_min, col_max : ndarray of shape (p,) or None
        A moments pass's smallest and largest value of each column over the
        finite rows, as stored (data units); None for a kernel pass.
    n_far : int
        Finite rows whose deviation from the centre overflows in working
        units: weight 0 (kernel passes).
    n_partial : int
        Rows with some cells missing that entered the sums by their observed
        cells (a plan's ``partial``); counted in ``n_rows``, not in ``n_nonfinite``.
    gaps : dict or None
        Per pattern of a plan's ``partial.patterns``, the weighted sums of
        those rows' observed cells (:class:`._missing.GapSums`, about the
        plan's centre, under ``log_scale``); not in ``weight``, ``mean`` and
        ``scatter`` until the client completes them.
    unit_exp : int
        ``mean`` and ``scatter`` are in units of ``2**unit_exp`` working
        units (squared for ``scatter``): 0 for a kernel pass; for a moments
        pass the largest unit of its sub-blocks (``_NO_UNIT``, any unit,
        while it has no rows).
    """

    n_rows: int
    n_nonfinite: int
    log_scale: np.ndarray
    weight: np.ndarray
    mean: np.ndarray
    scatter: np.ndarray
    sample: np.ndarray | None = None
    col_min: np.ndarray | None = None
    col_max: np.ndarray | None = None
    n_far: int = 0
    unit_exp: int = 0
    n_partial: int = 0
    gaps: dict | None = None

    def in_units(self, unit_exp: int) -> BlockStats:
        """These statistics with their mean and scatter in units of ``2**unit_exp`` (exact; may overflow to inf)."""
        mean, scatter = _in_unit(self, unit_exp)
        return replace(self, mean=mean, scatter=scatter, unit_exp=unit_exp)

    def covariance(self, j: int = 0, *, about: np.ndarray | None = None) -> np.ndarray:
        """Weighted covariance of kernel ``j``: about its weighted mean, or about ``about``."""
        scatter = self.scatter[j] if about is None else self.scatter_about(about, j)
        return scatter / self.weight[j]

    def scatter_about(self, center: np.ndarray, j: int = 0) -> np.ndarray:
        """``X^T G X`` about ``center`` (up to the kernel's factor ``exp(log_scale[j])``); inf where it overflows."""
        d = self.mean[j] - center
        with np.errstate(over="ignore", invalid="ignore"):
            return self.scatter[j] + self.weight[j] * np.outer(d, d)

    def __sizeof__(self) -> int:
        """Bytes held, arrays included (dask's ``sizeof`` uses it to account for a task's result)."""
        arrays = (self.log_scale, self.weight, self.mean, self.scatter, self.sample, self.col_min, self.col_max)
        return object.__sizeof__(self) + sum(a.nbytes for a in arrays if a is not None)


def _row_uniforms(rows: np.ndarray, seed: int) -> np.ndarray:
    """A uniform number in [0, 1) per global row index (splitmix64 hash)."""
    with np.errstate(over="ignore"):
        z = rows.astype(np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        z += np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _empty(plan: PassPlan, p: int) -> BlockStats:
    """The statistics of no rows: the identity of :func:`combine` for ``plan``'s passes."""
    J = plan.n_kernels
    moments = plan.kernels is None  # a moments pass also finds each column's range (the data's fingerprint)
    return BlockStats(
        n_rows=0,
        n_nonfinite=0,
        log_scale=np.full(J, -np.inf),
        weight=np.zeros(J),
        mean=np.zeros((J, p)),
        scatter=np.zeros((J, p, p)),
        sample=np.empty((0, p)) if plan.sample_rate > 0 else None,
        col_min=np.full(p, np.inf) if moments else None,
        col_max=np.full(p, -np.inf) if moments else None,
        unit_exp=_NO_UNIT if moments else 0,
    )


class _Workspace:
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
    Y: np.ndarray, shift: np.ndarray, plan: PassPlan, ws: _Workspace | None = None
) -> BlockStats:
    """Moments of the finite rows ``Y = X - shift`` under each kernel.

    For kernel passes ``shift`` is the kernels' centre c; for a moments pass
    it is a row of the sub-block, so the raw sums below never cancel badly.
    Both are in the units of ``Y``, and so is the result (``unit_exp`` 0; the
    caller sets the counts, the unit and the ranges of a moments pass).
    The scatter is formed as ``sum g y y^T - w m m^T`` (no centred copy of
    the rows): ``y`` is measured from a point near the weighted mean.

    ``Y`` is float32 for float32 data: the products are then float32 and
    their sums float64 (:func:`_weighted_sums`).  Equal kernels share one
    quadratic form, and all kernels one weighted GEMM.  This is the numpy
    spelling; :func:`_compiled_stats` does the usual case faster.
    """
    n, p = Y.shape
    if ws is None or ws.dtype != Y.dtype:
        ws = _Workspace(Y.dtype)
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
                YA = np.matmul(Y, A.astype(Y.dtype), out=ws.take("YA", (n, p)))
                np.einsum("ij,ij->i", YA, Y, out=quad)  # y_k^T A y_k, reused by equal kernels
                # Overflow (inf, or inf - inf = NaN) only for rows far beyond
                # any kernel's reach: infinitely far, weight 0.
                quad[np.isnan(quad)] = np.inf
            _exponents(quad, offsets[j], out=E[j])
        G, log_scale = _weights(E)
        wider[1:] &= log_scale[:-1] == 0
    weight, wsum, scatter = _weighted_sums(Y, G, ws, wider=None if G is None else wider)
    return _moments(n, log_scale, weight, wsum, scatter, shift)


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
    E[E < _LOG_TINY[E.dtype.type]] = -np.inf
    return np.exp(E, out=E), log_scale


def _moments(n: int, log_scale, weight, wsum, scatter, shift) -> BlockStats:
    """A sub-block's statistics from its weighted sums about ``shift``: the mean, and the scatter about it."""
    dead = weight == 0  # a kernel whose rows are all infinitely far
    rel_mean = wsum / np.where(dead, 1.0, weight)[:, None]
    scatter -= weight[:, None, None] * rel_mean[:, :, None] * rel_mean[:, None, :]
    scatter[dead] = 0.0
    return BlockStats(
        n_rows=n, n_nonfinite=0, log_scale=log_scale, weight=weight, mean=rel_mean + shift, scatter=scatter
    )


def _compiled_width(p: int) -> bool:
    """Whether the compiled loops take rows of ``p`` values (see ``COMPILED_MAX_FEATURES``)."""
    return COMPILED and 0 < p <= COMPILED_MAX_FEATURES


def _compiled_kernel(plan: PassPlan, work: type) -> np.ndarray | None:
    """The upper-triangle form of a pass's one quadratic form, for :func:`_compiled_stats`;
    None when the compiled loops do not apply (no numba, rows wider than
    ``COMPILED_MAX_FEATURES``, a moments pass, kernels that are not one matrix, or a working
    unit whose power of two is not a normal number of ``work``)."""
    if not _compiled_width(len(plan.center)) or plan.kernels is None or abs(plan.unit_exp) >= np.finfo(work).maxexp - 1:
        return None
    A = plan.kernels[0]
    if not all(np.array_equal(B, A) for B in plan.kernels[1:]):
        return None
    return _compiled.upper_doubled(A, work)


def _compiled_stats(
    Xs: np.ndarray, plan: PassPlan, U: np.ndarray, ws: _Workspace
) -> tuple[BlockStats, np.ndarray | None] | None:
    """A kernel pass's statistics of sub-block ``Xs`` (as stored, in the working dtype) by the
    compiled loops (:mod:`._compiled`), counts included, and the mask of the rows finite as
    stored (None: all are, or, in one sweep, no row sample is drawn).  None when a row finite
    as stored is not finite in working units (a far row, a float32 overflow), which the numpy
    spelling handles.

    The same quantities as :func:`_working_rows` then :func:`_sub_block_stats`: the rows are
    shifted by the centre rounded to the dtype, then scaled by the power of two; rows holding
    NaN or inf (as stored) and the plan's excluded rows get weight 0, and the former are counted
    in ``n_nonfinite``.  Sums differ from numpy's in their order only.  Kernels that all have a
    flat top (the default solver's) take one sweep (:func:`_one_sweep`), the others two.
    """
    n, p = Xs.shape
    X = np.ascontiguousarray(Xs)
    if _flat_tops(plan):
        done = _one_sweep(X, plan, U)
        if done is not None:
            return done
    dtype = Xs.dtype.type
    center, shift = _rounded_center(plan, dtype)
    scale = dtype(2.0**-plan.unit_exp)
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
    part = _moments(n, log_scale, *_compiled_sums(Yt, G), shift)
    part.n_nonfinite = 0 if finite is None else int(n - finite.sum())
    part.n_rows = n - part.n_nonfinite
    return part, finite


_NO_ROWS = np.zeros(0, bool)


def _one_sweep(X: np.ndarray, plan: PassPlan, U: np.ndarray) -> tuple[BlockStats, np.ndarray | None] | None:
    """:func:`_compiled_stats` in one sweep (:func:`._compiled.flat_top_sums`), for kernels that
    all have a flat top (the mask of finite rows only where the plan draws a row sample, its
    one use; None otherwise); None where it does not apply: a far row, or a kernel whose largest
    weight in the sub-block is below ``exp(_LOG_TINY / 2)`` (no row near its flat top), whose
    weights the two-sweep loops scale first so that none is lost.

    The sweep's weights are ``exp(e)``, not ``exp(e - m_j)``; dividing its sums by ``exp(m_j)``
    gives the two-sweep result, except for weights below ``exp(_LOG_TINY)``, which are 0 here
    and ``exp(e - m_j)`` there: at most ``exp(_LOG_TINY / 2)`` of the largest weight, far below
    the round-off of the sums.
    """
    n, p = X.shape
    dtype = X.dtype.type
    J, tiny = plan.n_kernels, _LOG_TINY[dtype]
    center, shift = _rounded_center(plan, dtype)
    scale = dtype(2.0**-plan.unit_exp)
    excluded = _NO_ROWS
    if plan.excluded or plan.excluded_rows:  # by sub-blocks: a narrow store's block has millions of rows
        starts = range(0, n, SUB_BLOCK_ROWS)
        excluded = np.concatenate([_excluded_rows(X[s : s + SUB_BLOCK_ROWS], plan) for s in starts])
    weight, wsum, scatter, top = np.zeros(J), np.zeros((J, p)), np.zeros((J, p, p)), np.empty(J)
    n_bad = _compiled.flat_top_sums(X, center, scale, U, plan.offsets, tiny, excluded, weight, wsum, scatter, top)
    if n_bad < 0 or not np.all(top >= tiny / 2):
        return None
    if np.any(top):
        rescale = np.exp(-top)
        weight *= rescale
        wsum *= rescale[:, None]
        scatter *= rescale[:, None, None]
    part = _moments(n, top, weight, wsum, _mirrored(scatter), shift)
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


def _compiled_moments(Xs: np.ndarray, ws: _Workspace) -> tuple[BlockStats, np.ndarray | None] | None:
    """A moments pass's statistics of sub-block ``Xs`` (as stored, in the working dtype) by the
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
    part = _moments(m, np.zeros(1), weight, wsum, scatter, np.ldexp(first.astype(np.float64), -unit))
    part.col_min, part.col_max, part.unit_exp = lo.astype(np.float64), hi.astype(np.float64), unit
    part.n_nonfinite = n - m
    return part, finite


#: Exponents below which a weight is set to 0 (exp would be subnormal).
_LOG_TINY = {np.float32: -80.0, np.float64: -700.0}

#: Rows per GEMM of the weighted sums: float32 products accumulate in float32
#: within one GEMM, so a short GEMM bounds their round-off (at worst about
#: ``GEMM_ROWS * 2^-24`` relative, typically its square root of that); the
#: GEMMs' results add in float64.  It also keeps a GEMM's operands in cache.
GEMM_ROWS = 4096


def _weighted_sums(
    Y: np.ndarray, G: np.ndarray | None, ws: _Workspace, *, wider: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per kernel j: ``sum_k G_jk``, ``sum_k G_jk y_k`` and ``sum_k G_jk y_k y_k^T`` in float64.

    Runs of ``GEMM_ROWS`` rows (float32 products accumulate in float32 within
    one product, and a short run keeps its operands in cache); the runs'
    results add in float64.  One kernel (the usual robust step) is a SYRK per
    run, ``(sqrt(g) y)^T (sqrt(g) y)``; several kernels are one GEMM per run,
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


#: Largest kernel entry (working units) multiplied in float32; beyond it the
#: pass works in float64 (a quadratic form could overflow float32 for near rows).
_F32_KERNEL_MAX = 2.0**60


def _work_dtype(dtype: np.dtype, plan: PassPlan) -> type:
    """float32 for float32 rows of either byte order (the products then run at float32
    speed; sums are float64), unless a kernel is beyond float32's comfortable range."""
    if np.dtype(dtype).newbyteorder("=") != np.float32:  # a big-endian float32 store is float32 too
        return np.float64
    if plan.kernels is not None and not np.all(np.abs(plan.kernels) <= _F32_KERNEL_MAX):
        return np.float64
    return np.float32


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


#: Rows side by side in :func:`_column_reduce`.
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

    ``X`` is as stored, float64 or float32; float32 rows stay float32 (the
    centre is rounded to float32 in the data's units, and that rounded centre
    is the returned shift, so the moments' bookkeeping is exact).  NaN and inf
    survive the shift: rows that stay finite were finite as stored.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        center, shift = _rounded_center(plan, X.dtype)
        Y = _scaled(_shifted(X, center, out), -plan.unit_exp)  # float32 rows stay float32: one rounding
        return Y, _finite_rows(Y), shift


def _rounded_center(plan: PassPlan, dtype) -> tuple[np.ndarray, np.ndarray]:
    """The kernels' centre as a kernel pass subtracts it: in the data's units (within the data's
    range), rounded to float32 for float32 rows, and that centre in working units (float64), the
    point the sub-block's moments are measured from."""
    center = np.ldexp(plan.center, plan.unit_exp)
    if dtype == np.float32:
        c32 = center.astype(np.float32)
        return c32, np.ldexp(c32.astype(np.float64), -plan.unit_exp)
    return center, plan.center


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
    (far: weight 0) are counted and left out.  If a finite float32 row
    overflows in float32 working units, the kept rows are redone in float64,
    where only rows ~1e150 spreads away are far.
    """
    keep = finite
    if plan.excluded or plan.excluded_rows:
        out = _excluded_rows(Xs, plan)
        keep = ~out if keep is None else keep & ~out
    if keep is not None:
        Y, near = Y[keep], None if near is None else near[keep]
    if near is not None and near.all():
        near = None  # the overflowing rows were the non-finite ones
    if near is not None and Y.dtype == np.float32:
        Y, near, shift = _working_rows((Xs if keep is None else Xs[keep]).astype(np.float64), plan)
    if near is None:
        return Y, shift, 0
    return Y[near], shift, int(len(near) - near.sum())


def block_stats(X: np.ndarray, plan: PassPlan, row_offset: int = 0) -> BlockStats:
    """Everything one row block contributes to a pass.

    Parameters
    ----------
    X : ndarray of shape (n_block, p)
        One row block, any float dtype; it is read once and shifted one
        sub-block at a time into float32 (float32 data) or float64 (any
        other) working rows; the sums are float64 (the caller's array is
        never modified).
    plan : PassPlan
        The kernels and options of this pass.
    row_offset : int
        Global index of the block's first row (for the row sample).

    Returns
    -------
    BlockStats
        The block's counts and per-kernel sums; ``sample`` (as stored) when
        the plan asks for one; ``col_min`` and ``col_max`` (over finite rows,
        as stored) for a moments pass (no kernels).
    """
    X = np.asarray(X)
    p = X.shape[1]
    work = _work_dtype(X.dtype, plan)
    U = _compiled_kernel(plan, work)
    whole = _whole_block(X, plan, U, work)
    if whole is not None:  # the usual block of a default-solver pass
        result, finite = whole
        if plan.sample_rate > 0:
            result.sample = _drawn(X, _sampled_mask(X, finite, plan), row_offset, plan)
        return _with_partial_rows(result, X, plan)
    result = _empty(plan, p)
    samples = []
    ws = _Workspace(work)
    for start in range(0, X.shape[0], SUB_BLOCK_ROWS):
        sub = X[start : start + SUB_BLOCK_ROWS]
        Xs = np.asarray(sub, dtype=work)  # as stored: float32 stays float32, any other dtype is cast to float64
        n_seen = Xs.shape[0]
        with np.errstate(over="ignore", invalid="ignore"):  # far rows; the runner checks the result
            done = _compiled_part(Xs, plan, U, ws) if n_seen else None
            part, finite = done if done is not None else _numpy_part(Xs, plan, ws)
        if plan.sample_rate > 0:
            samples.append(_drawn(Xs, _sampled_mask(Xs, finite, plan), row_offset + start, plan))
        result = combine(result, part)
    if plan.sample_rate > 0:
        result.sample = np.concatenate([result.sample, *samples])
    return _with_partial_rows(result, X, plan)


def _with_partial_rows(result: BlockStats, X: np.ndarray, plan: PassPlan) -> BlockStats:
    """``result`` (the block's complete rows) merged with its rows that have some cells missing,
    when the plan takes them (``plan.partial``): they move from ``n_nonfinite`` to ``n_rows``."""
    if plan.partial is None or not result.n_nonfinite:
        return result
    X = np.asarray(X)
    with np.errstate(over="ignore", invalid="ignore"):
        maybe = np.flatnonzero(~np.isfinite(X @ np.ones(X.shape[1], X.dtype)))  # NaN, inf (or overflow)
    rows = X[maybe].astype(np.float64, copy=False)  # a copy (fancy indexing): the partial sums' own
    observed = ~np.isnan(rows)
    codes = _missing.pattern_codes(observed)
    keep = _missing.partial_rows(rows, observed, codes)
    if not keep.any():
        return result
    if not keep.all():
        rows, observed = rows[keep], observed[keep]
        codes = None if codes is None else codes[keep]
    merged = combine(result, _partial_stats(rows, plan, observed, codes))
    merged.n_nonfinite -= len(rows)
    return merged


@functools.lru_cache(maxsize=256)
def _conditional_model(scatter: bytes, p: int, observed: bytes) -> _missing.ConditionalModel:
    """:func:`._missing.conditional_model`, once per pass's scatter and pattern in a process
    (every block of a pass asks for the same few)."""
    mask = np.frombuffer(observed, dtype=bool)
    return _missing.conditional_model(np.frombuffer(scatter, dtype=np.float64).reshape(p, p), mask)


def _partial_stats(
    X: np.ndarray, plan: PassPlan, observed: np.ndarray | None = None, codes: np.ndarray | None = None
) -> BlockStats:
    """A kernel pass's statistics of rows with missing cells (float64, as stored; overwritten),
    by pattern of observed cells: weights from the observed cells, then per pattern either sums
    of the observed cells for the client's EM (the plan's ``patterns``) or the rows completed by
    the conditional expectation plus the conditional covariance of the missing cells
    (:class:`PartialPlan`).  ``observed`` (``~isnan(X)``) and its pattern codes may be given."""
    part_plan = plan.partial
    n, p = X.shape
    J = plan.n_kernels
    observed = ~np.isnan(X) if observed is None else observed
    excluded = _excluded_rows(X, plan) if plan.excluded or plan.excluded_rows else None
    Y = _to_working_units(X, plan)
    scatter64 = np.ascontiguousarray(part_plan.scatter, dtype=np.float64)
    groups = list(_missing.patterns(observed, codes))
    # The rows regrouped by pattern (in their order within one): each pattern is then a slice.
    order = np.concatenate([rows for _, rows in groups])
    Y = Y[order]
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
    with np.errstate(over="ignore", invalid="ignore"):  # overflow in working units: weight 0
        far = ~np.isfinite(d2) | (done & ~np.isfinite(Y @ np.ones(p)))  # the others' missing cells are NaN
    if far.any():
        d2[far] = np.inf
        Y[far] = 0.0
    E = part_plan.offsets[:, counts] - d2[None, :] / (2 * part_plan.kernel_size2)
    if excluded is not None:
        E[:, excluded] = -np.inf
    G, log_scale = _weights(E)
    gaps = {}
    for mask, rows, model, key in slices:
        if key is not None:
            g, Yo = G[:, rows], Y[rows][:, model.observed]
            second = np.stack([(Yo * gj[:, None]).T @ Yo for gj in g])
            gaps[key] = _missing.GapSums(mask, g.sum(axis=1), g @ Yo, second)
    kept = slice(None) if done.all() else done
    weight, wsum, scatter = _weighted_sums(Y[kept], G[:, kept], _Workspace(np.float64))
    for _, rows, model, key in slices:
        if len(model.missing) and key is None:
            cell = np.ix_(model.missing, model.missing)
            for j in range(J):
                scatter[j][cell] += G[j, rows].sum() * model.residual
    part = _moments(n, log_scale, weight, wsum, scatter, plan.center)
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


def _whole_block(
    X: np.ndarray, plan: PassPlan, U: np.ndarray | None, work
) -> tuple[BlockStats, np.ndarray | None] | None:
    """A kernel pass's statistics of the whole block in one compiled sweep (:func:`_one_sweep`):
    the usual block of the default solver, whose kernels have flat tops, stored in the working
    dtype (no cast).  None otherwise, or where the sweep does not apply: the sub-blocks then take
    the other spellings, one by one.  A sweep works on runs of ``TILE`` rows and allocates
    nothing the size of the block, so the whole block is one call: the per-sub-block work in
    Python (merging, the moments) cost 15-20 % of the sweep itself at p = 10."""
    if U is None or not _flat_tops(plan) or X.dtype != work or not X.flags.c_contiguous or not len(X):
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        return _one_sweep(X, plan, U)


def _flat_tops(plan: PassPlan) -> bool:
    """Whether every kernel of the plan has a flat top (``offsets > 0``: the default solver's)."""
    return plan.offsets is not None and bool(np.all(plan.offsets > 0))


def _sampled_mask(Xs: np.ndarray, finite: np.ndarray | None, plan: PassPlan) -> np.ndarray | None:
    """The rows the row sample may draw: the finite ones, and with ``plan.sample_partial`` also
    those with some cells missing (None: all rows)."""
    if finite is None or not plan.sample_partial:
        return finite
    return finite | _missing.partial_rows(np.asarray(Xs))


def _drawn(Xs: np.ndarray, finite: np.ndarray | None, first: int, plan: PassPlan) -> np.ndarray:
    """The row sample's rows of ``Xs`` (rows ``first ..`` of the data; ``finite``: the mask of
    its rows finite as stored, None: all are), as stored, exactly, in float64; drawn
    ``SUB_BLOCK_ROWS`` rows at a time, so that the draw's temporaries stay the size of a
    sub-block's when ``Xs`` is a whole block."""
    parts = [np.empty((0, Xs.shape[1]))]
    for start in range(0, len(Xs), SUB_BLOCK_ROWS):
        rows = Xs[start : start + SUB_BLOCK_ROWS]
        ok = None if finite is None else finite[start : start + SUB_BLOCK_ROWS]
        if COMPILED:
            keep = _compiled.sampled_rows(first + start, len(rows), plan.seed, plan.sample_rate)
            if ok is not None:
                keep = keep[ok[keep]]
        else:
            keep = _row_uniforms(np.arange(first + start, first + start + len(rows)), plan.seed) < plan.sample_rate
            if ok is not None:
                keep &= ok
        parts.append(np.array(rows[keep], dtype=np.float64))
    return np.concatenate(parts)


def _first_row(Xs: np.ndarray) -> np.ndarray:
    """The point a moments sub-block is measured from, so that its sums never cancel badly: its
    first row (NaN and inf read as 0), float64."""
    return np.where(np.isfinite(Xs[0]), Xs[0], 0).astype(np.float64) if len(Xs) else np.zeros(Xs.shape[1])


def _compiled_part(
    Xs: np.ndarray, plan: PassPlan, U: np.ndarray | None, ws: _Workspace
) -> tuple[BlockStats, np.ndarray | None] | None:
    """Sub-block ``Xs``'s statistics by the compiled loops, counts included, and the mask of its
    rows finite as stored (None: all are, or, in one sweep, no row sample is drawn), as
    :func:`_numpy_part` gives them; None when the loops do not apply (see
    :func:`_compiled_stats` and :func:`_compiled_moments`)."""
    if U is not None:
        return _compiled_stats(Xs, plan, U, ws)
    if plan.kernels is None and _compiled_width(Xs.shape[1]):
        return _compiled_moments(Xs, ws)
    return None


def _numpy_part(Xs: np.ndarray, plan: PassPlan, ws: _Workspace) -> tuple[BlockStats, np.ndarray | None]:
    """Sub-block ``Xs``'s statistics in numpy, counts included, and the mask of its finite rows
    as stored (None: all are)."""
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
    part = _sub_block_stats(Y, shift, plan, ws) if len(Y) else _empty(plan, p)
    if plan.kernels is None and len(Y):
        part.col_min = _column_reduce(np.minimum, good).astype(np.float64)
        part.col_max = _column_reduce(np.maximum, good).astype(np.float64)
        part.unit_exp = unit
    n_bad = 0 if finite is None else int(n_seen - finite.sum())
    part.n_rows, part.n_nonfinite, part.n_far = n_seen - n_bad, n_bad, n_far
    return part, finite


def combine(a: BlockStats, b: BlockStats) -> BlockStats:
    """Merge two partial results of one pass (associative and commutative up to round-off).

    The counts add; the sums are brought to a common unit and a common
    log-scale and merged with the pairwise formula of Chan, Golub and LeVeque.
    Neither input is modified; where only one of them has a row sample, the
    result holds that same array (no copy).
    """
    unit = max(a.unit_exp, b.unit_exp)
    mean_a, scatter_a = _in_unit(a, unit)
    mean_b, scatter_b = _in_unit(b, unit)
    log_scale = np.maximum(a.log_scale, b.log_scale)
    finite = np.isfinite(log_scale)
    with np.errstate(invalid="ignore"):
        fa = np.where(finite, np.exp(a.log_scale - log_scale), 0.0)
        fb = np.where(finite, np.exp(b.log_scale - log_scale), 0.0)
    wa, wb = a.weight * fa, b.weight * fb
    weight = wa + wb
    safe = np.where(weight > 0, weight, 1.0)
    delta = mean_b - mean_a
    mean = mean_a + delta * (wb / safe)[:, None]
    scatter = (
        scatter_a * fa[:, None, None]
        + scatter_b * fb[:, None, None]
        + (wa * wb / safe)[:, None, None] * delta[:, :, None] * delta[:, None, :]
    )
    ranged = a.col_min is not None or b.col_min is not None
    return BlockStats(
        n_rows=a.n_rows + b.n_rows,
        n_nonfinite=a.n_nonfinite + b.n_nonfinite,
        log_scale=log_scale,
        weight=weight,
        mean=mean,
        scatter=scatter,
        sample=_joined(a.sample, b.sample),
        col_min=np.minimum(_or(a.col_min, np.inf), _or(b.col_min, np.inf)) if ranged else None,
        col_max=np.maximum(_or(a.col_max, -np.inf), _or(b.col_max, -np.inf)) if ranged else None,
        n_far=a.n_far + b.n_far,
        unit_exp=unit,
        n_partial=a.n_partial + b.n_partial,
        gaps=_missing.merge_gaps(a.gaps, fa, b.gaps, fb) if (a.gaps or b.gaps) else None,
    )


def _in_unit(stats: BlockStats, unit: int) -> tuple[np.ndarray, np.ndarray]:
    """``stats``' mean and scatter in units of ``2**unit`` working units (exact, powers of two).

    A shrink (``unit > stats.unit_exp``, as in :func:`combine`) goes at worst to 0, negligible
    beside the other part; a growth may overflow to inf (the caller checks).  The same arrays
    when the unit is already ``unit``.
    """
    if stats.unit_exp == unit:
        return stats.mean, stats.scatter
    d = max(stats.unit_exp - unit, _NO_UNIT)
    with np.errstate(over="ignore"):
        return np.ldexp(stats.mean, d), np.ldexp(stats.scatter, 2 * d)


def _or(value: np.ndarray | None, default: float) -> np.ndarray | float:
    return default if value is None else value


def _joined(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    """Two row samples as one (either may be None: no sample)."""
    if a is None or b is None:
        return b if a is None else a
    return np.concatenate([a, b])
