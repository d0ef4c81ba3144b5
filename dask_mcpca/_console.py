"""The ``dask-mcpca`` console script (and ``python -m dask_mcpca``): settings, the command line, a quick exit.

A command run as a program owns its process, so:

- the commands that stream a store through row blocks set glibc's malloc to
  reuse its large blocks (:func:`._malloc.reuse_large_blocks`): one pass of
  a 20M x 10 float64 store then takes half the time.  The setting must
  come before the imports: importing scikit-learn and ``dask.array`` leaves
  malloc a second arena, which one of dask's threads would then use instead
  of the reused heap.  So this module imports nothing heavy before it (the
  package's names load on first use, see ``__init__``);
- the process ends without tearing the interpreter down (:func:`_leave`):
  after a fit of 20M rows that teardown took 0.6 s, a tenth of the command.

:func:`.cli.main` called from Python does neither.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn

from ._malloc import reuse_large_blocks

__all__ = ["main", "run", "STREAMING_COMMANDS"]

#: Commands that stream a store through row blocks.  ``report`` sets its own
#: (:func:`._malloc.return_large_frees_to_os`).
STREAMING_COMMANDS = ("fit", "update", "score", "demo")


def run() -> int:
    """Run ``dask-mcpca`` with ``sys.argv`` and the process's settings; return the exit status."""
    if len(sys.argv) > 1 and sys.argv[1] in STREAMING_COMMANDS:
        reuse_large_blocks()
    from .cli import main as cli_main

    return cli_main()


def main() -> NoReturn:
    """The console script: :func:`run`, then leave the process with its status."""
    try:
        status = run()
    except SystemExit as stop:  # argparse: --help, --version, a usage error
        if not isinstance(stop.code, int | None):
            raise
        status = stop.code or 0
    _leave(status)


def _leave(status: int) -> NoReturn:
    """End the process as ``mypy`` does, without freeing every object and module one by one.

    What a normal exit does that matters is done first: the ``atexit``
    handlers (logging's flush among them) and the flush of stdout and
    stderr.  Every output file is already closed and published (written
    atomically) when the command returns; threads still alive are idle
    (dask's pool, zarr's event loop).  Under a profiler or a tracer
    (``python -m cProfile``, coverage), which write their results after the
    program returns, the exit is the ordinary one.
    """
    if sys.getprofile() is not None or sys.gettrace() is not None:
        raise SystemExit(status)
    try:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):  # closed (>&-), or a reader gone
                pass
    except KeyboardInterrupt:  # Ctrl-C on the way out (or re-delivered by cli's unraisable hook)
        status = 130
    os._exit(status)
