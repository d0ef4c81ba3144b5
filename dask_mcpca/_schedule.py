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

Calibrated cutoffs (``solver="auto"``)
    The flat-top radius ``q`` of the re-weighting and the ``d^2`` above which
    a row is flagged are quantiles of the data's own distances, not of the
    chi-square law: :func:`calibrated_cutoff` fits a normal law to the cube
    roots of ``d^2`` by median and MAD (Wilson-Hilferty: for Gaussian rows
    ``(d^2)^(1/3)`` is nearly normal) and takes its quantile, so the bulk's
    heavy tails or several regimes widen it while outliers, fewer than half,
    do not.  It is never below the quantile for Gaussian rows at the effective
    sample size (Hotelling's T^2 law of a new row, :func:`hotelling_quantile`),
    which keeps small samples from flagging their own rows.

Flat-top kernel (``solver="auto"``)
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
    "calibrated_cutoff",
    "hotelling_quantile",
    "CUTOFF_QUANTILE",
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

#: Rows with ``d^2`` above this quantile of the calibrated law of the fitted
#: bulk's distances (:func:`calibrated_cutoff`) are flagged by
#: ``MCPCA.is_outlier``: a false-alarm rate of 0.2 % where the law fits.
OUTLIER_QUANTILE = 0.998

#: The flat top of the default's re-weighting reaches this calibrated quantile.
CUTOFF_QUANTILE = 0.975


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
    if not np.isfinite(q):
        return 1.0  # every row has weight 1
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


def hotelling_quantile(p: int, n: float, quantile: float) -> float:
    """Quantile of ``d^2`` of a new Gaussian row under a covariance from ``n`` rows.

    ``d^2 ~ p (n - 1)(n + 1) / (n (n - p)) F(p, n - p)`` (Hotelling's T^2);
    it tends to the chi-square quantile as n grows, and is infinite for
    ``n <= p + 1``, where a covariance of n rows says nothing about a new one.
    """
    if not n > p + 1:
        return float("inf")
    return float(p * (n - 1) * (n + 1) / (n * (n - p)) * stats.f.ppf(quantile, p, n - p))


def calibrated_cutoff(d2: np.ndarray, quantile: float, *, p: int, n_effective: float, trim: bool = False) -> float:
    """The ``quantile`` of the bulk's law of ``d^2``, calibrated on the data.

    The cube roots of ``d^2`` are taken as normal with their median and
    (normal-consistent) MAD; with ``trim``, of those rows only whose ``d^2``
    is below the chi-square 99.9 % quantile rescaled to the data's median, so
    that a far minority of outliers cannot widen the law (the re-weighting
    radius, which must not let a cluster in; the flags use every row, so that
    a heavy-tailed bulk is not flagged).  The result is never below
    :func:`hotelling_quantile` at ``n_effective`` rows.
    """
    d2 = np.asarray(d2, dtype=np.float64)
    floor = hotelling_quantile(p, n_effective, quantile)
    med = np.median(d2)
    if not med > 0:
        return floor
    roots = np.cbrt(d2[d2 <= stats.chi2.ppf(0.999, p) * med / stats.chi2.ppf(0.5, p)] if trim else d2)
    center = np.median(roots)
    spread = stats.median_abs_deviation(roots, scale="normal")
    return max(float((center + stats.norm.ppf(quantile) * spread) ** 3), floor)
