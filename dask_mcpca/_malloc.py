"""glibc malloc settings for the processes the command line owns.

A pass allocates, per store chunk, the compressed bytes read and the
decoded chunk: two buffers of a block's size (76 MiB each for a chunk of
1M x 10 float64 values).  glibc serves any allocation above 32 MiB, its
largest mmap threshold, with a fresh ``mmap`` and gives it back with
``munmap`` when freed, so every chunk read costs the kernel a page fault
per 4 KiB page of both buffers, zeroing included.  On the 2-core machine
of ``benchmarks/`` that is 775,000 faults per pass of a 20M x 10 float64
store, more system time (1.8-3.3 s) than the pass's own work (1.6 s of
user time), and one ``(X.T @ X).compute()`` pass took 2.0-2.8 s.

Two settings, one per kind of command (the setting is global to the
process, so a library call never changes it; ``docs/performance.md`` shows
a Python program or a dask worker how to set it from the environment):

- :func:`reuse_large_blocks` (``fit``, ``update``, ``score``, ``demo``):
  every allocation comes from one heap that is kept, so each chunk reuses
  the pages of the one before.  The same pass took 1.15-1.25 s, with 13
  faults instead of 775,000.  Peak memory is that of the largest
  moment's live blocks plus what the heap could not reuse: 880 MiB instead
  of 730 MiB for a default fit of the 20M x 10 float64 store.
- :func:`return_large_frees_to_os` (``report``, whose smaller blocks and
  deeper pipeline made the heap grow with the rows): blocks of 8 MiB or more
  are mmap'd and unmapped.
"""

from __future__ import annotations

import ctypes
import platform

__all__ = ["reuse_large_blocks", "return_large_frees_to_os", "MMAP_THRESHOLD", "WORKER_ENV"]

#: Allocations from this size up go back to the OS when freed (:func:`return_large_frees_to_os`).
MMAP_THRESHOLD = 8 * 2**20

# glibc's mallopt parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
#: The largest trim threshold mallopt takes (an int): freed memory at the heap's top is kept.
_KEEP = 2**31 - 1


#: The environment that gives a process started later, a dask worker, what :func:`reuse_large_blocks`
#: gives this one: glibc reads the three ``MALLOC_`` variables when a process starts, and a nanny
#: sets the worker it spawns ``MALLOC_TRIM_THRESHOLD_=65536`` from
#: ``distributed.nanny.pre-spawn-environ`` unless that says otherwise (its other entries here are
#: distributed's defaults).  The cluster recipes (``cluster/``) carry it; on 2 local single-threaded
#: workers a 20M x 10 float64 fit took 3.4 s instead of 6.1 s, each worker's peak RSS 688 MiB
#: instead of 626 (``benchmarks/scaling.py --worker-malloc``).
WORKER_ENV = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(_KEEP),
    "DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON": repr({
        "MALLOC_TRIM_THRESHOLD_": _KEEP, "OMP_NUM_THREADS": 1, "MKL_NUM_THREADS": 1, "OPENBLAS_NUM_THREADS": 1,
    }),
}


def _mallopt(*settings: tuple[int, int]) -> bool:
    """Apply glibc ``mallopt`` settings in order; whether all were taken (False off glibc)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return all([bool(mallopt(param, int(value))) for param, value in settings])


def reuse_large_blocks() -> bool:
    """Have glibc's malloc serve every allocation from one heap it keeps (for a command that streams a store).

    One arena, no ``mmap`` for large blocks and no trimming of the heap:
    the buffers of each chunk read reuse the pages of the previous chunk's
    instead of being mapped, faulted in page by page and unmapped (see the
    module's docstring for the figures).  Call it before the command starts
    its threads: a thread that already has its own arena keeps it.  Returns
    whether it was set (False off glibc).
    """
    return _mallopt((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _KEEP))


def return_large_frees_to_os(threshold: int = MMAP_THRESHOLD) -> bool:
    """Have glibc's malloc give every block of ``threshold`` bytes or more back to the OS when freed.

    glibc serves a large allocation from its own heap once a block of that
    size has been freed (its mmap threshold rises with the frees, up to 32
    MiB), and keeps the freed memory: each chunk a reader thread reads (the
    compressed bytes, the decoded chunk, the block) lands in a different
    place, so the resident size grows well past what is in use.  Pinning
    the threshold makes such blocks mmap'd and unmapped on free.  Dask's
    nanny does the same for its workers (``MALLOC_TRIM_THRESHOLD_``).  The
    command line sets it for ``dask-mcpca report``.  Returns whether it
    was set (False off glibc).
    """
    return _mallopt((_M_MMAP_THRESHOLD, threshold))
