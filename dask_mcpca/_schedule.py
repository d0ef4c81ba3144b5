"""Kernel sizes: the paper's shrinking schedule and the robust default's rule.

Paper (Algorithm 3)
    Component i starts at ``sigma_i = sqrt(lambda_i)`` of the unweighted
    scatter and is shrunk ``n_decay`` times by ``eta``; the last size is
    ``eta**(n_decay - 1) * sqrt(lambda_i)`` (3.6 % for the published 0.95, 65).

Robust default (``solver="auto"``)
    The kernel is the Mahalanobis one of eq. (1) with a general Sigma:
    ``g(x) = exp(-d^2(x) / (2 c^2))`` with ``d^2 = (x - mu)^T Sigma^{-1} (x - mu)``.
    The kernel size ``c`` is measured in units of the current robust scatter,
    so it shrinks with it and stops where Gaussian efficiency would be lost:
    ``c^2 = max(KERNEL_SIZE_FACTOR * p, MIN_KERNEL_SIZE2)``.  For Gaussian rows, weighting by
    ``exp(-d^2 / (2 c^2))`` shrinks the covariance by exactly
    ``c^2 / (1 + c^2)``, which :func:`consistency_factor` undoes.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

__all__ = [
    "paper_kernel_sizes",
    "robust_kernel_size2",
    "consistency_factor",
    "outlier_cutoff_d2",
    "KERNEL_SIZE_FACTOR",
    "OUTLIER_QUANTILE",
]

#: c^2 = max(KERNEL_SIZE_FACTOR * p, MIN_KERNEL_SIZE2): the efficiency /
#: robustness trade-off of the default solver, chosen by measurement
#: (benchmarks/accuracy.py).  A larger c^2 is more efficient on Gaussian data
#: but lets a far, tight cluster of 10 % of the rows pull the fixed point at
#: p = 10 (c^2 = 10 failed there, 5 held); a smaller one costs efficiency at
#: small p (at p = 3, c^2 = 1.5 gave 1.5x the angle error of PCA on clean
#: data, c^2 = 3 gave 1.09x).
KERNEL_SIZE_FACTOR = 0.5
MIN_KERNEL_SIZE2 = 3.0

#: Rows with ``d^2`` above this chi-square quantile (p degrees of freedom)
#: are flagged as outliers by ``MCPCA.is_outlier``.
OUTLIER_QUANTILE = 0.999


def paper_kernel_sizes(sigma0: float, eta: float, n_decay: int) -> np.ndarray:
    """The ``n_decay`` kernel sizes ``sigma0 * eta**j`` of Algorithm 3, lines 5-9."""
    return sigma0 * eta ** np.arange(n_decay)


def robust_kernel_size2(p: int) -> float:
    """Squared kernel size ``c^2`` of the Mahalanobis kernel, in units of d^2."""
    return max(KERNEL_SIZE_FACTOR * p, MIN_KERNEL_SIZE2)


def consistency_factor(c2: float) -> float:
    """Factor that makes the kernel-weighted covariance consistent at the Gaussian."""
    return (1.0 + c2) / c2


def outlier_cutoff_d2(p: int, quantile: float = OUTLIER_QUANTILE) -> float:
    """The squared Mahalanobis distance above which a row is flagged."""
    return float(stats.chi2.ppf(quantile, df=p))
