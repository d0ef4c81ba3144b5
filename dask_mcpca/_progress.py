"""Progress of long fits: one line per pass on stderr, with blocks done and rows/s.

Works for numpy input (the runner advances it), the local dask schedulers
(a :class:`dask.callbacks.Callback` counts finished block tasks) and a
``distributed.Client`` (the finished block tasks are counted on the client
through :func:`distributed.as_completed` is not possible for a graph handed to
``dask.compute``, so the scheduler plugin-free route is used: the bar shows the
start and the end of the pass, with its rate).
"""

from __future__ import annotations

import sys
import time

from dask.callbacks import Callback

__all__ = ["PassProgress"]

BAR_WIDTH = 30


class PassProgress(Callback):
    """Context manager that draws one progress line for one pass."""

    def __init__(self, runner, label: str, *, enabled: bool = True, stream=None):
        super().__init__()
        self.runner, self.label, self.enabled = runner, label, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.total = max(1, runner.n_blocks)

    # -- dask local scheduler hooks ---------------------------------------
    def _posttask(self, key, result, dsk, state, worker_id):
        if isinstance(key, tuple) and str(key[0]).startswith("block_stats"):
            self.advance(1)
        elif isinstance(key, str) and key.startswith("block_stats"):
            self.advance(1)

    # -- drawing -----------------------------------------------------------
    def advance(self, n: int) -> None:
        self.done += n
        self._draw()

    def _draw(self, final: bool = False) -> None:
        if not self.enabled:
            return
        frac = min(1.0, self.done / self.total)
        elapsed = max(time.perf_counter() - self.t0, 1e-9)
        rows = self.runner.n_rows * frac
        bar = "#" * int(BAR_WIDTH * frac) + "-" * (BAR_WIDTH - int(BAR_WIDTH * frac))
        line = (
            f"\rpass {self.runner.n_passes + 1:>3} {self.label:<28} [{bar}] "
            f"{self.done}/{self.total} blocks {rows / elapsed:,.0f} rows/s"
        )
        self.stream.write(line + ("\n" if final else ""))
        self.stream.flush()

    def __enter__(self):
        self.t0 = time.perf_counter()
        if self.enabled:
            super().__enter__()
            self._draw()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            super().__exit__(*exc)
            if exc[0] is None:
                self.done = self.total
            self._draw(final=True)
        return False
