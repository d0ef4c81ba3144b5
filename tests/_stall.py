"""Kill a command mid-write, deterministically: stall its read on a named pipe.

A kill timed by polling for the output's temporary misses when the write is
faster than the poll (it did on a loaded CI machine). Instead one input chunk
is swapped for a FIFO: reading it blocks, as on a hung network mount, while
the chunks before it are already written to the hidden temporary.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import zarr

#: Seconds to wait for the temporary to appear.
DEADLINE = 120


@contextlib.contextmanager
def stalled_last_chunk(array: str | os.PathLike) -> Iterator[Path]:
    """Swap the last chunk file of the local 2-D Zarr v3 ``array`` (one column chunk) for a FIFO.

    Yields the chunk's path; on exit the chunk's bytes are put back."""
    z = zarr.open_array(str(array), mode="r")
    assert z.cdata_shape[1] == 1, "one chunk across the columns"
    last = Path(array) / "c" / str(z.cdata_shape[0] - 1) / "0"
    saved = last.read_bytes()
    last.unlink()
    os.mkfifo(last)
    try:
        yield last
    finally:
        last.unlink()
        last.write_bytes(saved)


def wait_until_writing(proc: subprocess.Popen, folder: str | os.PathLike) -> None:
    """Return once a hidden ``.tmp`` temporary appears in ``folder`` (``proc`` still running)."""
    deadline = time.monotonic() + DEADLINE
    while not any(n.endswith(".tmp") for n in os.listdir(folder)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)


def kill_once_writing(proc: subprocess.Popen, folder: str | os.PathLike) -> None:
    """SIGKILL ``proc`` once a hidden ``.tmp`` temporary appears in ``folder``."""
    try:
        wait_until_writing(proc, folder)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL
