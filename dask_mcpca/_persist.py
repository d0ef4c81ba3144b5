"""Saved models: a fitted :class:`MCPCA` as one JSON file, no pickle.

Format (``format_version`` 1)::

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

:func:`save` writes to a temporary sibling and renames it over ``path``
(:func:`dask_mcpca._atomic.atomic_path`), so a crash never leaves half a model.
:func:`load` refuses files of another format or of a newer format version.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

from ._atomic import atomic_path

__all__ = ["save", "load", "FORMAT", "FORMAT_VERSION"]

FORMAT = "dask-mcpca-model"
FORMAT_VERSION = 1

_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_ARRAY_KINDS = "biuf"  # bool, signed / unsigned int, float


class ModelFormatError(ValueError):
    """The file is not a model this version of dask-mcpca can read."""


def _encode_float(x: float):
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _decode_float(x):
    return _SPECIAL_FLOATS[x] if isinstance(x, str) else x


def _encode_value(name: str, value):
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _ARRAY_KINDS and value.dtype.kind not in "UO":
            raise TypeError(f"cannot save attribute {name}: arrays of dtype {value.dtype} are not supported")
        if value.dtype.kind in "UO":
            data = [str(v) for v in value.ravel().tolist()]
            dtype = "str"
        else:
            data = value.ravel().tolist()
            if value.dtype.kind == "f":
                data = [_encode_float(v) for v in data]
            dtype = value.dtype.str if value.dtype.kind != "b" else "bool"
        return {"dtype": dtype, "shape": list(value.shape), "data": data}
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return _encode_float(float(value))
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"cannot save {name}={value!r}: type {type(value).__name__} is not supported")


def _decode_value(value):
    if isinstance(value, dict):
        shape = tuple(value["shape"])
        if value["dtype"] == "str":
            return np.array(value["data"], dtype=object).reshape(shape)
        data = value["data"]
        dtype = np.dtype(value["dtype"])
        if dtype.kind == "f":
            data = [_decode_float(v) for v in data]
        return np.array(data, dtype=dtype).reshape(shape)
    if value in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[value]
    return value


def save(model, path) -> None:
    """Write the fitted ``model`` to ``path`` as JSON (see the module docstring).

    Parameters
    ----------
    model : MCPCA
        A fitted estimator.
    path : str or path-like
        Destination file; replaced atomically if it exists.
    """
    from sklearn.utils.validation import check_is_fitted

    check_is_fitted(model, "components_")
    from . import __version__

    attributes = {
        name: _encode_value(name, value)
        for name, value in sorted(vars(model).items())
        if name.endswith("_") and not name.startswith("_")
    }
    document = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "library_version": __version__,
        "class": type(model).__name__,
        "params": {name: _encode_value(name, v) for name, v in model.get_params(deep=False).items()},
        "attributes": attributes,
    }
    text = json.dumps(document, indent=1, allow_nan=False)
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text + "\n")


def load(path):
    """Read a model written by :meth:`MCPCA.save`.

    Parameters
    ----------
    path : str or path-like

    Returns
    -------
    MCPCA
        Fitted, with the saved parameters and attributes.

    Raises
    ------
    FileNotFoundError
        No file at ``path``.
    ValueError
        The file is not a dask-mcpca model, or was written by a newer format.
    """
    from ._estimator import MCPCA

    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f, parse_constant=_reject_constant)
    except FileNotFoundError:
        raise FileNotFoundError(f"no such model file: {path!r}") from None
    except IsADirectoryError:
        raise ModelFormatError(f"{path!r} is a directory, not a dask-mcpca model file") from None
    except (UnicodeDecodeError, ValueError) as err:  # includes JSONDecodeError
        raise ModelFormatError(f"{path!r} is not a dask-mcpca model file (not JSON: {err})") from None
    except RecursionError:
        raise ModelFormatError(f"{path!r} is not a dask-mcpca model file (JSON nested too deeply)") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ModelFormatError(f"{path!r} is not a dask-mcpca model file (no \"format\": \"{FORMAT}\")")
    version = document.get("format_version")
    if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise ModelFormatError(
            f"{path!r} has model format version {version!r}; this dask-mcpca reads versions 1..{FORMAT_VERSION}"
        )
    if document.get("class") != MCPCA.__name__:
        raise ModelFormatError(f"{path!r} holds a {document.get('class')!r}, not an MCPCA model")
    try:
        params = {name: _decode_value(v) for name, v in document["params"].items()}
        model = MCPCA(**params)
        for name, value in document["attributes"].items():
            if not (name.endswith("_") and name.isidentifier()):
                raise ValueError(f"bad attribute name {name!r}")
            setattr(model, name, _decode_value(value))
    except (KeyError, TypeError, ValueError) as err:
        raise ModelFormatError(f"{path!r} is a damaged dask-mcpca model file: {err}") from None
    return model


def _reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")
