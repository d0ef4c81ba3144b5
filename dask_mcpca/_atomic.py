"""Atomic writes: a file or store appears whole under its name, or not at all."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import uuid

__all__ = ["atomic_path", "stale_temporaries"]

#: Suffix of the temporary sibling; ``.old`` is added to a store moved aside.
TMP_SUFFIX = ".tmp"


def _temporary_name(path: str) -> str:
    parent, base = os.path.split(path)
    return os.path.join(parent, f".{base}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}")


def stale_temporaries(path) -> list[str]:
    """Temporaries of ``path`` left by a process killed while writing it."""
    path = os.path.abspath(os.fspath(path))
    parent, base = os.path.split(path)
    pattern = os.path.join(glob.escape(parent), f".{glob.escape(base)}.*{TMP_SUFFIX}")
    return sorted(glob.glob(pattern) + glob.glob(pattern + ".old"))


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def _fsync(path: str) -> None:
    """Flush a regular file to disk (a store's many files are left to the OS)."""
    if os.path.isfile(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary sibling of ``path``; rename it over ``path`` on success.

    Works for files and for directories (Zarr stores).  On any exception the
    temporary is removed and ``path`` is left as it was.  A directory cannot
    be renamed over a non-empty one, so an existing store is first moved to
    ``<temporary>.old``, the new one renamed into place and the old one
    deleted; if the second rename fails, the old store is moved back.
    """
    path = os.path.abspath(os.fspath(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = _temporary_name(path)
    old = tmp + ".old"
    try:
        yield tmp
        _fsync(tmp)
        if os.path.isdir(tmp) and os.path.lexists(path):
            os.replace(path, old)
            try:
                os.replace(tmp, path)
            except BaseException:
                os.replace(old, path)
                raise
            _remove(old)
        else:
            os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
