"""``solver="auto"``: the robust default, all components in a handful of passes.

The paper's schedule fails in more than three dimensions for three reasons
(issue 4): the kernel shrinks far below the noise level, the start is the
ordinary PCA that outliers have already captured, and the weight of a row
looks only at its distance from one candidate line.  The default keeps the
maximum correntropy criterion and removes the three causes:

1. **Robust start, in memory, from a row sample** drawn during the first pass:
   the deterministic starts of DetMCD (Hubert, Rousseeuw and Verdonck, 2012),
   each improved by concentration steps and ranked by the determinant of its
   half-sample covariance, so no minority of outliers, however tight, can
   capture the start.
2. **The general kernel of eq. (1)**: each row is weighted by
   ``exp(-d^2 / (2 c^2))`` with ``d^2`` its Mahalanobis distance under the
   current robust scatter, i.e. its reconstruction error in every direction at
   once, scaled by that direction's spread.
3. **A kernel size tied to the robust scatter** (see :mod:`._schedule`) that
   stops where efficiency on Gaussian data would be lost.
4. **A final re-weighting step in the same passes**: every full-data pass also
   evaluates a flat-top kernel (weight 1 up to the chi-square 95 % quantile
   of ``d^2``, the same Gaussian fall-off beyond) from the same location and
   scatter.  Its covariance, from the last pass, gives the components: the
   Gaussian kernel, which weighs typical rows down too, found the inliers;
   the flat top recovers PCA's efficiency on them (benchmarks/ACCURACY.md).

The correntropy fixed point ``mu = sum g x / sum g``,
``Sigma = (1 + 1/c^2) sum g (x - mu)(x - mu)^T / sum g`` is first iterated to
convergence on the sample (free: it is in memory), then on the full data, one
pass per step; at the Gaussian it contracts by ``1 / (1 + c^2)`` per step, so a
few passes finish it.  All p components come from one p x p eigendecomposition.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from ._block import PassPlan
from ._passes import PassResult, PassRunner
from ._power import descending_eigh
from ._schedule import consistency_factor, flat_top_consistency, flat_top_radius2, robust_kernel_size2

__all__ = ["RobustState", "robust_start", "fit_robust", "step_plan", "precision", "SAMPLE_SIZE"]

#: Rows drawn during the first pass for the in-memory robust start.
SAMPLE_SIZE = 20_000

#: Concentration steps per DetMCD start on the sample.
MAX_C_STEPS = 100

#: Fixed-point steps on the in-memory sample.
MAX_SAMPLE_STEPS = 500


@dataclass
class RobustState:
    """Location, scatter and bookkeeping of the robust fit (checkpointable)."""

    location: np.ndarray
    scatter: np.ndarray
    kernel_size2: float
    n_iter: int = 0
    converged: bool = False
    last_change: float = float("nan")  # change made by the last full-data step
    # The final re-weighting step from the state before the last full-data
    # pass (None until one ran): its location and consistent scatter.
    final_location: np.ndarray | None = None
    final_scatter: np.ndarray | None = None


def precision(scatter: np.ndarray) -> np.ndarray:
    """Pseudo-inverse of a scatter matrix; directions without spread get 0."""
    w, V = np.linalg.eigh((scatter + scatter.T) / 2)
    floor = max(w.max(), 0.0) * len(w) * np.finfo(float).eps * 1e3
    inv = np.where(w > floor, 1.0 / np.where(w > floor, w, 1.0), 0.0)
    return (V * inv) @ V.T


def _mahalanobis2(Y: np.ndarray, scatter: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", Y @ precision(scatter), Y)


def _mad(Z: np.ndarray) -> np.ndarray:
    return stats.median_abs_deviation(Z, axis=0, scale="normal")


def _detmcd_starts(Z: np.ndarray) -> list[np.ndarray]:
    """Deterministic scatter starts of DetMCD for standardised data ``Z``."""
    n = len(Z)
    ranks = stats.rankdata(Z, axis=0)
    norms = np.linalg.norm(Z, axis=1, keepdims=True)
    signs = Z / np.where(norms > 0, norms, 1.0)
    transforms = [
        np.tanh(Z),  # S1: hyperbolic tangent
        ranks,  # S2: Spearman
        stats.norm.ppf((ranks - 1 / 3) / (n + 1 / 3)),  # S3: normal scores
        signs,  # S4: spatial signs
        Z,  # classical: best on clean data
    ]
    return [np.atleast_2d(np.cov(T, rowvar=False)) for T in transforms]


def _start_from_shape(Z: np.ndarray, shape: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Robust scales along the eigenvectors of ``shape`` (DetMCD, step 2)."""
    _, E = descending_eigh(shape)
    B = Z @ E
    scales = _mad(B)
    scales = np.where(scales > 0, scales, np.std(B, axis=0))
    return E @ np.median(B, axis=0), (E * scales**2) @ E.T


def _c_steps(Z, mu, scatter, h):
    """Concentration steps of FastMCD; returns (mu, scatter, (rank, log pseudo-det)).

    Starts are ranked by that key: a lower rank is an exact fit and wins; a
    constant or duplicate column lowers every start's rank alike and leaves
    the ranking to the spread in the other directions.
    """
    prev = None
    for _ in range(MAX_C_STEPS):
        d2 = _mahalanobis2(Z - mu, scatter)
        subset = np.argpartition(d2, h - 1)[:h]
        key = np.sort(subset)
        if prev is not None and np.array_equal(key, prev):
            break
        prev = key
        mu = Z[subset].mean(axis=0)
        scatter = np.atleast_2d(np.cov(Z[subset], rowvar=False))
    w = np.linalg.eigvalsh(scatter)
    w = w[w > max(w.max(), 0.0) * len(w) * np.finfo(float).eps * 1e3]
    return mu, scatter, (len(w), float(np.log(w).sum()))


def robust_start(sample: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DetMCD location and scatter of an in-memory row sample.

    The scatter is scaled so that the median squared Mahalanobis distance is
    the chi-square median, as it is for Gaussian rows.
    """
    n, p = sample.shape
    med = np.median(sample, axis=0)
    scale = _mad(sample)
    spread = np.std(sample, axis=0)
    scale = np.where(scale > 0, scale, np.where(spread > 0, spread, 1.0))
    Z = (sample - med) / scale
    h = min(n, (n + p + 1) // 2)
    best = None
    for shape in _detmcd_starts(Z):
        mu, scatter = _start_from_shape(Z, shape)
        mu, scatter, logdet = _c_steps(Z, mu, scatter, h)
        if best is None or logdet < best[2]:
            best = (mu, scatter, logdet)
    mu, scatter, (rank, _) = best
    d2 = _mahalanobis2(Z - mu, scatter)
    scatter = scatter * (np.median(d2) / stats.chi2.ppf(0.5, rank) if np.median(d2) > 0 else 1.0)
    return med + scale * mu, scatter * np.outer(scale, scale)


def step_plan(location, scatter, kernel_size2: float, *, final: bool = True) -> PassPlan:
    """The plan of one fixed-point pass: the Mahalanobis kernel, and with
    ``final`` the flat-top kernel of the final step (same matrix, offset
    ``q / (2 c^2)``)."""
    A = precision(scatter) / kernel_size2
    if not final:
        return PassPlan(center=location, kernels=A[None])
    z = flat_top_radius2(len(A)) / (2 * kernel_size2)
    return PassPlan(center=location, kernels=np.stack([A, A]), offsets=np.array([0.0, z]))


def _step(
    runner: PassRunner,
    state: RobustState,
    *,
    fixed_center: np.ndarray | None,
    label: str,
    accelerate: bool = False,
    final: bool = False,
) -> tuple[PassResult, float]:
    """One fixed-point step (one pass); updates ``state`` and returns the change.

    With ``final``, the same pass also evaluates the flat-top kernel of the
    final re-weighting step (see :mod:`._schedule`) from the current state
    and stores its location and scatter in ``state.final_*``.

    With ``accelerate``, the step is over-relaxed by ``omega = 1 + 1/c^2``:
    at the Gaussian the map contracts location and scatter (whitened) by
    exactly ``1 / (1 + c^2)`` in every direction, so
    ``x + omega (F(x) - x)`` removes that contraction and the fit lands in
    about two passes instead of three or four.  A relaxed scatter that is not
    clearly positive definite falls back to the plain step.
    """
    c2, p = state.kernel_size2, len(state.location)
    res = runner.run(step_plan(state.location, state.scatter, c2, final=final), label=label)
    if final:
        state.final_location, state.final_scatter = _weighted_moments(res, 1, fixed_center)
        state.final_scatter = state.final_scatter * flat_top_consistency(p, c2, flat_top_radius2(p))
    location, scatter = _weighted_moments(res, 0, fixed_center)
    scatter = consistency_factor(c2) * scatter
    if accelerate:
        omega = 1.0 + 1.0 / state.kernel_size2
        relaxed = state.scatter + omega * (scatter - state.scatter)
        if np.linalg.eigvalsh(relaxed).min() > 0.5 * np.linalg.eigvalsh(scatter).min():
            scatter = relaxed
            if fixed_center is None:
                location = state.location + omega * (location - state.location)
    change = _relative_change(state, location, scatter)
    state.location, state.scatter = location, scatter
    state.n_iter += 1
    return res, change


def _weighted_moments(res: PassResult, j: int, fixed_center) -> tuple[np.ndarray, np.ndarray]:
    """Location and covariance of kernel ``j``, about ``fixed_center`` if given."""
    location = res.mean[j] if fixed_center is None else fixed_center
    return location, res.covariance(j, about=fixed_center)


def _relative_change(state: RobustState, location, scatter) -> float:
    """Largest change of the fit, measured in the metric of the old scatter."""
    w, V = np.linalg.eigh(state.scatter)
    keep = w > w.max() * 1e-12 if w.max() > 0 else np.zeros_like(w, bool)
    if not keep.any():
        return 0.0
    W = V[:, keep] / np.sqrt(w[keep])
    shape_change = np.linalg.norm(W.T @ scatter @ W - np.eye(keep.sum()), 2)
    loc_change = np.linalg.norm(W.T @ (location - state.location))
    return float(shape_change + loc_change)


#: Cap on the estimated contraction rate of the fixed point.
MAX_RATE = 0.95


def _remaining(change: float, previous: float, kernel_size2: float) -> float:
    """Estimated distance to the fixed point after a step that moved by ``change``.

    The fixed point converges linearly with some rate ``rho``, so what is left
    is at most about ``change * rho / (1 - rho)``.  ``rho`` is the ratio of the
    last two changes; after a first step it is ``1 / (1 + c^2)``, the rate at
    the Gaussian.  Stopping on this estimate rather than on the last change
    saves a pass and still lands within ``tol`` of the fixed point.
    """
    if np.isfinite(previous) and previous > 0:
        rho = min(change / previous, MAX_RATE)
    else:
        rho = 1.0 / (1.0 + kernel_size2)
    return change * rho / (1.0 - rho)


def fit_robust(
    runner: PassRunner,
    *,
    moments: PassResult,
    fixed_center: np.ndarray | None,
    kernel_factor: float = 1.0,
    tol: float,
    max_passes: int,
    state: RobustState | None = None,
    on_step=None,
    final_step: bool = True,
) -> RobustState:
    """Robust location and scatter by the correntropy fixed point.

    Parameters
    ----------
    runner : PassRunner
        Passes over the full data (counted).
    moments : PassResult
        The first pass, with its row sample.
    fixed_center : ndarray or None
        Keep the location fixed (``center="mean"`` or ``False``); None
        estimates it robustly.
    tol : float
        Stop when the estimated distance to the fixed point (relative, in the
        metric of the scatter; see :func:`_remaining`) is below ``tol``.
    max_passes : int
        Bound on the full-data passes of this stage.
    final_step : bool, default=True
        Also evaluate the final flat-top step in each full-data pass (the
        default solver uses it; the paper solver needs only the location).
    """
    p = runner.n_features
    if state is None:
        sample = moments.sample
        if len(sample) < p + 2:
            raise ValueError(
                f"{moments.n_rows} usable rows are too few for {p} features: "
                f"the robust fit needs at least {p + 2}"
            )
        location, scatter = robust_start(sample)
        if fixed_center is not None:
            location = fixed_center
        state = RobustState(location=location, scatter=scatter, kernel_size2=kernel_factor**2 * robust_kernel_size2(p))
        in_memory = PassRunner(sample)
        previous = float("nan")
        for _ in range(MAX_SAMPLE_STEPS):
            change = _step(in_memory, state, fixed_center=fixed_center, label="sample")[1]
            if _remaining(change, previous, state.kernel_size2) < tol:
                break
            previous = change
        state.n_iter = 0
        if on_step is not None:
            on_step(state)
    while not state.converged and state.n_iter < max_passes:  # a resumed state continues its count
        res, change = _step(
            runner,
            state,
            fixed_center=fixed_center,
            label=f"robust step {state.n_iter + 1}",
            accelerate=True,
            final=final_step,
        )
        state.converged = _remaining(change, state.last_change, state.kernel_size2) < tol
        state.last_change = change
        if on_step is not None:
            on_step(state)
        if state.converged:
            break
    return state
