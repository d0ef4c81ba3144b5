"""Where a command writes: output locations checked before any work, and stores that appear whole or not at all.

An output never overlaps the input store (:func:`refuse_inside_input`);
``--overwrite`` replaces only a Zarr store; ``score`` writes into a
temporary put in place when complete (:func:`output_store`).
"""

from __future__ import annotations

import contextlib
import os

from .._atomic import check_file_target, is_zarr_store
from .._urls import is_url, local_path, with_timeouts
from .._urls import overlaps as _overlaps
from .common import UsageError, one_line, store_root

__all__ = [
    "refuse_inside_input", "check_output_location", "compute_settled", "refuse_replacing_other_data", "path_exists",
    "output_store",
]


def refuse_inside_input(output: str, store: str, what: str) -> None:
    """Refuse an output inside the input store, or one that holds it (replacing that output would
    delete the store), for paths and URLs alike (an input store is never written to)."""
    root = store_root(store)
    if _overlaps(output, root):
        raise UsageError(f"{what} {output!r} would overlap the input store {root!r}; choose another path")


def check_output_location(output: str, *, is_file: bool) -> None:
    """Refuse, before any work, an output that could not be written (read-only, not a folder)."""
    if is_url(output):  # the object store says so when it is written, except for a key it cannot hold
        key = output.split("://", 1)[1].rstrip("/")
        if "" in key.split("/"):
            raise UsageError(f"--output {output!r} has an empty path segment ('//'), which an object store "
                             "cannot hold; write each '/' once")
        return
    path = os.path.abspath(output)
    if is_file and os.path.isdir(path):
        raise UsageError(f"--output {output!r} is a directory; name a file")
    if is_file:
        try:
            check_file_target(path)  # a device node, a FIFO, a socket: never replaced by a file
        except OSError as err:
            raise UsageError(f"--output {output!r}: {one_line(err)}") from None
    parent = os.path.dirname(path)
    while not os.path.lexists(parent):  # atomic_path creates the missing folders
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UsageError(f"--output {output!r} cannot be created: {parent!r} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--output {output!r} cannot be created: directory {parent!r} is not writable")


def compute_settled(*collections, progress: bool):
    """Compute ``collections``; on a failure, return only once no local task still runs.

    When one task fails, dask's threaded scheduler raises while the tasks
    already running go on and write their chunks; the temporary output
    deleted on the way out would get them after it was deleted.  So the
    local threads are a pool of this call's own, shut down (the running
    tasks waited for, the queued ones cancelled) before the error goes on.
    On a distributed scheduler the workers' running tasks cannot be waited
    for: a few chunks may land in the temporary after it is deleted, and the
    next write of the same output from this host deletes them.
    """
    from concurrent.futures import ThreadPoolExecutor

    import dask
    import dask.threaded

    from .._passes import single_threaded_blas
    from .._progress import _active_client, compute_with_progress

    if _active_client() is not None:
        return compute_with_progress(*collections, enabled=progress)
    executor = getattr(dask.threaded, "ContextAwareThreadPoolExecutor", ThreadPoolExecutor)  # dask's own kind
    pool = executor(int(dask.config.get("num_workers", None) or os.cpu_count() or 1))
    # dask's threaded scheduler named as a function, not found by name: the lookup by name (and dask's default one)
    # imports distributed to look for a client, 0.3-0.4 s of a command's start that no local run needs
    local = {"scheduler": dask.threaded.get} if dask.config.get("scheduler", None) is None else {}
    try:
        # one task per core already: nested BLAS threads slow each block's products (see single_threaded_blas)
        with dask.config.set(pool=pool, **local), single_threaded_blas():
            return compute_with_progress(*collections, enabled=progress)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def refuse_replacing_other_data(path: str, options: dict | None = None) -> None:
    """``--overwrite`` replaces a Zarr store, never another directory, file or prefix:
    ``--output ~/projects --overwrite`` would otherwise delete the folder, and
    ``--output s3://bucket/projects --overwrite`` every object under it.

    A local store is a folder with root Zarr metadata that parses (:func:`dask_mcpca._atomic.is_zarr_store`);
    on an object store, a prefix with root metadata or an interrupted publication, recognised by
    its own marker (:data:`dask_mcpca._atomic.PUBLISHING_MARKER`), not by missing metadata.  Checked again
    when the new store is put in place (:func:`output_store`).
    """
    from .._atomic import url_store_state
    from .._urls import answered, url_to_fs

    local = local_path(path)
    if local is None:
        fs, root = url_to_fs(path, options)
        with answered(path, "write"):
            if url_store_state(fs, root) in ("zarr", "interrupted", "absent"):
                return
    elif is_zarr_store(local):
        return
    raise UsageError(
        f"--output {path!r} exists and is not a Zarr store; --overwrite replaces only a Zarr store "
        "(remove it yourself if you mean to replace it)"
    )


def path_exists(path: str, options: dict | None) -> bool:
    """Whether something is at ``path``; on an object store a timeout is a one-line TimeoutError, never False."""
    from .._urls import answered, info_or_none, local_path, url_to_fs

    local = local_path(path)
    if local is not None:
        return os.path.lexists(local)
    fs, root = url_to_fs(path, options)
    fs.invalidate_cache(root)
    with answered(path, "write"):
        return info_or_none(fs, root) is not None


@contextlib.contextmanager
def output_store(path: str, options: dict | None, *, overwrite: bool = False):
    """Where ``score`` writes: a temporary that appears under ``path`` only when complete.

    A local path (or ``file://`` URL) is a temporary sibling renamed into
    place (:func:`dask_mcpca._atomic.atomic_path`); an object store URL a hidden
    sibling prefix published by copies inside the store, root metadata last
    (:func:`dask_mcpca._atomic.atomic_url_store`, which says what a reader may see
    after an interruption).  The group attribute ``complete: true`` is set
    in the temporary once every array is written.  What is at ``path`` when
    the store is put in place is replaced only with ``overwrite`` and only if
    it is a Zarr store (on an object store, also an interrupted publication).
    """
    import zarr

    from .._atomic import atomic_path, atomic_url_store
    from .._urls import local_path

    def replaceable(existing: str) -> bool:
        return overwrite and is_zarr_store(existing)

    local = local_path(path)
    with atomic_path(local, replace=replaceable) if local is not None else atomic_url_store(
        path, storage_options=options, overwrite=overwrite
    ) as tmp:
        yield tmp
        so = {"storage_options": with_timeouts(tmp, options)} if is_url(tmp) else {}
        zarr.open_group(tmp, mode="r+", **so).attrs["complete"] = True

