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

Final efficiency step (``solver="auto"``)
    The fixed point's kernel weighs even typical rows down (at p = 3 a row at
    the median distance gets 0.67), which costs efficiency: its components
    are about 10 % less accurate than PCA's on clean data.  Every full-data
    pass therefore also evaluates a *flat-top* kernel from the same location
    and scatter, ``exp(-max(d^2 - q, 0) / (2 c^2))`` with ``q`` the chi-square
    ``FINAL_QUANTILE`` quantile: weight 1 for the bulk, the same Gaussian
    fall-off beyond ``q``.  The last pass's gives the components: one
    re-weighting step, as in the reweighted MCD, at no extra pass.  :func:`flat_top_consistency`
    gives its factor at the Gaussian in closed form.
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
    "FINAL_QUANTILE",
    "flat_top_radius2",
    "flat_top_consistency",
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


#: The flat top of the final step reaches this chi-square quantile of d^2.
#: Chosen by measurement (20 seeds, p = 3, median largest angle): 0.95 took
#: clean data from 1.81 to 1.71 deg and a 25 % far cluster from 1.90 to 1.65;
#: 0.99 let 20 % paper-type outliers in (2.15 -> 2.67 deg), 0.95 less so (2.32).
FINAL_QUANTILE = 0.95


def flat_top_radius2(p: int, quantile: float = FINAL_QUANTILE) -> float:
    """``q``: rows with ``d^2 <= q`` get weight 1 in the final step."""
    return float(stats.chi2.ppf(quantile, df=p))


def flat_top_consistency(p: int, c2: float, q: float) -> float:
    """Factor that makes the flat-top-weighted covariance consistent at the Gaussian.

    For Gaussian rows, ``d^2 ~ chi^2_p`` and weights
    ``w = exp(-max(d^2 - q, 0) / (2 c^2))`` shrink the covariance by
    ``E[w d^2] / (p E[w])``; this returns its inverse.  Beyond ``q`` the weight
    times the chi-square density is again a chi-square density, rescaled by
    ``s = c^2 / (1 + c^2)``, so both expectations are sums of chi-square
    distribution functions.
    """
    s = c2 / (1.0 + c2)
    # The tail terms in logs: for a small c^2, exp(q / 2c^2) overflows while
    # the survival function underflows, and their product is tiny, not NaN.
    log_tail = q / (2.0 * c2) + (p / 2.0) * np.log(s)
    weight = stats.chi2.cdf(q, p) + np.exp(log_tail + stats.chi2.logsf(q / s, p))
    moment = p * stats.chi2.cdf(q, p + 2) + s * p * np.exp(log_tail + stats.chi2.logsf(q / s, p + 2))
    return float(p * weight / moment)


def outlier_cutoff_d2(p: int, quantile: float = OUTLIER_QUANTILE) -> float:
    """The squared Mahalanobis distance above which a row is flagged."""
    return float(stats.chi2.ppf(quantile, df=p))
