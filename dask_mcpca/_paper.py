"""``solver="paper"``: Algorithms 1-3 exactly as published.

For each component i = 1 .. p-1 the kernel size starts at sqrt(lambda_i) of
the unweighted scatter and is shrunk ``n_decay`` times by ``eta``; for each
size, the outer loop re-weights (one pass over the data) and the inner loop
runs the power iteration on the p x p matrix K until both converge.  The
components found are deflated with P and Q (Woodbury); the last component
spans the null space of the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._block_rows import top_exponent as _top_exponent
from ._passes import PassRunner
from ._power import (
    deflated_operator,
    descending_eigh,
    last_component,
    power_iteration,
    residual_kernel,
    variance_floor,
    woodbury_update,
)
from ._schedule import paper_kernel_sizes, quantile_of
from ._stats import PassPlan

__all__ = ["LastPass", "PaperState", "fit_paper", "sample_variances"]


@dataclass(slots=True)
class LastPass:
    """The weighted statistics of the last pass at a component's last kernel size.

    A component's robust variance is read from them when its kernel sizes
    are done (and the last component's, from component p-1's), so they are
    part of the checkpointed state.  All in the fit's working units
    (``X * 2**-unit_exp``, see :mod:`._block`), about the fit's centre.

    Attributes
    ----------
    S : ndarray of shape (p, p)
        ``X^T G X`` about the centre: the scatter weighted by that pass's
        correntropy weights (the ``S`` of eq. (14)), in squared working units,
        up to the pass's common weight factor.
    weight : float
        The sum of the same weights, up to the same factor: ``S / weight``
        is the weighted covariance, in squared working units.
    sigma : float
        The kernel size of that pass, in working units.
    """

    S: np.ndarray
    weight: float
    sigma: float


@dataclass
class PaperState:
    """Everything needed to resume Algorithm 3 after a completed kernel size."""

    component: int = 0  # index i of the component being estimated
    decay_step: int = 0  # next kernel size j of that component
    v: np.ndarray | None = None  # current direction of component i
    P: np.ndarray | None = None
    Q: np.ndarray | None = None
    components: list = field(default_factory=list)
    variances: list = field(default_factory=list)
    sigmas: list = field(default_factory=list)
    n_iter: int = 0
    converged: bool = True
    last_pass: LastPass | None = None  # statistics of the last pass of component i


def _unit_scaled(S: np.ndarray) -> np.ndarray:
    """``S`` divided by the power of two above its largest entry.

    K (eq. (14)) is linear in S, and scaling by a power of two is exact, so
    the power iteration sees the same directions bit for bit; its products
    and norms can no longer overflow, whatever the data's magnitude.
    """
    return np.ldexp(S, -_top_exponent(S))  # 0 (S itself) when S is 0, inf or NaN


def _weighted_variance(v, S, weight):
    return float(v @ S @ v / weight)


def fit_paper(
    runner: PassRunner,
    *,
    center: np.ndarray,
    scatter0: np.ndarray,
    n_components: int,
    eta: float,
    n_decay: int,
    kernel_factor: float = 1.0,
    tol: float,
    max_iter: int,
    state: PaperState | None = None,
    on_step=None,
) -> PaperState:
    """Run Algorithm 3 from ``state`` (or from the start) and return the final state.

    Parameters
    ----------
    runner : PassRunner
    center : ndarray of shape (p,)
        The data are ``X - center`` (zeros reproduce the paper's setting).
    scatter0 : ndarray of shape (p, p)
        ``(1/n) X^T X`` about ``center``: line 1 of Algorithm 3.
    n_components : int
        Components to estimate, 1 .. p.
    on_step : callable, optional
        Called with the state after every completed kernel size.
    """
    p = runner.n_features
    lam, V0 = descending_eigh(scatter0)
    lam = np.maximum(lam, 0.0)
    # Eigenvalues at round-off level of the largest are zero: a tiny kernel
    # size sqrt(lambda_i) built on round-off would give meaningless weights.
    rank = int(np.sum(lam > variance_floor(lam[0], p)))
    if min(n_components, p - 1) > rank:
        raise ValueError(
            f"the data have rank {rank} about the centre (eigenvalues of the unweighted scatter: "
            f"{np.array2string(lam, precision=3)}), too low for n_components={n_components} of p={p}: "
            + (f"use n_components <= {rank}" if rank else "every row equals the centre; there is nothing to fit")
        )
    if state is None:
        state = PaperState(P=np.zeros((p, p)), Q=np.eye(p))
    for i in range(state.component, min(n_components, p - 1)):
        if state.v is None:
            state.v = V0[:, i].copy()
        sizes = paper_kernel_sizes(kernel_factor * np.sqrt(lam[i]), eta, n_decay)
        for j in range(state.decay_step, n_decay):
            sigma = sizes[j]
            v = state.v
            for _ in range(max_iter):
                plan = PassPlan(center=center, kernels=residual_kernel(state.P, v, sigma)[None])
                res = runner.run(plan, label=f"component {i + 1} sigma={sigma:.3g}")
                S = res.scatter_about(center)
                S_unit = _unit_scaled(S)
                K = deflated_operator(S_unit, state.P, state.Q)
                v_new, _, inner_ok, negative = power_iteration(K, v, tol=tol)
                if negative:  # max|diag K| was not "large enough" (eq. (15))
                    K = deflated_operator(S_unit, state.P, state.Q, bound=True)
                    v_new, _, inner_ok, _ = power_iteration(K, v, tol=tol)
                state.n_iter += 1
                state.converged &= inner_ok
                step = np.linalg.norm(v_new - v)
                v = v_new
                if step < tol:
                    break
            else:
                state.converged = False
            state.v = v
            state.last_pass = LastPass(S=S, weight=float(res.weight[0]), sigma=float(sigma))
            state.decay_step = j + 1
            if on_step is not None:
                on_step(state)
        v = state.v / np.linalg.norm(state.v)
        lp = state.last_pass
        state.components.append(v)
        state.variances.append(_weighted_variance(v, lp.S, lp.weight))
        state.sigmas.append(lp.sigma)
        state.P = state.P + np.outer(v, v)
        state.Q = woodbury_update(state.Q, v)
        state.component, state.decay_step, state.v = i + 1, 0, None
    if n_components == p:
        _append_last(state, p, scatter0)
    return state


def _append_last(state: PaperState, p: int, scatter0: np.ndarray) -> None:
    """Section 3.3: the last component spans the null space of the others.

    The state keeps a variance from the last weights of component p-1, whose
    residual is exactly the coordinate along v_p (for Gaussian coordinates of
    variance lambda, weighting by exp(-z^2 / (2 sigma^2)) gives the variance
    s = lambda sigma^2 / (lambda + sigma^2), inverted here); it is too noisy
    to use where sigma^2 is far below lambda, and the model takes the last
    variance from the row sample instead (:func:`sample_variances`, as every component's).
    """
    if p == 1:
        v = np.ones(1)
        state.components.append(v)
        state.variances.append(float(scatter0[0, 0]))
        state.sigmas.append(float("nan"))
        return
    v = last_component(np.column_stack(state.components))
    lp = state.last_pass
    s, sigma2 = _weighted_variance(v, lp.S, lp.weight), lp.sigma**2
    state.components.append(v)
    # in units of the power of two above sigma^2 (exact), so s * sigma^2 cannot overflow
    e = int(np.frexp(sigma2)[1]) if 0 < sigma2 < np.inf else 0
    s_e, sigma2_e = np.ldexp(s, -e), np.ldexp(sigma2, -e)
    state.variances.append(float(np.ldexp(s_e * sigma2_e / (sigma2_e - s_e), e)) if s < sigma2 else s)
    state.sigmas.append(float("nan"))


def sample_variances(sample: np.ndarray, center: np.ndarray, components: np.ndarray, k: int):
    """The components' variances, robustly from the in-memory row ``sample`` about ``center``:
    ``(kept, rest)``, the k components' variances and the total of the ``p - k`` discarded directions
    (0 with all kept); ``(None, None)`` without sample rows.

    The paper gives the components only.  A component's weighted variance at its last kernel size
    (``sigma^2`` about 0.1 % of its variance: some 20 of 5,000 rows carry the weight, the very rows
    the direction was chosen on) was 75 % too high on clean Gaussian data for the first p - 1
    components, and for the last one, inverted from component p - 1's last weights, noise (2 to 14
    times too low on the paper's clean example); the discarded total was the unweighted trace less
    the kept variances, outliers included.  Now: the second moment about ``center`` of the rows'
    coordinate along each component, robustly: its squared MAD about its median (Gaussian
    consistent) plus its median squared (rows that share one offset from the centre, as in the
    paper's uncentred setting, keep their mean square), and for the discarded directions the median squared residual
    norm over the median of a chi-square with ``p - k`` degrees of freedom, times ``p - k`` (the
    noise variance of probabilistic PCA, robustly).  Components rows of ``components``
    (orthonormal); all in the same units.
    """
    Y = np.asarray(sample, np.float64) - center
    Y = Y[np.isfinite(Y).all(axis=1)]
    p = len(center)
    if not len(Y):
        return None, None
    kept = components[:k]
    scores = Y @ kept.T
    offset = np.median(scores, axis=0)
    variances = (np.median(np.abs(scores - offset), axis=0) / quantile_of("norm", 0.75)) ** 2 + offset**2
    if k == p:
        return variances, 0.0
    r = Y - scores @ kept
    return variances, float(np.median(np.einsum("ij,ij->i", r, r)) / quantile_of("chi2", 0.5, p - k) * (p - k))

