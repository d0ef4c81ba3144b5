"""URLs and paths on the read path: what a path or URL names, its filesystem, its bytes.

An fsspec URL (``s3://...``, ``gs://...``) or a local path (a ``file://`` URL is one): whether a
name is a URL (:func:`is_url`) and the local path it names (:func:`local_path`), whether two
overlap (:func:`overlaps`), its filesystem with the wait limit's timeouts on ``s3://``
(:func:`url_to_fs`, :func:`with_timeouts`, :data:`S3_TIMEOUTS`), a file's bytes
(:func:`read_bytes`) and an object store's timeouts as one-line errors (:func:`answered`).
Reading code (:mod:`._io`, :mod:`._stacked`) imports these and nothing of the writes, which
live in :mod:`._atomic`.
"""

from __future__ import annotations

import contextlib
import os
import stat

from ._waits import DEFAULT_WAIT_LIMIT, fix_hint, is_timeout, s3_config

__all__ = [
    "is_url",
    "local_path",
    "overlaps",
    "url_to_fs",
    "with_timeouts",
    "missing_backend",
    "read_bytes",
    "info_or_none",
    "answered",
    "file_kind",
    "S3_TIMEOUTS",
]


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` is, in words (for messages)."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def is_url(path) -> bool:
    """Whether ``path`` is a URL for fsspec (``s3://...``) rather than a local path."""
    return isinstance(path, str) and "://" in path


def overlaps(a, b) -> bool:
    """Whether one of two paths or URLs lies inside the other (or they are the same).

    Local paths are compared as the OS resolves them (symlinks followed); a ``file://`` or
    ``local://`` URL is compared as the local path it names; a local path never overlaps a remote
    URL.  Remote URLs are compared under their scheme's canonical name (``s3a://`` is ``s3://``),
    as fsspec registers it.
    """
    la, lb = local_path(a), local_path(b)
    if la is not None and lb is not None:
        return _is_within(la, lb) or _is_within(lb, la)
    if la is not None or lb is not None:
        return False
    a, b = (_canonical_url(os.fspath(u)).rstrip("/") + "/" for u in (a, b))
    return a.startswith(b) or b.startswith(a)


def _protocol(url: str) -> str:
    """The canonical name of ``url``'s scheme as fsspec registers it (``s3a`` -> ``s3``,
    ``local`` -> ``file``); the scheme itself where fsspec or the scheme's backend is missing
    (such a URL cannot be opened either)."""
    scheme = url.split("://", 1)[0].lower()
    try:
        import fsspec

        names = fsspec.get_filesystem_class(scheme).protocol
    except (ImportError, ValueError):
        return scheme
    return names if isinstance(names, str) else names[0]


def _canonical_url(url: str) -> str:
    return _protocol(url) + "://" + url.split("://", 1)[1]


def _is_within(path: str, parent: str) -> bool:
    path, parent = os.path.realpath(path), os.path.realpath(parent)
    return path == parent or path.startswith(parent.rstrip(os.sep) + os.sep)


def local_path(path) -> str | None:
    """The local path of ``path``: itself, or that of a ``file://`` (or ``local://``) URL; None for other URLs."""
    if not is_url(path):
        return os.fspath(path)
    if path.startswith("file://") or _protocol(path) == "file":
        return path.split("://", 1)[1]
    return None


#: The botocore ``Config`` of every request to an ``s3://`` URL at the default wait limit (120 s), as
#: :func:`with_timeouts` gives it unless the storage options set a key (``config_kwargs.read_timeout=...``):
#: see :func:`._waits.s3_config`, which sizes them to ``$DASK_MCPCA_WAIT_LIMIT`` when that is set.
S3_TIMEOUTS = s3_config(DEFAULT_WAIT_LIMIT, session=False)


def with_timeouts(url, storage_options: dict | None = None) -> dict | None:
    """``storage_options`` for ``url`` with :func:`._waits.s3_config` where the URL is ``s3://`` and the
    options do not set its keys (the user's keys win, key by key): an endpoint that stops answering
    fails a request within the wait limit (``$DASK_MCPCA_WAIT_LIMIT``, 120 s).  Other URLs' options
    are returned as given: their backends have their own (fsspec's HTTP: aiohttp's 5 min per request)."""
    if not is_url(url) or local_path(url) is not None or _protocol(url) != "s3":
        return storage_options
    options = dict(storage_options or {})
    for key in _S3_MAPPINGS:
        if not isinstance(options.get(key, {}), dict):
            raise ValueError(f"storage option {key}={options[key]!r} must be a mapping ({key}.KEY=VALUE)")
    config = options.get("config_kwargs", {})
    for key in ("connect_timeout", "read_timeout"):
        value = config.get(key, 1.0)
        if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 < value < float("inf")):
            raise ValueError(f"storage option config_kwargs.{key}={value!r} must be a number of seconds > 0")
    options["config_kwargs"] = {**s3_config(), **config}
    return options


#: Options of ``s3fs.S3FileSystem`` that hold keys of their own (given as ``KEY.SUBKEY=VALUE``).
_S3_MAPPINGS = ("client_kwargs", "config_kwargs", "s3_additional_kwargs")


def url_to_fs(url: str, storage_options: dict | None = None):
    """``(filesystem, path)`` of an fsspec URL; an ImportError naming the extra when a backend is missing.

    An ``s3://`` URL gets :data:`S3_TIMEOUTS` unless ``storage_options`` set them; options its backend
    does not take are a ValueError naming them.
    """
    try:
        import fsspec
    except ImportError:
        raise ImportError(f"{url!r} is a URL, which needs fsspec: pip install 'dask-mcpca[cloud]'") from None
    options = with_timeouts(url, storage_options)
    try:
        return fsspec.core.url_to_fs(url, **(options or {}))
    except ImportError as err:
        raise ImportError(missing_backend(url, err)) from None
    except (TypeError, AttributeError) as err:
        raise ValueError(f"storage options {sorted(storage_options or {})} do not suit {url!r}: {err}") from None


def missing_backend(url: str, err: BaseException) -> str:
    """The message for a URL whose fsspec backend is not installed."""
    return (
        f"{url!r} needs the fsspec backend of its protocol, which is not installed ({err}); "
        "pip install 'dask-mcpca[cloud]' installs fsspec and s3fs (s3://); gs:// needs gcsfs, abfs:// adlfs"
    )


def read_bytes(path, *, storage_options: dict | None = None, limit: int | None = None) -> bytes:
    """The bytes of the file ``path`` (a local path or a URL), at most ``limit + 1`` of them.

    Raises FileNotFoundError when there is none, IsADirectoryError for a
    directory, ValueError for anything else that is not a regular file.
    """
    local = local_path(path)
    if local is not None:
        mode = os.stat(local).st_mode  # before opening: opening a FIFO for reading waits for a writer
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(local)
        if not stat.S_ISREG(mode):
            raise ValueError(f"it is {file_kind(mode)}, not a regular file")
        # non-blocking, in case it was swapped for a FIFO since: then refused below, never waited on
        fd = os.open(local, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        with open(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise ValueError(f"it is {file_kind(mode)}, not a regular file")
            if hasattr(os, "set_blocking"):
                os.set_blocking(fd, True)
            return f.read(-1 if limit is None else limit + 1)
    fs, where = url_to_fs(path, storage_options)
    fs.invalidate_cache(where)  # fsspec caches listings: the object may be newer than this process's last look
    with answered(path, "read"):
        info = info_or_none(fs, where)
        if info is None:
            raise FileNotFoundError(path)
        if info.get("type") != "file":
            raise IsADirectoryError(path)
        with fs.open(where, "rb") as f:
            return f.read(-1 if limit is None else limit + 1)


def info_or_none(fs, path: str) -> dict | None:
    """``fs.info(path)``, or None when nothing is there; any other error (a timeout) is raised.

    Never fsspec's ``isfile``/``isdir``/``exists`` on a URL: they say False for any error, so an
    endpoint that did not answer reads as no object, and the next question (s3fs's ``isdir`` lists
    the path as a folder) waits on it once more.
    """
    try:
        return fs.info(path)
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def answered(url, doing: str):
    """Inside the block, a timeout of the object store of ``url`` is a one-line ``TimeoutError`` that names
    ``url``, what was being done (``doing``: "read", "write") and the wait limit that changes it."""
    try:
        yield
    except Exception as err:
        if not is_timeout(err):
            raise
        cause = " ".join(str(err).split()) or type(err).__name__
        raise TimeoutError(
            f"cannot {doing} {os.fspath(url)!r}: its object store did not answer ({cause}); "
            f"check its endpoint, or {fix_hint()}"
        ) from None
