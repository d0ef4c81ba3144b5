"""The small p x p linear algebra that runs on the client.

Equation numbers refer to Chereau, Scalzo Dees and Mandic, "Robust principal
component analysis based on maximum correntropy power iterations".
"""

from __future__ import annotations

import threading

import numpy as np
import scipy.linalg

__all__ = [
    "PSD_TOL",
    "deflated_operator",
    "power_iteration",
    "woodbury_update",
    "last_component",
    "residual_kernel",
    "orient_rows",
    "descending_eigh",
    "variance_floor",
    "direction_floors",
    "spread_directions",
]

#: Negative eigenvalue accepted in a saved scatter or kept covariance, relative to its largest variance
#: (round-off of a weighted sum: ~1e-16 on a constant channel); read by the model file's and the
#: checkpoint's checks.
PSD_TOL = 1e-9

#: Variances below ``RANK_FLOOR * p * eps`` times the largest are round-off:
#: the numerical rank floor of every scatter the package decomposes.
RANK_FLOOR = 1e3

#: Bound on the inner power iteration (Algorithm 2, lines 6-8).
MAX_POWER_STEPS = 20_000

#: Consecutive sign flips that reveal a negative dominant eigenvalue.
FLIPS_FOR_NEGATIVE = 5


def variance_floor(largest: float, p: int) -> float:
    """The variance below which a direction of a p x p scatter is round-off, relative to the largest.

    Not scale-free: a channel in small units (1e-3 beside 1e3) can carry a real
    variance under it; :func:`direction_floors` judges each direction against
    its own channels' scales.
    """
    return max(float(largest), 0.0) * p * np.finfo(float).eps * RANK_FLOOR


def direction_floors(variances: np.ndarray, directions: np.ndarray, channel_variances: np.ndarray) -> np.ndarray:
    """The variance below which each direction (a unit column of ``directions``) is round-off, in its channels' units.

    A direction ``v`` carrying variance ``w`` is measured against its channels'
    scale ``t = sum_j v_j^2 s_j`` (``s``: the channel variances), so that its
    quotient ``q = w / t`` does not depend on the units of the channels: ``q``
    is the Rayleigh quotient of the correlation-scaled scatter, and
    multiplying a channel by a constant leaves it unchanged.  A direction is
    round-off when ``q`` is under ``RANK_FLOOR * p * eps`` times the largest
    quotient (the rule of :func:`variance_floor` in correlation units) *and*
    ``w`` is under :func:`variance_floor` of the largest variance (so the
    floor never rises above the former rule's: a direction kept before is
    kept now, with the same bits).  Never below ``p * eps`` times the largest
    variance either: an eigendecomposition resolves nothing under it (a
    channel that is constant up to the centre's round-off stays round-off).
    A direction that is round-off by both rules gets the former floor (the
    variance it is given in the distances, as before).

    Parameters
    ----------
    variances : ndarray of shape (m,)
    directions : ndarray of shape (p, m)
        Unit directions, as columns.
    channel_variances : ndarray of shape (p,)

    Returns
    -------
    ndarray of shape (m,)
    """
    variances = np.asarray(variances, np.float64)
    p = len(directions)
    largest = float(variances.max(initial=0.0))
    relative = variance_floor(largest, p)
    resolved = relative / RANK_FLOOR
    t = (np.asarray(directions, np.float64) ** 2).T @ np.maximum(np.asarray(channel_variances, np.float64), 0.0)
    has_scale = t > 0
    if not has_scale.any() or largest <= 0:
        return np.full(len(variances), relative)
    floors = np.full(len(variances), relative)
    with np.errstate(over="ignore"):  # an overflowing quotient or product is above ``relative``: the minimum keeps it
        q_max = float(np.max(variances[has_scale] / t[has_scale]))
        floors[has_scale] = np.minimum(relative, variance_floor(q_max, p) * t[has_scale])
    floors = np.maximum(floors, resolved)
    return np.where(variances > floors, floors, relative)  # round-off either way: the former floor, the same bits


#: Scatters whose :func:`spread_directions` are kept, the most recent first.  A robust
#: step decomposes the same scatter several times (the next pass's metric, the change
#: of the step, the radii); at p = 1000 each eigendecomposition costs about 0.1 s.
SPREAD_CACHE_SIZE = 4

_spread_cache: list[tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]] = []
_spread_lock = threading.Lock()


def spread_directions(scatter: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Variances and unit directions (columns) of ``scatter`` above :func:`direction_floors`.

    The decomposition of a scatter equal (exactly) to one of the last
    ``SPREAD_CACHE_SIZE`` decomposed is returned again (read-only arrays):
    the same bits, once per scatter.
    """
    scatter = np.asarray(scatter)
    with _spread_lock:
        for i, (M, found) in enumerate(_spread_cache):
            if M.shape == scatter.shape and M.dtype == scatter.dtype and np.array_equal(M, scatter):
                _spread_cache.insert(0, _spread_cache.pop(i))
                return found
    w, V = np.linalg.eigh((scatter + scatter.T) / 2)
    keep = w > variance_floor(w.max(), len(w))
    if not keep.all():  # judge the directions under the floor again, each in its own channels' units
        keep = w > direction_floors(w, V, np.diag(scatter))
    found = (w[keep], V[:, keep])
    for a in found:
        a.setflags(write=False)
    key = scatter.copy()
    key.setflags(write=False)
    with _spread_lock:
        _spread_cache.insert(0, (key, found))
        del _spread_cache[SPREAD_CACHE_SIZE:]
    return found


def descending_eigh(C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (descending) and eigenvectors (columns) of a symmetric matrix."""
    w, V = np.linalg.eigh((C + C.T) / 2)
    return w[::-1], V[:, ::-1]


def deflated_operator(S: np.ndarray, P: np.ndarray, Q: np.ndarray, *, bound: bool = False) -> np.ndarray:
    """``K = Q (S - P S - S P) + theta I``: Algorithm 2, lines 4-5 (eqs. (14)-(15)).

    ``theta = max|diag K|`` as published.  Eq. (15) only asks for "a large
    enough positive constant", and max|diag K| is not always enough: a
    negative eigenvalue can stay the largest in size, and the power iteration
    then flips sign forever.  ``bound=True`` uses ``max(max|diag K|,
    ||K||_inf)``, which bounds the spectral radius, so every eigenvalue of the
    shifted matrix has a non-negative real part.
    """
    K = Q @ (S - P @ S - S @ P)
    theta = np.max(np.abs(np.diag(K)))
    if bound:
        theta = max(theta, np.max(np.abs(K).sum(axis=1)))
    return K + theta * np.eye(len(K))


def power_iteration(K: np.ndarray, v: np.ndarray, *, tol: float, max_steps: int = MAX_POWER_STEPS):
    """Iterate ``v <- K v / ||K v||`` (eq. (9)) until ``||v_new - v|| < tol``.

    Returns
    -------
    v : ndarray of shape (p,)
    n_steps : int
    converged : bool
    negative : bool
        The iterate flipped sign on ``FLIPS_FOR_NEGATIVE`` consecutive steps:
        the dominant eigenvalue of ``K`` is negative (the shift was too small)
        and the iteration stopped early.
    """
    v = v / np.linalg.norm(v)
    flips = 0
    for step in range(1, max_steps + 1):
        w = K @ v
        norm = np.linalg.norm(w)
        if norm == 0:
            return v, step, True, False
        w /= norm
        if np.linalg.norm(w - v) < tol:
            return w, step, True, False
        flips = flips + 1 if w @ v < 0 else 0
        if flips >= FLIPS_FOR_NEGATIVE:
            return w, step, False, True
        v = w
    return v, max_steps, False, False


def woodbury_update(Q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``Q_(i) = Q_(i-1) - Q v v^T Q / (1 + v^T Q v)``: Algorithm 3, line 11."""
    Qv = Q @ v
    return Q - np.outer(Qv, v @ Q) / (1.0 + v @ Qv)


def last_component(V: np.ndarray) -> np.ndarray:
    """The unit vector spanning the null space of ``V^T`` (Section 3.3).

    ``V`` holds the first p - 1 components as columns.
    """
    null = scipy.linalg.null_space(V.T)
    return null[:, 0]


def residual_kernel(P: np.ndarray, v: np.ndarray, sigma: float) -> np.ndarray:
    """Kernel matrix ``A = M^T M / sigma^2`` with ``M = I - P - v v^T``.

    Then ``-1/2 x^T A x = -||(I - P - v v^T) x||^2 / (2 sigma^2)``, the
    exponent of ``[G_sigma]_kk`` in eq. (13).
    """
    M = np.eye(len(v)) - P - np.outer(v, v)
    return (M.T @ M) / sigma**2


def orient_rows(components: np.ndarray) -> np.ndarray:
    """Deterministic signs: the largest-magnitude entry of each row is positive.

    The convention of scikit-learn's ``svd_flip(u_based_decision=False)``.
    """
    idx = np.argmax(np.abs(components), axis=1)
    signs = np.sign(components[np.arange(len(components)), idx])
    signs[signs == 0] = 1.0
    return components * signs[:, None]
