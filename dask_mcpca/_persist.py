"""Saved models: a fitted estimator as one JSON file, no pickle, and what a file read must satisfy.

This module knows parameters and fitted arrays, not the estimator.
:meth:`MCPCA.save` hands it the model; :func:`dask_mcpca.load` hands it the
class to rebuild (``load(path, MCPCA)``).  The file is written and read in
:mod:`._model_file` (the JSON codec); here are the entry points and the
checks a model read passes (:func:`validate_fitted`).

Format (``format_version`` 1, 2 for a model with ``repeated_rows_``, 3 for one with operating modes)::

    {
      "format": "dask-mcpca-model",
      "format_version": 1,
      "library_version": "0.1.0",
      "class": "MCPCA",
      "params": {"n_components": null, "solver": "auto", ...},
      "attributes": {
        "components_": {"dtype": "float64", "shape": [3, 12], "data": [...]},
        "kernel_scale_": 2.449489742783178,
        "converged_": true,
        ...
      }
    }

A model with operating modes (``MCPCA(modes=...)``) holds, beside its own
attributes (its largest mode's), ``mode_models_``: a list with one
``{"params": ..., "attributes": ...}`` object per mode, each an ordinary
model; and ``modes_`` (the labels: numbers, or strings written as
``"dtype": "str"``), ``n_modes_``, ``mode_weights_``, ``mode_means_``.
Each mode's model is checked as a model is, and the modes against one
another (:func:`_validate_modes`).

``params`` are the constructor arguments (``get_params``; a path-like
``checkpoint`` is stored as a string).  ``attributes`` are the fitted
attributes (names ending in ``_``): a numpy array is an object with its dtype,
shape and its values as a flat, C-ordered list; Python and numpy scalars are
JSON numbers, booleans or strings.  Floats are written with Python's shortest
round-trip representation, so a loaded model computes bit for bit what the
saved one did; NaN and infinities, which JSON has no numbers for, are written
as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``.  The file is
plain, strict JSON that any language can read; nothing in it is executed on
load.

:func:`save` never leaves half a model (:func:`dask_mcpca._atomic.write_bytes`):
a local path is written to a temporary sibling renamed over ``path``; an
fsspec URL (``s3://bucket/model.json``) is written as one object with
``fs.pipe_file`` once the whole text is encoded, which S3 makes visible only
whole (one PUT, or above 100 MiB a multipart upload published when completed
and aborted on failure), as GCS and Azure Blob do.
:func:`load` refuses files of another format or of a newer format version,
and trusts nothing in the file: it reads at most ``MAX_MODEL_BYTES`` of a
regular file (a local one or a URL), validates the parameters as the constructor's callers do
(``MCPCA._validate_params``), drops ``checkpoint`` (a path written by another
fit must not be resumed from), and checks every fitted attribute against
``n_features_in_`` and ``n_components_``: its shape, a float dtype, finite
values, and the model's invariants: orthonormal components, each row of
``components_`` carrying its own variance under ``covariance_``, variances
>= 0 with the first > 0 and, for ``solver="auto"``, none increasing,
``kernel_scale_`` within the range a fit of ``n_features_in_`` features and
this ``kernel_factor`` gives, a finite ``outlier_cutoff_ > 0`` that matches
``outlier_threshold_`` (:func:`validate_fitted`); and the sums ``partial_fit``
updates from and the rules rows are judged by, against the model they
belong to: the ``update_*`` sums give, as an update without new rows would
compute them, the model's mean, components, variances and the state that
weighs new rows, and obey their own rules (covariances positive
semi-definite, weights per row at most 1, radii ordered, the kernel size
that ``kernel_scale_`` implies); ``quantization_steps_`` fit within each
channel's variance (:func:`_validate_steps`).  A file that fails is refused
with a :class:`ModelFormatError` that names the file and the attribute, in
one line.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import TypeVar

import numpy as np

from ._exceptions import ModelFormatError
from ._fitted_params import kernel_scale_range
from ._model_file import FORMAT, FORMAT_VERSION, MAX_MODEL_BYTES, damaged, read, save
from ._update_checks import FIX, UPDATE_ARRAYS, UPDATE_SUMS_TOL, check_update_sums

T = TypeVar("T")

__all__ = ["save", "load", "load_with_digest", "validate_fitted", "FORMAT", "FORMAT_VERSION", "MAX_MODEL_BYTES",
           "ModelFormatError"]

#: Largest deviation of ``components_ @ components_.T`` from the identity accepted.
ORTHONORMAL_TOL = 1e-6
#: Relative round-off accepted between values a fit derives from one another
#: (a variance and ``c^T covariance_ c``, the threshold and the cutoff).
CONSISTENCY_TOL = 1e-8


def load(path: str | os.PathLike, cls: type[T], *, storage_options: dict | None = None) -> T:
    """Read a model of class ``cls`` written by :func:`save` (see :func:`load_with_digest`)."""
    return load_with_digest(path, cls, storage_options=storage_options)[0]


def load_with_digest(path: str | os.PathLike, cls: type[T], *, storage_options: dict | None = None) -> tuple[T, str]:
    """Read a model of class ``cls`` written by :func:`save`, and the SHA-256 of its file, in one read.

    Parameters
    ----------
    path : str or path-like
        The model file, or an fsspec URL.
    cls : type
        The estimator class; the file must name it, and it is rebuilt as
        ``cls(**params)`` with the saved attributes set on it.
    storage_options : dict, optional
        fsspec options for a URL.

    Returns
    -------
    model : cls
        Fitted, with the saved parameters and attributes (checked by :func:`validate_fitted`).
    digest : str
        The SHA-256 (hex) of the file's bytes, as a score store names the model that scored its rows.

    Raises
    ------
    FileNotFoundError
        No file at ``path``.
    ModelFormatError
        The file is not a dask-mcpca model, is damaged, or was written by a newer format.
    """
    model, digest = read(path, cls, storage_options=storage_options)
    try:
        validate_fitted(model)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise damaged(os.fspath(path), err) from None
    return model, digest


# name -> (shape in terms of p and k, allow NaN); checked by validate_fitted.
_ARRAYS = {
    "components_": (("k", "p"), False),
    "explained_variance_": (("k",), False),
    "explained_variance_ratio_": (("k",), False),
    "mean_": (("p",), False),
    "covariance_": (("p", "p"), False),
    "sigmas_": (("k",), True),  # NaN for the paper's last component
}


def _int(model, name: str, low: int, high: float = math.inf) -> int:
    value = getattr(model, name)
    if not (isinstance(value, numbers.Integral) and not isinstance(value, bool) and low <= value <= high):
        raise ValueError(f"{name}={value!r} must be an int in [{low}, {high}]")
    return int(value)


def _real(model, name: str, ok, expected: str) -> None:
    value = getattr(model, name)
    if not (isinstance(value, numbers.Real) and not isinstance(value, bool) and ok(float(value))):
        raise ValueError(f"{name}={value!r} must be {expected}")
    setattr(model, name, float(value))


def validate_fitted(model) -> None:
    """Check a model's fitted attributes against ``n_features_in_`` (see :func:`load`).

    Raises
    ------
    ValueError
        Naming the first attribute that is missing, of the wrong shape or
        dtype, non-finite, out of range, or inconsistent with the others
        (see the module docstring for the invariants checked).
    """
    missing = [n for n in (*_ARRAYS, "n_features_in_", "n_components_", "noise_variance_", "kernel_scale_",
                           "outlier_threshold_", "n_samples_", "n_passes_", "n_iter_", "converged_")
               if not hasattr(model, n)]
    if missing:
        raise ValueError(f"fitted attribute(s) {', '.join(missing)} missing")
    p = _int(model, "n_features_in_", 1)
    k = _int(model, "n_components_", 1, p)
    for name, (dims, allow_nan) in _ARRAYS.items():
        value = getattr(model, name)
        shape = tuple({"p": p, "k": k}[d] for d in dims)
        if not isinstance(value, np.ndarray) or value.dtype.kind != "f" or value.shape != shape:
            got = type(value).__name__
            if isinstance(value, np.ndarray):
                got = f"{value.dtype} array of shape {value.shape}"
            raise ValueError(
                f"{name} must be a float array of shape {shape} (n_features_in_={p}, n_components_={k}); got {got}"
            )
        bad = np.isinf(value) if allow_nan else ~np.isfinite(value)
        if bad.any():
            raise ValueError(f"{name} holds {int(bad.sum())} non-finite value(s)")
    C = model.components_
    gap = float(np.abs(C @ C.T - np.eye(k)).max())
    if not gap <= ORTHONORMAL_TOL:
        raise ValueError(f"components_ are not orthonormal (|C C^T - I| = {gap:.3g} > {ORTHONORMAL_TOL:g})")
    for name in ("explained_variance_", "explained_variance_ratio_", "sigmas_"):
        if (getattr(model, name) < 0).any():
            raise ValueError(f"{name} holds negative values")
    if (model.explained_variance_ratio_ > 1).any():
        raise ValueError("explained_variance_ratio_ holds values above 1")
    cov = model.covariance_
    if not np.allclose(cov, cov.T, rtol=1e-9, atol=1e-12 * max(1.0, float(np.abs(cov).max()))):
        raise ValueError("covariance_ is not symmetric")
    _real(model, "noise_variance_", lambda v: math.isfinite(v) and v >= 0, "a finite float >= 0")
    scale = getattr(model, "scale_", None)  # scale="robust": the channels' robust scales; none before scale existed
    if getattr(model, "mode_models_", None) is not None:  # each mode has its own scales: checked on its model
        if scale is not None:
            raise ValueError("scale_ of a model with operating modes is each mode's (mode_models_[m].scale_), "
                             "not the model's own")
    elif (scale is not None) != (getattr(model, "scale", None) == "robust"):
        raise ValueError(f"scale={getattr(model, 'scale', None)!r} and scale_ disagree (scale_ is set exactly "
                         "for scale='robust')")
    if scale is not None and not (isinstance(scale, np.ndarray) and scale.shape == (p,) and scale.dtype.kind == "f"
                                  and np.isfinite(scale).all() and (scale > 0).all()):
        raise ValueError(f"scale_ must be {p} finite floats > 0")
    if getattr(model, "cell_cutoff_", None) is not None:  # a cellwise fit's: a chi-square(1) quantile
        _real(model, "cell_cutoff_", lambda v: 1.0 <= v < 1e4, "a squared cell cutoff in [1, 1e4)")
    _validate_variances(model)
    low, high = kernel_scale_range(model, p)
    _real(model, "kernel_scale_", lambda v: low <= v <= high,
          f"a float in [{low:.6g}, {high:.6g}] (sqrt(c^2) of {p} features times kernel_factor)")
    _real(model, "outlier_threshold_", lambda v: 0 <= v <= 1, "a float in [0, 1]")
    if not hasattr(model, "outlier_cutoff_"):  # written before the cutoff was calibrated: the threshold implies it
        t = model.outlier_threshold_
        if not t > 0:
            raise ValueError("outlier_cutoff_ missing, and outlier_threshold_=0 does not give it")
        model.outlier_cutoff_ = -2.0 * model.kernel_scale_**2 * math.log(t)
    _real(model, "outlier_cutoff_", lambda v: math.isfinite(v) and v > 0, "a finite float > 0")
    implied = math.exp(-model.outlier_cutoff_ / (2.0 * model.kernel_scale_**2))
    if not math.isclose(model.outlier_threshold_, implied, rel_tol=CONSISTENCY_TOL, abs_tol=1e-300):
        raise ValueError(f"outlier_threshold_={model.outlier_threshold_!r} does not match outlier_cutoff_ and "
                         f"kernel_scale_ (exp(-cutoff / (2 kernel_scale^2)) = {implied!r})")
    repeated = getattr(model, "repeated_values_", np.empty((0, 2)))
    if not (isinstance(repeated, np.ndarray) and repeated.ndim == 2 and repeated.shape[1] == 2
            and repeated.dtype.kind == "f" and np.isfinite(repeated).all()
            and np.all((repeated[:, 0] >= 0) & (repeated[:, 0] < p) & (repeated[:, 0] % 1 == 0))):
        raise ValueError(f"repeated_values_ must be finite (column, value) pairs, columns in [0, {p})")
    model.repeated_values_ = repeated
    rows = getattr(model, "repeated_rows_", np.empty((0, p)))  # none in a file written before they were found
    if not (isinstance(rows, np.ndarray) and rows.ndim == 2 and rows.shape[1] == p
            and rows.dtype.kind == "f" and np.isfinite(rows).all()):
        raise ValueError(f"repeated_rows_ must be a finite float array of shape (m, {p})")
    model.repeated_rows_ = rows
    found_steps = hasattr(model, "quantization_steps_")
    steps = getattr(model, "quantization_steps_", np.zeros(p))  # none in a file written before they were found
    if not (isinstance(steps, np.ndarray) and steps.shape == (p,) and steps.dtype.kind == "f"
            and np.isfinite(steps).all() and (steps >= 0).all()):
        raise ValueError(f"quantization_steps_ must be {p} finite floats >= 0")
    model.quantization_steps_ = steps
    limits = getattr(model, "saturation_limits_", None)  # none in a file written before they were learned
    if limits is not None:
        limits = np.asarray(limits, dtype=np.float64) if isinstance(limits, np.ndarray) else limits
        if not (isinstance(limits, np.ndarray) and limits.shape == (p, 2) and not np.isinf(limits).any()
                and not (limits[:, 0] >= limits[:, 1]).any()):
            raise ValueError(f"saturation_limits_ must be a float array of shape ({p}, 2): finite or NaN, "
                             "each channel's lower limit below its upper one")
        model.saturation_limits_ = limits
    shift = getattr(model, "shift_scale_", None)  # none in a file written before the shift rule, or too few rows
    if shift is not None:
        shift = np.asarray(shift, dtype=np.float64) if isinstance(shift, np.ndarray) else shift
        if not (isinstance(shift, np.ndarray) and shift.shape == (p,) and np.isfinite(shift).all()
                and (shift > 0).all()):
            raise ValueError(f"shift_scale_ must be {p} finite floats > 0")
        model.shift_scale_ = shift
    _int(model, "n_samples_", 1)
    if hasattr(model, "n_samples_partial_"):  # none in a file written before it was counted
        _int(model, "n_samples_partial_", 0, model.n_samples_)
    _int(model, "n_passes_", 0)
    _int(model, "n_iter_", 0)
    if not isinstance(model.converged_, (bool, np.bool_)):
        raise ValueError(f"converged_={model.converged_!r} must be true or false")
    _validate_steps(model, p)
    _validate_update(model, p, found_steps=found_steps)
    _validate_archive_rows(model)
    _validate_modes(model, p)


#: What a model with operating modes holds beside ``mode_models_`` (all or none of them).
_MODE_ATTRIBUTES = ("n_modes_", "modes_", "mode_weights_", "mode_means_", "mode_channels_")
#: Largest deviation of the modes' weights' sum from 1 accepted.
WEIGHTS_TOL = 1e-9


def _validate_modes(model, p: int) -> None:
    """A model with operating modes (``mode_models_``): each mode's model passes :func:`validate_fitted` on the
    same ``n_features_in_``; ``n_modes_ == len(mode_models_)`` (at least 2), one label per mode in ``modes_``
    (no two alike), weights > 0 summing to 1, each mode's mean (``mode_means_``), the channels that tell the
    modes apart (``mode_channels_``) as the modes give them (:func:`._modes.mode_finder`), and the model's own
    attributes its largest mode's."""
    from ._modes import mode_finder

    present = [n for n in ("mode_models_", *_MODE_ATTRIBUTES) if hasattr(model, n)]
    if not present:
        return
    if len(present) < len(_MODE_ATTRIBUTES) + 1:
        missing = sorted({"mode_models_", *_MODE_ATTRIBUTES} - set(present))
        raise ValueError(f"fitted attribute(s) {', '.join(missing)} missing (a model with operating modes "
                         f"holds all of mode_models_, {', '.join(_MODE_ATTRIBUTES)})")
    models = model.mode_models_
    k = _int(model, "n_modes_", 2)
    if not isinstance(models, list) or len(models) != k:
        raise ValueError(f"n_modes_={k} but mode_models_ holds {len(models) if isinstance(models, list) else '?'} "
                         "models; one model per mode")
    for m, one in enumerate(models):
        try:
            validate_fitted(one)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"mode_models_[{m}]: {err}") from None
        if one.n_features_in_ != p:
            raise ValueError(f"mode_models_[{m}] has n_features_in_={one.n_features_in_}, the model {p}")
    labels = model.modes_
    if not (isinstance(labels, np.ndarray) and labels.shape == (k,) and len(set(labels.tolist())) == k):
        raise ValueError(f"modes_ must hold {k} distinct labels, one per mode")
    weights = model.mode_weights_
    if not (isinstance(weights, np.ndarray) and weights.dtype.kind == "f" and weights.shape == (k,)
            and np.isfinite(weights).all() and (weights > 0).all()
            and abs(float(weights.sum()) - 1.0) <= WEIGHTS_TOL):
        raise ValueError(f"mode_weights_ must be {k} floats > 0 summing to 1 (each mode's share of the rows)")
    means = model.mode_means_
    if not (isinstance(means, np.ndarray) and means.dtype.kind == "f" and means.shape == (k, p)
            and np.isfinite(means).all()):
        raise ValueError(f"mode_means_ must be a finite float array of shape ({k}, {p})")
    for m, one in enumerate(models):
        centre = one.mean_ * getattr(one, "scale_", 1.0)
        if not np.allclose(means[m], centre, rtol=CONSISTENCY_TOL, atol=0):
            raise ValueError(f"mode_means_[{m}] is not mode_models_[{m}]'s mean (mean_ * scale_); {FIX}")
    channels = model.mode_channels_
    if not (isinstance(channels, np.ndarray) and channels.dtype == bool and channels.shape == (p,)
            and np.array_equal(channels, mode_finder(models, weights).channels)):
        raise ValueError(f"mode_channels_ must be {p} booleans, the channels that tell the modes apart as "
                         f"mode_models_ give them; {FIX}")
    largest = models[int(np.argmax(weights))]
    if not (np.array_equal(model.components_, largest.components_)
            and model.outlier_cutoff_ == largest.outlier_cutoff_):
        raise ValueError(f"the model's components_ and outlier_cutoff_ are not its largest mode's "
                         f"(mode_models_[{int(np.argmax(weights))}]); {FIX}")


def _validate_archive_rows(model) -> None:
    """The archive rows a model read (``archive_rows_``) as runs ``(k, 2)``, sorted and apart (a file written
    before runs were kept holds one ``[start, stop)``), and their fingerprint ``archive_samples_``:
    ``[position, digest]`` pairs at rows of those runs (see :mod:`._rowprints`)."""
    from ._rowprints import as_runs

    if not hasattr(model, "archive_rows_"):
        if hasattr(model, "archive_samples_"):
            raise ValueError("archive_samples_ without the archive_rows_ they sample")
        return
    runs = as_runs(model.archive_rows_)
    model.archive_rows_ = np.array(runs, dtype=np.int64).reshape(-1, 2)
    samples = getattr(model, "archive_samples_", None)
    if samples is None:
        return
    if not (isinstance(samples, np.ndarray) and samples.dtype.kind in "iu" and samples.ndim == 2
            and samples.shape[1] == 2 and (samples[:, 1] >= 0).all()
            and all(any(a <= pos < b for a, b in runs) for pos in samples[:, 0].tolist())
            and (np.diff(samples[:, 0]) > 0).all()):
        raise ValueError("archive_samples_ must be [position, digest] pairs of whole numbers >= 0, positions "
                         "increasing and inside archive_rows_")
    model.archive_samples_ = samples.astype(np.int64)


def _validate_variances(model) -> None:
    """``explained_variance_`` against itself, ``components_``, ``covariance_`` and the ratios.

    The first variance is > 0; with ``solver="auto"`` they do not increase
    (``"paper"`` keeps them in the order its deflation found them); each row of
    ``components_`` carries its own variance (``c_i^T covariance_ c_i``); the
    ratios are the variances over one common total.
    """
    lam = model.explained_variance_.tolist()  # Python floats: their repr is the number
    if not lam[0] > 0:
        raise ValueError(f"explained_variance_[0]={lam[0]!r} must be > 0 (the model explains no variance)")
    rises = [i for i in range(len(lam) - 1) if lam[i + 1] > lam[i]]
    if getattr(model, "solver", "auto") == "auto" and rises:
        i = rises[0]
        raise ValueError(f"explained_variance_ must not increase (solver='auto'); "
                         f"explained_variance_[{i + 1}]={lam[i + 1]!r} > explained_variance_[{i}]={lam[i]!r}")
    C = model.components_
    carried = np.einsum("ij,jk,ik->i", C, model.covariance_, C)
    scale = max(float(lam[0]), model.noise_variance_)
    off = np.abs(carried - np.array(lam)) > CONSISTENCY_TOL * scale
    if off.any():
        i = int(np.argmax(off))
        raise ValueError(f"components_[{i}] does not carry explained_variance_[{i}]={lam[i]!r} "
                         f"(components_[{i}] @ covariance_ @ components_[{i}] = {float(carried[i])!r}); "
                         "rows of components_ and their variances do not match")
    ratio = model.explained_variance_ratio_
    if ratio[0] > 0 and not np.allclose(ratio / ratio[0] * lam[0], lam, rtol=CONSISTENCY_TOL,
                                        atol=CONSISTENCY_TOL * lam[0]):
        raise ValueError("explained_variance_ratio_ is not explained_variance_ over one total")


def _validate_update(model, p: int, *, found_steps: bool = True) -> None:
    """Check the sums kept for ``partial_fit`` (a model without them, written before it existed, passes).

    They are checked against their own invariants and against the model they
    belong to: an update recomputes the model from them (``_fit.update_rows``),
    so sums that do not give the model would move the next update anywhere.
    See :func:`._update_checks.check_update_sums`.
    """
    present = [n for n in (*UPDATE_ARRAYS, "update_unit_", "n_samples_seen_") if hasattr(model, n)]
    if not present:
        return
    if len(present) < len(UPDATE_ARRAYS) + 2:
        missing = sorted(set(UPDATE_ARRAYS) | {"update_unit_", "n_samples_seen_"} - set(present))
        raise ValueError(f"fitted attribute(s) {', '.join(missing)} missing (partial_fit's sums are incomplete)")
    for name, dims in UPDATE_ARRAYS.items():
        value = getattr(model, name)
        shape = tuple(p if d == "p" else d for d in dims)
        if not (isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.shape == shape):
            raise ValueError(f"{name} must be a float array of shape {shape} (n_features_in_={p})")
        if not np.isfinite(value).all():
            raise ValueError(f"{name} holds non-finite value(s)")
    _int(model, "update_unit_", -1100, 1100)
    _int(model, "n_samples_seen_", 1)
    if not found_steps:  # the steps came first (5e5dcf8, then the sums in ad364ff): no model of ours lacks them
        raise ValueError("quantization_steps_ missing beside partial_fit's sums (update_*), which every model that "
                         f"keeps the sums has (they floor the channels' variances in an update); {FIX}")
    check_update_sums(model, p)


def _validate_steps(model, p: int) -> None:
    """``quantization_steps_`` against the spread the model gives each channel.

    A channel's step is 0 (continuous) or the step of the lattice its values
    lie on; its rounding error has the variance ``step**2 / 12``.  The default
    solver (whose fits and updates set ``support_``) floors each channel's
    variance at that (``_robust._floored``):
    the full-rank scatter ``S`` has ``S_ii >= step_i**2 / 12``, and of the
    model's ``covariance_`` (``S`` with its trailing eigenvalues replaced by
    their mean ``noise_variance_``) ``covariance_ii >= S_ii -
    (explained_variance_[-1] - noise_variance_)``, so ``step_i**2 / 12 <=
    covariance_ii + explained_variance_[-1] - noise_variance_``.  The
    paper's solver has no floor, but its total variance (the unweighted
    scatter's trace, ``explained_variance_[0] / explained_variance_ratio_[0]``)
    bounds the steps: a channel on a lattice of step ``s`` with two levels in
    ``n`` rows has a second moment of at least ``s**2 (n - 1) / n**2``.
    Quantized channels have no saturation limits (their extreme levels are
    levels like the others).
    """
    steps = model.quantization_steps_
    if not steps.any():
        return
    limits = getattr(model, "saturation_limits_", None)
    if limits is not None and not np.isnan(limits[steps > 0]).all():
        i = int(np.flatnonzero((steps > 0) & ~np.isnan(limits).all(axis=1))[0])
        raise ValueError(f"saturation_limits_[{i}] holds a limit for a channel quantized with step "
                         f"quantization_steps_[{i}]={float(steps[i])!r}; quantized channels have none; {FIX}")
    lam, noise = model.explained_variance_, model.noise_variance_
    if getattr(model, "support_", None) is not None:  # a fit or update by the default solver: the floor
        room = (np.diag(model.covariance_) + (float(lam[-1]) - noise)) * (1 + UPDATE_SUMS_TOL)
        over = steps**2 / 12 > room
        if over.any():
            i = int(np.flatnonzero(over)[0])
            raise ValueError(f"quantization_steps_[{i}]={float(steps[i])!r} is larger than channel {i}'s spread "
                             f"allows (its variance in the model, at least the rounding error's step**2 / 12, "
                             f"gives a step of at most {math.sqrt(12 * max(room[i], 0.0)):.6g}); {FIX}")
        return
    n = model.n_samples_
    total = float(lam[0] / model.explained_variance_ratio_[0]) if model.explained_variance_ratio_[0] > 0 else 0.0
    least = float(np.sum(steps**2)) * (n - 1) / n**2
    if not least <= total * (1 + UPDATE_SUMS_TOL):
        raise ValueError(f"quantization_steps_ (largest {float(steps.max())!r}) are larger than the channels' total "
                         f"variance {total:.6g} allows for {n} rows; {FIX}")
