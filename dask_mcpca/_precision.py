"""A fitted model's precision and what follows from it channel by channel.

The floored variances (:func:`floored_variances`), the precision ``P`` and its
powers (:func:`precision_power`: ``P`` is :meth:`MCPCA.get_precision`, ``P^-1``
:meth:`MCPCA.get_covariance`, ``P^(1/2)`` the root that whitens a row), the power
of two the distances are computed in (:func:`working_unit`), the rows in the
model's units (:func:`model_rows`), and the channel contributions
(:func:`contributor`, :func:`contribution_matrix`, :func:`top_channel`).  Every
function takes ``model``: anything with the fitted attributes it reads (a
fitted estimator, or a fit's :class:`._fit_result.ModelView` while the fit is
assembled).  The distances built on these live in :mod:`._distances`, the
per-row methods' rules in :mod:`._model`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _missing
from ._contributions import channel_scales, contributions_with_gaps
from ._power import direction_floors, variance_floor
from ._scale import in_model_units

__all__ = [
    "CONTRIBUTION_METHODS",
    "channel_variances",
    "contribution_matrix",
    "contributor",
    "floored_variances",
    "model_rows",
    "precision_power",
    "top_channel",
    "working_unit",
]

#: The methods of :meth:`MCPCA.channel_contributions` (``"residual"``: ``"reconstruction"``'s former name).
CONTRIBUTION_METHODS = ("reconstruction", "whitened", "product", "residual")


def model_rows(model: Any, block):
    """Rows as stored in the model's units: divided by ``scale_`` (``scale="robust"``), else as given."""
    return in_model_units(block, getattr(model, "scale_", None))


# ----------------------------------------------------------- variances, precision
def channel_variances(model: Any) -> np.ndarray:
    """Each channel's variance under the model's fitted variances as they are (not floored), in its units."""
    C = model.components_
    return ((C**2).T @ np.maximum(model.explained_variance_, 0.0)
            + max(model.noise_variance_, 0.0) * np.maximum(1.0 - (C**2).sum(axis=0), 0.0))


def floored_variances(model: Any) -> tuple[np.ndarray, float]:
    """The fitted variances and noise variance, floored at the fit's round-off level.

    The floor is :func:`._power.variance_floor` of the largest variance,
    lowered for a direction whose variance is real in its own channels'
    units (:func:`._power.direction_floors`: a channel in millivolts beside
    one in kilowatts): a direction in which the data never varied counts a
    row's deviation along it, consistently, as a huge distance when it is
    beyond round-off and as nothing when it is round-off.  The noise
    variance keeps the floor of the largest variance.

    Parameters
    ----------
    model : MCPCA or FitResult
        Reads ``explained_variance_``, ``noise_variance_``, ``n_features_in_``.

    Returns
    -------
    lam : ndarray of shape (n_components_,)
    noise : float
    """
    lam = model.explained_variance_
    top = max(float(lam.max(initial=0.0)), model.noise_variance_)
    floor = variance_floor(top, model.n_features_in_) if top > 0 else np.finfo(float).tiny
    if top > 0 and lam.min(initial=floor) <= floor:  # each direction in its own channels' units
        floors = direction_floors(np.maximum(lam, 0.0), model.components_.T, channel_variances(model))
        return np.maximum(lam, floors), max(model.noise_variance_, floor)
    return np.maximum(lam, floor), max(model.noise_variance_, floor)


def precision_power(model: Any, power: float) -> np.ndarray:
    """``P^power`` of the precision P whose quadratic form is the model's ``d^2``.

    ``power=1`` is :meth:`MCPCA.get_precision`, ``-1`` :meth:`MCPCA.get_covariance`,
    ``0.5`` the symmetric root that whitens a row.

    Parameters
    ----------
    model : MCPCA or FitResult
        A fitted model.
    power : float
        The power of the precision.

    Returns
    -------
    ndarray of shape (n_features_in_, n_features_in_)
    """
    lam, noise = floored_variances(model)
    C = model.components_
    P = (C.T * lam**-power) @ C
    if model.n_components_ < model.n_features_in_:
        P += noise**-power * (np.eye(model.n_features_in_) - C.T @ C)
    return P


def working_unit(model: Any) -> tuple[np.ndarray, float, int]:
    """The floored variances, the noise variance and the power of two the distances are computed in
    (the exponent of the largest spread: scaling by it is exact, and squares stay far from overflow)."""
    lam, noise = floored_variances(model)
    return lam, noise, int(np.frexp(np.sqrt(lam.max(initial=noise)))[1])


def contribution_matrix(model: Any, P: np.ndarray | None = None) -> np.ndarray:
    """``M`` with ``(y M)_a^2 = (P y)_a^2 / P_aa``, channel a's reconstruction-based contribution of a
    complete centred row ``y`` (:func:`._contributions.reconstruction_contributions`'s unit-diagonal
    precision, its rows scaled back): ``P``'s columns divided by ``sqrt(P_aa)``, unseen channels 0.
    ``P``: the model's :func:`precision_power` 1, where the caller has it."""
    P = precision_power(model, 1.0) if P is None else P
    root, seen = channel_scales(P)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        M = P / root[None, :]
    M[~seen, :] = 0.0
    M[:, ~seen] = 0.0
    return np.ascontiguousarray(M)


def top_channel(contributions: np.ndarray) -> np.ndarray:
    """Index of each row's largest contribution (int16); -1 where they are all NaN."""
    top = np.argmax(contributions, axis=1).astype(np.int16)  # a NaN would be taken as the largest
    gaps = _missing.nonfinite_rows(contributions, nan_only=True)
    if len(gaps):
        c = contributions[gaps]
        top[gaps] = np.argmax(np.where(np.isnan(c), -np.inf, c), axis=1)
        top[gaps[np.isnan(c).all(axis=1)]] = -1
    return top


def contributor(model: Any, method: str):
    """The row-block function of :meth:`MCPCA.channel_contributions` by ``method``."""
    if method not in CONTRIBUTION_METHODS:
        raise ValueError(
            f"method={method!r} is invalid; expected 'reconstruction', 'whitened', 'product' or 'residual'"
        )
    mean = model.mean_
    if method in ("reconstruction", "residual"):
        P, cov = precision_power(model, 1.0), precision_power(model, -1.0)

        def func(b):  # a row with gaps ("partial"): on its observed channels, NaN for a missing cell
            return contributions_with_gaps(np.asarray(b, np.float64) - mean, P, cov)
    elif method == "whitened":
        root = precision_power(model, 0.5)

        def func(b):
            return ((np.asarray(b, np.float64) - mean) @ root) ** 2
    else:
        P = precision_power(model, 1.0)

        def func(b):
            Y = np.asarray(b, np.float64) - mean
            return Y * (Y @ P)

    return func
