"""Atomic writes: a file or store appears whole under its name, or not at all.

The new content is written to a hidden sibling ``.<name>.<random>-<pid>@<host>.tmp``
and renamed into place.  A process killed on the way leaves that sibling,
and, when it is killed between the two renames that replace a store
(``<name>`` moved to ``<temporary>.old``, the new store not yet in place), the
old store under ``.old`` and no ``<name>``.  The next write of the same path
repairs both before it starts (:func:`recover`): an orphaned ``.old`` store is
moved back under ``<name>`` when that is missing and deleted otherwise, and
the temporaries of processes that no longer run are deleted.  Temporaries of
a live process (a concurrent writer) are left alone.  Whether the writer runs
is asked of this host's process table only for a temporary named with this
host (:func:`_writer_alive`); on a shared file system a temporary named with
another host is taken for a live writer's until it is older than
``FOREIGN_TEMPORARY_AGE``.

On an object store (an fsspec URL other than ``file://``) nothing can be
renamed.  A single file (a model, a PNG, a CSV) is one object, which S3,
GCS and Azure Blob make visible only whole (:func:`write_bytes`,
:func:`atomic_open`).  A Zarr store is written under a hidden sibling prefix
and published by copies inside the store with its root metadata last
(:func:`atomic_url_store`, which lists what a reader may see after an
interruption).

Files that belong together (a report's PNG and CSVs) are put in place one after
the other once all are written, with Ctrl-C and SIGTERM held meanwhile
(:func:`atomic_files`).

Writes only: what a path or URL names, its filesystem and a file's bytes (the read path's
needs) are :mod:`._urls`'.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import signal
import socket
import stat
import tempfile
import threading
import time
import uuid

from ._urls import answered, file_kind, info_or_none, local_path, url_to_fs
from ._waits import is_timeout

__all__ = [
    "atomic_path",
    "atomic_open",
    "atomic_files",
    "atomic_url_store",
    "recover",
    "stale_temporaries",
    "write_bytes",
    "check_file_target",
    "is_zarr_store",
    "url_store_state",
    "PUBLISHING_MARKER",
]

#: Signals held while :func:`atomic_files` puts its files in place, acted on once the last is in place.
HELD_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
#: Suffix of the temporary sibling; ``.old`` is added to a store moved aside.
TMP_SUFFIX = ".tmp"


#: Seconds after which a temporary named with another host is taken for a dead writer's: that
#: host's process table cannot be asked, and no write of one file or store takes a day.
FOREIGN_TEMPORARY_AGE = 24 * 3600


def _host() -> str:
    """This host's name as temporaries carry it (only letters, digits, ``.``, ``_`` and ``-``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "localhost"


def _temporary_name(path: str) -> str:
    parent, base = os.path.split(path)
    return os.path.join(parent, f".{base}.{uuid.uuid4().hex[:8]}-{os.getpid()}@{_host()}{TMP_SUFFIX}")


def _writer_alive(temporary: str) -> bool:
    """Whether the process that named ``temporary`` may still be writing it.

    The name carries the writer's pid and host (``-<pid>@<host>``).  A pid of
    this host is asked of the process table (:func:`_pid_alive`); a temporary
    of another host is alive until it is older than ``FOREIGN_TEMPORARY_AGE``
    (by its modification time; one that cannot be read is alive).  A name with
    a pid and no host (written by an earlier version) is taken for this
    host's; one with no pid is dead.
    """
    name = os.path.basename(temporary).removesuffix(".old").removesuffix(TMP_SUFFIX)
    owner, at, host = name.rpartition("@")
    if not at:
        owner, host = name, None
    _, _, pid = owner.rpartition("-")
    if not pid.isdigit():
        return False  # no pid in the name: written by an older version, long gone
    if host is not None and host != _host():
        try:
            age = time.time() - os.lstat(temporary).st_mtime
        except OSError:
            return True
        return age <= FOREIGN_TEMPORARY_AGE
    return int(pid) == os.getpid() or _pid_alive(int(pid))  # this process: another thread may write it


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs.

    POSIX: ``os.kill(pid, 0)``, which sends nothing.  Windows, where
    ``os.kill`` terminates the process whatever the signal: ``OpenProcess``
    and ``GetExitCodeProcess``; a process that exists but cannot be opened
    is alive.
    """
    if os.name != "nt":
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except (PermissionError, OverflowError):
            return True  # another user's process; or a pid the OS cannot hold, never taken for dead
        return True
    import ctypes
    from ctypes import wintypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.OpenProcess.restype = wintypes.HANDLE
    handle = kernel32.OpenProcess(_PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
    if not handle:
        return ctypes.get_last_error() != _ERROR_INVALID_PARAMETER  # no such process; else: exists, denied
    try:
        code = wintypes.DWORD()
        if not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)):
            return True
        return code.value == _STILL_ACTIVE
    finally:
        kernel32.CloseHandle(handle)


#: Windows API constants of :func:`_pid_alive`.
_PROCESS_QUERY_LIMITED_INFORMATION = 0x1000
_ERROR_INVALID_PARAMETER = 87
_STILL_ACTIVE = 259


def _resolved(path) -> str:
    """``path`` made absolute with its symlinks resolved, as the OS resolves it.

    ``os.path.abspath`` drops ``link/..`` as text, where the OS goes to the link's target's
    parent; the checks of the command line resolve paths the OS's way, so the write must too.
    A symlink named as the output is followed: the file or store it points to is replaced (its
    checks are that target's), and the link stays a link naming the new version.
    """
    path = os.path.join(os.getcwd(), os.fspath(path))  # joined, not normalised: keeps "link/.."
    return os.path.realpath(path.rstrip(os.sep) or os.sep)


def _is_temporary_of(name: str, base: str, host: str | None = None) -> bool:
    """Whether file name ``name`` is a temporary this module made for ``base`` (exactly, not by prefix:
    ``.scores.v2.zarr.<id>.tmp`` belongs to ``scores.v2.zarr``, not to ``scores``)."""
    owner = r"-\d+@" + re.escape(host) if host is not None else r"(-\d+(@[A-Za-z0-9._-]+)?)?"  # older: no host, pid
    pattern = rf"\.{re.escape(base)}\.[0-9a-f]{{8}}{owner}{re.escape(TMP_SUFFIX)}(\.old)?"
    return re.fullmatch(pattern, name) is not None


def stale_temporaries(path) -> list[str]:
    """Temporaries of ``path`` left by processes killed while writing it (``.old`` ones included)."""
    path = _resolved(path)
    parent, base = os.path.split(path)
    pattern = os.path.join(glob.escape(parent), f".{glob.escape(base)}.*{TMP_SUFFIX}")
    found = glob.glob(pattern) + glob.glob(pattern + ".old")
    mine = [t for t in found if _is_temporary_of(os.path.basename(t), base)]
    return sorted(t for t in mine if not _writer_alive(t))


def recover(path) -> None:
    """Repair what a killed writer of ``path`` left: restore an orphaned old store, delete temporaries."""
    path = _resolved(path)
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


def check_file_target(path) -> None:
    """Refuse to write a file over ``path`` when it exists and is neither a regular file nor a symlink
    (callers pass the path :func:`_resolved`, a symlink followed to its target): a directory, a device
    node, a FIFO, a socket would be replaced by a regular file (as root even ``/dev/null``)."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there (what cannot be created says so later)
        return
    if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"cannot write {os.fspath(path)!r}: it is a directory; name a file")
    raise FileExistsError(f"cannot write {os.fspath(path)!r}: it is {file_kind(mode)}, not a regular file; name a file")


def _check_replace(tmp: str, path: str, replace) -> None:
    """Whether the finished temporary ``tmp`` may be renamed over what is at ``path`` now (see :func:`atomic_path`)."""
    if not os.path.lexists(path):
        return
    if os.path.isdir(tmp) and not os.path.islink(tmp):
        if not os.path.isdir(path):
            mode = os.lstat(path).st_mode
            raise FileExistsError(f"cannot write the store {path!r}: it exists and is {file_kind(mode)}, not a folder")
    else:
        check_file_target(path)
    if replace is not None and not replace(path):
        raise FileExistsError(f"cannot write {path!r}: it exists and may not be replaced")


@contextlib.contextmanager
def atomic_path(path, *, replace=None):
    """Yield a temporary sibling of ``path``; rename it over ``path`` on success.

    Works for files and for directories (Zarr stores).  On any exception the
    temporary is removed and ``path`` is left as it was.  A directory cannot
    be renamed over a non-empty one, so an existing store is first moved to
    ``<temporary>.old``, the new one renamed into place and the old one
    deleted; if the second rename fails, the old store is moved back.  What
    a killed writer of ``path`` left behind is repaired first (:func:`recover`).

    A file replaces only a regular file or a symlink (never a directory, a
    device node, a FIFO or a socket), a store only a directory; and where
    ``replace`` is given, ``replace(path)`` must say True of what exists at
    ``path`` when the temporary is renamed over it.  Else ``FileExistsError``
    (``IsADirectoryError``) naming ``path``, and ``path`` is left as it is.
    """
    path = _resolved(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    recover(path)
    tmp = _temporary_name(path)
    old = tmp + ".old"
    try:
        yield tmp
        _fsync(tmp)
        _check_replace(tmp, path, replace)
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


def write_bytes(path, data: bytes, *, storage_options: dict | None = None) -> None:
    """Write one file atomically: renamed into place locally, one object on an object store.

    A local path or ``file://`` URL goes through :func:`atomic_path`.  Any
    other URL is written with ``fs.pipe_file``: on S3 that is one PUT (below
    2 x 50 MiB), or a multipart upload that S3 publishes only when it is
    completed and that s3fs aborts on failure; GCS and Azure Blob also
    publish an object only whole.  A reader sees the old object or the new
    one, never part of it.
    """
    local = local_path(path)
    try:
        if local is None:
            fs, where = url_to_fs(path, storage_options)
            with answered(path, "write"):
                fs.pipe_file(where, data)
            return
        check_file_target(_resolved(local))  # before the work, and again at the rename
        with atomic_path(local) as tmp, open(tmp, "wb") as f:
            f.write(data)
    except OSError as err:
        raise _naming(err, path) from None


def _naming(err: OSError, path) -> OSError:
    """``err`` as a one-line error of its own type that names ``path`` (what could not be written)."""
    text = " ".join(str(err).split()) or type(err).__name__
    if os.fspath(path) in text:
        return err
    try:
        return type(err)(f"cannot write {os.fspath(path)!r}: {err.strerror or text}")
    except TypeError:  # an OSError subclass with another signature
        return OSError(f"cannot write {os.fspath(path)!r}: {text}")


def _is_object(fs, path: str) -> bool:
    info = info_or_none(fs, path)
    return info is not None and info.get("type") == "file"


#: Metadata objects of a Zarr node (v3; v2 and its consolidated metadata): published after the chunks.
_ZARR_METADATA = ("zarr.json", ".zgroup", ".zarray", ".zattrs", ".zmetadata")


def _url_temporary_name(name: str) -> str:
    return f".{name}.{uuid.uuid4().hex[:8]}-{os.getpid()}@{_host()}{TMP_SUFFIX}"


def _stale_url_temporaries(fs, parent: str, name: str) -> list[str]:
    """Temporaries of ``parent/name`` written by processes of this host that no longer run."""
    try:
        entries = fs.ls(parent, detail=False, refresh=True)
    except FileNotFoundError:
        return []
    stale = []
    for entry in entries:
        base = entry.rstrip("/").rpartition("/")[2]
        if not _is_temporary_of(base, name, host=_host()):
            continue
        if not _writer_alive(base):  # this host's: its process table is asked
            stale.append(entry.rstrip("/"))
    return stale


#: Root metadata of a Zarr store (v3, v2 group, v2 array): a prefix or folder with one is a store.
_ZARR_ROOTS = ("zarr.json", ".zgroup", ".zarray")
#: The object a publication writes inside the store's prefix before it touches anything there, and
#: deletes once the root metadata is published: a prefix holding it is an interrupted publication.
PUBLISHING_MARKER = ".dask-mcpca-publishing"


def is_zarr_store(path) -> bool:
    """Whether the local ``path`` is a Zarr store: a directory with root Zarr metadata, a regular file
    holding a JSON object (``.zattrs`` or ``.zmetadata`` alone, or a folder named ``zarr.json``, is not)."""
    import json

    if not os.path.isdir(path):
        return False
    for name in _ZARR_ROOTS:
        meta = os.path.join(path, name)
        try:
            if not stat.S_ISREG(os.stat(meta).st_mode):
                continue
            with open(meta, "rb") as f:
                if isinstance(json.loads(f.read(2**20)), dict):
                    return True
        except (OSError, ValueError):
            continue
    return False


def url_store_state(fs, root: str) -> str:
    """What is at ``root`` of ``fs``: ``"absent"``, ``"zarr"`` (a store: root Zarr metadata),
    ``"interrupted"`` (a publication's marker, no root metadata) or ``"other"`` (anything else: an
    object named as the store, or a prefix of other objects, which is never replaced)."""
    root = root.rstrip("/")
    fs.invalidate_cache(root)
    info = info_or_none(fs, root)  # a timeout is raised, never read as "absent" (see info_or_none)
    if info is None:
        return "absent"
    if info.get("type") == "file":
        return "other"
    if any(_is_object(fs, f"{root}/{m}") for m in _ZARR_ROOTS):
        return "zarr"
    if _is_object(fs, f"{root}/{PUBLISHING_MARKER}"):
        return "interrupted"
    return "other"


def _refuse_url_target(url: str, state: str, overwrite: bool) -> None:
    if state == "absent" or (overwrite and state in ("zarr", "interrupted")):
        return
    if state == "other":
        raise FileExistsError(
            f"{url!r} exists and is not a Zarr store (no root Zarr metadata, no {PUBLISHING_MARKER} of an "
            "interrupted publication); only a Zarr store is replaced (remove it yourself if you mean to)"
        )
    raise FileExistsError(f"{url!r} exists; pass overwrite (--overwrite) to replace it")


@contextlib.contextmanager
def atomic_url_store(url: str, *, storage_options: dict | None = None, overwrite: bool = False):
    """Yield a temporary URL to write a Zarr store to; publish it under ``url`` when the block ends.

    An object store cannot rename a prefix, so the store is written under a
    hidden sibling ``.<name>.<id>-<pid>@<host>.tmp`` and published with
    copies inside the store (S3: ``CopyObject``, no data through this
    machine), in an order that keeps readers from seeing a part of it:

    1. an old store under ``url`` is made invisible first (its root
       ``zarr.json`` deleted), then deleted;
    2. the chunks are copied, then each array's metadata (deepest first),
       then the root group's metadata, one object, last.

    ``zarr.open_group`` and ``xarray.open_zarr`` need the root metadata, so
    a reader finds the old store, then no store, then the new one whole.  An
    array opened on its own path has its metadata only once all its chunks
    are there.  After an interruption:

    - while the temporary is written (the computation): ``url`` is as it
      was; the temporary is deleted, or left by a killed process, or
      partly re-created by a task still running elsewhere when the block
      failed (the caller must wait for its local tasks: ``dask-mcpca
      score`` does); the next write of ``url`` from the same host deletes
      what is left;
    - while publishing: ``url`` holds objects but no root metadata, and
      :data:`PUBLISHING_MARKER`, written before anything under ``url`` is
      touched and deleted after the root metadata is published; readers
      see no store, and ``dask-mcpca score --overwrite`` replaces it.

    What exists at ``url`` is replaced only with ``overwrite`` and only when it
    is a Zarr store (root metadata) or an interrupted publication (the
    marker); anything else (an object named ``url``, a prefix of other
    objects) is a ``FileExistsError`` naming ``url``, checked when the block
    starts and again before publishing, and left as it is.

    A ``file://`` URL is a local path: use :func:`atomic_path` for it.
    """
    fs, root = url_to_fs(url, storage_options)
    root = root.rstrip("/")
    parent, _, name = root.rpartition("/")
    if not parent or not name:
        raise ValueError(f"{url!r} names no key prefix inside its bucket; name one, as s3://bucket/scores.zarr")
    with answered(url, "write"):
        _refuse_url_target(url, url_store_state(fs, root), overwrite)
        for stale in _stale_url_temporaries(fs, parent, name):
            fs.rm(stale, recursive=True)
    tmp = f"{parent}/{_url_temporary_name(name)}"
    silent = False
    try:
        yield fs.unstrip_protocol(tmp)
        with answered(url, "write"):
            _refuse_url_target(url, url_store_state(fs, root), overwrite)
            _publish(fs, tmp, root)
    except BaseException as err:
        silent = is_timeout(err)
        raise
    finally:
        if not silent:  # an endpoint that did not answer would make the error wait once more
            with contextlib.suppress(Exception):  # best effort; the next write from this host deletes a leftover
                fs.rm(tmp, recursive=True)


def _publish(fs, source: str, target: str) -> None:
    """Copy the Zarr store at ``source`` over ``target`` in the order :func:`atomic_url_store` gives."""
    fs.invalidate_cache(source)
    keys = sorted(k[len(source) + 1 :] for k in fs.find(source))
    marker = f"{target}/{PUBLISHING_MARKER}"
    existed = fs.exists(target)
    fs.pipe_file(marker, f"publishing {source}\n".encode())  # first: what follows is recognised as ours
    if existed:
        visible = [f"{target}/{m}" for m in _ZARR_METADATA if fs.exists(f"{target}/{m}")]
        if visible:  # (none after an interrupted publication; fsspec's rm refuses an empty list)
            fs.rm(visible)  # invisible first
        fs.invalidate_cache(target)
        rest = [k for k in fs.find(target) if k.rstrip("/") != marker]
        if rest:
            fs.rm(rest)
    is_meta = [k.rpartition("/")[2] in _ZARR_METADATA for k in keys]
    chunks = [k for k, meta in zip(keys, is_meta, strict=True) if not meta]
    levels: dict[int, list[str]] = {}
    for k, meta in zip(keys, is_meta, strict=True):
        if meta:
            levels.setdefault(k.count("/"), []).append(k)
    for batch in [chunks] + [levels[d] for d in sorted(levels, reverse=True)]:  # depth 0, the root, last
        if batch:
            fs.copy([f"{source}/{k}" for k in batch], [f"{target}/{k}" for k in batch])
    fs.rm(marker)  # last: the store is whole
    fs.invalidate_cache(target)


@contextlib.contextmanager
def atomic_open(path, mode: str = "w", *, storage_options: dict | None = None, **open_kwargs):
    """Open ``path`` for writing; it appears whole when the block ends without error, else not at all.

    A local path or ``file://`` URL: a temporary sibling renamed into place
    (:func:`atomic_path`).  Any other URL: a local temporary file (in
    :func:`tempfile.gettempdir`), uploaded as one object with
    ``fs.put_file`` when the block ends (atomic as :func:`write_bytes` says)
    and deleted.  ``mode`` is ``"w"`` or ``"wb"``; ``open_kwargs`` go to
    :func:`open` (``newline=""`` for CSV).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode={mode!r}; expected 'w' or 'wb'")
    local = local_path(path)
    if local is not None:
        in_body = False  # an error of the caller's block is its own, not one of writing path
        try:
            check_file_target(_resolved(local))  # before the work, and again at the rename
            with atomic_path(local) as tmp, open(tmp, mode, **open_kwargs) as f:
                in_body = True
                yield f
                in_body = False
        except OSError as err:
            if in_body:
                raise
            raise _naming(err, path) from None
        return
    with _uploaded(path, storage_options) as tmp, open(tmp, mode, **open_kwargs) as f:
        yield f


@contextlib.contextmanager
def atomic_files(paths, *, storage_options: dict | None = None):
    """Yield one temporary file per path of ``paths`` (a list, in the same order); when the block ends
    without error, put them all in place, in the order of ``paths``, else none of them.

    A local path's temporary is its hidden sibling (:func:`atomic_path`), a URL's a local file uploaded
    as one object.  An error, Ctrl-C or SIGTERM in the block leaves every path as it was.  Once the
    block is done the files are put in place one after the other with ``HELD_SIGNALS`` held
    (:func:`_signals_held`), so such a signal is acted on after the last.  Several renames are not one
    step: a SIGKILL, a crash or a failed rename between them leaves the first paths new and the
    others old; callers name last the file whose new content says the set is whole.
    """
    paths = list(paths)
    temporaries: dict[int, str] = {}
    with contextlib.ExitStack() as stack:
        for i in reversed(range(len(paths))):  # closed last in, first out: ``paths[0]`` is put in place first
            local = local_path(paths[i])
            if local is None:
                temporaries[i] = stack.enter_context(_uploaded(paths[i], storage_options))
                continue
            try:
                check_file_target(_resolved(local))  # before the work, and again at the rename
            except OSError as err:
                raise _naming(err, paths[i]) from None
            temporaries[i] = stack.enter_context(atomic_path(local))
        yield [temporaries[i] for i in range(len(paths))]
        with _signals_held():
            stack.close()


@contextlib.contextmanager
def _uploaded(path: str, storage_options: dict | None):
    """A local temporary file uploaded to the URL ``path`` as one object when the block ends without error."""
    fs, where = url_to_fs(path, storage_options)
    with answered(path, "write"):  # before the block's work: an endpoint that does not answer is found now
        info_or_none(fs, where)
    fd, tmp = tempfile.mkstemp(prefix="dask-mcpca-", suffix=TMP_SUFFIX)
    os.close(fd)
    try:
        yield tmp
        try:
            with answered(path, "write"):
                fs.put_file(tmp, where)
        except OSError as err:
            raise _naming(err, path) from None
    finally:
        os.remove(tmp)


@contextlib.contextmanager
def _signals_held():
    """``HELD_SIGNALS`` received in the block are acted on (their handlers restored, each raised again)
    when it ends.  Only the main thread can set handlers: elsewhere the block runs with them as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {}
    for name in HELD_SIGNALS:
        number = getattr(signal, name, None)
        if number is None or signal.getsignal(number) is None:  # not on this OS, or a handler not set from Python
            continue
        previous[number] = signal.signal(number, lambda got, _frame: received.append(got))
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in dict.fromkeys(received):
            signal.raise_signal(number)
