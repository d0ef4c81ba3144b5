"""A robust step's change at wide p (:func:`._robust_step.change_in_metric` by Lanczos iterations).

The expected norms are built into the matrices: ``S = I + a u u^T`` whitened by ``W = I`` moves by
``||a u u^T||_2 = |a|`` for a unit vector ``u``.
"""

from __future__ import annotations

import numpy as np
import pytest

from dask_mcpca import _robust_step
from dask_mcpca._robust_step import BIG_CHANGE, LANCZOS_MIN_FEATURES, change_in_metric

R = LANCZOS_MIN_FEATURES + 44


def test_a_contrast_directions_change_is_found():
    """The top eigenvector (1, -1, 0, ...)/sqrt(2) (eigenvalue 5.0) is orthogonal to a start vector of
    ones, whose Krylov space then holds only the smaller moves (the third axis, 1.0, and a spread of
    0 to 0.9 on the others, none of which reach the contrast): the norm must be 5.0 (ones gave 1.0)."""
    scatter = np.eye(R)
    scatter[:2, :2] += 2.5 * np.array([[1.0, -1.0], [-1.0, 1.0]])
    scatter[2, 2] += 1.0
    scatter[3:, 3:] += np.diag(np.linspace(0.0, 0.9, R - 3))
    zero = np.zeros(R)
    assert change_in_metric(np.eye(R), zero, zero, scatter) == pytest.approx(5.0, rel=1e-7)


def test_a_random_moves_change_is_its_largest_eigenvalue():
    """A random symmetric move of known eigenvalues (4.0 the largest in magnitude) in a random basis."""
    rng = np.random.default_rng(5)
    Q, _ = np.linalg.qr(rng.normal(size=(R, R)))
    values = np.concatenate([[4.0, -3.5], rng.uniform(-3.0, 3.0, R - 2)])
    scatter = np.eye(R) + (Q * values) @ Q.T
    zero = np.zeros(R)
    assert change_in_metric(np.eye(R), zero, zero, scatter) == pytest.approx(4.0, rel=1e-7)


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_a_non_finite_scatter_is_a_big_change_without_arpack(monkeypatch, capfd, bad):
    """A scatter that overflowed is far from converged: BIG_CHANGE at once, as the dense route gives,
    and nothing on stderr (ARPACK on inf made LAPACK print 'DLASCL parameter number 4 ...')."""
    calls = []
    monkeypatch.setattr(_robust_step, "eigsh", lambda *a, **k: calls.append(1))
    scatter = np.eye(R)
    scatter[3, 7] = scatter[7, 3] = bad
    zero = np.zeros(R)
    assert change_in_metric(np.eye(R), zero, zero, scatter) == BIG_CHANGE
    assert calls == []
    assert capfd.readouterr().err == ""


def test_lanczos_that_does_not_converge_falls_back_to_the_dense_norm(monkeypatch):
    """ARPACK's restarts bounded (``LANCZOS_MAXITER``): with one restart allowed and a clustered top of
    the spectrum it stops unconverged, and the dense route gives the norm (6.0)."""
    monkeypatch.setattr(_robust_step, "LANCZOS_MAXITER", 1)
    rng = np.random.default_rng(2)
    Q, _ = np.linalg.qr(rng.normal(size=(R, R)))
    values = np.concatenate([[6.0], 6.0 - np.geomspace(1e-6, 1e-3, R - 1)])
    scatter = np.eye(R) + (Q * values) @ Q.T
    zero = np.zeros(R)
    assert change_in_metric(np.eye(R), zero, zero, scatter) == pytest.approx(6.0, rel=1e-9)
