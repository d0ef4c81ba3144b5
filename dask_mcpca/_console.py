"""The ``dask-mcpca`` console script (and ``python -m dask_mcpca``): the process's settings, then the command line.

A command run as a program owns its process, so the commands that stream a
store through row blocks set glibc's malloc to reuse its large blocks
(:func:`._malloc.reuse_large_blocks`): one pass of a 20M x 10 float64
store then takes half the time.  The setting must come before the imports:
importing scikit-learn and ``dask.array`` leaves malloc a second arena,
which one of dask's threads would then use instead of the reused heap.  So
this module imports nothing heavy before it (the package's names load on
first use, see ``__init__``), and :func:`._cli.main` called from Python
leaves the process's malloc alone.
"""

from __future__ import annotations

import sys

from ._malloc import reuse_large_blocks

__all__ = ["main", "STREAMING_COMMANDS"]

#: Commands that stream a store through row blocks.  ``report`` sets its own
#: (:func:`._malloc.return_large_frees_to_os`).
STREAMING_COMMANDS = ("fit", "update", "score", "demo")


def main() -> int:
    """Run ``dask-mcpca`` with ``sys.argv``; return the exit status."""
    if len(sys.argv) > 1 and sys.argv[1] in STREAMING_COMMANDS:
        reuse_large_blocks()
    from ._cli import main as cli_main

    return cli_main()
