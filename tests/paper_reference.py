"""An independent, in-memory implementation of the paper's Algorithms 1-3.

Written from the equations of Chereau, Scalzo Dees and Mandic (the LaTeX in
shared/paper), not from the package: plain numpy on the whole matrix, no
blocks, no log-scale bookkeeping.  Only one liberty is taken: the weights are
divided by their largest value before forming S.  That rescales S (and so K
and its shift max|diag K|) by one positive number, which leaves every
eigenvector and every power-iteration step unchanged, and it keeps the
weights from underflowing to zero at the smallest kernel sizes.
"""

import numpy as np


def paper_experiment(seed, *, n=400, outlier_fraction=0.05, nu=15.0):
    """The simulation of Section 4: N(0, S) rows, a fraction replaced by N(0, nu Lambda)."""
    S = np.array([[8.0, 3.0, -1.0], [3.0, 4.0, -2.0], [-1.0, -2.0, 6.0]])
    lam, V = np.linalg.eigh(S)
    lam, V = lam[::-1], V[:, ::-1]
    rng = np.random.default_rng(seed)
    X = rng.multivariate_normal(np.zeros(3), S, size=n)
    n_out = int(round(outlier_fraction * n))
    rows = rng.choice(n, n_out, replace=False)
    X[rows] = rng.normal(size=(n_out, 3)) * np.sqrt(nu * lam)
    return X, V.T, lam


def mcpi_paper(X, *, eta=0.95, n_decay=65, tol=1e-6, max_outer=100, max_inner=20_000):
    """Algorithm 3 (with Algorithm 2 inside); returns the p components as rows."""
    n, p = X.shape
    # Line 1: V_(0), Lambda from the EVD of X^T X / n, in decreasing order.
    evals, evecs = np.linalg.eigh(X.T @ X / n)
    order = np.argsort(evals)[::-1]
    evals, evecs = evals[order], evecs[:, order]
    P = np.zeros((p, p))
    Q = np.eye(p)
    found = []
    for i in range(p - 1):
        sigma = np.sqrt(evals[i])
        v = evecs[:, i].copy()
        for _ in range(n_decay):
            # Algorithm 2.
            for _ in range(max_outer):
                v_before = v.copy()
                R = X @ (np.eye(p) - P - np.outer(v, v)).T  # rows: (I - P - v v^T) x_k
                exponent = -np.sum(R**2, axis=1) / (2 * sigma**2)
                g = np.exp(exponent - exponent.max())  # [G]_kk up to one common factor
                S = X.T @ (g[:, None] * X)
                K = Q @ (S - P @ S - S @ P)
                K = K + np.max(np.abs(np.diag(K))) * np.eye(p)
                v = v / np.linalg.norm(v)
                for _ in range(max_inner):
                    w = K @ v
                    w = w / np.linalg.norm(w)
                    done = np.linalg.norm(w - v) < tol
                    v = w
                    if done:
                        break
                if np.linalg.norm(v - v_before) < tol:
                    break
            sigma = eta * sigma
        found.append(v)
        P = P + np.outer(v, v)
        Q = Q - (Q @ np.outer(v, v) @ Q) / (1 + v @ Q @ v)
    # Last component: the null space of V_(1:p-1)^T, from the full SVD.
    Vp = np.column_stack(found)
    _, _, Wt = np.linalg.svd(Vp.T)
    found.append(Wt[-1])
    return np.array(found)


def angles_deg(A, B):
    """Angle in degrees between corresponding rows of A and B, sign ignored."""
    A = A / np.linalg.norm(A, axis=1, keepdims=True)
    B = B / np.linalg.norm(B, axis=1, keepdims=True)
    return np.degrees(np.arccos(np.clip(np.abs(np.sum(A * B, axis=1)), 0.0, 1.0)))
