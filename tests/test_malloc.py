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

import numpy as np
import pytest

GLIBC = platform.libc_ver()[0] == "glibc"
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


def test_the_probe_sees_a_fresh_mapping_without_the_setting():
    assert _faults("") >= PAGES * 0.9


def test_reuse_large_blocks_serves_a_block_again_from_the_freed_one():
    if not GLIBC:  # nothing to set: the function says so
        from dask_mcpca._malloc import reuse_large_blocks

        assert reuse_large_blocks() is False
        return
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


@pytest.mark.parametrize("command, reused", [("fit", True), ("report", False)])
def test_the_console_script_sets_it_for_the_streaming_commands(small_store, tmp_path, command, reused):
    model = str(tmp_path / "model.json")
    if command == "report":
        from dask_mcpca._cli import main

        assert main(["fit", small_store, "-o", model, "--no-progress"]) == 0
        args = ["report", small_store, "--model", model, "-o", str(tmp_path / "r.png"), "--no-progress"]
    else:
        args = ["fit", small_store, "-o", model, "--no-progress"]
    faults = _faults(CONSOLE, *args)
    if reused and GLIBC:
        assert faults < PAGES * 0.05
    else:  # report keeps glibc's mapping of large blocks (its memory stays flat in the rows)
        assert faults >= PAGES * 0.9


def test_main_called_from_python_leaves_the_process_alone(small_store, tmp_path):
    code = textwrap.dedent(
        f"""
        from dask_mcpca._cli import main
        assert main(["fit", {small_store!r}, "-o", {str(tmp_path / "m.json")!r}, "--no-progress"]) == 0
        """
    )
    assert _faults(code) >= PAGES * 0.9


def test_the_console_module_loads_no_numerics_before_the_setting():
    code = "import sys, dask_mcpca._console; print(sorted(m for m in ('numpy', 'dask', 'sklearn') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
