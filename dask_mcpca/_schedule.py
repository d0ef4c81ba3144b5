"""Kernel sizes and radii: the paper's shrinking schedule, the default's calibrated cutoffs.

Paper (Algorithm 3)
    Component i starts at ``sigma_i = sqrt(lambda_i)`` of the unweighted
    scatter and is shrunk ``n_decay`` times by ``eta``; the last size is
    ``eta**(n_decay - 1) * sqrt(lambda_i)`` (3.75 % for the published 0.95, 65).

Flat-top kernels (``solver="auto"``)
    The default weighs a row by ``exp(-max(d^2 - q, 0) / (2 c^2))``, with
    ``d^2`` its squared Mahalanobis distance under the current robust
    location and scatter: weight 1 inside the ellipsoid ``d^2 <= q``, a
    Gaussian (correntropy) fall-off beyond.  :func:`flat_top_consistency`
    gives, in closed form, the factor that makes the weighted covariance
    consistent at the Gaussian.

Calibrated cutoffs (``solver="auto"``)
    The radii ``q`` and the ``d^2`` above which a row is flagged are
    quantiles of the data's own distances, not of the chi-square law:
    :func:`calibrated_cutoff` fits a normal law to the cube roots of ``d^2`` by
    median and MAD (Wilson-Hilferty: for Gaussian rows ``(d^2)^(1/3)`` is
    nearly normal) and takes its quantile, so the bulk's heavy tails or several
    regimes widen it while outliers, fewer than half, do not.  For the
    outlier cutoff the spread is at least the one read off the upper decile
    of the cube roots (:func:`upper_tail_spread`): a heavy-tailed bulk's
    tail is longer than its MAD says (issue 36, benchmarks/HEAVY_TAILS.md).  The
    re-weighting radii are never below the quantile for Gaussian rows at the
    effective sample size (Hotelling's T^2 law of a new row,
    :func:`hotelling_quantile`), which keeps small samples from shutting
    their own rows out of the fit; the outlier cutoff is never below the
    quantile of a row the fit was made on (a Beta law,
    :func:`fitted_quantile`), which keeps small samples from flagging their
    own rows and still finds their outliers.

``score_samples`` reports the correntropy weight ``exp(-d^2 / (2 c^2))``
with ``c^2 = max(p / 2, 3)`` (:func:`robust_kernel_size2`): a score that
orders rows by distance on a scale that does not saturate.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy import special, stats

__all__ = [
    "paper_kernel_sizes",
    "robust_kernel_size2",
    "chi2_cdf",
    "chi2_logsf",
    "quantile_of",
    "flat_top_consistency",
    "outlier_cutoff_d2",
    "hotelling_quantile",
    "fitted_quantile",
    "calibrated_cutoff",
    "upper_tail_spread",
    "OUTLIER_QUANTILE",
    "CUTOFF_QUANTILE",
    "FINAL_QUANTILE",
    "TRIM_QUANTILE",
    "TAIL_QUANTILE",
    "TAIL_GUARD",
    "TAIL_MIN_ROWS",
]

#: ``c^2 = max(KERNEL_SIZE_FACTOR * p, MIN_KERNEL_SIZE2)`` of the score kernel.
KERNEL_SIZE_FACTOR = 0.5
MIN_KERNEL_SIZE2 = 3.0

#: Rows with ``d^2`` above this quantile of the calibrated law of the fitted
#: bulk's distances (:func:`calibrated_cutoff`) are flagged by
#: ``MCPCA.is_outlier``: a false-alarm rate of 0.2 % where the law fits.
#: Chosen on benchmarks/robustness.py: 0.999 missed spikes on real recordings
#: (recall 0.93), 0.995 flagged two good rows of starsCYG.
OUTLIER_QUANTILE = 0.998

#: The core fixed point's flat top reaches this calibrated (trimmed) quantile.
CUTOFF_QUANTILE = 0.975

#: The final, inclusive kernel reaches this calibrated (untrimmed) quantile:
#: the bulk's tails and regimes are in, the faults out.
FINAL_QUANTILE = 0.99

#: With ``trim``, :func:`calibrated_cutoff` fits its law to the rows whose
#: ``d^2`` is below this chi-square quantile (rescaled to the data's median).
TRIM_QUANTILE = 0.999

#: The outlier cutoff's spread is at least the upper tail's: the distance
#: of this quantile of the cube roots from their median, over the normal
#: quantile (a heavy-tailed bulk has a longer upper tail than its MAD says).
#: None: the MAD alone (the cutoff before issue 36).
TAIL_QUANTILE: float | None = 0.9

#: That quantile is taken over the rows whose cube root lies within this
#: many MADs of the median, so that a minority of outliers does not widen
#: it: at 4, the 20 % of outliers near the bulk of accuracy.py's paper20
#: (p = 3) widened it and their recall fell from 0.63 to 0.45; at 3.25 it
#: is 0.63 (benchmarks/HEAVY_TAILS.md).
TAIL_GUARD = 3.25

#: The upper tail is read only from at least this many rows (its decile then
#: holds 50): from fewer it is noise, and it widened stackloss's cutoff (21
#: rows) past two of its four published outliers.
TAIL_MIN_ROWS = 500


def paper_kernel_sizes(sigma0: float, eta: float, n_decay: int) -> np.ndarray:
    """The ``n_decay`` kernel sizes ``sigma0 * eta**j`` of Algorithm 3, lines 5-9."""
    return sigma0 * eta ** np.arange(n_decay)


def robust_kernel_size2(p: int) -> float:
    """Squared kernel size ``c^2`` of the score kernel, in units of d^2."""
    return max(KERNEL_SIZE_FACTOR * p, MIN_KERNEL_SIZE2)


def chi2_cdf(x, df):
    """``P(chi2_df <= x)`` for ``x >= 0``: :func:`scipy.special.chdtr`, the function ``scipy.stats.chi2.cdf``
    evaluates there, without its argument checks (60-90 us a call, thousands of calls a fit: a robust
    step's consistency factor, :func:`flat_top_consistency`, takes four)."""
    return special.chdtr(df, x)


def chi2_logsf(x, df):
    """``log P(chi2_df > x)`` for ``x >= 0``, by the rule ``scipy.stats.chi2.logsf`` follows (scipy 1.17,
    ``rv_continuous._logsf``) and its values: the log of the survival function above the median, where it
    is small, ``log1p`` of minus the distribution function below it, where it is near 1.  Without the
    argument checks (see :func:`chi2_cdf`); -inf where the survival function underflows, 0 at 0."""
    df = np.asarray(df)
    with np.errstate(divide="ignore"):
        inner = np.where(x > 2 * special.gammaincinv(df / 2, 0.5), np.log(special.chdtrc(df, x)),
                         np.log1p(-special.chdtr(df, x)))
    return np.where(x > 0, inner, 0.0)  # 0, not log1p's -0, at the support's edge


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
    weight = chi2_cdf(q, p) + np.exp(log_tail + chi2_logsf(q / s, p))
    moment = p * chi2_cdf(q, p + 2) + s * p * np.exp(log_tail + chi2_logsf(q / s, p + 2))
    return float(p * weight / moment)


@functools.lru_cache(maxsize=4096)
def quantile_of(law: str, q: float, *args) -> float:
    """``scipy.stats.<law>.ppf(q, *args)``, kept: the few quantiles a fit asks for again and again, of the
    chi-square and the normal law at fixed probabilities (a call to scipy.stats takes about 90 us)."""
    return float(getattr(stats, law).ppf(q, *args))


def outlier_cutoff_d2(p: int, quantile: float = OUTLIER_QUANTILE) -> float:
    """The squared Mahalanobis distance above which a row is flagged."""
    return quantile_of("chi2", quantile, p)


def hotelling_quantile(p: int, n: float, quantile: float) -> float:
    """Quantile of ``d^2`` of a new Gaussian row under a covariance from ``n`` rows.

    ``d^2 ~ p (n - 1)(n + 1) / (n (n - p)) F(p, n - p)`` (Hotelling's T^2);
    it tends to the chi-square quantile as n grows, and is infinite for
    ``n <= p + 1``, where a covariance of n rows says nothing about a new one.
    """
    if not n > p + 1:
        return float("inf")
    # scipy.stats.f.ppf's own function, without its argument checks (see chi2_cdf)
    return float(p * (n - 1) * (n + 1) / (n * (n - p)) * special.fdtri(p, n - p, quantile))


def fitted_quantile(p: int, n: float, quantile: float) -> float:
    """Quantile of ``d^2`` of one of the ``n`` Gaussian rows a mean and covariance were fitted on.

    Notes
    -----
    With the mean and the covariance of the ``n`` rows (divisor ``n``, as the
    weighted sums of the fit: sum of weights), a row that is one of them has
    ``d^2 / (n - 1) ~ Beta(p / 2, (n - p - 1) / 2)`` (Wilks 1963; with the
    divisor ``n - 1``, ``n d^2 / (n - 1)^2`` has that law).  It is bounded by
    ``n - 1``, is lighter-tailed than chi-square and tends to the chi-square
    quantile as n grows (below it at every n, for the upper quantiles used
    here), while :func:`hotelling_quantile`, the law of a row the fit did not
    see, lies above it.  Infinite for ``n <= p + 1``.
    """
    if not n > p + 1:
        return float("inf")
    return float((n - 1) * stats.beta.ppf(quantile, p / 2, (n - p - 1) / 2))


def calibrated_cutoff(d2: np.ndarray, quantile: float, *, p: int, n_effective: float, trim: bool = False,
                      law: str = "new") -> float:
    """The ``quantile`` of the bulk's law of ``d^2``, calibrated on the data.

    The cube roots of ``d^2`` are taken as normal with their median and
    (normal-consistent) MAD; with ``trim``, of those rows only whose ``d^2``
    is below the chi-square 99.9 % quantile rescaled to the data's median, so
    that a far minority of outliers cannot widen the law (the re-weighting
    radius, which must not let a cluster in; the flags use every row, so that
    a heavy-tailed bulk is not flagged).  The result is never below the
    Gaussian quantile at ``n_effective`` rows: with ``law="new"`` (the
    re-weighting radii) that of a row the fit did not see
    (:func:`hotelling_quantile`), with ``law="fitted"`` (the outlier cutoff)
    that of a row it was fitted on (:func:`fitted_quantile`).

    Notes
    -----
    The outlier cutoff's floor, for ``m = n_effective`` rows.  A row the fit
    holds (weight 1: ``d^2`` inside the flat top, whose radius is at least
    Hotelling's 97.5 % quantile ``H_0.975``) has the fitted rows' law,
    ``d^2 / (m - 1) ~ Beta(p/2, (m - p - 1)/2)`` (:func:`fitted_quantile`,
    quantile ``B_q``); a row beyond the flat top gets no weight (the fall-off
    is steep) and behaves like a new row (Hotelling, quantile ``H_q``).  So
    the floor is ``B_q`` where ``B_q <= H_0.975``, that is where the rows
    that reach ``B_q`` are rows the fit holds (small samples: m up to about
    8.5 p + 4, 21 rows at p = 2, 37 at p = 4), and ``H_q`` beyond, where
    rows as far out as ``B_q`` lie outside the flat top and only the new-row
    law describes them.  At the switch the floor jumps from ``B_q`` to
    ``H_q`` (14.5 to 23.9 at p = 4, m = 37); both tend to the chi-square
    quantile as m grows, and from a few hundred rows on the calibrated
    quantile decides.

    Why small samples need ``B_q``: at n = 21, p = 4 the 99.8 % quantiles are
    12.7 (fitted row), 16.9 (chi-square) and 33.0 (new row), and
    stackloss's published outliers lie at new-row tail probabilities of
    1-4 %: the new-row law found none of them.  Cerioli (2010) tests rows in
    the reweighted fit against the Beta law and rows out of it against the
    F law; at this rate that misses them too.  Here every row is judged by
    the fitted rows' law: could it be one of the bulk's own rows?  The
    trade-off: a clean row that the robust start shut out of a small
    sample's fit keeps a new row's (larger) distance and is flagged, so on
    clean Gaussian samples of 20-100 rows the mean share flagged is
    0.6-1.4 % rather than 0.2 % (0.1-0.5 % with the new-row floor; median
    0 % both ways), and rows scored later by a model fitted on so few rows
    are flagged more readily than 0.2 %.
    """
    d2 = np.asarray(d2, dtype=np.float64)
    floor = hotelling_quantile(p, n_effective, quantile)
    if law == "fitted":
        fitted = fitted_quantile(p, n_effective, quantile)
        if fitted <= hotelling_quantile(p, n_effective, CUTOFF_QUANTILE):  # such rows are inside the flat top
            floor = fitted
    med = np.median(d2)
    if not (0 < med < np.inf):  # no spread, or every distance beyond float64
        return floor
    roots = np.cbrt(d2[d2 <= quantile_of("chi2", TRIM_QUANTILE, p) * med / quantile_of("chi2", 0.5, p)] if trim else d2)
    center = np.median(roots)
    spread = stats.median_abs_deviation(roots, scale="normal")
    if law == "fitted" and TAIL_QUANTILE is not None:
        spread = max(spread, upper_tail_spread(roots, center, spread))
    return max(float((center + quantile_of("norm", quantile) * spread) ** 3), floor)


def upper_tail_spread(roots: np.ndarray, center: float, spread: float) -> float:
    """The spread of the cube roots read off their upper tail: ``(Q_h - median) / z_h``.

    ``Q_h`` is the :data:`TAIL_QUANTILE` quantile of the roots within
    :data:`TAIL_GUARD` MADs of the median, ``z_h`` the normal quantile;
    0 (the MAD decides) where fewer than :data:`TAIL_MIN_ROWS` roots are left.
    For Gaussian rows the cube roots are nearly normal and this is the MAD
    spread again (the cutoff keeps its 0.2 % rate); for a heavy-tailed bulk
    (a multivariate t, a real recording's bursts) the upper tail is longer
    than the MAD says, and the extrapolated quantile follows it.
    """
    near = roots[roots <= center + TAIL_GUARD * spread]
    if len(near) < TAIL_MIN_ROWS:
        return 0.0
    return float((np.quantile(near, TAIL_QUANTILE) - center) / quantile_of("norm", TAIL_QUANTILE))
