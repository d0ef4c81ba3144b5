"""The small p x p linear algebra that runs on the client.

Equation numbers refer to Chereau, Scalzo Dees and Mandic, "Robust principal
component analysis based on maximum correntropy power iterations".
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

__all__ = [
    "deflated_operator",
    "power_iteration",
    "woodbury_update",
    "last_component",
    "residual_kernel",
    "orient_rows",
    "descending_eigh",
]

#: Bound on the inner power iteration (Algorithm 2, lines 6-8).
MAX_POWER_STEPS = 20_000


def descending_eigh(C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (descending) and eigenvectors (columns) of a symmetric matrix."""
    w, V = np.linalg.eigh((C + C.T) / 2)
    return w[::-1], V[:, ::-1]


def deflated_operator(S: np.ndarray, P: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """``K = Q (S - P S - S P) + max|diag K| I``: Algorithm 2, lines 4-5 (eqs. (12)-(13))."""
    K = Q @ (S - P @ S - S @ P)
    return K + np.max(np.abs(np.diag(K))) * np.eye(len(K))


def power_iteration(K: np.ndarray, v: np.ndarray, *, tol: float, max_steps: int = MAX_POWER_STEPS):
    """Iterate ``v <- K v / ||K v||`` (eq. (9)) until ``||v_new - v|| < tol``.

    Returns
    -------
    v : ndarray of shape (p,)
    n_steps : int
    converged : bool
    """
    v = v / np.linalg.norm(v)
    for step in range(1, max_steps + 1):
        w = K @ v
        norm = np.linalg.norm(w)
        if norm == 0:
            return v, step, True
        w /= norm
        if np.linalg.norm(w - v) < tol:
            return w, step, True
        v = w
    return v, max_steps, False


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
