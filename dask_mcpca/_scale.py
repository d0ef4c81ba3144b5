"""Per-channel robust scales: what ``scale="robust"`` divides each channel by, and the division itself.

A robust fit with one centre and one scatter is affine equivariant in
principle, but not in floating point and not where the model averages:
``noise_variance_`` is one variance for every discarded direction, and
the rank floor (:func:`._power.variance_floor`) is relative to the
largest variance.  A channel in small units (volts beside kilowatts)
then counts for little.  With ``scale="robust"`` the fit and every
method see each channel divided by a robust scale learned from the first
pass's row sample (no extra pass), so multiplying a channel by a
constant multiplies its scale by the same constant and changes no flag.

:func:`robust_scales` is the scale; :func:`in_model_units` the one
spelling of the division, used by the fit's passes and by every
per-row method alike, so that a value the fit learned (a stuck value,
a saturation limit) is met again bit for bit.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MAD_TO_SD", "IQR_TO_SD", "SCALES", "in_model_units", "robust_scales", "scale_text"]

#: The options of ``scale``: None (the data's own units) or ``"robust"`` (each channel over its robust scale).
SCALES = (None, "robust")

#: MAD of a normal variable times this is its standard deviation.
MAD_TO_SD = 1.482602218505602

#: Interquartile range of a normal variable over this is its standard deviation.
IQR_TO_SD = 1.3489795003921634


def _column_scale(x: np.ndarray) -> float:
    """One channel's robust scale: MAD (normal-consistent), else IQR, else the mean absolute deviation
    from the median (a channel mostly at one value), else 1 (a constant channel)."""
    x = x[np.isfinite(x)]
    if not len(x):
        return 1.0
    med = np.median(x)
    dev = np.abs(x - med)
    for s in (MAD_TO_SD * np.median(dev), np.subtract(*np.percentile(x, [75, 25])) / IQR_TO_SD, 1.2533 * dev.mean()):
        if np.isfinite(s) and s > 0:
            return float(s)
    return 1.0


def robust_scales(sample: np.ndarray) -> np.ndarray:
    """Each channel's robust scale on the row ``sample`` (NaN cells ignored), shape (n_features,).

    The MAD times 1.4826 (the standard deviation for normal data; Hampel
    1974), robust to half the rows being outliers; a channel whose MAD is
    0 (most rows at one value: an idle device, a quantized channel at
    rest) gets its interquartile range over 1.349, then its mean absolute
    deviation from the median times 1.2533, then 1 (a constant channel).
    ``robust_scales(c * X) == c * robust_scales(X)`` up to round-off, for
    any positive c per channel.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(20000, 2)) * [1e-3, 1e3]
    >>> np.round(robust_scales(X) / [1e-3, 1e3], 1)
    array([1., 1.])
    """
    sample = np.asarray(sample, np.float64)
    return np.array([_column_scale(sample[:, j]) for j in range(sample.shape[1])], np.float64)


def in_model_units(block, scale: np.ndarray | None) -> np.ndarray:
    """Rows in the model's units: ``block / scale`` in float64, or ``block`` as given when ``scale`` is None.

    The one spelling of the division, so that a value the fit learned from
    scaled rows is met again exactly.
    """
    if scale is None:
        return block
    return np.asarray(block, np.float64) / scale


def scale_text(model) -> str:
    """What a command prints of a model's units: ``"scale robust (...)"`` or ``"scale none (...)"``."""
    model = (getattr(model, "mode_models_", None) or [model])[0]  # with operating modes: each mode's own scales
    if getattr(model, "scale_", None) is not None:
        return "scale robust (components, loadings and drift windows in units of each channel's robust scale)"
    return "scale none (components, loadings and drift windows in the data's units)"
