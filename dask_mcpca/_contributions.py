"""Which channel made a row an outlier: reconstruction-based contributions.

For a centred row ``y`` and a precision ``P`` (so that ``d^2 = y^T P y``),
the reconstruction-based contribution of channel j (Alcala and Qin 2009,
*Automatica* 45(7), 1593-1600) is

    RBC_j = (P y)_j^2 / P_jj,

the drop in ``d^2`` when channel j alone is replaced by its conditional
expectation given the other channels (the value of ``y_j`` that minimises
``d^2`` with the others held): ``min over t of d^2(y + t e_j)`` is reached at
``t = -(P y)_j / P_jj`` and equals ``d^2 - RBC_j``.  It is the generalised
likelihood ratio of "channel j is off by an unknown amount" under the
Gaussian model, so the largest RBC is the maximum-likelihood single-channel
fault.  Two guarantees follow:

- **units**: scaling channel j by ``s`` (``y_j -> s y_j``, ``P -> D^-1 P D^-1``)
  leaves every RBC unchanged, so a channel in millibar and one in pascal are
  ranked alike;
- **single-channel faults**: for ``y = y0 + f e_i``, ``RBC_i - RBC_j`` grows as
  ``f^2 (P_ii - P_ij^2 / P_jj) >= 0`` (Cauchy-Schwarz for a positive
  semi-definite P), so a large enough fault on channel i is named channel i,
  unless channels i and j are exactly collinear in P's metric (partial
  correlation +-1, ``P_ij^2 = P_ii P_jj``): two copies of one sensor that no
  other channel predicts cannot be told apart by any method.

The contributions are >= 0 but do not sum to ``d^2`` (their largest is at
most ``d^2``).  The function works on any subset of channels: for a row with
gaps, pass its observed cells and the precision of the observed channels'
marginal model (the inverse of the covariance restricted to them, not the
restriction of the precision).
"""

from __future__ import annotations

import numpy as np

from . import _missing

__all__ = ["reconstruction_contributions", "contributions_with_gaps"]


def reconstruction_contributions(Y: np.ndarray, P: np.ndarray) -> np.ndarray:
    """Reconstruction-based contributions ``(P y)_j^2 / P_jj`` of centred rows.

    Parameters
    ----------
    Y : array of shape (n, k) or (k,)
        Centred rows (the row minus the model's centre), on the k channels
        that ``P`` describes.  NaN or inf cells give NaN or inf contributions
        for that row.
    P : array of shape (k, k)
        A symmetric positive semi-definite precision of those k channels, in
        the units of ``Y``: the inverse of their covariance (for a subset of
        the fitted channels, the inverse of the covariance restricted to
        them).

    Returns
    -------
    contributions : float64 array of the shape of ``Y``
        ``RBC_j >= 0``, the drop in ``y^T P y`` when channel j is replaced by
        its conditional expectation given the others.  A channel with
        ``P_jj <= 0`` or a non-finite ``P_jj`` (one the distance does not
        see, as a zero row of a pseudo-inverse) gets 0: replacing it cannot
        lower the distance.

    Raises
    ------
    ValueError
        ``P`` is not square or does not match ``Y``'s channels.

    Examples
    --------
    >>> import numpy as np
    >>> from dask_mcpca._contributions import reconstruction_contributions
    >>> C = np.array([[1.0, 0.9], [0.9, 1.0]])    # two correlated channels
    >>> P = np.linalg.inv(C)
    >>> c = reconstruction_contributions(np.array([[0.0, 3.0]]), P)  # channel 1 is off
    >>> int(c.argmax()), bool(np.isclose(c[0, 1], 9.0 / C[1, 1] / (1 - 0.9**2)))
    (1, True)
    >>> D = np.diag([1.0, 1e6])                   # channel 1 in other units
    >>> c2 = reconstruction_contributions(np.array([[0.0, 3.0e6]]), np.linalg.inv(D @ C @ D))
    >>> bool(np.allclose(c, c2))
    True
    """
    Y = np.asarray(Y, dtype=np.float64)
    P = np.asarray(P, dtype=np.float64)
    if P.ndim != 2 or P.shape[0] != P.shape[1]:
        raise ValueError(f"P must be a square matrix; got shape {P.shape}")
    if Y.shape[-1] != P.shape[0]:
        raise ValueError(f"Y has {Y.shape[-1]} channels but P describes {P.shape[0]}")
    root, seen = channel_scales(P)
    # The symmetric scaling D^-1/2 P D^-1/2 (unit diagonal) applied to D^1/2 y:
    # the same numbers as (P y)_j^2 / P_jj, but each factor stays within the
    # range of the data even when channels' units differ by many decades.
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        R = P / root[:, None] / root[None, :]
        R[~seen, :] = 0.0
        R[:, ~seen] = 0.0
        out = ((Y * root) @ R) ** 2
    return out


def channel_scales(P: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(root, seen)`` of a precision ``P``: which channels the distance sees (``P_jj`` finite and
    > 0) and ``sqrt(P_jj)`` for them (1 for the others, whose contribution is 0)."""
    diag = np.diag(P).copy()
    seen = np.isfinite(diag) & (diag > 0)
    return np.sqrt(np.where(seen, diag, 1.0)), seen


def contributions_with_gaps(Y: np.ndarray, P: np.ndarray, covariance: np.ndarray) -> np.ndarray:
    """Reconstruction-based contributions of centred rows ``Y`` whose NaN cells are missing.

    Complete rows use ``P``; a row with gaps is judged on its observed
    channels, with the precision of their marginal model (the inverse of
    ``covariance`` restricted to them, :mod:`._missing`), pattern by pattern;
    a missing cell's contribution is NaN, and a row with no observed cell is
    NaN throughout.

    Examples
    --------
    >>> import numpy as np
    >>> from dask_mcpca._contributions import contributions_with_gaps
    >>> C = np.array([[1.0, 0.5, 0.0], [0.5, 1.0, 0.0], [0.0, 0.0, 1.0]])
    >>> c = contributions_with_gaps(np.array([[np.nan, 4.0, 0.0]]), np.linalg.inv(C), C)
    >>> c.round(2)   # channel 0 offline: channel 1 is judged on its own variance
    array([[nan, 16.,  0.]])
    """
    Y = np.asarray(Y, dtype=np.float64)
    if not len(_missing.nonfinite_rows(Y, nan_only=True)):
        return reconstruction_contributions(Y, P)
    gaps = np.isnan(Y)
    whole = ~gaps.any(axis=1)
    out = np.full(Y.shape, np.nan)
    out[whole] = reconstruction_contributions(Y[whole], P)
    part = np.flatnonzero(~whole)
    for observed, rows in _missing.patterns(~gaps[part]):
        if observed.any():
            model = _missing.conditional_model(covariance, observed)
            cells = np.ix_(part[rows], model.observed)
            out[cells] = reconstruction_contributions(Y[cells], model.precision)
    return out
