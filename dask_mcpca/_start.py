"""The robust start: the least outlying half of the in-memory row sample.

:func:`robust_start` gives the default solver (:mod:`._robust`) its first
location and scatter: the Stahel-Donoho outlyingness of every sample row
(its largest robust z-score over directions through pairs of sample rows, as
in ROBPCA's first stage), then the mean and covariance of the least outlying
half, scaled so that the median squared Mahalanobis distance is the
chi-square median.  Outlyingness looks at one direction at a time, so a
tight cluster is as outlying as its distance makes it.  Also here: the
Mahalanobis metric of a scatter (:func:`precision`) that the start and the
steps share.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from ._power import spread_directions
from ._schedule import quantile_of
from ._threads import map_on_cores

__all__ = ["robust_start", "outlyingness", "precision", "TINY_EIGENVALUE", "START_FRACTION", "N_DIRECTIONS"]

#: Directions (through pairs of sample rows) of the outlyingness start.
N_DIRECTIONS = 250

#: Share of the sample, by outlyingness, that gives the start.
START_FRACTION = 0.5

#: Eigenvalues of a scatter below this (in working units, where the bulk's
#: spread is near 1) count as zero, so that no inverse overflows.
TINY_EIGENVALUE = 2.0**-1000


def precision(scatter: np.ndarray) -> np.ndarray:
    """Pseudo-inverse of a scatter matrix; directions without spread get 0.

    A channel that lies in those directions alone (a constant channel: its
    share of the kept directions, ``sum_k V_jk^2``, under ``p * eps``, the
    round-off of orthonormal directions) gets a zero row and column: the
    pseudo-inverse left it a round-off diagonal of about 1e-29, which a
    cellwise fit took for a channel with spread 3e-15, flagging its cells
    and completing them 1e11 from the centre.  A channel with any real share
    (half each for two channels that always agree) keeps its entries.
    """
    w, V = spread_directions(scatter)
    keep = w > TINY_EIGENVALUE
    kept = V[:, keep]
    P = (kept / w[keep]) @ kept.T
    unseen = (kept**2).sum(axis=1) < len(P) * np.finfo(np.float64).eps
    if unseen.any():
        P[unseen, :] = 0.0
        P[:, unseen] = 0.0
    return P


def _rank(scatter: np.ndarray) -> int:
    return len(spread_directions(scatter)[0])


#: Rows of :func:`_mahalanobis2` multiplied at once: their product (16 MB at p = 1000) is reused, where
#: all of a 20,000-row sample's (160 MB) paid its page faults.
DISTANCE_ROWS = 2048


def _mahalanobis2(Y: np.ndarray, scatter: np.ndarray) -> np.ndarray:
    """Squared distances under ``scatter``, ``DISTANCE_ROWS`` rows at a time; inf for rows so far that
    they overflow."""
    P = precision(scatter)
    d2 = np.empty(len(Y))
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, len(Y), DISTANCE_ROWS):
            rows = Y[start : start + DISTANCE_ROWS]
            d2[start : start + len(rows)] = np.einsum("ij,ij->i", rows @ P, rows)
    d2[np.isnan(d2)] = np.inf
    return d2


def outlyingness(sample: np.ndarray, *, n_directions: int = N_DIRECTIONS, seed: int = 0) -> np.ndarray:
    """Stahel-Donoho outlyingness of each row over directions through pairs of rows.

    For a direction ``a`` the robust z-score of row ``x`` is
    ``|a^T x - median(a^T X)| / MAD(a^T X)``; the outlyingness is the largest
    over the directions ``x_i - x_j`` of ``n_directions`` pairs.  The pairs are
    drawn after ordering the rows by their distance to the mean, so the result
    depends on the set of rows, not on their order, and it is equivariant
    under rotation, translation and scaling.  The directions and z-scores
    are computed from the rows centred at the coordinatewise median (the
    differences and the deviations from a median do not depend on the
    centre): one row of a float32 fill value (9.97e36) among 6,000 moved the
    mean so far that every other row, centred at it, lost all its digits and
    became the same row, every direction's MAD was 0, and the fit rested on
    the first rows by index, the fill row among them.
    """
    n, p = sample.shape
    about_mean = sample - sample.mean(axis=0)
    norm2 = np.einsum("ij,ij->i", about_mean, about_mean)
    order = np.argsort(norm2, kind="stable")
    if np.any(np.diff(norm2[order]) == 0):  # ties (repeated rows): broken by the columns, in order
        order = np.lexsort((*about_mean.T[::-1], norm2))
    del about_mean
    centred = sample - np.median(sample, axis=0)
    rows = centred[order]
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, n, n_directions), rng.integers(0, n, n_directions)
    directions = rows[i] - rows[j]
    norms = np.linalg.norm(directions, axis=1)
    directions = directions[norms > 0] / norms[norms > 0, None]
    if not len(directions):
        return np.zeros(n)
    runs = [directions[k : k + DIRECTION_RUN] for k in range(0, len(directions), DIRECTION_RUN)]
    # The runs' partial sorts release the GIL: on the client's cores at once.
    scores = [s for s in map_on_cores(_largest_z_score, runs, centred) if s is not None]
    return np.maximum.reduce(scores) if scores else np.zeros(n)


#: Directions of the outlyingness start scored at once: their projections of a
#: 20,000-row sample (5 MB) stay in cache through the medians, deviations and
#: ratios; all 250 at once (40 MB) took 0.14 s instead of 0.115 s.
DIRECTION_RUN = 32


def _largest_z_score(directions: np.ndarray, centred: np.ndarray) -> np.ndarray | None:
    """Each row's largest robust z-score over ``directions`` (unit vectors), or None when no
    direction has a spread (a MAD above 0)."""
    deviation = directions @ centred.T  # one direction per (contiguous) row: the projections, then
    deviation -= _row_medians(deviation)[:, None]  # their deviations from the median, in place
    np.abs(deviation, out=deviation)
    spread = _row_medians(deviation) * _MAD_TO_SD
    keep = spread > 0
    if not keep.any():
        return None
    if not keep.all():
        deviation, spread = deviation[keep], spread[keep]
    with np.errstate(over="ignore"):  # a row 1e300 spreads out is infinitely outlying: inf, no warning
        deviation /= spread[:, None]
    return deviation.max(axis=0)


#: MAD times this is the standard deviation of a normal law.
_MAD_TO_SD = 1.0 / stats.norm.ppf(0.75)


def _row_medians(A: np.ndarray) -> np.ndarray:
    """The median of each row, by one partial sort (``np.median`` copies and checks for NaN).

    One selection, of the upper middle value; for an even length the lower one is the
    largest value below it (numpy's partition at two positions took 5x as long).
    """
    n = A.shape[1]
    k = n // 2
    part = np.partition(A, k, axis=1)
    return part[:, k] if n % 2 else (part[:, :k].max(axis=1) + part[:, k]) / 2


def _median_scaled(Y: np.ndarray, scatter: np.ndarray) -> np.ndarray:
    """``scatter`` scaled so the median ``d^2`` of the rows ``Y`` is the chi-square median."""
    d2 = _mahalanobis2(Y, scatter)
    med = np.median(d2)
    return scatter * (med / quantile_of("chi2", 0.5, max(_rank(scatter), 1))) if med > 0 else scatter


def robust_start(sample: np.ndarray, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Location and scatter of the least outlying half of an in-memory row sample.

    See :func:`outlyingness`.  The half holds at least ``p + 2`` rows; its
    scatter is scaled so that the median squared Mahalanobis distance of the
    whole sample is the chi-square median, as it is for Gaussian rows.
    """
    n, p = sample.shape
    h = min(n, max(int(np.ceil(START_FRACTION * n)), p + 2))
    subset = np.argsort(outlyingness(sample, seed=seed), kind="stable")[:h]
    location = sample[subset].mean(axis=0)
    scatter = np.atleast_2d(np.cov(sample[subset], rowvar=False, bias=True))
    return location, _median_scaled(sample - location, scatter)
