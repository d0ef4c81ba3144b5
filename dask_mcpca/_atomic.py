"""Atomic writes: a file or store appears whole under its name, or not at all."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid

__all__ = ["atomic_path"]


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary sibling of ``path``; rename it over ``path`` on success.

    Works for files and for directories (Zarr stores).  On any exception the
    temporary is removed and ``path`` is left as it was.
    """
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        if os.path.isdir(tmp) and os.path.exists(path):
            # A directory cannot be renamed over a non-empty one: move the old
            # one aside first, then drop it once the new one is in place.
            old = tmp + ".old"
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.exists(tmp):
            os.remove(tmp)
        raise
