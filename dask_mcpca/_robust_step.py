"""The default solver's state and its full-data steps: one re-weighting pass each (:mod:`._robust`).

:class:`RobustState` is the fit's location, scatter, radii and bookkeeping
(checkpointed, and what a ``warm_start`` refit continues from), in the
working unit ``2**k`` (:func:`working_exponent`).  A full-data step
(:func:`full_step`) is one pass of the flat-top kernels of
:func:`step_plan` from the current state; its weighted sums, completed by
the client's EM where rows with gaps came back as sums per pattern
(:func:`em_completed`), give the next state, made consistent at the
Gaussian and floored at the channels' rounding error (:func:`floored`).
How far a step moved the fit, in the metric of the old scatter
(:func:`relative_change`), and the estimated distance left to the fixed
point (:func:`remaining`) decide when the iteration stops.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.sparse.linalg import ArpackError, ArpackNoConvergence, LinearOperator, eigsh

from . import _cells
from ._block_rows import top_exponent
from ._missing import em_moments, radius_for_count
from ._passes import PassResult, PassRunner
from ._power import spread_directions
from ._repeated import find_repeated
from ._schedule import flat_top_consistency
from ._shift import run_plan
from ._start import precision
from ._stats import BlockStats, PartialPlan, PassPlan
from ._threads import map_on_cores

__all__ = [
    "BIG_CHANGE",
    "FALL_OFF2",
    "FAR_ROW",
    "LANCZOS_MAXITER",
    "LANCZOS_MIN_FEATURES",
    "LANCZOS_SEED",
    "MAX_RATE",
    "RobustState",
    "archive_repeats",
    "change_in_metric",
    "consistent_scatters",
    "covariance_about",
    "em_completed",
    "floored",
    "full_step",
    "kernel_rank",
    "relative_change",
    "remaining",
    "sample_in_units",
    "step_plan",
    "working_exponent",
]

#: Sample rows with a coordinate beyond this, in working units (the bulk's
#: spread is near 1), are left out of the in-memory work: their squares and
#: sums would overflow, and a full pass gives them weight 0 anyway.
FAR_ROW = 2.0**400

#: ``c^2`` of the fall-off beyond the flat top, in units of ``d^2`` (at
#: ``kernel_factor=1``): steep, so that a row just beyond the radius, such
#: as a tight cluster at a moderate distance, cannot pull the fit towards it
#: (a fall-off of ``c^2 = 1`` let 10-20 % clusters at Mahalanobis distance 6
#: in; benchmarks/robustness.py).
FALL_OFF2 = 0.25

#: The change reported when it overflows (finite, so that rates stay numbers).
BIG_CHANGE = 1e300

#: Cap on the estimated contraction rate of the fixed point.
MAX_RATE = 0.95

#: From this many whitened directions on, a step's change (:func:`change_in_metric`) takes the
#: spectral norm by Lanczos iterations (a few dozen matrix-vector products) instead of forming
#: ``W^T S W`` (two p^3 products) and all its eigenvalues (issue 37; measured in benchmarks/).
#: Narrower fits keep the dense route and their bits.
LANCZOS_MIN_FEATURES = 256

#: Relative accuracy of the Lanczos norm: the change only decides when the fit stops.
LANCZOS_TOL = 1e-8

#: ARPACK's restarts at most (each some 20 matrix-vector products): a norm that has not converged
#: by then falls back to the dense route at once instead of after ARPACK's default ``10 p`` restarts.
LANCZOS_MAXITER = 30

#: Seed of the Lanczos start vector: a random start (fixed, so the result is the same every time)
#: is not orthogonal to the top eigenvector, as a vector of ones is for a contrast such as (1, -1, 0, ...).
LANCZOS_SEED = 0


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
        top = top_exponent(sample)
        # One column per (contiguous) row: the medians select along rows, several times faster
        # than down the columns of the sample at wide p; the values are the same.
        dev = np.empty(sample.shape[::-1], np.ldexp(sample[:1], 0).dtype)  # as ldexp gives: float32 stays
        np.ldexp(sample.T, -top, out=dev)  # |Z| <= 1, one copy
        runs = [dev[k : k + MAD_RUN] for k in range(0, len(dev), MAD_RUN)]  # the client's cores at once
        spread = float(np.max(map_on_cores(_largest_mad, runs)))  # NaN in any run: NaN, as np.max gives
        if not spread > 0 and dev.any():  # most rows equal: the nearest other rows set the scale
            spread = float(dev[dev > 0].min())
        if spread > 0:
            return top + int(np.frexp(spread)[1])
        return top
    ranges = np.concatenate([col_min, col_max])
    return top_exponent(ranges[np.isfinite(ranges)])


#: Channels of :func:`working_exponent`'s MADs a thread takes at once.
MAD_RUN = 64


def _largest_mad(dev: np.ndarray) -> float:
    """The largest MAD of the rows of ``dev`` (one channel a row), which become their absolute deviations
    from their medians, in place, in some order within each row (the caller reads only which values a row
    holds)."""
    dev -= np.median(dev, axis=1)[:, None]
    np.abs(dev, out=dev)
    return float(np.max(np.median(dev, axis=1, overwrite_input=True)))


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
    # in working units: the floor of each channel's variance (:func:`floored`).
    resolution: np.ndarray | None = None


def floored(scatter: np.ndarray, resolution: np.ndarray | None) -> np.ndarray:
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
    cell_plan = None if cells is None else _cells.CellPlan(_cells.cell_precision(scatter), float(cells), missing_ok,
                                                         held=pairs)
    return PassPlan(center=location, kernels=kernels, offsets=cutoffs / (2 * kernel_size2), excluded=pairs,
                    excluded_rows=rows, partial=part, cells=cell_plan)


def kernel_rank(scatter: np.ndarray) -> int:
    """The dimension the kernels of ``scatter`` weigh rows in: its rank (the directions above
    :func:`._power.direction_floors`), at least 1.

    The radii are chi-square quantiles of that many degrees of freedom (:func:`._robust_sample.pass_radii`),
    and so must the consistency factors be (:func:`._schedule.flat_top_consistency`): with the full width,
    30 constant channels beside 30 live ones inflated every fitted variance 1.3 times, 10 derived
    channels among 100 by 1.2 %.  (The decomposition is cached: the radii read it first.)
    """
    return max(len(spread_directions(scatter)[0]), 1)


def consistent_scatters(covs: list, c2: float, cutoffs: list, rank: int, resolution) -> list:
    """The kernels' weighted covariances ``covs`` times their consistency factors for ``rank``
    dimensions (:func:`._schedule.flat_top_consistency`), floored at ``resolution``.

    ``rank`` is the rank of the scatter that weighed the rows (:func:`kernel_rank`).  Where the core's
    result has another rank (a channel constant at the fit that came alive in ``partial_fit``'s new
    rows), the factors are taken again for that rank: the model file's check reads the rank off the
    kept core scatter (``update_scatter_``), and must find the factors the model was built with (a
    model updated so was refused as damaged).  The decomposition is cached: the next pass's radii
    read it.
    """
    def scaled(r: int) -> list:
        return [floored(cov * flat_top_consistency(r, c2, q), resolution) for cov, q in zip(covs, cutoffs, strict=True)]

    out = scaled(rank)
    again = kernel_rank(out[0])
    return out if again == rank else scaled(again)


def full_step(
    runner: PassRunner,
    state: RobustState,
    *,
    fixed_center: np.ndarray | None,
    label: str,
    final: bool = False,
    sample_rate: float = 0.0,
    seed: int = 0,
    keep_runs: bool = False,
) -> tuple[PassResult, float]:
    """One re-weighting step (one pass); updates ``state`` and returns the change.

    With ``final``, the same pass also evaluates the final kernel (radius
    ``state.final_cutoff``) from the current state and stores its location
    and consistent scatter in ``state.final_*``.  ``sample_rate`` also draws
    a row sample in the pass (a warm start's, or a cold fit's whose first read
    read a spread of the blocks); ``keep_runs``: the pass also keeps the runs of
    rows the shift rule learns from (:func:`._shift.run_plan`; a warm start's,
    whose pass is its first read).
    """
    c2, p = state.kernel_size2, kernel_rank(state.scatter)
    cutoffs = [state.cutoff, state.final_cutoff] if final else [state.cutoff]
    plan = step_plan(state.location, state.scatter, c2, cutoffs, excluded=state.repeated,
                     excluded_rows=state.repeated_rows, partial=runner.nan_policy == "partial",
                     patterns=getattr(runner, "gap_patterns", ()), cells=getattr(runner, "cell_cutoff2", None),
                     missing_ok=runner.nan_policy == "partial")
    if sample_rate > 0:
        plan = replace(plan, sample_rate=sample_rate, seed=seed, sample_partial=runner.nan_policy == "partial")
    runs = run_plan(runner.block_rows(), range(runner.n_blocks), runner.n_features) if keep_runs else None
    res = runner.run(plan, label=label, runs=runs)
    if res.gaps:
        res = em_completed(res, plan, [flat_top_consistency(p, c2, q) for q in cutoffs], fixed_center,
                            [(state.location, state.scatter)] * len(cutoffs))
    scatters = consistent_scatters([res.covariance(j, about=fixed_center) for j in range(len(cutoffs))],
                                   c2, cutoffs, p, state.resolution)
    if final:
        runner.last_sums = res  # the kernels' weighted sums of all rows, kept by MCPCA for partial_fit
        state.final_location = res.mean[1] if fixed_center is None else fixed_center
        state.final_scatter = scatters[1]
        state.support = float(res.weight[1] * np.exp(res.log_scale[1]) / res.n_rows)
    location = res.mean[0] if fixed_center is None else fixed_center
    scatter = scatters[0]
    change = relative_change(state, location, scatter)
    state.location, state.scatter = location, scatter
    state.core_support = float(res.weight[0] * np.exp(res.log_scale[0]) / res.n_rows)
    state.n_iter += 1
    return res, change


def covariance_about(cov: np.ndarray, mean: np.ndarray, center: np.ndarray | None) -> np.ndarray:
    """A covariance about its mean, moved to ``center`` if given."""
    if center is None:
        return cov
    d = mean - center
    return cov + np.outer(d, d)


def _spectral_norm(M: np.ndarray) -> float:
    """``||M||_2`` of a symmetric matrix: its largest absolute eigenvalue (no SVD)."""
    return float(np.abs(np.linalg.eigvalsh((M + M.T) / 2)).max())


def relative_change(state: RobustState, location, scatter) -> float:
    """Largest change of the fit, measured in the metric of the old scatter."""
    w, V = spread_directions(state.scatter)
    if not len(w):
        return 0.0
    W = V / np.sqrt(w)
    return change_in_metric(W, state.location, location, scatter)


def change_in_metric(W: np.ndarray, old_location, location, scatter) -> float:
    """``||W^T S W - I||_2 + ||W^T (m - m_old)||``: the change in the whitening ``W`` of the old scatter.

    From ``LANCZOS_MIN_FEATURES`` whitened directions on, the norm is the largest eigenvalue in
    magnitude by Lanczos iterations on ``v -> W^T (S (W v)) - v`` (:func:`_lanczos_norm`), without forming
    ``W^T S W``; narrower, and where Lanczos does not converge, ``W^T S W`` and all its eigenvalues.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        shift = W.T @ (location - old_location)
    norm = None
    if W.shape[1] >= LANCZOS_MIN_FEATURES:
        if not (np.all(np.isfinite(shift)) and np.all(np.isfinite(scatter))):
            return BIG_CHANGE  # as the dense route below; ARPACK on inf makes LAPACK complain on stderr
        norm = _lanczos_norm(W, scatter)
    if norm is None:
        with np.errstate(over="ignore", invalid="ignore"):
            shape = W.T @ scatter @ W - np.eye(W.shape[1])
        if not (np.all(np.isfinite(shape)) and np.all(np.isfinite(shift))):
            return BIG_CHANGE  # the scatter moved by more than float64 holds: far from converged
        norm = _spectral_norm(shape)
    return float(norm + np.linalg.norm(shift))


def _lanczos_norm(W: np.ndarray, scatter: np.ndarray) -> float | None:
    """``||W^T S W - I||_2`` by ARPACK's Lanczos iterations (``LANCZOS_TOL``, at most ``LANCZOS_MAXITER``
    restarts, a random start vector of a fixed seed: the same result every time), three matrix-vector
    products per iteration; None where it does not converge or meets a non-finite value (the caller
    forms the matrix).  ``scatter`` is finite (the caller checks)."""
    r = W.shape[1]
    v0 = np.random.default_rng(LANCZOS_SEED).standard_normal(r)
    with np.errstate(over="ignore", invalid="ignore"):
        op = LinearOperator((r, r), matvec=lambda v: W.T @ (scatter @ (W @ v)) - v, dtype=np.float64)
        try:
            value = eigsh(op, k=1, which="LM", v0=v0, tol=LANCZOS_TOL, maxiter=LANCZOS_MAXITER,
                          return_eigenvectors=False)
        except (ArpackNoConvergence, ArpackError, ValueError):
            return None
    norm = float(np.abs(value).max())
    return norm if np.isfinite(norm) else None


def remaining(change: float, rate: float) -> float:
    """Estimated distance to the fixed point after a step that moved by ``change``.

    The fixed point converges linearly with some rate ``rho``, so what is left
    is at most about ``change * rho / (1 - rho)``; ``rho`` is the ratio of
    the last two changes (on the sample, then on the full data).
    """
    rho = min(rate, MAX_RATE) if np.isfinite(rate) else 0.5
    return change * rho / (1.0 - rho)


def em_completed(res: BlockStats, plan: PassPlan, factors, fixed_center, starts) -> BlockStats:
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


def sample_in_units(sample: np.ndarray, unit_exp: int) -> np.ndarray:
    """A full-data step's row sample (as stored) in working units ``2**unit_exp``, far rows left out,
    as the estimator maps a cold fit's first sample."""
    with np.errstate(over="ignore"):
        sample = np.ldexp(sample, -unit_exp)
    far = ((sample > FAR_ROW) | (sample < -FAR_ROW)).any(axis=1)  # rows with gaps stay (a partial fit's)
    return sample[~far] if far.any() else sample  # boolean temporaries, no copy: 160 MB at p = 1000


def archive_repeats(state: RobustState, sample: np.ndarray, unit_exp: int, to_stored=None) -> bool:
    """Set ``state``'s repeated values and rows to those of ``sample`` (rows as stored, drawn from
    the whole archive in a full-data step); True where they changed.  ``to_stored``: see
    :func:`._repeated.find_repeated`."""
    found = find_repeated(sample_in_units(sample, unit_exp), to_stored)
    before = (state.repeated, state.repeated_rows)
    state.repeated, state.repeated_rows = found
    return not all(np.array_equal(b[:0] if a is None else a, b) for a, b in zip(before, found, strict=True))
