"""The statistics of a pass: its plan, what a row block returns, and how two results merge.

Every pass over the data, local or distributed, asks each row block for a
:class:`BlockStats` under one :class:`PassPlan` (:func:`._block.block_stats`)
and merges the results with :func:`combine`.  The result of a block, of a
merge and of the whole pass is that one type: a few p x p matrices and
counts, never rows of the data, except for an optional row sample that is
bounded by design.

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

Moments
-------
Weighted moments are kept as (total weight, weighted mean, scatter about that
mean) and merged with the pairwise formula of Chan, Golub and LeVeque, so no
large uncentred sum is ever formed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from . import _missing

__all__ = ["PassPlan", "PartialPlan", "BlockStats", "BulkBox", "BulkSums", "WIDE_FEATURES", "combine", "empty",
           "from_sums", "merge_moments"]

#: From this many columns on, rows are wide: beyond the compiled loops (``_block.COMPILED_MAX_FEATURES``
#: = 32), BLAS's products do a block's work.  One threshold for every wide rule, each of which keeps
#: narrower fits' work and bits: the kernels' quadratic forms by a triangular product and a kernel
#: pass by :func:`._kernels.wide_block` (``_block.WIDE_MIN_FEATURES``), a store's first read from a
#: spread of its blocks (``_passes.PARTIAL_MIN_BLOCKS_WIDE``), the sample's fixed point stopping at
#: ``tol`` and its triangular whitening (:mod:`._robust_sample`).
WIDE_FEATURES = 33

#: The zero every empty scatter is a view of (:func:`empty`).
_ZERO = np.zeros(())

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
    cells : _cells.CellPlan or None
        Judge each row's cells one by one and leave out those the model
        cannot explain (:func:`._cells.cell_stats`; needs ``partial`` for
        the radii by number of good cells); None: rows are taken whole.
    bulk : BulkBox or None
        The bulk's box (:mod:`._bulk`): a wide block's sums of the rows in it are
        the plain sums one pass kept, less each kernel's corrections; None: every
        row weighed in full.

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
    cells: Any = None
    bulk: BulkBox | None = None
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


@dataclass(frozen=True, eq=False)
class BulkBox:
    """The bulk of a pass's rows: those whose every value lies in ``[lo, hi]`` (as the block function
    reads them; see :mod:`._bulk`).

    Membership reads the values only, so it is the same set in every pass.  ``origin`` is the
    working-units point the plain sums are taken about; ``collect``: this pass returns the bulk's
    plain sums (the first), else the client holds them.
    """

    lo: np.ndarray
    hi: np.ndarray
    origin: np.ndarray
    collect: bool


@dataclass(slots=True)
class BulkSums:
    """A wide kernel pass's sums over the bulk (:mod:`._bulk`), about the plan's centre, with a
    column of ones appended to the rows (``(p + 1) x (p + 1)``: scatter, sum, count).

    ``plain``: the bulk's rows unweighted (a collecting pass; None otherwise); ``corrections``
    (J of them): what each kernel's weighted sums of the rows served differ from the bulk's plain
    sums by; ``n_rows``: the bulk's rows met, served or not.  Summed by :func:`combine`.
    """

    plain: np.ndarray | None
    corrections: np.ndarray
    n_rows: int


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
    routes : dict
        Rows served by each route of :func:`._block.block_stats` (a
        :data:`._block.Route` name, or ``"partial"`` for rows with missing
        cells), summed by :func:`combine`: which kernels did the work.
    cells_flagged : ndarray of shape (p,) or None
        Cells flagged per channel by a plan's ``cells`` (None: not judged).
    segments : tuple of ndarray
        Runs of consecutive rows as stored (float64), each inside one block, that a
        read was asked to keep (:func:`._shift.run_plan`), in row order (:mod:`._shift`
        learns ``shift_scale_`` from them); empty for a pass that keeps none.
    bulk : BulkSums or None
        A plan's ``bulk`` sums (:mod:`._bulk`): the rows they cover are counted in
        ``n_rows`` and are not in ``weight``, ``mean`` and ``scatter`` until the
        client completes them (:func:`._bulk.completed`).
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
    routes: dict = field(default_factory=dict)
    cells_flagged: np.ndarray | None = None
    segments: tuple = ()
    bulk: BulkSums | None = None

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
        arrays = (self.log_scale, self.weight, self.mean, self.scatter, self.sample, self.col_min, self.col_max,
                  *self.segments, *(() if self.bulk is None else (self.bulk.plain, self.bulk.corrections)))
        return object.__sizeof__(self) + sum(a.nbytes for a in arrays if a is not None)


def empty(plan: PassPlan, p: int) -> BlockStats:
    """The statistics of no rows: the identity of :func:`combine` for ``plan``'s passes."""
    J = plan.n_kernels
    moments = plan.kernels is None  # a moments pass also finds each column's range (the data's fingerprint)
    return BlockStats(
        n_rows=0,
        n_nonfinite=0,
        log_scale=np.full(J, -np.inf),
        weight=np.zeros(J),
        mean=np.zeros((J, p)),
        scatter=np.broadcast_to(_ZERO, (J, p, p)),  # read-only, no memory: a block's result held until merged
        sample=np.empty((0, p)) if plan.sample_rate > 0 else None,
        col_min=np.full(p, np.inf) if moments else None,
        col_max=np.full(p, -np.inf) if moments else None,
        unit_exp=_NO_UNIT if moments else 0,
    )


def from_sums(n: int, log_scale, weight, wsum, scatter, shift) -> BlockStats:
    """A sub-block's statistics from its weighted sums about ``shift``: the mean, and the scatter about it."""
    dead = weight == 0  # a kernel whose rows are all infinitely far
    rel_mean = wsum / np.where(dead, 1.0, weight)[:, None]
    scatter -= weight[:, None, None] * rel_mean[:, :, None] * rel_mean[:, None, :]
    scatter[dead] = 0.0
    return BlockStats(
        n_rows=n, n_nonfinite=0, log_scale=log_scale, weight=weight, mean=rel_mean + shift, scatter=scatter
    )


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
    weight, mean, scatter = merge_moments(a.weight * fa, mean_a, scatter_a * fa[:, None, None],
                                          b.weight * fb, mean_b, scatter_b * fb[:, None, None])
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
        routes=_added(a.routes, b.routes),
        cells_flagged=_summed(a.cells_flagged, b.cells_flagged),
        segments=a.segments + b.segments,
        bulk=_bulk_summed(a.bulk, b.bulk),
    )


def merge_moments(wa, mean_a: np.ndarray, scatter_a: np.ndarray, wb, mean_b: np.ndarray, scatter_b: np.ndarray):
    """Two sets' (weight, mean, scatter about the mean) merged: the pairwise formula of Chan, Golub and LeVeque.

    ``weight = wa + wb``, ``mean = mean_a + delta * wb / weight`` and
    ``scatter = scatter_a + scatter_b + delta delta^T * wa * wb / weight``
    with ``delta = mean_b - mean_a``: exact at any offset of the data (no
    sum of squares about the origin).  The weights are scalars (counts of
    rows) or arrays of shape (m,) for m stacked sets (means (m, p),
    scatters (m, p, p)); a total weight of 0 keeps ``mean_a``.  The one
    home of this rule: :func:`combine` and the report (:mod:`._report`,
    :mod:`._report_block`) merge with it.  Returns ``(weight, mean, scatter)``.
    """
    wa, wb = np.asarray(wa, np.float64), np.asarray(wb, np.float64)
    weight = wa + wb
    safe = np.where(weight > 0, weight, 1.0)
    delta = mean_b - mean_a
    mean = mean_a + delta * (wb / safe)[..., None]
    scatter = scatter_a + scatter_b + (wa * wb / safe)[..., None, None] * delta[..., :, None] * delta[..., None, :]
    return weight, mean, scatter


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


def _summed(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    """Two counts per channel as one (either may be None: not counted)."""
    if a is None or b is None:
        return b if a is None else a
    return a + b


def _bulk_summed(a: BulkSums | None, b: BulkSums | None) -> BulkSums | None:
    """Two blocks' bulk sums as one (either may be None: none)."""
    if a is None or b is None:
        return b if a is None else a
    return BulkSums(_summed(a.plain, b.plain), a.corrections + b.corrections, a.n_rows + b.n_rows)


def _added(a: dict, b: dict) -> dict:
    """Two counts of rows by route as one."""
    if not a or not b:
        return dict(b if not a else a)
    return {route: a.get(route, 0) + b.get(route, 0) for route in {**a, **b}}
