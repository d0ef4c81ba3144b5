"""The model file: a fitted estimator written as one JSON file and read back, no pickle.

The format is described in :mod:`dask_mcpca._persist`, which checks what is
read (:func:`dask_mcpca._persist.validate_fitted`) and is the estimator's way
in (``save``, ``load``).  This module only writes and reads the file: a
model's parameters and attributes as JSON values, the file published whole
(:func:`dask_mcpca._atomic.write_bytes`), read once with its size capped, and
its SHA-256 taken from the bytes read (a score store names the model that
scored its rows by it).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Any, TypeVar

import numpy as np
from sklearn.utils.validation import check_is_fitted

from ._atomic import write_bytes
from ._exceptions import ModelFormatError
from ._fitted_params import check_fitted_params
from ._urls import read_bytes
from ._version import __version__

T = TypeVar("T")

__all__ = ["save", "read", "damaged", "FORMAT", "FORMAT_VERSION", "MAX_MODEL_BYTES", "MODE_MODELS"]

FORMAT = "dask-mcpca-model"
FORMAT_VERSION = 3
#: Version 2 adds ``repeated_rows_`` (a frozen logger's records, which
#: ``is_outlier`` flags).  A model without any is still written as version 1,
#: which readers of version 1 understand fully; one with some is version 2,
#: so that such a reader refuses it instead of loading a model that silently
#: stops flagging those rows.  Version 3 adds operating modes
#: (``mode_models_``: each mode's model, nested); a model without modes is
#: written as before (1 or 2), one with modes as 3, which a reader of
#: version 2 refuses instead of judging every row by the largest mode alone.
#: The attribute that holds each mode's model, as a list of ``{"params", "attributes"}`` objects.
MODE_MODELS = "mode_models_"
#: Largest model file read (bytes); the p x p covariance of p = 5000 is ~0.5 GB of JSON.
MAX_MODEL_BYTES = 2**30

_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_ARRAY_KINDS = "biuf"  # bool, signed / unsigned int, float


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
            numbers = np.array(data)  # every value a JSON number (no NaN or inf): numpy reads the list at once
            if numbers.dtype.kind in "fiu" and numbers.ndim == 1:  # 0.2 s -> 0.02 s for a p = 300 model
                return numbers.astype(dtype).reshape(shape)
            data = [_decode_float(v) for v in data]
        return np.array(data, dtype=dtype).reshape(shape)
    if value in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[value]
    return value



def save(model: Any, path: str | os.PathLike, *, storage_options: dict | None = None) -> None:
    """Write the fitted ``model`` to ``path`` as JSON (see the module docstring).

    Parameters
    ----------
    model : MCPCA
        A fitted estimator: its ``get_params()`` and its attributes whose
        names end in ``_`` are written.  Refused (ValueError) where
        ``set_params`` changed a parameter that defines the fitted model
        (:func:`dask_mcpca._fitted_params.check_fitted_params`): the file
        would say another model than it holds, and ``load`` refuse it.
    path : str or path-like
        Destination file or fsspec URL; replaced atomically if it exists.
    storage_options : dict, optional
        fsspec options for a URL.
    """
    check_is_fitted(model, "components_")
    check_fitted_params(model, "save")
    modes = getattr(model, MODE_MODELS, None) is not None
    version = 3 if modes else (2 if len(getattr(model, "repeated_rows_", ())) else 1)
    document = {
        "format": FORMAT,
        "format_version": version,
        "library_version": __version__,
        "class": type(model).__name__,
        **_body(model),
    }
    text = json.dumps(document, indent=1, allow_nan=False) + "\n"
    write_bytes(path, text.encode("utf-8"),
                storage_options=storage_options)


def _body(model: Any) -> dict:
    """A fitted model's ``params`` and ``attributes`` as JSON values; ``mode_models_`` as a list of bodies."""
    attributes = {
        name: [_body(m) for m in value] if name == MODE_MODELS else _encode_value(name, value)
        for name, value in sorted(vars(model).items())
        if name.endswith("_") and not name.startswith("_")
    }
    return {"params": {name: _encode_value(name, v) for name, v in model.get_params(deep=False).items()},
            "attributes": attributes}


def _rebuilt(cls: type[T], body: Any, *, nested: bool = False) -> T:
    """The model of class ``cls`` that a body of :func:`_body` describes (its parameters checked, its attributes
    by their names only).  Raises KeyError, TypeError or ValueError naming what is wrong."""
    if not isinstance(body, dict) or not isinstance(body.get("params"), dict) or not isinstance(
            body.get("attributes"), dict):
        raise ValueError("it needs a \"params\" and an \"attributes\" object")
    params = {name: _decode_value(v) for name, v in body["params"].items()}
    params.pop("checkpoint", None)  # a path of another fit: never resumed from on refit
    known = sorted(cls().get_params(deep=False))
    if unknown := [name for name in params if name not in known]:
        raise ValueError(f"\"params\" holds {', '.join(map(repr, unknown))}, not a parameter of {cls.__name__} "
                         f"(its parameters: {', '.join(known)})")
    model = cls(**params)
    model._validate_params()  # scikit-learn's declarative check of the parameters
    for name, value in body["attributes"].items():
        if not (isinstance(name, str) and name.endswith("_") and name.isidentifier()) or (
            name.startswith("_") or hasattr(type(model), name)
        ):
            raise ValueError(f"bad attribute name {name!r}")
        if name == MODE_MODELS:
            if nested or not isinstance(value, list):
                raise ValueError(f"{MODE_MODELS} must be a list of models (one per mode), not nested")
            setattr(model, name, [_rebuilt(cls, one, nested=True) for one in value])
        else:
            setattr(model, name, _decode_value(value))
    return model


def read(path: str | os.PathLike, cls: type[T], *, storage_options: dict | None = None) -> tuple[T, str]:
    """Read a model of class ``cls`` written by :func:`save`, and the SHA-256 of the file: one read.

    The model's parameters are checked (``_validate_params``), its attributes only by their names:
    :func:`dask_mcpca._persist.validate_fitted` checks them.

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
        Fitted, with the saved parameters and attributes.
    digest : str
        The SHA-256 of the bytes read (hex).

    Raises
    ------
    FileNotFoundError
        No file at ``path``.
    ValueError
        The file is not a dask-mcpca model, or was written by a newer format.
    """
    path = os.fspath(path)
    if "://" in path:  # a bad DASK_MCPCA_WAIT_LIMIT says so, not "not JSON" (the read below wraps ValueErrors)
        from ._waits import wait_limit

        wait_limit()
    try:
        data = _read_capped(path, storage_options)
        document = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
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
    if document.get("class") != cls.__name__:
        raise ModelFormatError(f"{path!r} holds a {document.get('class')!r}, not an {cls.__name__} model")
    try:
        model = _rebuilt(cls, document)
        if version < 3 and hasattr(model, MODE_MODELS):
            raise ValueError(f"{MODE_MODELS} in a file of format version {version}; operating modes are version 3")
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise damaged(path, err) from None
    return model, hashlib.sha256(data).hexdigest()


def damaged(path: str, err: BaseException) -> ModelFormatError:
    """The error that refuses the model file ``path`` as damaged, saying why (``err``) in one line."""
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    return ModelFormatError(f"{path!r} is a damaged dask-mcpca model file: {text}")


def _read_capped(path: str, storage_options: dict | None = None) -> bytes:
    """The bytes of the regular file (or object) ``path``, refused beyond ``MAX_MODEL_BYTES``."""
    data = read_bytes(path, storage_options=storage_options, limit=MAX_MODEL_BYTES)
    if len(data) > MAX_MODEL_BYTES:
        raise ValueError(f"larger than {MAX_MODEL_BYTES} bytes, the most a model file may hold")
    return data


def _reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")
