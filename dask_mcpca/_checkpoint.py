"""Resumable fits: the small state of a fit, written atomically after each step.

A checkpoint is one ``.npz`` file (no pickle): the solver's state as arrays
plus a JSON header with the parameters and a fingerprint of the data (row
count, mean, scatter and each column's minimum and maximum, from the first
pass: a reflection ``2 * mean - X`` has the same mean and scatter, not the
same ranges; and a digest of that pass's row sample in row order, whose rows
are drawn by their positions: the same rows in another order have the same
statistics, not the same sample).  It is written to a temporary
file in the same directory and renamed over the old one, so an interrupted
write leaves the previous checkpoint or none, never half a file.  A
checkpoint written for other data or other parameters is refused, and so
is one whose saved state has the wrong shapes or non-finite values.

The file is kept after a successful fit: fitting again resumes at the end,
after the one pass that checks the data.  Temporaries left by a process
killed during a write are removed when the checkpoint is next opened.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import typing

import numpy as np

from ._atomic import atomic_path, recover
from ._exceptions import CheckpointMismatchError
from ._paper import PaperState
from ._power import PSD_TOL
from ._robust_step import RobustState
from ._urls import local_path

__all__ = ["Checkpoint"]

#: Version 3: the fingerprint holds the columns' ranges; version 4: the robust
#: state is the calibrated re-weighting (radii, supports, repeated values);
#: version 5: the states are in the fit's working units (``X * 2**-k``, k
#: from the first pass, so the same for the same data); version 6: the robust
#: state holds the repeated rows (a frozen logger's records); version 7: the
#: robust state holds each channel's rounding-error variance (the floor of a
#: quantized channel's variance).  An older file cannot be checked or holds
#: another estimator's state: refused.
#: 8: float32 data worked in float64 (its sums and fingerprint changed); 9: the fingerprint holds the
#: row sample's digest (``sample``).
FORMAT = "dask_mcpca-checkpoint-9"
#: Fingerprint entries (all from the first pass).
_FINGERPRINT = ("n_rows", "mean", "scatter", "col_min", "col_max", "sample")
#: Those compared to ``FINGERPRINT_RTOL`` (sums: round-off may move them); the others are compared exactly.
_CLOSE = ("mean", "scatter", "col_min", "col_max")
#: Relative tolerance of the fingerprint's mean and scatter: sums in another order (float64 for
#: float32 data too) move them by far less.
FINGERPRINT_RTOL = 1e-9
#: Shapes of the state arrays, in terms of the number of features p.
_STATE_SHAPES = {"location": 1, "scatter": 2, "final_location": 1, "final_scatter": 2, "v": 1, "P": 2, "Q": 2,
                 "components": 1, "S": 2, "resolution": 1}
#: State arrays of rows of p values (any number of rows).
_STATE_ROWS = ("repeated_rows",)
#: State entries that may hold NaN (a paper's null-space sigma, "no step yet").
_MAY_BE_NAN = ("sigmas", "last_change", "cutoff", "final_cutoff", "support", "core_support", "rate")
_STATES = {"paper": PaperState, "robust": RobustState}


def _encode(state: RobustState | PaperState) -> tuple[dict, dict]:
    """Split a state dataclass into JSON scalars and named arrays.

    A field holding a list is written as one array per item; a field holding
    a dataclass (``PaperState.last_pass``) as one array per field of it,
    under ``{"dict": names}``, the form format 5 gave the dict it replaced.
    """
    meta, arrays = {}, {}
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        if isinstance(value, np.ndarray):
            arrays[f.name] = value
        elif isinstance(value, list):
            meta[f.name] = {"list": len(value)}
            for i, item in enumerate(value):
                arrays[f"{f.name}.{i}"] = np.asarray(item)
        elif dataclasses.is_dataclass(value):
            names = sorted(g.name for g in dataclasses.fields(value))
            meta[f.name] = {"dict": names}
            for name in names:
                arrays[f"{f.name}.{name}"] = np.asarray(getattr(value, name))
        else:
            meta[f.name] = {"value": value.item() if isinstance(value, np.generic) else value}
    return meta, arrays


def _decode(cls: type, meta: dict, arrays: dict) -> RobustState | PaperState:
    """The state of class ``cls`` from :func:`_encode`'s scalars and arrays."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in arrays:
            kwargs[f.name] = np.array(arrays[f.name])
        elif f.name not in meta:
            continue
        elif "list" in meta[f.name]:
            items = [np.array(arrays[f"{f.name}.{i}"]) for i in range(meta[f.name]["list"])]
            kwargs[f.name] = [x.item() if x.ndim == 0 else x for x in items]
        elif "dict" in meta[f.name]:
            items = {k: np.array(arrays[f"{f.name}.{k}"]) for k in meta[f.name]["dict"]}
            fields = {k: (x.item() if x.ndim == 0 else x) for k, x in items.items()}
            kwargs[f.name] = _field_class(cls, f.name)(**fields)
        else:
            kwargs[f.name] = meta[f.name]["value"]
    return cls(**kwargs)


def _field_class(cls: type, name: str) -> type:
    """The dataclass that field ``name`` of ``cls`` holds (``LastPass`` for ``LastPass | None``)."""
    hint = typing.get_type_hints(cls)[name]
    return next(t for t in (*typing.get_args(hint), hint) if dataclasses.is_dataclass(t))


def _damaged_header(header: dict) -> str:
    """What is wrong with a checkpoint header's layout ("" when nothing is)."""
    kinds = {"params": dict, "shape": list, "data": dict, "states": dict}
    for key, kind in kinds.items():
        if not isinstance(header.get(key), kind):
            return f"no {key!r} {kind.__name__}"
    if not all(k in header["data"] for k in _FINGERPRINT):
        return "its data fingerprint is incomplete"
    unknown = sorted(set(header["states"]) - set(_STATES))
    return f"unknown state(s) {unknown}" if unknown else ""


def _check_state(state, p: int, *, prefix: str = "") -> None:
    """Refuse a saved state whose arrays have the wrong shapes or hold NaN, inf or non-numbers.

    A field holding a dataclass is checked field by field by the same rules
    (its fields named ``field.name`` in the message).
    """
    for f in dataclasses.fields(state):
        if f.name in _MAY_BE_NAN:
            continue
        value = getattr(state, f.name)
        for item in value if isinstance(value, list) else [value]:
            if item is None:
                continue
            if dataclasses.is_dataclass(item):
                _check_state(item, p, prefix=f"{prefix}{f.name}.")
                continue
            arr = np.asarray(item)
            expected = (p,) * _STATE_SHAPES.get(f.name, arr.ndim)
            if f.name in _STATE_SHAPES and arr.shape != expected:
                raise ValueError(f"{prefix}{f.name} has shape {arr.shape}, expected {expected}")
            if f.name in _STATE_ROWS and (arr.ndim != 2 or arr.shape[1] != p):
                raise ValueError(f"{prefix}{f.name} has shape {arr.shape}, expected (m, {p})")
            if arr.dtype.kind not in "biuf" or not np.isfinite(arr).all():
                raise ValueError(f"{prefix}{f.name} holds NaN, inf or no number")
    if isinstance(state, RobustState):
        _check_robust(state)


def _check_robust(state: RobustState) -> None:
    """A robust state's own rules: its scatters are covariances (symmetric, positive semi-definite), its
    kernel size is > 0, its radii are > 0 (NaN before the first step) and its rounding errors >= 0."""
    for name in ("scatter", "final_scatter"):
        S = getattr(state, name)
        if S is None:
            continue
        S = np.asarray(S, np.float64)
        scale = max(float(np.abs(np.diag(S)).max(initial=0.0)), np.finfo(float).tiny)
        if not (np.allclose(S, S.T, rtol=1e-9, atol=1e-12 * scale)
                and np.linalg.eigvalsh(S).min(initial=0.0) >= -PSD_TOL * scale):
            raise ValueError(f"{name} is not a covariance (symmetric, positive semi-definite)")
    if not (np.isfinite(state.kernel_size2) and state.kernel_size2 > 0):
        raise ValueError(f"kernel_size2={state.kernel_size2!r} must be a finite number > 0")
    for name in ("cutoff", "final_cutoff"):
        value = getattr(state, name)
        if not (np.isnan(value) or 0 < value):
            raise ValueError(f"{name}={value!r} must be > 0")
    if state.resolution is not None and not (np.asarray(state.resolution) >= 0).all():
        raise ValueError("resolution (the channels' rounding-error variances) must be >= 0")


def sample_digest(sample: np.ndarray | None) -> str:
    """sha256 of the first pass's row sample, its rows in row order (``"none"`` without one).

    The order-sensitive part of the fingerprint: the sample draws each row by its position
    (:func:`._block._row_uniforms` of its global index), so the same rows in another order draw
    other rows, or (a sample of every row) the same rows in another order; the mean, scatter and
    ranges are order-free.  The sample holds the stored values exactly (no sums), so the same
    data gives the same digest whatever its chunks or its container (numpy, Zarr, HDF5).
    """
    if sample is None:
        return "none"
    rows = np.ascontiguousarray(np.asarray(sample, np.float64)) + 0.0  # -0.0 as 0.0
    digest = hashlib.sha256(repr(rows.shape).encode())
    digest.update(rows.tobytes())
    return digest.hexdigest()


def _plain(value):
    """A numpy scalar as the Python number it equals (``np.int64(2)`` is ``2``), else its repr."""
    return value.item() if isinstance(value, np.generic) else repr(value)


class _NoCheckpoint:
    def check_data(self, moments) -> None:
        pass

    def load(self, kind):
        return None

    def save(self, kind, state) -> None:
        pass


class Checkpoint:
    """Checkpoint file of one fit; use :meth:`open`."""

    def __init__(self, path, params: dict, shape):
        local = local_path(path)
        if local is None:  # it used to be written as a local path named like the URL ("./s3:/bucket/...")
            raise ValueError(f"checkpoint={path!r} is a URL; a checkpoint is a local file: name a local path")
        self.path = local
        self.params = json.loads(json.dumps(params, default=_plain))
        self.shape = list(shape)
        self.fingerprint = None
        self.states: dict = {}
        self._loaded: dict = {}

    @classmethod
    def open(cls, path, *, params: dict, shape):
        """A checkpoint at ``path``, or a no-op object when ``path`` is None."""
        return _NoCheckpoint() if path is None else cls(path, params, shape)

    def check_data(self, moments) -> None:
        """Fingerprint the data from the first pass; load a matching checkpoint."""
        self.fingerprint = {
            "n_rows": int(moments.n_rows),
            "mean": moments.mean[0].tolist(),
            "scatter": moments.scatter[0].ravel().tolist(),
            "col_min": moments.col_min.tolist(),
            "col_max": moments.col_max.tolist(),
            "sample": sample_digest(moments.sample),
        }
        recover(self.path)  # temporaries left by a process killed mid-write
        if not os.path.exists(self.path):
            return
        try:
            with np.load(self.path, allow_pickle=False) as z:
                header = json.loads(str(z["__header__"]))
                arrays = {k: z[k] for k in z.files if k != "__header__"}
        except Exception as err:
            raise CheckpointMismatchError(f"checkpoint {self.path!r} cannot be read: {err}") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            found = header.get("format") if isinstance(header, dict) else header
            raise CheckpointMismatchError(
                f"{self.path!r} is not a {FORMAT} file (found {found!r}); delete it to fit afresh"
            )
        damaged = _damaged_header(header)
        if damaged:
            raise CheckpointMismatchError(
                f"checkpoint {self.path!r} has a damaged header ({damaged}); delete it to fit afresh"
            )
        if header["params"] != self.params:
            diff = sorted(k for k in self.params if header["params"].get(k) != self.params[k])
            raise CheckpointMismatchError(
                f"checkpoint {self.path!r} was written with other parameters ({', '.join(diff)}); "
                "delete it or fit with the same parameters"
            )
        old = header["data"]
        same = (
            header["shape"] == self.shape
            and all(old[k] == self.fingerprint[k] for k in _FINGERPRINT if k not in _CLOSE)
            and all(
                np.shape(old[k]) == np.shape(self.fingerprint[k])
                and np.allclose(old[k], self.fingerprint[k], rtol=FINGERPRINT_RTOL, atol=1e-12)
                for k in _CLOSE
            )
        )
        if not same:
            raise CheckpointMismatchError(
                f"checkpoint {self.path!r} was written for other data (shape, row count, mean, "
                "scatter, column ranges or the rows sampled in row order differ); delete it to start afresh"
            )
        for kind, meta in header["states"].items():
            prefix = kind + ":"
            mine = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
            try:
                self._loaded[kind] = _decode(_STATES[kind], meta, mine)
                _check_state(self._loaded[kind], self.shape[1])
            except (KeyError, TypeError, ValueError) as err:
                raise CheckpointMismatchError(
                    f"checkpoint {self.path!r} holds a damaged {kind!r} state ({err}); delete it to fit afresh"
                ) from None
        self.states = dict(self._loaded)

    def load(self, kind: str):
        """The saved state of stage ``kind`` ("robust" or "paper"), or None."""
        return self._loaded.get(kind)

    def save(self, kind: str, state) -> None:
        """Record ``state`` and write the file atomically."""
        self.states[kind] = state
        header = {
            "format": FORMAT,
            "params": self.params,
            "shape": self.shape,
            "data": self.fingerprint,
            "states": {},
        }
        arrays = {}
        for name, st in self.states.items():
            meta, arr = _encode(st)
            header["states"][name] = meta
            arrays.update({f"{name}:{k}": v for k, v in arr.items()})
        with atomic_path(self.path) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, __header__=np.array(json.dumps(header)), **arrays)
