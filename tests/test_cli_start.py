"""The command line's start: ``--version``, ``--help`` and a usage error load no heavy library.

Each case runs the console script's :func:`dask_mcpca._console.run` in a fresh
interpreter and lists which of :data:`HEAVY` are in ``sys.modules`` when it
returns: the parser must answer from the standard library and the package's
light modules (the commands import what they use when they run).  A module
count, never a time.
"""

import os
import subprocess
import sys

import pytest

import dask_mcpca
from dask_mcpca import cli

#: Libraries a command loads when it runs and the parser must not.
HEAVY = ("dask", "distributed", "numpy", "scipy", "sklearn", "numba", "zarr", "xarray", "pandas", "h5py")

#: Run ``dask-mcpca ARGS`` as the console script does, then print the heavy modules loaded and the status.
WRAPPER = """
import sys
sys.argv = ["dask-mcpca", *sys.argv[1:]]
from dask_mcpca._console import run
try:
    status = run()
except SystemExit as stop:
    status = stop.code or 0
heavy = sorted(m for m in {heavy!r} if m in sys.modules)
print("LOADED", heavy, status, file=sys.__stderr__)
"""

CASES = {
    "version": (["--version"], 0),
    "help": (["--help"], 0),
    "fit help": (["fit", "--help"], 0),
    "score help": (["score", "--help"], 0),
    "report help": (["report", "--help"], 0),
    "fit without a store": (["fit"], 2),
    "an unknown option": (["fit", "archive.zarr", "--no-such-option"], 2),
    "an unknown command": (["fitt", "archive.zarr"], 2),
    "a bad value": (["score", "archive.zarr", "-m", "m.json", "-o", "s.zarr", "--outputs", "nope"], 2),
}


@pytest.mark.parametrize("case", CASES)
def test_the_parser_loads_no_heavy_library(case, tmp_path):
    argv, expected_status = CASES[case]
    package_root = os.path.dirname(os.path.dirname(dask_mcpca.__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", WRAPPER.format(heavy=HEAVY), *argv], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=120)
    loaded = [line for line in proc.stderr.splitlines() if line.startswith("LOADED ")]
    assert proc.returncode == 0 and loaded, proc.stderr
    assert loaded[-1] == f"LOADED [] {expected_status}"
    if expected_status == 2:  # the one-line usage error
        assert "dask-mcpca" in proc.stderr and "error:" in proc.stderr


def test_every_command_has_a_function():
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert set(commands) == set(cli.COMMANDS)
    for name in commands:
        assert callable(cli._command(name))


def test_max_events_help_states_the_reports_default():
    from dask_mcpca._report import MAX_EVENTS

    assert cli._MAX_EVENTS_HELP == f"{MAX_EVENTS:,}"
    assert cli.build_parser().parse_args(["report", "s.zarr", "-m", "m.json"]).max_events is None
