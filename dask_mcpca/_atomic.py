"""Atomic writes: a file or store appears whole under its name, or not at all.

The new content is written to a hidden sibling ``.<name>.<random>-<pid>.tmp``
and renamed into place.  A process killed on the way leaves that sibling,
and, when it is killed between the two renames that replace a store
(``<name>`` moved to ``<temporary>.old``, the new store not yet in place), the
old store under ``.old`` and no ``<name>``.  The next write of the same path
repairs both before it starts (:func:`recover`): an orphaned ``.old`` store is
moved back under ``<name>`` when that is missing and deleted otherwise, and
the temporaries of processes that no longer run are deleted.  Temporaries of
a live process (a concurrent writer) are left alone.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import uuid

__all__ = ["atomic_path", "recover", "stale_temporaries", "is_url", "write_bytes"]

#: Suffix of the temporary sibling; ``.old`` is added to a store moved aside.
TMP_SUFFIX = ".tmp"


def _temporary_name(path: str) -> str:
    parent, base = os.path.split(path)
    return os.path.join(parent, f".{base}.{uuid.uuid4().hex[:8]}-{os.getpid()}{TMP_SUFFIX}")


def _writer_alive(temporary: str) -> bool:
    """Whether the process that named ``temporary`` still runs (its pid is in the name)."""
    name = os.path.basename(temporary).removesuffix(".old").removesuffix(TMP_SUFFIX)
    _, _, pid = name.rpartition("-")
    if not pid.isdigit():
        return False  # no pid in the name: written by an older version, long gone
    pid = int(pid)
    if pid == os.getpid():
        return True  # another thread of this process may be writing it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_temporaries(path) -> list[str]:
    """Temporaries of ``path`` left by processes killed while writing it (``.old`` ones included)."""
    path = os.path.abspath(os.fspath(path))
    parent, base = os.path.split(path)
    pattern = os.path.join(glob.escape(parent), f".{glob.escape(base)}.*{TMP_SUFFIX}")
    found = glob.glob(pattern) + glob.glob(pattern + ".old")
    return sorted(t for t in found if not _writer_alive(t))


def recover(path) -> None:
    """Repair what a killed writer of ``path`` left: restore an orphaned old store, delete temporaries."""
    path = os.path.abspath(os.fspath(path))
    stale = stale_temporaries(path)
    for old in sorted((t for t in stale if t.endswith(".old")), key=os.path.getmtime, reverse=True):
        if not os.path.lexists(path):
            os.replace(old, path)  # killed between the two renames: the old store comes back
        else:
            _remove(old)
    for tmp in stale:
        if not tmp.endswith(".old"):
            _remove(tmp)


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
    deleted; if the second rename fails, the old store is moved back.  What
    a killed writer of ``path`` left behind is repaired first (:func:`recover`).
    """
    path = os.path.abspath(os.fspath(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    recover(path)
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


def is_url(path) -> bool:
    """Whether ``path`` is a URL for fsspec (``s3://...``) rather than a local path."""
    return isinstance(path, str) and "://" in path


def write_bytes(path, data: bytes, *, storage_options: dict | None = None) -> None:
    """Write one file atomically: renamed into place locally, one PUT on an object store.

    An object store (S3, GCS, Azure) makes a single object visible whole or
    not at all, so a URL is written with one ``fsspec`` write of all the bytes.
    """
    if is_url(path):
        import fsspec

        with fsspec.open(path, "wb", **(storage_options or {})) as f:
            f.write(data)
        return
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
