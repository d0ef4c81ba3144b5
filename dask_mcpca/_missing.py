"""Rows with missing cells (``nan_policy="partial"``): the Gaussian model restricted to what was observed.

A sensor archive loses one channel at a time: a row with a NaN cell still
holds the other channels' measurements.  Under a Gaussian model with mean 0
(rows are centred first) and covariance ``S``, the observed cells ``O`` of a
row and its missing cells ``M`` obey

    y_O ~ N(0, S_OO),     y_M | y_O ~ N(B y_O, C),
    B = S_MO S_OO^-1,     C = S_MM - S_MO S_OO^-1 S_OM

(Tipping and Bishop 1999, appendix; Little and Rubin 2002, ch. 11).  Hence:

- the squared distance on the observed cells, ``d^2_O = y_O^T S_OO^-1 y_O``,
  which for a Gaussian row is chi-square with ``k = |O|`` degrees of freedom;
- the conditional expectation of the missing cells, ``B y_O`` (what
  :meth:`MCPCA.impute` returns and :meth:`MCPCA.transform` projects);
- the E-step of a (weighted) EM fit: a row contributes ``w yhat yhat^T + w C``
  to the scatter, where ``yhat`` is the row completed by ``B y_O``
  (:func:`._block.block_stats` adds these terms for a plan's ``partial`` rows).

Rows with different numbers of observed cells are compared on one scale by
the chi-square probability: :func:`equivalent_d2` maps ``d^2_O`` with k
degrees of freedom to the p-channel distance with the same upper-tail
probability, and :func:`radius_for_count` maps a p-channel radius to k
channels.  A row's outlier cutoff is thus calibrated for the number of its
observed channels at the same false-alarm rate.

Rows are grouped by their pattern of observed cells, so each pattern's
p x p algebra is done once; archives have few patterns (one per set of
channels offline at the same time).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from scipy import stats
from scipy.special import gammaln

__all__ = [
    "partial_rows",
    "patterns",
    "ConditionalModel",
    "conditional_model",
    "observed_d2",
    "completed",
    "equivalent_d2",
    "radius_for_count",
]


def partial_rows(X: np.ndarray) -> np.ndarray:
    """Rows with at least one observed cell, some cells NaN and none inf: the rows ``"partial"`` keeps."""
    nan = np.isnan(X)
    some = nan.any(axis=1)
    return some & ~nan.all(axis=1) & ~np.isinf(X).any(axis=1)


def patterns(observed: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(observed_columns_mask, row_indices)`` per distinct row of the boolean mask ``observed``.

    In the order of the patterns' packed bytes, so the same rows give the
    same order whatever the chunking.
    """
    if not len(observed):
        return
    keys = np.packbits(observed, axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(uniq) + 1))
    for i in range(len(uniq)):
        rows = order[bounds[i] : bounds[i + 1]]
        yield observed[rows[0]], rows


class ConditionalModel:
    """The Gaussian model ``N(0, S)`` seen through one pattern of observed cells.

    Attributes
    ----------
    observed, missing : ndarray of int
        Column indices of the observed and missing cells.
    precision : ndarray of shape (k, k)
        ``S_OO^-1`` (a pseudo-inverse: directions without spread count nothing).
    regression : ndarray of shape (p - k, k)
        ``B = S_MO S_OO^-1``.
    residual : ndarray of shape (p - k, p - k)
        ``C = S_MM - B S_OM``, the covariance of the missing cells given the observed ones.
    """

    def __init__(self, scatter: np.ndarray, observed: np.ndarray):
        obs = np.flatnonzero(observed)
        mis = np.flatnonzero(~np.asarray(observed, bool))
        S_OO = scatter[np.ix_(obs, obs)]
        self.observed, self.missing = obs, mis
        self.precision = np.linalg.pinv((S_OO + S_OO.T) / 2, hermitian=True)
        self.regression = scatter[np.ix_(mis, obs)] @ self.precision
        C = scatter[np.ix_(mis, mis)] - self.regression @ scatter[np.ix_(obs, mis)]
        self.residual = (C + C.T) / 2

    def d2(self, Y_obs: np.ndarray) -> np.ndarray:
        """``y_O^T S_OO^-1 y_O`` of centred observed cells (n x k)."""
        return np.einsum("ij,ij->i", Y_obs @ self.precision, Y_obs)


def conditional_model(scatter: np.ndarray, observed: np.ndarray) -> ConditionalModel:
    """:class:`ConditionalModel` of ``scatter`` for the observed columns ``observed`` (a boolean mask)."""
    return ConditionalModel(np.asarray(scatter, np.float64), np.asarray(observed, bool))


def observed_d2(Y: np.ndarray, scatter: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Squared distance on the observed cells of centred rows ``Y`` (NaN: missing), and their counts.

    Complete rows get ``y^T S^-1 y`` (k = p); rows with no observed cell get
    NaN and count 0.
    """
    Y = np.asarray(Y, np.float64)
    observed = ~np.isnan(Y)
    counts = observed.sum(axis=1)
    d2 = np.full(len(Y), np.nan)
    for mask, rows in patterns(observed):
        if mask.any():
            d2[rows] = conditional_model(scatter, mask).d2(Y[np.ix_(rows, np.flatnonzero(mask))])
    return d2, counts


def completed(Y: np.ndarray, scatter: np.ndarray) -> np.ndarray:
    """Centred rows ``Y`` with each missing cell replaced by its conditional expectation ``B y_O``.

    Rows with no observed cell stay NaN.
    """
    out = np.array(Y, dtype=np.float64, copy=True)
    observed = ~np.isnan(out)
    incomplete = ~observed.all(axis=1)
    if not incomplete.any():
        return out
    sub = observed[incomplete]
    idx = np.flatnonzero(incomplete)
    for mask, rows in patterns(sub):
        if mask.any():
            model = conditional_model(scatter, mask)
            r = idx[rows]
            out[np.ix_(r, model.missing)] = out[np.ix_(r, model.observed)] @ model.regression.T
    return out


def equivalent_d2(d2: np.ndarray, counts: np.ndarray, p: int) -> np.ndarray:
    """``d^2`` on ``counts`` observed channels mapped to p channels at the same chi-square upper-tail probability.

    Complete rows (``counts == p``) keep their value exactly; NaN stays NaN,
    inf stays inf; far rows (tail probabilities below float64's range) keep
    their order through the tail's asymptotic form.
    """
    d2 = np.asarray(d2, np.float64)
    counts = np.asarray(counts)
    out = d2.copy()
    part = (counts < p) & (counts > 0) & np.isfinite(d2)
    if part.any():
        out[part] = _chi2_isf_log(_chi2_logsf(d2[part], counts[part]), p)
    return out


def radius_for_count(radius: float, p: int, k: np.ndarray | int) -> np.ndarray:
    """A p-channel ``d^2`` radius mapped to ``k`` observed channels at the same upper-tail probability.

    An infinite radius stays infinite; ``k == p`` gives ``radius`` itself.
    """
    k = np.asarray(k)
    if not np.isfinite(radius):
        return np.full(k.shape, float(radius))
    with np.errstate(invalid="ignore"):
        out = stats.chi2.isf(stats.chi2.sf(radius, p), k)
    return np.where(k == p, radius, out)


#: Below this log tail probability the chi-square tail is taken in its asymptotic form.
_FAR_LOG_SF = -600.0


def _log_tail(x: np.ndarray, df) -> np.ndarray:
    """``log P(chi2_df > x)`` for large x: ``(df/2 - 1) log(x/2) - x/2 - lgamma(df/2) + log(1 + (df/2 - 1)/(x/2))``."""
    a = np.asarray(df, np.float64) / 2
    return (a - 1) * np.log(x / 2) - x / 2 - gammaln(a) + np.log1p((a - 1) / (x / 2))


def _chi2_logsf(x: np.ndarray, df) -> np.ndarray:
    """``log P(chi2_df > x)``, finite for every finite x (scipy's underflows to -inf far out)."""
    with np.errstate(divide="ignore"):
        out = np.asarray(stats.chi2.logsf(x, df), np.float64)
    far = out < _FAR_LOG_SF
    if np.any(far):
        out[far] = _log_tail(x[far], np.broadcast_to(df, np.shape(x))[far])
    return out


def _chi2_isf_log(log_sf: np.ndarray, df: int) -> np.ndarray:
    """The chi-square quantile whose log upper-tail probability is ``log_sf`` (to far tails)."""
    out = stats.chi2.isf(np.exp(log_sf), df)
    far = log_sf < _FAR_LOG_SF
    if np.any(far):
        x = -2.0 * log_sf[far]
        for _ in range(8):  # Newton on the asymptotic tail; it starts within a few per cent
            a = df / 2
            f = _log_tail(x, df) - log_sf[far]
            x = np.maximum(x - f / ((a - 1) / x - 0.5), 1.0)
        out[far] = x
    return out
