"""``solver="auto"``: the robust default, all components in a handful of passes.

Real archives are multi-regime and heavy-tailed, and their contamination
includes tight groups of rows (a stuck sensor, a frozen logger) near the bulk.
A robust estimator for them must neither call most rows outliers nor let a
tight minority capture it.  The default works on a row sample drawn during the
first pass, in memory, and then on the full data, one pass per step:

1. **Start** (:func:`._start.robust_start`): the Stahel-Donoho outlyingness of every
   sample row (its largest robust z-score over directions through pairs of
   sample rows, as in ROBPCA's first stage), and the mean and covariance of
   the least outlying half, scaled so that the median squared Mahalanobis
   distance is the chi-square median.  Outlyingness looks at one direction at
   a time, so a tight cluster is as outlying as its distance makes it; the
   half-sample determinant that ranked DetMCD's starts rewards a tight
   cluster instead, and 50 %-breakdown S-estimators are drawn to one.
2. **Core fixed point**: each row gets the correntropy weight of a flat-top
   kernel, ``w = exp(-max(d^2 - q, 0) / (2 c^2))``: 1 inside the ellipsoid
   ``d^2 <= q``, a steep Gaussian fall-off beyond.  The weighted mean and
   covariance, made consistent at the Gaussian, are the next state.  The
   radius is first the Gaussian quantile (so the start's neighbourhood, not
   the data's tails, decides what is in), then calibrated on the data's own
   distances (:func:`._schedule.calibrated_cutoff`), so that heavy tails and
   several regimes widen it and the fit cannot shrink onto one quiet regime.
3. **Final, inclusive kernel**: the same kernel with a wider calibrated radius,
   untrimmed, lets the bulk's tails and regimes in, stopping short of a tight
   group of rows between the two radii.  It gives the components.
4. **Repeated rows and values**: a whole row repeated exactly in many sample
   rows, far more often than the rows next to it on the data's lattice (a
   frozen logger's record; :func:`._repeated.repeated_rows`), and a value one column
   holds exactly in many of the other rows, far more often than its
   neighbouring values (a stuck sensor; :func:`._repeated.repeated_values`), exclude
   their rows from every kernel's sums.  A repeat must also be one the data's
   model cannot explain: a value holds 5 times the rows a robust Gaussian
   marginal puts in its lattice cell (quantization levels, integer counts, a
   range limit are no faults), and a record is no set point (zeros, round
   values: an idle device).

Each full-data pass evaluates all kernels from the current state with one
quadratic form; the core is iterated until the estimated distance to its fixed
point is below ``tol``.  All p components come from one p x p
eigendecomposition of the final kernel's covariance.

Coverage guarantee: the core radius is never below the median of the sample's
``d^2``, so at least half of the sample's rows (and of all rows, up to
sampling error) carry full weight in every step, whatever the data's shape
(``MCPCA.support_`` reports the final kernel's share).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.linalg.blas import dtrmm as _blas_trmm
from scipy.spatial import cKDTree

from . import _cells
from ._block import block_stats
from ._block_rows import top_exponent as _top_exponent
from ._exceptions import NumericalRangeError
from ._kernels import TRIANGULAR_MIN_FEATURES as _TRIANGULAR_MIN_FEATURES
from ._missing import MAX_PATTERNS, em_moments, pattern_key, radius_for_count, rare_pattern_rows
from ._passes import PassResult, PassRunner
from ._power import spread_directions
from ._repeated import TIGHT_MIN_ROWS, TIGHT_SHARE, find_repeated, held_out, quantization_steps
from ._schedule import CUTOFF_QUANTILE, FINAL_QUANTILE, calibrated_cutoff, flat_top_consistency, hotelling_quantile
from ._start import START_FRACTION, TINY_EIGENVALUE, _mahalanobis2, _rank, outlyingness, precision, robust_start
from ._stats import BlockStats, PartialPlan, PassPlan, combine

__all__ = [
    "RobustState",
    "fit_robust",
    "warm_step",
    "update_robust",
    "state_in_units",
    "step_plan",
    "working_exponent",
    "gap_patterns",
    "SAMPLE_SIZE",
    "FAR_ROW",
    "FALL_OFF2",
    # Re-exported, where callers of the fit import them: the start (._start)
    # and the repeated-value rules (._repeated).
    "robust_start",
    "outlyingness",
    "precision",
    "quantization_steps",
    "find_repeated",
    "held_out",
]

#: Rows drawn during the first pass for the in-memory robust start.
SAMPLE_SIZE = 20_000

#: Fixed-point steps on the in-memory sample.
MAX_SAMPLE_STEPS = 200

#: Sample rows with a coordinate beyond this, in working units (the bulk's
#: spread is near 1), are left out of the in-memory work: their squares and
#: sums would overflow, and a full pass gives them weight 0 anyway.
FAR_ROW = 2.0**400


def working_exponent(sample: np.ndarray | None, col_min: np.ndarray, col_max: np.ndarray) -> int:
    """Exponent k of the fit's working unit ``2**k``: the power of two nearest the bulk's spread.

    The spread is the largest column MAD of the first pass's row sample (a
    robust scale: a single row of 1e160 does not move it), or, for a sample
    with no MAD (most rows equal), its smallest positive deviation from the
    column medians (not the largest: a far row would set a unit in which the
    bulk's variances underflow), or the columns' largest magnitude.  Measured after dividing by the power of two
    above the sample's largest magnitude, so nothing overflows; ``c * X``
    for a power of two c gives k + log2(c), exactly.  Why one unit, not one
    per column: ``components_`` are eigenvectors in the data's units, which
    a common factor keeps and a per-column one does not.  Rows of the sample
    with a missing cell (a ``"partial"`` fit's) are left out.
    """
    if sample is not None:
        sample = sample[~np.isnan(sample).any(axis=1)]  # rows with gaps (a "partial" sample): complete ones only
    if sample is not None and len(sample):
        top = _top_exponent(sample)
        # One column per (contiguous) row: the medians select along rows, several times faster
        # than down the columns of the sample at wide p; the values are the same.
        dev = np.ldexp(np.ascontiguousarray(sample.T), -top)  # |Z| <= 1
        dev -= np.median(dev, axis=1)[:, None]
        np.abs(dev, out=dev)
        spread = float(np.max(np.median(dev, axis=1)))  # (a copy: dev is kept)
        if not spread > 0 and dev.any():  # most rows equal: the nearest other rows set the scale
            spread = float(dev[dev > 0].min())
        if spread > 0:
            return top + int(np.frexp(spread)[1])
        return top
    ranges = np.concatenate([col_min, col_max])
    return _top_exponent(ranges[np.isfinite(ranges)])


@dataclass
class RobustState:
    """Location, scatter and bookkeeping of the robust fit (checkpointable).

    ``kernel_size2`` is ``c^2`` of the kernels' fall-off, ``cutoff`` and
    ``final_cutoff`` the flat-top radii of the core and the final kernel,
    ``core_support`` and ``support`` their weighted shares of the rows (the
    effective number of rows over n) in the last step.
    """

    location: np.ndarray
    scatter: np.ndarray
    kernel_size2: float
    cutoff: float = float("nan")
    support: float = float("nan")
    core_support: float = float("nan")
    n_iter: int = 0
    converged: bool = False
    last_change: float = float("nan")  # change made by the last full-data step
    rate: float = float("nan")  # contraction rate of the fixed point, from the sample
    # (column, value) pairs repeated in the sample (stuck sensors, a frozen
    # logger), in working units: their rows get no weight in the fit.
    repeated: np.ndarray | None = None
    # Whole rows repeated in the sample (a frozen logger's records), shape
    # (m, p), in working units: rows equal to one get no weight in the fit.
    repeated_rows: np.ndarray | None = None
    # The final, inclusive step of the last full-data pass (None until one ran).
    final_cutoff: float = float("nan")
    final_location: np.ndarray | None = None
    final_scatter: np.ndarray | None = None
    # The variance of each channel's rounding error, step^2 / 12 for a
    # quantized channel (:func:`._repeated.quantization_steps`), 0 for a continuous one,
    # in working units: the floor of each channel's variance (:func:`_floored`).
    resolution: np.ndarray | None = None


def _floored(scatter: np.ndarray, resolution: np.ndarray | None) -> np.ndarray:
    """``scatter`` with each channel's variance raised to at least its rounding error's (``resolution``).

    A quantized reading carries at least the variance of its rounding error,
    ``step^2 / 12``; without the floor, a channel that sits on one level in
    most rows (an ADC at rest) gets a variance of 0 from the rows that carry
    weight, and every row one step off an infinite distance.  Adding a
    non-negative diagonal keeps the scatter positive semi-definite.
    """
    if resolution is None or not np.any(resolution):
        return scatter
    lift = np.maximum(resolution - np.diag(scatter), 0.0)
    return scatter + np.diag(lift) if np.any(lift) else scatter


def step_plan(
    location, scatter, kernel_size2: float, cutoffs, *, excluded=None, excluded_rows=None, partial: bool = False,
    patterns: tuple = (), cells: float | None = None, missing_ok: bool = False,
) -> PassPlan:
    """The plan of one re-weighting pass: flat-top Mahalanobis kernels.

    Kernel ``j`` gives ``exp(min(q_j / (2 c^2) - d^2 / (2 c^2), 0))`` with
    ``d^2`` under ``scatter``: one matrix ``A = Sigma^-1 / c^2`` (its
    quadratic form is computed once) with offsets ``q_j / (2 c^2)``.  Rows
    holding one of the ``excluded`` (column, value) pairs, or equal to one of
    the ``excluded_rows``, enter no sums.  With ``partial``, rows with some
    cells missing enter by their observed cells (:class:`._stats.PartialPlan`):
    the radius ``q_j`` (less the kernel factor's widening) is mapped to k
    observed channels at the same chi-square probability; rows of the
    ``patterns`` of observed cells come back as sums for the client's EM.
    With ``cells`` (a squared cutoff), each row's cells are judged one by
    one and those the model cannot explain are left out, as missing cells
    are (:func:`._cells.cell_stats`; ``missing_ok``: NaN cells are missing);
    so are the cells holding one of the ``excluded`` values: the row keeps
    the rest.
    """
    cutoffs = np.atleast_1d(np.asarray(cutoffs, dtype=np.float64))
    prec = precision(scatter)
    kernels = np.repeat((prec / kernel_size2)[None], len(cutoffs), axis=0)
    partial = partial or cells is not None
    pairs = () if excluded is None else tuple(map(tuple, excluded))
    rows = () if excluded_rows is None else tuple(map(tuple, excluded_rows))
    part = None
    if partial:
        p, widen = len(location), kernel_size2 / FALL_OFF2
        counts = np.arange(p + 1)
        radii = np.array([radius_for_count(q / widen, p, counts) * widen for q in cutoffs])
        part = PartialPlan(scatter=np.asarray(scatter, np.float64), kernel_size2=float(kernel_size2),
                           offsets=np.nan_to_num(radii / (2 * kernel_size2), nan=0.0, posinf=np.inf),
                           patterns=tuple(patterns))
    cell_plan = None if cells is None else _cells.CellPlan(prec, float(cells), missing_ok, held=pairs)
    return PassPlan(center=location, kernels=kernels, offsets=cutoffs / (2 * kernel_size2), excluded=pairs,
                    excluded_rows=rows, partial=part, cells=cell_plan)


#: ``c^2`` of the fall-off beyond the flat top, in units of ``d^2`` (at
#: ``kernel_factor=1``): steep, so that a row just beyond the radius, such
#: as a tight cluster at a moderate distance, cannot pull the fit towards it
#: (a fall-off of ``c^2 = 1`` let 10-20 % clusters at Mahalanobis distance 6
#: in; benchmarks/robustness.py).
FALL_OFF2 = 0.25

#: A sample row with ``max(TIGHT_MIN_ROWS, TIGHT_SHARE * n)`` sample rows (itself
#: included, :mod:`._repeated`) within ``TIGHT_RADIUS`` in the whitened metric
#: belongs to a tight group.
TIGHT_RADIUS = 0.05


def _whiten(Y: np.ndarray, scatter: np.ndarray) -> np.ndarray:
    w, V = spread_directions(scatter)
    return Y @ (V / np.sqrt(w))


def _tight_rows(Z: np.ndarray, n_sample: int) -> np.ndarray:
    """Rows of ``Z`` (whitened) with many others within ``TIGHT_RADIUS``: a point mass."""
    if len(Z) < 2 or Z.shape[1] == 0:
        return np.zeros(len(Z), bool)
    k = max(TIGHT_MIN_ROWS, int(TIGHT_SHARE * n_sample))
    counts = cKDTree(Z).query_ball_point(Z, r=TIGHT_RADIUS, return_length=True)
    return np.asarray(counts) >= k


def _core_radius(d2: np.ndarray, p: int, n_effective: float, *, calibrate: bool = True) -> float:
    """The core kernel's radius (d^2 units) from the sample's distances ``d2``.

    The Gaussian quantile at the effective sample size, or (``calibrate``)
    the trimmed calibrated one, never below the median distance (the
    coverage guarantee).  A median distance that overflows float64 raises
    :class:`NumericalRangeError`.
    """
    med = float(np.median(d2))
    if not np.isfinite(med):
        raise NumericalRangeError(
            "the squared distances of most sample rows from the fit's centre overflow float64: the centre "
            "lies ~1e150 spreads from the bulk (center='mean' with rows near the float64 limit does this); "
            "use center='robust'"
        )
    if calibrate:
        q_fit = calibrated_cutoff(d2, CUTOFF_QUANTILE, p=p, n_effective=n_effective, trim=True)
    else:
        q_fit = hotelling_quantile(p, n_effective, CUTOFF_QUANTILE)
    return max(q_fit, med)


def _cutoffs(state: RobustState, sample: np.ndarray, n_effective: float):
    """Radii ``(q_fit, q_final)`` of the next pass, from the sample's distances now.

    ``q_fit`` keeps the fixed point robust (:func:`_core_radius`, calibrated).
    ``q_final`` lets in all the bulk, heavy tails and regimes included
    (untrimmed, ``FINAL_QUANTILE``), except a tight group of rows: if one lies
    between the two radii, ``q_final`` stops short of it.
    """
    p = max(_rank(state.scatter), 1)
    Y = sample[~held_out(sample, state.repeated, state.repeated_rows)] - state.location
    d2 = _whitened_d2(Y, state.scatter)
    if d2 is None:
        d2 = _mahalanobis2(Y, state.scatter)
    q_fit = _core_radius(d2, p, n_effective)
    scale = state.kernel_size2 / FALL_OFF2  # kernel_factor ** 2
    q_final = max(calibrated_cutoff(d2, FINAL_QUANTILE, p=p, n_effective=n_effective), q_fit)
    shell = (d2 > q_fit) & (d2 <= q_final)
    if shell.sum() > 1:
        tight = _tight_rows(_whiten(Y[shell], state.scatter), len(sample))
        if tight.any():
            q_final = max(q_fit, 0.9 * d2[shell][tight].min())
    return q_fit * scale, q_final * scale


def _step(
    runner: PassRunner,
    state: RobustState,
    *,
    fixed_center: np.ndarray | None,
    label: str,
    final: bool = False,
    sample_rate: float = 0.0,
    seed: int = 0,
) -> tuple[PassResult, float]:
    """One re-weighting step (one pass); updates ``state`` and returns the change.

    With ``final``, the same pass also evaluates the final kernel (radius
    ``state.final_cutoff``) from the current state and stores its location
    and consistent scatter in ``state.final_*``.  ``sample_rate`` also draws
    a row sample in the pass (a warm start's).
    """
    c2, p = state.kernel_size2, len(state.location)
    cutoffs = [state.cutoff, state.final_cutoff] if final else [state.cutoff]
    plan = step_plan(state.location, state.scatter, c2, cutoffs, excluded=state.repeated,
                     excluded_rows=state.repeated_rows, partial=runner.nan_policy == "partial",
                     patterns=getattr(runner, "gap_patterns", ()), cells=getattr(runner, "cell_cutoff2", None),
                     missing_ok=runner.nan_policy == "partial")
    if sample_rate > 0:
        plan = replace(plan, sample_rate=sample_rate, seed=seed, sample_partial=runner.nan_policy == "partial")
    res = runner.run(plan, label=label)
    if res.gaps:
        res = _em_completed(res, plan, [flat_top_consistency(p, c2, q) for q in cutoffs], fixed_center,
                            [(state.location, state.scatter)] * len(cutoffs))
    if final:
        runner.last_sums = res  # the kernels' weighted sums of all rows, kept by MCPCA for partial_fit
        state.final_location = res.mean[1] if fixed_center is None else fixed_center
        state.final_scatter = _floored(res.covariance(1, about=fixed_center) * flat_top_consistency(p, c2, cutoffs[1]),
                                       state.resolution)
        state.support = float(res.weight[1] * np.exp(res.log_scale[1]) / res.n_rows)
    location = res.mean[0] if fixed_center is None else fixed_center
    scatter = _floored(res.covariance(0, about=fixed_center) * flat_top_consistency(p, c2, cutoffs[0]),
                       state.resolution)
    change = _relative_change(state, location, scatter)
    state.location, state.scatter = location, scatter
    state.core_support = float(res.weight[0] * np.exp(res.log_scale[0]) / res.n_rows)
    state.n_iter += 1
    return res, change


def _about(cov: np.ndarray, mean: np.ndarray, center: np.ndarray | None) -> np.ndarray:
    """A covariance about its mean, moved to ``center`` if given."""
    if center is None:
        return cov
    d = mean - center
    return cov + np.outer(d, d)


def _spectral_norm(M: np.ndarray) -> float:
    """``||M||_2`` of a symmetric matrix: its largest absolute eigenvalue (no SVD)."""
    return float(np.abs(np.linalg.eigvalsh((M + M.T) / 2)).max())


def _relative_change(state: RobustState, location, scatter) -> float:
    """Largest change of the fit, measured in the metric of the old scatter."""
    w, V = spread_directions(state.scatter)
    if not len(w):
        return 0.0
    W = V / np.sqrt(w)
    return _change_in_metric(W, state.location, location, scatter)


def _change_in_metric(W: np.ndarray, old_location, location, scatter) -> float:
    """``||W^T S W - I||_2 + ||W^T (m - m_old)||``: the change in the whitening ``W`` of the old scatter."""
    with np.errstate(over="ignore", invalid="ignore"):
        shape = W.T @ scatter @ W - np.eye(W.shape[1])
        shift = W.T @ (location - old_location)
    if not (np.all(np.isfinite(shape)) and np.all(np.isfinite(shift))):
        return BIG_CHANGE  # the scatter moved by more than float64 holds: far from converged
    return float(_spectral_norm(shape) + np.linalg.norm(shift))


#: The change reported when it overflows (finite, so that rates stay numbers).
BIG_CHANGE = 1e300


#: Default tolerance of the fixed point, and the share of the scatter's own
#: sampling error (``sqrt(p / n)`` in the metric of :func:`_relative_change`)
#: below which the default stops too: at p = 200 the core's shape converges
#: slowly (rate 0.6-0.9 per pass), far below the noise of the estimate.
DEFAULT_TOL = 1e-3
STATISTICAL_TOL = 0.1

#: Cap on the estimated contraction rate of the fixed point.
MAX_RATE = 0.95


def _remaining(change: float, rate: float) -> float:
    """Estimated distance to the fixed point after a step that moved by ``change``.

    The fixed point converges linearly with some rate ``rho``, so what is left
    is at most about ``change * rho / (1 - rho)``; ``rho`` is the ratio of
    the last two changes (on the sample, then on the full data).
    """
    rho = min(rate, MAX_RATE) if np.isfinite(rate) else 0.5
    return change * rho / (1.0 - rho)


#: Sample steps without a new smallest change after which the calibrated
#: phase stops: its radius is a step function of the state (a median of the
#: sample's distances), so the iteration can settle into a jitter of the size
#: of one row's weight rather than converge.
STALL_STEPS = 10


def _sample_step(
    state: RobustState, free: np.ndarray, n_sample: int, *, fixed_center, calibrate: bool, partial=None
) -> float:
    """One core step on the sample's rows ``free`` (the repeated rows and values left out); the change.

    The core radius (:func:`_core_radius`), then the re-weighting of
    :func:`_step`, from one eigendecomposition and one quadratic form of the
    rows, in memory: at p = 500 a step costs a third of the two passes, three
    eigendecompositions and the shell search that those functions make.
    Same numerics as those functions: eigenvalues below ``TINY_EIGENVALUE``
    do not enter the distances (:func:`._start.precision`), distances that overflow
    are inf (weight 0), and a median distance that overflows raises
    :class:`NumericalRangeError`.  Sample rows with missing cells
    (``partial``) enter as a ``"partial"`` pass weighs them (EM; the radius
    comes from the complete rows).
    """
    w, V = spread_directions(state.scatter)
    p = max(len(w), 1)
    Y = free - state.location
    W = V / np.sqrt(w)  # whitening: the metric of _relative_change
    keep = w > TINY_EIGENVALUE
    L = _triangular_whitening(W) if keep.all() else None
    if L is None:
        with np.errstate(over="ignore", invalid="ignore"):
            Z = Y @ W[:, keep]  # d^2 = |Z|^2, as _mahalanobis2 under precision(scatter)
            d2 = np.einsum("ij,ij->i", Z, Z)
        del Z
        d2[np.isnan(d2)] = np.inf
    else:  # wide rows: the same d^2 by a triangular product (half the GEMM's work)
        W = L  # L^-1 W is orthogonal: the same metric for the change
        d2 = _triangular_d2(Y, L)
    c2 = state.kernel_size2
    state.cutoff = _core_radius(d2, p, state.core_support * n_sample, calibrate=calibrate) * c2 / FALL_OFF2
    e = np.minimum(state.cutoff / (2 * c2) - d2 / (2 * c2), 0.0)
    log_scale = e.max()
    g = np.exp(e - log_scale)
    weight = g.sum()
    shift = (g @ Y) / weight
    mean = state.location + shift
    Y -= shift  # centred at the weighted mean, then scaled by sqrt(g): one GEMM gives the covariance
    Y *= np.sqrt(g)[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        cov = Y.T @ Y / weight
    if partial is not None:
        mean, cov, weight, log_scale = _with_partial_sample(state, partial, mean, cov, weight, log_scale)
    if not (np.all(np.isfinite(cov)) and np.all(np.isfinite(mean))):
        raise NumericalRangeError(
            "the weighted scatter of the sample is not finite in float64 (rows of magnitude near the "
            "float64 limit carry weight); rescale the data or remove those rows"
        )
    location = mean if fixed_center is None else fixed_center
    scatter = _floored(_about(cov, mean, fixed_center) * flat_top_consistency(len(state.location), c2, state.cutoff),
                       state.resolution)
    change = _change_in_metric(W, state.location, location, scatter) if len(w) else 0.0
    state.location, state.scatter = location, scatter
    state.core_support = float(weight * np.exp(log_scale) / n_sample)
    return change


#: From this many columns on (full rank), a sample step whitens its rows by the lower
#: Cholesky factor of the precision, a triangular product (:data:`._kernels.TRIANGULAR_MIN_FEATURES`).
TRIANGULAR_MIN_FEATURES = _TRIANGULAR_MIN_FEATURES


def _triangular_whitening(W: np.ndarray) -> np.ndarray | None:
    """The lower Cholesky factor ``L`` (Fortran order) of ``W W^T`` for a square whitening ``W``
    of at least ``TRIANGULAR_MIN_FEATURES`` columns, or None (narrower, not square, or no factor):
    ``|y^T L|`` is ``|y^T W|`` and ``L^T S L`` has the spectrum of ``W^T S W``."""
    p = W.shape[0]
    if p < TRIANGULAR_MIN_FEATURES or W.shape[1] != p:
        return None
    try:
        L = np.linalg.cholesky(W @ W.T)
    except np.linalg.LinAlgError:
        return None
    return np.asfortranarray(L) if np.all(np.isfinite(L)) else None


def _triangular_d2(Y: np.ndarray, L: np.ndarray) -> np.ndarray:
    """``|y^T L|^2`` of each row of ``Y`` (``L`` lower triangular, Fortran order) by one
    triangular product on a copy of the rows; inf for rows so far that they overflow."""
    Z = np.array(Y, dtype=np.float64, order="C")
    with np.errstate(over="ignore", invalid="ignore"):
        if len(Z):
            _blas_trmm(1.0, L, Z.T, side=0, lower=1, trans_a=1, overwrite_b=1)  # (Z L)^T in place
        d2 = np.einsum("ij,ij->i", Z, Z)
    d2[np.isnan(d2)] = np.inf
    return d2


def _whitened_d2(Y: np.ndarray, scatter: np.ndarray) -> np.ndarray | None:
    """:func:`._start._mahalanobis2` of wide rows (full rank, :func:`_triangular_whitening`) by a
    triangular product; None where that does not apply (the caller takes the GEMM)."""
    w, V = spread_directions(scatter)
    if len(w) != len(scatter) or not np.all(w > TINY_EIGENVALUE):
        return None
    L = _triangular_whitening(V / np.sqrt(w))
    return None if L is None else _triangular_d2(Y, L)


def _em_completed(res: BlockStats, plan: PassPlan, factors, fixed_center, starts) -> BlockStats:
    """``res`` with the rows it returned as pattern sums (``res.gaps``) completed by EM to
    convergence under each kernel's fixed weights (:func:`._missing.em_moments`), in its sums.
    The patterns are taken in the plan's order, so the sums do not depend on the blocks' order."""
    sums = [res.gaps[k] for k in plan.partial.patterns if k in res.gaps]
    res = replace(res, weight=res.weight.copy(), mean=res.mean.copy(), scatter=res.scatter.copy(), gaps=None)
    for j, (factor, (location, scatter)) in enumerate(zip(factors, starts, strict=True)):
        gaps = [(g.observed, float(g.weight[j]), g.wsum[j], g.second[j]) for g in sums]
        mean, cov = em_moments(res.weight[j], res.mean[j], res.scatter[j], gaps, plan.center, location=location,
                               covariance=scatter, factor=factor, fixed_center=fixed_center)
        res.weight[j] += sum(g[1] for g in gaps)
        res.mean[j], res.scatter[j] = mean, cov * res.weight[j]
    return res


def _with_partial_sample(state: RobustState, partial: np.ndarray, mean, cov, weight: float, log_scale: float):
    """The weighted mean and covariance of a sample step, merged with those of the sample's rows
    with missing cells (:func:`._block.block_stats` with a ``partial`` plan, in memory): one EM
    step per sample step, the rows completed under the step's model (the sample's fixed point
    iterates the EM with the re-weighting; a step costs a few ms)."""
    plan = step_plan(state.location, state.scatter, state.kernel_size2, [state.cutoff], excluded=state.repeated,
                     excluded_rows=state.repeated_rows, partial=True)
    whole = BlockStats(n_rows=0, n_nonfinite=0, log_scale=np.array([log_scale]), weight=np.array([weight]),
                       mean=mean[None], scatter=(cov * weight)[None])
    merged = combine(whole, block_stats(partial, plan))
    return merged.mean[0], merged.covariance(0), float(merged.weight[0]), float(merged.log_scale[0])


#: A pattern of observed cells gets the client's EM to convergence only if at least this share of the
#: sample's rows hold it (a channel offline for a while), and at least :func:`._missing.rare_pattern_rows`.
GAP_PATTERN_SHARE = 0.01


def gap_patterns(partial: np.ndarray | None, n_sample: int = 0) -> tuple:
    """The patterns of observed cells whose rows a ``"partial"`` pass returns as sums for the client's EM:
    the ``MAX_PATTERNS`` most frequent among the sample's rows with missing cells (ties: by key), of
    those held by at least :data:`GAP_PATTERN_SHARE` of the ``n_sample`` sample rows and
    :func:`._missing.rare_pattern_rows` (a channel offline for a while; at wide p, scattered gaps
    make many small patterns, whose EM on the client costs a p x p inverse per pattern and
    iteration, and whose sums per pattern fill the pass's results)."""
    if partial is None or not len(partial):
        return ()
    keys = [pattern_key(row) for row in ~np.isnan(partial)]
    uniq, counts = np.unique(np.array(keys, dtype=object), return_counts=True)
    # rarer ones are completed in the pass, one EM step per pass
    least = max(rare_pattern_rows(partial.shape[1]), int(np.ceil(GAP_PATTERN_SHARE * n_sample)))
    order = sorted((i for i in range(len(uniq)) if counts[i] >= least), key=lambda i: (-counts[i], uniq[i]))
    return tuple(uniq[i] for i in order[:MAX_PATTERNS])


def _iterate_on_sample(state: RobustState, sample: np.ndarray, *, fixed_center, tol: float, partial=None) -> None:
    """The core fixed point on the in-memory sample; then the radii of the full-data passes.

    First with the Gaussian radius (so the start's neighbourhood, not the
    data's tails, decides what is in the core), then with the calibrated one
    (so heavy tails and several regimes widen it).  The radii are then fixed
    for the full-data passes, which thus iterate one smooth map.
    """
    free = sample[~held_out(sample, state.repeated, state.repeated_rows)]
    if partial is not None and not len(partial):
        partial = None
    n_sample = len(sample) + (0 if partial is None else len(partial))
    for calibrate in (False, True):
        previous, best, since_best = float("nan"), float("inf"), 0
        for _ in range(MAX_SAMPLE_STEPS):
            change = _sample_step(state, free, n_sample, fixed_center=fixed_center, calibrate=calibrate,
                                  partial=partial)
            if np.isfinite(previous) and previous > 0 and change > 0:
                state.rate = change / previous
            if change == 0 or _remaining(change, state.rate) < tol / 10:
                break
            best, since_best = (change, 0) if change < best else (best, since_best + 1)
            if since_best >= STALL_STEPS:
                break
            previous = change
    state.cutoff, state.final_cutoff = _cutoffs(state, sample, state.core_support * len(sample))
    state.n_iter = 0
    state.rate = float("nan")


#: Bound on the cellwise fixed point's steps on the in-memory sample.
CELL_SAMPLE_STEPS = 30


def _pairs(repeated: np.ndarray | None) -> tuple:
    """``(column, value)`` pairs of a state's repeated values, as a plan holds them."""
    return () if repeated is None else tuple((int(c), float(v)) for c, v in repeated)


def _cellwise_start(
    rows: np.ndarray, complete: np.ndarray, *, fixed_center, kernel_factor: float, cutoff2: float, tol: float,
) -> RobustState:
    """The robust state of a cellwise fit, from the in-memory row sample ``rows`` (NaN: missing).

    Starts from each channel's median and robust spread (a diagonal model:
    its first cell flags are univariate), then iterates the flat-top
    re-weighting of :func:`_sample_step` on :func:`._cells.judge` and
    :func:`._cells.cell_sums`: each step flags the cells the current model
    cannot explain (``cutoff2``; ``inf`` flags none, a partial fit's start
    from rows with gaps), completes them from the row's good cells and
    weighs each row by its distance on those (first with the Gaussian
    radius, then the calibrated one).  The repeated values come from all of
    ``rows``, the repeated rows and the quantization steps from its
    complete rows ``complete``.  The radii of the full-data passes are then
    calibrated on the good-cell distances.
    """
    n, p = rows.shape
    if n < p + 2:
        raise ValueError(f"{n} usable rows are too few for {p} features: the robust fit needs at least {p + 2}")
    med, spread = _cells.robust_columns(rows)
    repeated, repeated_rows = find_repeated(rows)
    resolution = quantization_steps(complete) ** 2 / 12 if len(complete) else None
    state = RobustState(
        location=med if fixed_center is None else np.asarray(fixed_center, np.float64),
        scatter=_floored(np.diag(spread**2), resolution),
        resolution=resolution,
        kernel_size2=kernel_factor**2 * FALL_OFF2,
        core_support=START_FRACTION,
        repeated=repeated,
        repeated_rows=repeated_rows,
    )
    c2, scale = state.kernel_size2, kernel_factor**2
    flags = np.zeros(rows.shape, bool)  # each step starts from the last one's flags
    for step in range(CELL_SAMPLE_STEPS):
        cells = _cells.CellPlan(precision(state.scatter), cutoff2, True, held=_pairs(state.repeated))
        judged = _cells.judge(rows, state.location, cells, start=flags)
        flags[:] = False
        flags[judged.rows] = judged.flags
        d2 = judged.equivalent_d2()
        calibrate = step >= CELL_SAMPLE_STEPS // 3
        state.cutoff = _core_radius(d2, p, state.core_support * n, calibrate=calibrate) * scale
        plan = step_plan(state.location, state.scatter, c2, [state.cutoff], excluded=state.repeated,
                         excluded_rows=state.repeated_rows, cells=cutoff2, missing_ok=True)
        res = _cells.cell_sums(judged, plan)
        location = res.mean[0] if fixed_center is None else fixed_center
        scatter = _floored(res.covariance(0, about=fixed_center) * flat_top_consistency(p, c2, state.cutoff),
                           state.resolution)
        change = _relative_change(state, location, scatter)
        state.location, state.scatter = location, scatter
        state.core_support = float(res.weight[0] * np.exp(res.log_scale[0]) / n)
        if calibrate and step >= 2 and change < tol / 10:
            break
    cells = _cells.CellPlan(precision(state.scatter), cutoff2, True, held=_pairs(state.repeated))
    d2 = _cells.judge(rows, state.location, cells, start=flags).equivalent_d2()
    n_effective = state.core_support * n
    q_fit = _core_radius(d2, p, n_effective)
    q_final = max(calibrated_cutoff(d2[np.isfinite(d2)], FINAL_QUANTILE, p=p, n_effective=n_effective), q_fit)
    state.cutoff, state.final_cutoff = q_fit * scale, q_final * scale
    state.n_iter, state.rate = 0, float("nan")
    return state


def state_in_units(state: RobustState, d: int) -> RobustState | None:
    """``state`` with its location, scatters, repeated values and rows multiplied by ``2**d`` (scatters by ``4**d``).

    Exact (powers of two) unless a value overflows or its scatter's largest
    eigenvalue underflows, when None is returned.  Radii and kernel size are
    in units of the scatter (Mahalanobis), so they do not change.
    """
    with np.errstate(over="ignore", under="ignore"):
        mapped = replace(
            state,
            location=np.ldexp(state.location, d),
            scatter=np.ldexp(state.scatter, 2 * d),
            final_location=None if state.final_location is None else np.ldexp(state.final_location, d),
            final_scatter=None if state.final_scatter is None else np.ldexp(state.final_scatter, 2 * d),
        )
        if state.repeated is not None:
            mapped.repeated = state.repeated.copy()
            mapped.repeated[:, 1] = np.ldexp(state.repeated[:, 1], d)
        if state.repeated_rows is not None:
            mapped.repeated_rows = np.ldexp(state.repeated_rows, d)
        if state.resolution is not None:
            mapped.resolution = np.ldexp(state.resolution, 2 * d)
    for M, M0 in ((mapped.scatter, state.scatter), (mapped.final_scatter, state.final_scatter)):
        if M is None:
            continue
        top = np.abs(np.diag(M)).max(initial=0.0)
        lost = np.abs(np.diag(M0)).max(initial=0.0) > 0 and not top >= np.finfo(np.float64).tiny
        if lost or not np.all(np.isfinite(M)):
            return None
    values = [mapped.location, mapped.final_location, None if mapped.repeated is None else mapped.repeated[:, 1],
              mapped.repeated_rows]
    if not all(v is None or np.all(np.isfinite(v)) for v in values):
        return None
    return mapped


def _sample_in_units(sample: np.ndarray, unit_exp: int) -> np.ndarray:
    """A full-data step's row sample (as stored) in working units ``2**unit_exp``, far rows left out,
    as the estimator maps a cold fit's first sample."""
    with np.errstate(over="ignore"):
        sample = np.ldexp(sample, -unit_exp)
    with np.errstate(invalid="ignore"):
        return sample[~(np.abs(sample) > FAR_ROW).any(axis=1)]  # rows with gaps stay (a partial fit's)


def _archive_repeats(state: RobustState, sample: np.ndarray, unit_exp: int) -> bool:
    """Set ``state``'s repeated values and rows to those of ``sample`` (rows as stored, drawn from
    the whole archive in a full-data step); True where they changed."""
    found = find_repeated(_sample_in_units(sample, unit_exp))
    before = (state.repeated, state.repeated_rows)
    state.repeated, state.repeated_rows = found
    return not all(np.array_equal(b[:0] if a is None else a, b) for a, b in zip(before, found, strict=True))


def warm_step(
    runner: PassRunner,
    state: RobustState,
    *,
    fixed_center: np.ndarray | None,
    sample_rate: float,
    seed: int = 0,
) -> tuple[PassResult, RobustState | None]:
    """The first full-data step of a warm start, from a previous fit's ``state``.

    No start and no sample stage: the previous fit's location, scatter and
    radii go straight into a full-data step, which also draws the row sample
    (so the pass gives the new data's row count and the sample that the
    outlier cutoff is calibrated on).  The radii, repeated rows and values are then
    recalibrated on the new sample, as a cold fit sets them after its sample
    stage, and :func:`fit_robust` continues from the returned state (the
    pass's result is returned too, with the sample).  A
    refit of an archive grown by rows like the old ones typically stops
    after one more pass (``tests/test_mcpca.py``).
    """
    state = replace(state, n_iter=0, converged=False, last_change=float("nan"), rate=float("nan"))
    res, change = _step(
        runner,
        state,
        fixed_center=fixed_center,
        label="warm step 1",
        final=True,
        sample_rate=sample_rate,
        seed=seed,
    )
    state.last_change = change
    # Units.  The step ran in the runner's unit, the previous fit's, in which
    # ``state`` is.  The unit is now chosen from this pass's row sample as a
    # cold fit chooses it from its first pass's; if it changed, the state is
    # mapped to it (exact: a power of two) and the runner switched, so the
    # rest of the fit is the one a cold fit would run in that unit.  A state
    # that does not survive the mapping (a change of scale by ~1e150) refuses
    # the warm start: None is returned and the estimator fits cold.
    unit = working_exponent(res.sample, np.zeros(0), np.zeros(0)) if len(res.sample) else runner.unit_exp
    if unit != runner.unit_exp:
        state = state_in_units(state, runner.unit_exp - unit)
        if state is None:
            return res, None
        runner.unit_exp = unit
    sample = _sample_in_units(res.sample, runner.unit_exp)
    state.repeated, state.repeated_rows = find_repeated(sample)
    state.cutoff, state.final_cutoff = _cutoffs(state, sample, state.core_support * len(sample))
    return res, state


def update_robust(
    runner: PassRunner, state: RobustState, sums: BlockStats, *, fixed_center: np.ndarray | None
) -> tuple[RobustState, BlockStats, BlockStats]:
    """One update of a fitted robust state by new rows (``MCPCA.partial_fit``): one pass over them only.

    ``sums`` are the core and the final kernel's weighted sums of every row
    seen so far (``n_rows``, total weight with its log-scale, weighted mean
    and scatter, in the runner's working unit), as the last full-data pass
    of the fit (:func:`_step`) and the previous updates left them.  The new
    rows are weighted by the plan of the current state (:func:`step_plan`:
    its location and scatter, its core and final radii, its repeated values
    and rows), exactly as the next full-data step of a fit would weigh them;
    their sums are merged with ``sums`` by the pairwise formula
    (:func:`._block.combine`), and the state's location, scatter, final
    location and final scatter are set from the merged sums as :func:`_step`
    sets them (made consistent at the Gaussian, floored at the channels'
    rounding error).  Radii, kernel size, repeated values and rows are kept.

    Each row thus keeps the weight the model gave it when it arrived: rows
    like the fitted ones enter with the weights a refit would give them
    (the fit is a fixed point), while rows far from the model (outliers, or
    every row of a new regime) get little or no weight, so the model does
    not follow a change of regime (see ``MCPCA.partial_fit``).

    Returns the updated state (a copy), the merged sums (to keep) and the
    new rows' sums (their ``weight * exp(log_scale) / n_rows`` is the new
    rows' weighted share).
    """
    c2, p = state.kernel_size2, len(state.location)
    cutoffs = [state.cutoff, state.final_cutoff]
    plan = step_plan(state.location, state.scatter, c2, cutoffs, excluded=state.repeated,
                     excluded_rows=state.repeated_rows, partial=runner.nan_policy == "partial")
    new = runner.run(plan, label="update")
    if new.gaps:
        new = _em_completed(new, plan, [flat_top_consistency(p, c2, q) for q in cutoffs], fixed_center,
                            [(state.location, state.scatter)] * len(cutoffs))
    merged = combine(sums, new)
    factors = [flat_top_consistency(p, c2, q) for q in cutoffs]
    covs = [_floored(merged.covariance(j, about=fixed_center) * factors[j], state.resolution) for j in (0, 1)]
    means = [merged.mean[j] if fixed_center is None else fixed_center for j in (0, 1)]
    if not all(np.all(np.isfinite(a)) for a in (*covs, *means)):
        raise NumericalRangeError(
            "the merged weighted scatter of the model's rows and the new rows is not finite in float64 "
            "(new rows of magnitude near the float64 limit carry weight); remove those rows"
        )
    shares = merged.weight * np.exp(merged.log_scale) / max(merged.n_rows, 1)
    updated = replace(state, location=means[0], scatter=covs[0], final_location=means[1], final_scatter=covs[1],
                      core_support=float(shares[0]), support=float(shares[1]), n_iter=1, rate=float("nan"))
    updated.last_change = _relative_change(state, updated.location, updated.scatter)
    return updated, merged, new


def fit_robust(
    runner: PassRunner,
    *,
    moments: PassResult,
    fixed_center: np.ndarray | None,
    kernel_factor: float = 1.0,
    tol: float | None,
    max_passes: int,
    state: RobustState | None = None,
    on_step=None,
    seed: int = 0,
    final_step: bool = True,
    partial_sample: np.ndarray | None = None,
    archive_sample_rate: float = 0.0,
    cellwise: bool = False,
) -> RobustState:
    """Robust location and scatter by the calibrated re-weighting fixed point.

    Parameters
    ----------
    runner : PassRunner
        Passes over the full data (counted), in working units.
    moments : PassResult
        The first pass, with its row sample, in the runner's working units
        (the estimator maps it; see :func:`working_exponent`).  Sample rows
        beyond ``FAR_ROW`` are left out of the in-memory work.
    fixed_center : ndarray or None
        Keep the location fixed (``center="mean"`` or ``False``); None
        estimates it robustly.
    kernel_factor : float
        Multiplies the kernel: the flat-top radius and the fall-off grow with
        its square; a huge value gives every row weight 1 (ordinary PCA).
    tol : float or None
        Stop when the estimated distance to the fixed point (relative, in the
        metric of the scatter; see :func:`_remaining`) is below ``tol``.
        None: below ``max(DEFAULT_TOL, STATISTICAL_TOL * sqrt(p / n))``, a
        tenth of the sampling error of the scatter itself in that metric
        (about ``sqrt(p / n)``): iterating further moves the fit by less
        than its own noise.
    max_passes : int
        Bound on the full-data passes of this stage.
    seed : int
        Seed of the outlyingness directions.
    final_step : bool, default=True
        Also evaluate the final, inclusive kernel in each full-data pass (the
        default solver's estimate; the paper solver needs only the location).
    partial_sample : ndarray or None
        Sample rows with missing cells (NaN), in working units
        (``nan_policy="partial"``): the start and the radii come from the
        complete rows, and the sample's fixed point also weighs these by
        their observed cells (EM, :func:`._block.block_stats`'s
        ``partial``), so that the full-data passes start near the EM fixed
        point.
    archive_sample_rate : float, default=0.0
        Where ``moments``' sample comes from a spread of the row blocks
        only (:func:`._passes.spread_blocks`): the first full-data step also
        draws a row sample of the whole archive at this rate, and the
        repeated values and rows (stuck sensors, frozen records) are found
        anew in it (:func:`_archive_repeats`).  A stuck stretch outside the
        spread's blocks is then found as a full first pass finds it.
    cellwise : bool, default=False
        Judge cells one by one (:mod:`._cells`): the start and the sample's
        fixed point are :func:`_cellwise_start`'s, and every full-data pass
        leaves out the cells the current model cannot explain.
    """
    p = runner.n_features
    sample = moments.sample
    n_sample = len(sample) + (0 if partial_sample is None else len(partial_sample))
    runner.gap_patterns = gap_patterns(partial_sample, n_sample) if runner.nan_policy == "partial" else ()
    if tol is None:
        tol = max(DEFAULT_TOL, STATISTICAL_TOL * np.sqrt(p / max(moments.n_rows, 1)))
    with np.errstate(invalid="ignore"):
        sample = sample[np.all(np.abs(sample) <= FAR_ROW, axis=1)]
    if cellwise:
        runner.cell_cutoff2 = _cells.cell_cutoff2()
    gaps = partial_sample is not None and len(partial_sample) > 0
    if state is None and (cellwise or (gaps and len(sample) < p + 2)):
        # A cellwise fit, or too few complete rows for the row-wise start (wide rows, each with a gap
        # somewhere): start from every row by its good or observed cells (no cell flagged then).
        whole = np.concatenate([sample, partial_sample]) if gaps else sample
        with np.errstate(invalid="ignore"):
            whole = whole[~(np.abs(whole) > FAR_ROW).any(axis=1)]
        state = _cellwise_start(whole, sample, fixed_center=fixed_center, kernel_factor=kernel_factor,
                                cutoff2=runner.cell_cutoff2 if cellwise else np.inf, tol=tol)
        if on_step is not None:
            on_step(state)
    if state is None:
        if len(sample) < p + 2:
            raise ValueError(
                f"{moments.n_rows} usable rows are too few for {p} features: "
                f"the robust fit needs at least {p + 2}"
            )
        location, scatter = robust_start(sample, seed=seed)
        if fixed_center is not None:
            location = fixed_center
        with_gaps = sample if partial_sample is None or not len(partial_sample) else np.concatenate(
            [sample, partial_sample])
        repeated, rows = find_repeated(with_gaps)  # a value stuck while another channel is offline, too
        resolution = quantization_steps(sample) ** 2 / 12
        state = RobustState(
            location=location,
            scatter=_floored(scatter, resolution),
            resolution=resolution,
            kernel_size2=kernel_factor**2 * FALL_OFF2,
            core_support=min(1.0, max(START_FRACTION, (p + 2) / len(sample))),
            repeated=repeated,
            repeated_rows=rows,
        )
        _iterate_on_sample(state, sample, fixed_center=fixed_center, tol=tol, partial=partial_sample)
        if on_step is not None:
            on_step(state)
    while not state.converged and state.n_iter < max_passes:  # a resumed state continues its count
        resample = archive_sample_rate > 0 and state.n_iter == 0
        res, change = _step(
            runner, state, fixed_center=fixed_center, label=f"robust step {state.n_iter + 1}", final=final_step,
            sample_rate=archive_sample_rate if resample else 0.0, seed=seed,
        )
        if np.isfinite(state.last_change) and state.last_change > 0:
            state.rate = change / state.last_change
        state.converged = _remaining(change, state.rate) < tol
        state.last_change = change
        if resample and _archive_repeats(state, res.sample, runner.unit_exp):
            state.converged = False  # the next step leaves out rows this one weighed
        if on_step is not None:
            on_step(state)
    return state
