"""The console script's malloc setting (``_malloc``, ``_console``), in fresh processes.

The setting is global to a process, so every case runs in a child Python.
What is measured is what the setting is for: a large block allocated again
after one of its size was freed.  Under glibc's defaults such a block
(above its 32 MiB mmap ceiling) is mapped afresh, and writing it faults in
every page (32,768 for 128 MiB); with the setting it reuses the freed pages.
The expected counts come from the page size, not from the code under test.
The probe writes a ``bytearray``, as a chunk read returns its compressed
bytes (numpy asks for huge pages for its own large arrays).
"""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
from json import loads as json_loads

import numpy as np
import pytest

GLIBC = platform.libc_ver()[0] == "glibc"


def _huge_pages_always() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[always]" in f.read()
    except OSError:
        return False


#: Where the probe's fault count means what the tests say: Linux's fault counter, glibc's malloc,
#: and 4 KiB pages for a plain allocation (with huge pages "always", 64 faults map 128 MiB).
FAULTS_SHOW = sys.platform.startswith("linux") and GLIBC and not _huge_pages_always()
needs_faults = pytest.mark.skipif(not FAULTS_SHOW, reason="page faults of a 128 MiB block are counted on Linux "
                                  "with glibc and 4 KiB pages only")
BLOCK = 128 * 2**20  # bytes: 32,768 pages of 4 KiB, above glibc's largest mmap threshold (32 MiB)
PAGES = BLOCK // 4096

# Allocates and writes a block twice (the first freed before the second) and prints the minor
# page faults of the second allocation and write.  A bytearray, as the compressed bytes a chunk
# read returns: numpy's own large arrays ask for huge pages (512 times fewer faults).
PROBE = textwrap.dedent(
    f"""
    import resource
    first = bytearray({BLOCK})
    del first
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    second = bytearray({BLOCK})
    second[::4096] = bytes(len(second[::4096]))
    print("FAULTS", resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _faults(code: str, *args: str) -> int:
    out = subprocess.run([sys.executable, "-c", code + PROBE, *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split("FAULTS")[-1])


def test_the_settings_are_taken_on_glibc_only():
    code = ("from dask_mcpca._malloc import return_large_frees_to_os, reuse_large_blocks; "
            "print(reuse_large_blocks(), return_large_frees_to_os())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(GLIBC)] * 2


@needs_faults
def test_the_probe_sees_a_fresh_mapping_without_the_setting():
    assert _faults("") >= PAGES * 0.9


@needs_faults
def test_reuse_large_blocks_serves_a_block_again_from_the_freed_one():
    faults = _faults("from dask_mcpca._malloc import reuse_large_blocks\nassert reuse_large_blocks()\n")
    assert faults < PAGES * 0.05


@pytest.fixture
def small_store(tmp_path):
    import zarr

    path = str(tmp_path / "x.zarr")
    rng = np.random.default_rng(0)
    z = zarr.open_array(path, mode="w", shape=(4000, 3), chunks=(1000, 3), dtype="f8")
    z[:] = rng.standard_normal((4000, 3))
    return path


CONSOLE = textwrap.dedent(
    """
    import sys
    sys.argv = ["dask-mcpca", *sys.argv[1:]]
    from dask_mcpca._console import run
    assert run() == 0
    """
)


@pytest.mark.slow  # a fresh process that fits or reports: seconds
@needs_faults
@pytest.mark.parametrize("command, reused", [("fit", True), ("report", False)])
def test_the_console_script_sets_it_for_the_streaming_commands(small_store, tmp_path, command, reused):
    model = str(tmp_path / "model.json")
    if command == "report":
        from dask_mcpca.cli import main

        assert main(["fit", small_store, "-o", model, "--no-progress"]) == 0
        args = ["report", small_store, "--model", model, "-o", str(tmp_path / "r.png"), "--no-progress"]
    else:
        args = ["fit", small_store, "-o", model, "--no-progress"]
    faults = _faults(CONSOLE, *args)
    if reused:
        assert faults < PAGES * 0.05
    else:  # report keeps glibc's mapping of large blocks (its memory stays flat in the rows)
        assert faults >= PAGES * 0.9


@pytest.mark.slow  # a fresh process that fits or reports: seconds
@needs_faults
def test_main_called_from_python_leaves_the_process_alone(small_store, tmp_path):
    code = textwrap.dedent(
        f"""
        from dask_mcpca.cli import main
        assert main(["fit", {small_store!r}, "-o", {str(tmp_path / "m.json")!r}, "--no-progress"]) == 0
        """
    )
    assert _faults(code) >= PAGES * 0.9


def test_the_console_module_loads_no_numerics_before_the_setting():
    code = "import sys, dask_mcpca._console; print(sorted(m for m in ('numpy', 'dask', 'sklearn') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _module(*args: str, code: str | None = None, cwd=None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "dask_mcpca", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.mark.slow  # a fresh process that fits or reports: seconds
def test_the_quick_exit_keeps_the_status_the_output_and_the_model(small_store, tmp_path):
    model = tmp_path / "model.json"
    done = _module("fit", small_store, "-o", str(model), "--no-progress")
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith(f"model written to {model}")  # the last line, flushed
    assert json_loads(model.read_text())  # whole
    failed = _module("fit", str(tmp_path / "missing.zarr"))
    assert failed.returncode == 2
    assert failed.stderr.startswith("dask-mcpca fit: error: ")
    usage = _module("fit")  # argparse's SystemExit(2)
    assert usage.returncode == 2
    version = _module("--version")  # argparse's SystemExit(0)
    assert version.returncode == 0 and version.stdout.startswith("dask-mcpca ")


def test_the_quick_exit_runs_the_exit_handlers():
    code = ("import atexit, sys; atexit.register(print, 'HANDLER RAN'); sys.argv = ['dask-mcpca', '--version']; "
            "from dask_mcpca._console import main; main()")
    done = _module(code=code)
    assert done.returncode == 0, done.stderr
    version, handler = done.stdout.splitlines()
    assert version.startswith("dask-mcpca ") and handler == "HANDLER RAN"


def test_a_profiler_still_gets_its_results_written(tmp_path):
    done = subprocess.run([sys.executable, "-m", "cProfile", "-o", "out.prof", "-m", "dask_mcpca", "--version"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.prof").stat().st_size > 0
