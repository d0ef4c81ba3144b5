"""How :class:`~dask_mcpca.MCPCA` is fitted: from full-row blocks to a typed :class:`FitResult`.

:func:`fit_rows` makes the first read (moments, a row sample and the NaN
check) and hands over to one solver: :func:`._paper.fit_paper` (Algorithms
1-3 as published) or :func:`._robust.fit_robust` (the default), or refits
warm from the previous fit's robust state; data with fewer rows than
``n_features + 2`` are fitted in the span of the rows (:mod:`._update` holds
:meth:`MCPCA.partial_fit`'s update by new rows in one pass). The first read,
the robust stage and the model's assembly are apart (:func:`first_read`,
:func:`robust_stage`, :func:`finish_fit`) so that :mod:`._fit_modes` runs
them once per operating mode. :func:`fit_rows` reads only the estimator's
constructor parameters and returns a :class:`FitResult`, built once at the
end and never changed, which the estimator copies onto itself in one place. The
helpers compute values and return them: the model as a
:class:`._fit_result.ModelView` (what :mod:`._model`'s algebra reads while
the fit is assembled: distances, the repeated rows, the outlier cutoff), the
kept sums as :class:`._fit_result.UpdateSums`.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any, NamedTuple

import dask.array as da
import numpy as np
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning

from . import _cells, _checkpoint, _shift
from ._block import PassPlan
from ._distances import breakdown_flags, calibrated_d2, mahalanobis_d2, sample_d2
from ._fit_result import FitResult, ModelView, fit_result, model_view, update_sums, with_cutoff
from ._io import as_row_blocks
from ._model import contamination_cutoff, repeated
from ._paper import fit_paper, sample_variances
from ._passes import NonFiniteRowsError, NumericalRangeError, PassRunner, nonfinite_rows_message, spread_blocks
from ._power import descending_eigh, direction_floors, orient_rows
from ._repeated import quantization_steps, saturation_limits
from ._robust import DEFAULT_TOL as _robust_tol
from ._robust import fit_robust
from ._robust_step import FAR_ROW, RobustState, working_exponent
from ._robust_warm import warm_step
from ._scale import in_model_units, robust_scales
from ._schedule import OUTLIER_QUANTILE, calibrated_cutoff, outlier_cutoff_d2, robust_kernel_size2
from ._start import outlyingness

__all__ = ["SPREAD_ROWS_PER_FEATURE", "FitResult", "finish_fit", "fingerprint_params", "first_read", "fit_rows",
           "robust_stage", "solver_limits", "variances_in_data_units"]

#: ``tol=None``: the paper solver's power-iteration tolerance; the default solver's is its own
#: (:data:`._robust.DEFAULT_TOL`, one home for it).
DEFAULT_TOL = {"paper": 1e-6, "auto": _robust_tol}
DEFAULT_MAX_ITER = {"paper": 100, "auto": 3}

#: Below this ``kernel_factor`` a fit rests on a few rows and ``fit`` warns.
#: The default solver's flat top then holds less than the half of the rows
#: its coverage guarantee keeps (the radius scales with ``kernel_factor**2``)
#: and its variances are biased: on Gaussian data (n = 20000, p = 3) 0.3 gave
#: the second variance 16 % too high and 0.1 the first 45 % too low, while
#: 0.5 was within 3 %.  The paper's solver (n = 2000, p = 3) flagged 53 % of
#: the clean rows at 0.01 and 98 % at 0.001, with ``converged_`` True.
MIN_KERNEL_FACTOR = 0.5

#: Accepted chance that the row sample of the robust start is too small.
SAMPLE_SHORT_PROB = 1e-9


# ------------------------------------------------------------------ helpers
#: A first read samples a spread of the blocks (:func:`._passes.spread_blocks`) only where those blocks hold
#: at least this many rows per feature (plus 2): a dask array keeps its own row chunks, and a spread of 32
#: one-row blocks gave the robust start 32 rows for 40 features (refused); it reads every block instead.
SPREAD_ROWS_PER_FEATURE = 10


def _least_sample_size(needed: int) -> int:
    """Smallest ``sample_size`` whose row sample holds ``needed`` rows but with ``SAMPLE_SHORT_PROB``.

    Each row is kept with probability ``sample_size / n``, so the sample's
    size is binomial, with a lower tail below that of Poisson(``sample_size``);
    checking the Poisson tail makes whether a fit can start independent of
    the seed (a ``sample_size`` just above ``needed`` failed on some seeds).
    """
    from scipy.stats import poisson

    lo, hi = needed, 2 * needed + 64
    while poisson.cdf(needed - 1, hi) > SAMPLE_SHORT_PROB:
        hi *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if poisson.cdf(needed - 1, mid) <= SAMPLE_SHORT_PROB else (mid + 1, hi)
    return lo


def variances_in_data_units(lam_w: np.ndarray, unit: int) -> np.ndarray:
    """Variances from working units ``2**unit`` to the data's units, or a named error.

    The largest variance must be a normal float64; the smaller ones may
    underflow, as they would beside it in any float64 eigendecomposition.
    """
    with np.errstate(over="ignore", under="ignore"):
        lam = np.ldexp(lam_w, 2 * unit)
    top = lam.max(initial=0.0)
    if lam_w.max(initial=0.0) > 0 and not (np.isfinite(top) and top >= np.finfo(np.float64).tiny):
        where = "above the largest" if not np.isfinite(top) else "below the smallest normal"
        power = -100 if not np.isfinite(top) else 100
        exponent = float(np.log10(lam_w.max())) + 2 * unit * float(np.log10(2.0))
        raise NumericalRangeError(
            f"the robust variances of these data (the largest about 1e{exponent:.0f}) are {where} float64 "
            f"number and cannot be reported; multiply the data by a power of two such as 2**{power} "
            "before fitting: the components do not change and the variances scale by its square"
        )
    return lam


def _in_working_units(rows: np.ndarray) -> tuple[np.ndarray, int]:
    """In-memory rows (wide data) in the fit's working units ``2**unit``, or a named error.

    As for a fit by passes (:func:`._robust_step.working_exponent`); here every
    row enters the SVD, so a row beyond ``FAR_ROW`` spreads cannot be left
    out of the arithmetic and is refused instead.
    """
    unit = working_exponent(rows, np.zeros(0), np.zeros(0))
    with np.errstate(over="ignore"):
        scaled = np.ldexp(rows, -unit)
    if not np.all(np.abs(scaled) <= FAR_ROW):
        raise NumericalRangeError(
            "wide data (fewer rows than n_features + 2): some rows lie more than ~1e120 spreads from the "
            "others, too far for float64 to hold their distances in one fit; remove them"
        )
    return scaled, unit


def fingerprint_params(est) -> dict:
    """The parameters that make a fit's state: those a checkpoint must have been written with."""
    params = est.get_params()
    params.pop("checkpoint"), params.pop("progress"), params.pop("contamination")  # no effect on the fit's state
    return params


# ---------------------------------------------------------------------- fit
def solver_limits(est) -> tuple[float, int]:
    """The solver's ``tol`` and ``max_iter``: the estimator's, or the solver's defaults."""
    tol = est.tol if est.tol is not None else DEFAULT_TOL[est.solver]
    max_iter = est.max_iter if est.max_iter is not None else DEFAULT_MAX_ITER[est.solver]
    return tol, max_iter


def fit_rows(X, est, *, warm: tuple[RobustState, int] | None = None) -> FitResult:
    """The fit proper, on full-row blocks; see :meth:`MCPCA.fit`.

    Parameters
    ----------
    X : ndarray or dask array of shape (n_samples, n_features)
        Full-row blocks (:func:`._io.as_row_blocks`), at least 2 rows.
    est : MCPCA
        The estimator; only its constructor parameters are read.
    warm : (RobustState, int, ndarray or None), optional
        The previous fit's robust state, its working unit and its
        ``scale_``, for ``warm_start``; used when the width, ``center``
        and ``scale`` allow.

    Returns
    -------
    FitResult
    """
    n, p = X.shape
    k = p if est.n_components is None else est.n_components
    if k > p:
        raise ValueError(f"MCPCA: parameter n_components={k} is invalid; X has only {p} features")
    needed = p + 2 if (est.solver == "auto" or est.center == "robust") else 2
    if n < needed and est.solver == "auto" and k <= n - 2:
        return _fit_in_span(X, est, k)
    if n < needed:
        raise ValueError(
            f"X has {n} rows and {p} features; solver={est.solver!r} with center={est.center!r} "
            f"needs at least {needed} rows (or, with solver='auto', n_components <= {n - 2} to fit "
            "in the span of the rows)"
        )
    least = needed if n <= est.sample_size else _least_sample_size(needed)
    if n > est.sample_size < least:
        raise ValueError(
            f"MCPCA: parameter sample_size={est.sample_size} is invalid; the robust start "
            f"needs a row sample of at least {needed} rows (n_features + 2); the sample's size "
            f"varies with the seed, so sample_size must be at least {least}"
        )
    solver = est.solver
    if est.kernel_factor < MIN_KERNEL_FACTOR:
        warnings.warn(
            f"MCPCA: kernel_factor={est.kernel_factor} < {MIN_KERNEL_FACTOR} shrinks the kernels until the "
            "fit rests on a few rows: its variances are biased and many clean rows may be flagged; "
            f"use kernel_factor >= {MIN_KERNEL_FACTOR}",
            UserWarning,
            stacklevel=3,
        )
    tol, max_iter = solver_limits(est)
    runner = PassRunner(X, nan_policy=est.nan_policy, progress=est.progress,
                        names=getattr(est, "feature_names_in_", None))
    ckpt = _checkpoint.Checkpoint.open(est.checkpoint, params=fingerprint_params(est), shape=(n, p))

    seed = 0 if est.random_state is None else est.random_state
    warm = _warm_state(est, warm, p) if solver == "auto" else None
    refit = None if warm is None else _warm_refit(est, runner, *warm, seed=seed, max_iter=max_iter)
    if refit is not None:
        robust, moments, unit = refit
        start = _Start(moments, moments, unit, robust, runner.scale, None)
    else:
        start = _cold_fit(est, runner, ckpt, seed=seed, max_iter=max_iter)
    return finish_fit(est, runner, start, k=k, tol=tol, max_iter=max_iter, ckpt=ckpt)


def finish_fit(est, runner, start: _Start, *, k: int, tol: float, max_iter: int, ckpt=None) -> FitResult:
    """The model from where the robust stage left it (``start``): the paper solver's steps where
    ``est.solver="paper"``, then the components, the cutoff and the kept sums, as a :class:`FitResult`."""
    if ckpt is None:
        ckpt = _checkpoint.Checkpoint.open(None, params={}, shape=(runner.n_rows, runner.n_features))
    p = runner.n_features
    solver = est.solver
    moments, work, unit, robust = start.moments, start.work, start.unit, start.robust
    fixed = {"mean": work.mean[0], False: np.zeros(p)}.get(est.center)
    center = robust.location if robust is not None else fixed
    sample = moments.sample if moments.sample is not None else np.empty((0, p))
    steps = quantization_steps(sample)  # before the cutoff, which is calibrated on cells
    limits = None
    if robust is not None:  # before the cutoff, which judges a saturated cell as censored
        stuck = None if robust.repeated is None else robust.repeated.copy()
        if stuck is not None:
            stuck[:, 1] = np.ldexp(stuck[:, 1], unit)  # to the sample's units, as repeated_values_ are
        limits = saturation_limits(sample, steps, stuck)
    known = {"n_features_in_": p, "quantization_steps_": steps, "saturation_limits_": limits,
             "scale_": start.scale, "cell_cutoff_": start.cell_cutoff}
    if solver == "auto":
        view, spectrum = _from_robust(robust, k, moments, unit, kernel_factor=est.kernel_factor, known=known)
        n_iter, converged = robust.n_iter, robust.converged
    else:
        scatter0 = work.covariance(about=center)
        if not np.all(np.isfinite(scatter0)):
            raise NumericalRangeError(
                "solver='paper': the unweighted scatter of the data about the centre (Algorithm 3, line 1, "
                "where its kernel sizes start) overflows float64: rows far beyond the bulk, near the "
                "float64 limit, dominate it; use solver='auto', or remove those rows"
            )
        state = fit_paper(runner, center=center, scatter0=scatter0, n_components=k, eta=est.eta,
                          n_decay=est.n_decay, kernel_factor=est.kernel_factor, tol=tol, max_iter=max_iter,
                          state=ckpt.load("paper"), on_step=lambda s: ckpt.save("paper", s))
        view = _from_paper(state, center, scatter0, k, unit, sample=work.sample, known=known)
        n_iter = state.n_iter
        converged = state.converged and (robust is None or robust.converged)
    final = getattr(runner, "last_sums", None) if solver == "auto" else None  # the final pass, over every row
    if est.contamination != "auto":
        view = with_cutoff(view, contamination_cutoff(view, sample, est.contamination))
    if moments.segments and est.contamination == "auto":  # the shift rule's spread, under the model complete;
        # a share of rows flagged that the user fixed has no rule adding to it
        view = replace(view, shift_scale_=_shift.shift_scales(view, moments.segments))
    unconverged = breakdown = None
    if not converged:
        unconverged = (
            f"MCPCA(solver={solver!r}) stopped before converging (tol={tol}, max_iter={max_iter}, "
            f"{runner.n_passes} passes); raise max_iter or tol"
        )
    if solver == "auto":
        rows = _cells.breakdown_rows(sample)
        # the robust stage's health, judged under every component: with k < p the discarded directions share
        # one variance, and a loud channel's cells look unexplained (p = 300, k = 10: 93 % of clean rows)
        judged = view if k >= p or robust is None else _robust_view(
            robust, p, unit, kernel_factor=est.kernel_factor, known=known, spectrum=spectrum)[0]
        breakdown = _cells.breakdown_message(breakdown_flags(judged, rows), view.support_ if view.support_ else np.nan,
                                             cellwise=view.cell_cutoff_ is not None)
    return fit_result(
        view,
        None if final is None else update_sums(robust, final, unit),
        n_samples_=int(moments.n_rows), n_samples_partial_=0 if final is None else int(final.n_partial),
        n_iter_=n_iter, converged_=converged, n_passes_=runner.n_passes,
        n_partial_reads_=runner.n_partial_reads, n_blocks_read_=runner.n_blocks_read,
        robust_state=robust if solver == "auto" else None,
        robust_unit=unit,  # the working unit the robust state is in (for warm_start)
        unconverged=unconverged, breakdown=breakdown,
    )


class _Start(NamedTuple):
    """Where the fit stands after its first read and robust stage (:func:`_cold_fit`, :func:`_warm_refit`)."""

    moments: Any  # the first read's moments, as stored
    work: Any  # the same in working units, with the mapped sample
    unit: int  # the working unit 2**unit
    robust: RobustState | None  # the robust state, None for none
    scale: np.ndarray | None  # the channels' robust scales (scale="robust"), None for none
    cell_cutoff: float | None  # the cellwise fit's cell cutoff, None for a rowwise fit


def _cold_fit(est, runner, ckpt, *, seed: int, max_iter: int) -> _Start:
    """The first read (:func:`first_read`), then the robust stage (:func:`robust_stage`).

    The first read is a full pass, except for the default solver with
    ``center`` robust or False on a store of many row blocks and no
    ``checkpoint``: it then
    reads a spread of the blocks (:func:`._passes.spread_blocks`), and
    the robust stage's passes count the rows and check them for NaN.
    The working unit is chosen from the first read's row sample, full or
    partial alike, and the sample is mapped to it.

    Returns the first read's moments (as stored), the same in working
    units (``work``, with the mapped sample), the unit, the robust state,
    the channels' scales and the cell cutoff, as a :class:`_Start`.
    """
    # a checkpointed fit reads every block first: the checkpoint's data fingerprint is then the whole
    # archive's, not a spread of its blocks' (another archive sharing those blocks was resumed from it)
    moments, partial_sample, rate = first_read(est, runner, ckpt, seed=seed, spread=est.checkpoint is None)
    return robust_stage(est, runner, moments, partial_sample, ckpt=ckpt, seed=seed, max_iter=max_iter,
                        archive_sample_rate=rate)


def first_read(est, runner, ckpt, *, seed: int, spread: bool = True):
    """The first read: the moments, the row sample (its complete rows, and apart those with missing
    cells), runs of consecutive rows (``segments``, :mod:`._shift`) and the NaN check, over a spread
    of the blocks where :func:`_cold_fit` says (``spread``),
    and the rate at which the robust stage's first pass samples the whole archive then (0: a full read).
    """
    n, p = runner.n_rows, runner.n_features
    solver = est.solver
    blocks = spread_blocks(runner.n_blocks, p) if spread and solver == "auto" and est.center != "mean" else None
    if blocks is not None and runner.block_rows()[blocks].sum() < min(SPREAD_ROWS_PER_FEATURE * (p + 2), n):
        blocks = None  # small blocks (a dask array's own row chunks): the spread would hold too few rows to sample
    rows_read = n if blocks is None else int(runner.block_rows()[blocks].sum())
    rate = min(1.0, est.sample_size / rows_read)
    plan = PassPlan(center=np.zeros(p), sample_rate=rate, seed=seed, sample_partial=est.nan_policy == "partial")
    read = range(runner.n_blocks) if blocks is None else blocks  # runs of rows to learn the shift rule from
    moments = runner.run(plan, label="moments" if blocks is None else "row sample", blocks=blocks,
                         runs=_shift.run_plan(runner.block_rows(), read, p))
    gaps = np.isnan(moments.sample).any(axis=1)
    partial_sample = moments.sample[gaps]  # rows with missing cells ("partial"): the EM part of the sample stage
    moments.sample = moments.sample[~gaps]
    ckpt.check_data(moments.in_units(0))
    if moments.n_rows < 2:
        raise ValueError(f"only {moments.n_rows} usable row(s); at least 2 are needed")
    if blocks is not None:  # the share of usable rows in the blocks read, until a full pass counts them
        moments.n_rows = round(moments.n_rows * n / rows_read)
    return moments, partial_sample, (0.0 if blocks is None else min(1.0, est.sample_size / n))


def robust_stage(est, runner, moments, partial_sample: np.ndarray, *, ckpt, seed: int, max_iter: int,
                 archive_sample_rate: float = 0.0) -> _Start:
    """From the first read (``moments``, its complete sample rows; ``partial_sample``, those with
    missing cells) to the robust state: the channels' scales, the working unit, then
    :func:`._robust.fit_robust`'s passes through ``runner``; see :func:`_cold_fit`."""
    p, solver = runner.n_features, est.solver
    scale = None
    if getattr(est, "scale", None) == "robust":  # every later pass and all the fit's work: X / scale_
        runner.scale = scale = robust_scales(moments.sample)
        moments, partial_sample = _to_scaled(moments, partial_sample, runner.scale)

    # Working units (see _block): every later pass and the in-memory work
    # see X * 2**-unit, whose bulk has a spread near 1; results are mapped
    # back at the end.  A power of two, so the scaling is exact and c * X
    # for c a power of two gives bit for bit the same fit, scaled.
    unit = working_exponent(moments.sample, moments.col_min, moments.col_max)
    runner.unit_exp = unit
    work = moments.in_units(unit)
    with np.errstate(over="ignore"):  # far rows overflow to inf; fit_robust leaves them out
        work.sample = np.ldexp(moments.sample, -unit) if moments.sample is not None else None
    fixed = {"mean": work.mean[0], False: np.zeros(p)}.get(est.center)
    if fixed is not None and not np.all(np.isfinite(fixed)):
        raise NumericalRangeError(
            "center='mean': the mean of these data lies beyond float64's range in the units of their "
            "bulk (rows near the float64 limit dominate it); use center='robust'"
        )
    robust = None
    cellwise = bool(getattr(est, "cellwise", False)) and solver == "auto"
    # read before the cutoff is calibrated: the rows are judged on their good cells
    cell_cutoff = _cells.cell_cutoff2() if cellwise else None
    if solver == "auto" or est.center == "robust":
        with np.errstate(over="ignore"):
            partial_sample = np.ldexp(partial_sample, -unit)
        robust = fit_robust(
            runner,
            moments=work,
            partial_sample=partial_sample,
            fixed_center=fixed,
            kernel_factor=est.kernel_factor,
            tol=None if solver == "paper" else est.tol,
            max_passes=DEFAULT_MAX_ITER["auto"] if solver == "paper" else max_iter,
            state=ckpt.load("robust"),
            on_step=lambda s: ckpt.save("robust", s),
            seed=seed,
            final_step=solver == "auto",
            archive_sample_rate=0.0 if cellwise else archive_sample_rate,
            cellwise=cellwise,
        )
    if runner.n_usable_rows is not None:
        moments.n_rows = work.n_rows = runner.n_usable_rows
    return _Start(moments, work, unit, robust, scale, cell_cutoff)


def _to_scaled(moments, partial_sample: np.ndarray, scale: np.ndarray):
    """The first read's statistics of ``X / scale`` from those of ``X`` (exact up to round-off: the
    mean divides by ``scale``, the scatter by its outer product), without reading the rows again."""
    with np.errstate(over="ignore", under="ignore"):
        scaled = replace(
            moments, mean=moments.mean / scale, scatter=moments.scatter / np.outer(scale, scale),
            sample=in_model_units(moments.sample, scale), col_min=moments.col_min / scale,
            col_max=moments.col_max / scale,
        )
    return scaled, in_model_units(partial_sample, scale)


def _warm_state(est, warm, p: int):
    """The previous fit's robust state, working unit and scales, if ``warm_start`` and one of the same
    width and ``scale`` exists (a state is in the units of its fit's scales).  A cellwise fit starts
    cold: the warm passes weigh whole rows (a warm cellwise refit was the row-wise fit)."""
    state = None if warm is None else warm[0]
    if not est.warm_start or est.center == "mean" or est.cellwise or state is None or len(state.location) != p:
        return None
    if (warm[2] is not None) != (getattr(est, "scale", None) == "robust"):
        return None
    return warm  # the unit is set with every robust state


def _warm_refit(est, runner, state, unit: int, scale, *, seed: int, max_iter: int):
    """A warm start: the previous fit's state goes straight into the full-data passes.

    Units: the previous state is in the previous fit's working unit, so the
    warm step runs in that unit; :func:`._robust.warm_step` then chooses
    the unit from the new data's row sample, as a cold fit would, and maps
    the state to it (exactly: powers of two) if it changed, so a warm
    refit works in the unit a cold fit of the same data would.  Where the
    mapped state is not representable (the data's scale changed by
    ~1e150 or more) the warm start is refused: None, and the caller makes
    a cold fit (the warm step's pass then counts as one more pass).
    With ``scale="robust"`` the refit keeps the previous fit's scales
    (``scale``), in which the state is expressed.
    """
    n, p = runner.n_rows, runner.n_features
    runner.scale = scale
    fixed = {False: np.zeros(p)}.get(est.center)
    rate = min(1.0, est.sample_size / n)
    runner.unit_exp = unit
    moments, state = warm_step(runner, state, fixed_center=fixed, sample_rate=rate, seed=seed)
    if state is None:
        runner.scale = None  # the cold fit learns its own
        return None
    robust = fit_robust(
        runner,
        moments=moments,
        fixed_center=fixed,
        kernel_factor=est.kernel_factor,
        tol=est.tol,
        max_passes=max_iter,
        state=state,
        seed=seed,
    )
    return robust, moments, runner.unit_exp


def _fit_in_span(X, est, k: int) -> FitResult:
    """Wide data (fewer than ``n_features + 2`` rows): a robust fit in k dimensions of the rows' span.

    As ROBPCA does: the rows, centred at their coordinatewise median,
    span at most n - 1 dimensions; their outlyingness in that span picks
    the least outlying half, whose principal axes give k robust
    directions; the default solver then fits the rows' coordinates along
    them (k <= n - 2, so it has the rows it needs), and the result is
    mapped back.  Distances (and flags) are measured within the k
    directions, plus the distance from them in units of
    ``noise_variance_``, the half's median squared residual per discarded
    direction; the cutoff is calibrated on the rows' distances.  The rows
    are read into memory (they are fewer than the features).
    """
    rows = np.asarray(X.compute() if isinstance(X, da.Array) else X, dtype=np.float64)
    finite = np.isfinite(rows).all(axis=1)
    if not finite.all():
        if est.nan_policy == "raise":
            raise NonFiniteRowsError(nonfinite_rows_message(int((~finite).sum()), len(rows)))
        rows = rows[finite]
    scale = robust_scales(rows) if getattr(est, "scale", None) == "robust" else None
    rows = in_model_units(rows, scale)  # the rows' robust scales, from every row: they are few
    n, p = rows.shape
    if k > n - 2:
        raise ValueError(f"only {n} usable rows for n_components={k}: fitting in their span needs k <= n - 2")
    seed = 0 if est.random_state is None else est.random_state
    data_rows, rows, unit = rows, *_in_working_units(rows)
    origin = np.zeros(p) if est.center is False else np.median(rows, axis=0)
    _, sv, Vt = np.linalg.svd(rows - origin, full_matrices=False)
    span = Vt[: int(np.sum(sv > sv[0] * max(n, p) * np.finfo(float).eps))].T if sv[0] > 0 else Vt[:1].T
    scores = (rows - origin) @ span
    h = min(n, max(int(np.ceil(n / 2)), k + 2))
    half = np.argsort(outlyingness(scores, seed=seed), kind="stable")[:h]
    _, W = descending_eigh(np.atleast_2d(np.cov(scores[half], rowvar=False)))
    basis = span @ W[:, :k]  # p x k, orthonormal columns
    inner_est = clone(est).set_params(n_components=None, checkpoint=None, **(
        {"scale": None} if "scale" in est.get_params() else {}))
    inner = fit_rows(as_row_blocks((rows - origin) @ basis), inner_est)
    if inner.unconverged:
        warnings.warn(inner.unconverged, ConvergenceWarning, stacklevel=4)
    centred = rows[half] - origin
    residual2 = np.einsum("ij,ij->i", centred, centred) - np.sum((centred @ basis) ** 2, axis=1)
    noise = np.full(p - k, max(float(np.median(residual2)), 0.0) / (p - k)) if p > k else np.empty(0)
    lam = variances_in_data_units(np.concatenate([inner.explained_variance_, noise]), unit)
    lam, noise = lam[:k], lam[k:]
    location = np.ldexp(origin + inner.mean_ @ basis.T, unit)
    view = model_view(orient_rows(inner.components_ @ basis.T), lam, noise, lam.sum() + noise.sum(), location,
                       inner.kernel_scale_, n_features_in_=p, support_=inner.support_,
                       quantization_steps_=np.zeros(p),  # too few rows to tell a lattice
                       scale_=scale)
    d2 = mahalanobis_d2(view, data_rows)
    view = with_cutoff(view, calibrated_cutoff(d2, OUTLIER_QUANTILE, p=k, n_effective=inner.support_ * n,
                                                law="fitted"))
    if est.contamination != "auto":
        view = with_cutoff(view, contamination_cutoff(view, data_rows, est.contamination))
    return fit_result(view, n_samples_=n, n_iter_=inner.n_iter_, converged_=inner.converged_,
                   n_samples_partial_=0,  # rows with a gap were left out above
                   n_passes_=1, n_partial_reads_=0, n_blocks_read_=0, robust_state=None)


# ------------------------------------------------------- fitted attributes
def _robust_view(robust, k, unit, *, kernel_factor: float, known: dict[str, Any], spectrum=None):
    """The model of ``k`` components from the robust state's final, inclusive step (its core fixed point
    without one), in the data's units, before its cutoff is calibrated; and the scatter's descending
    eigenvalues (data units) and eigenvectors, ``spectrum``, where the caller has them from an earlier call
    (one eigendecomposition of the scatter: 0.2 s at p = 1000)."""
    final = robust.final_scatter is not None
    scatter = robust.final_scatter if final else robust.scatter
    location = robust.final_location if final else robust.location
    support = robust.support if final else robust.core_support
    if spectrum is None:
        lam, V = descending_eigh(scatter)
        spectrum = variances_in_data_units(np.maximum(lam, 0.0), unit), V
    lam, V = spectrum
    kernel_scale = np.sqrt(robust_kernel_size2(len(lam))) * kernel_factor
    repeated_values = np.empty((0, 2)) if robust.repeated is None else robust.repeated.copy()
    repeated_values[:, 1] = np.ldexp(repeated_values[:, 1], unit)  # exact: a power of two
    found = {"repeated_values_": repeated_values}
    if robust.repeated_rows is not None:
        found["repeated_rows_"] = np.ldexp(robust.repeated_rows, unit)
    view = model_view(orient_rows(V[:, :k].T), lam[:k], lam[k:], lam.sum(), np.ldexp(location, unit),
                      kernel_scale, support_=float(support), **found, **known)
    return view, lam, V


def _from_robust(robust, k, moments, unit, *, kernel_factor: float, known: dict[str, Any]) -> tuple:
    """The model from the final, inclusive step of the last pass, with its calibrated cutoff; and the
    scatter's spectrum (:func:`_robust_view`'s ``spectrum``).

    Without a full-data step (a fit resumed from a checkpoint that had
    converged) the core fixed point gives it.  The robust state is in
    working units ``2**unit``; it is mapped back to the data's units here.
    The outlier cutoff is then calibrated on the sample's distances under
    the fitted model (:func:`._schedule.calibrated_cutoff`), at the
    effective number of rows.  ``known`` holds the fields fixed before
    (the scales, the quantization steps, the saturation limits...).
    """
    view, lam, V = _robust_view(robust, k, unit, kernel_factor=kernel_factor, known=known)
    support = view.support_
    # the dimensions the distances count: a round-off direction (a constant channel's 1e-15, or 0.0, as the
    # blocks' sums happened to round) is floored in them and counts for none (_precision.floored_variances)
    rank = int(np.sum(lam > direction_floors(lam, V, (V**2) @ lam)))
    free = moments.sample[~repeated(view, moments.sample)]  # both in data units
    n_effective = support * moments.n_rows
    cutoff = calibrated_cutoff(calibrated_d2(view, free, sample_d2(view, free)), OUTLIER_QUANTILE, p=max(rank, 1),
                               n_effective=n_effective, law="fitted")
    if not np.isfinite(cutoff):  # too few rows to calibrate on (n <= p + 1): the Gaussian quantile
        cutoff = outlier_cutoff_d2(max(rank, 1))
    return with_cutoff(view, cutoff), (lam, V)


def _from_paper(state, center, scatter0, k, unit, *, sample, known: dict[str, Any]) -> ModelView:
    """The model from the paper solver's last step (``known`` as for :func:`_from_robust`); the
    components' variances and the discarded total from the row ``sample`` (:func:`._paper.sample_variances`;
    all in working units; the solver's own weighted variances where no sample row is left)."""
    # The power iteration stops within tol of K's eigenvector, so rows are
    # orthogonal only to ~tol; Gram-Schmidt in order makes them exactly so.
    q, r = np.linalg.qr(np.array(state.components).T)
    components = orient_rows((q * np.sign(np.diag(r))).T)
    variances = np.maximum(np.array(state.variances), 0.0)
    kept, rest = sample_variances(sample, center, components, k)
    if kept is not None:
        variances = kept
    if rest is None:  # no sample row: the unweighted trace less the kept variances
        rest = max(float(np.trace(scatter0)) - float(variances.sum()), 0.0)
    total = float(variances.sum()) + rest
    rest_lam = np.full(len(center) - k, rest / (len(center) - k)) if k < len(center) else np.empty(0)
    lam = variances_in_data_units(np.concatenate([variances, rest_lam]), unit)
    kernel_scale = np.sqrt(robust_kernel_size2(len(center)))
    return model_view(components, lam[:k], lam[k:], np.ldexp(total, 2 * unit), np.ldexp(center, unit),
                       kernel_scale, sigmas_=np.ldexp(np.array(state.sigmas), unit), **known)
