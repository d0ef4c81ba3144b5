"""Progress of long fits: one line per pass on stderr, with blocks done and rows/s.

A pass is the unit of cost, so the bar is per pass::

    pass   3  robust step 2          [################--------------]   4/8 blocks   1.6 M rows/s

It counts finished block tasks in all three ways a pass can run:

- numpy input: :class:`~dask_mcpca._passes.PassRunner` calls :meth:`PassProgress.advance`
  after each slice;
- dask on a local scheduler (threads, processes, synchronous): the bar is a
  :class:`dask.callbacks.Callback` and counts the block tasks as they finish;
- dask with a ``distributed.Client`` as the scheduler (local callbacks never
  fire there): :meth:`PassProgress.compute` submits the pass with
  ``client.compute``, asking for the block results as futures too, and counts
  them with :func:`distributed.as_completed`.  The graph is the same; only the
  small per-block results are also kept until counted.  ``as_completed`` also
  yields the futures cancelled when the pass fails (its workers lost, say):
  only those whose status is ``'finished'`` are counted.

A pass that ends in an exception keeps the blocks it had finished on its line,
marked ``interrupted``, so that a failed pass is never drawn as a full bar.

On a terminal the line is redrawn in place (at most every ``REDRAW_SECONDS``);
otherwise (a log file, a pipe) only the finished line of each pass is written.

Work that is not a pass (``dask-mcpca score`` writing its outputs) uses dask's
own bars through :func:`compute_with_progress`.
"""

from __future__ import annotations

import sys
import time

import dask
from dask.callbacks import Callback

__all__ = ["PassProgress", "compute_with_progress"]

#: Characters of the bar.
BAR_WIDTH = 30
#: Shortest interval between two redraws on a terminal.
REDRAW_SECONDS = 0.1
#: Mark on the last line of a pass that ended in an exception (its count is the blocks finished).
INTERRUPTED = "interrupted"


def _active_client():
    """The ``distributed.Client`` that ``dask.compute`` would use now, or None."""
    if "distributed" not in sys.modules:
        return None
    from distributed import Client

    client = getattr(dask.base.get_scheduler(), "__self__", None)
    return client if isinstance(client, Client) else None


def compute_with_progress(*collections, enabled: bool = True, stream=None):
    """``dask.compute(*collections)`` with dask's progress bar on ``stream`` (stderr).

    The local schedulers get :class:`dask.diagnostics.ProgressBar`; with a
    ``distributed.Client`` the collections are submitted as futures and
    :func:`distributed.progress` draws its text bar (which writes to stdout,
    so stdout is redirected to ``stream`` while it draws).
    """
    stream = stream if stream is not None else sys.stderr
    if not enabled:
        return dask.compute(*collections)
    client = _active_client()
    if client is None:
        from dask.diagnostics import ProgressBar

        with ProgressBar(out=stream):
            return dask.compute(*collections)
    import contextlib

    from distributed import progress

    futures = client.compute(list(collections))
    with contextlib.redirect_stdout(stream):
        progress(futures)
        stream.write("\n")
    return tuple(client.gather(futures))


def _rate(rows_per_s: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if rows_per_s >= scale:
            return f"{rows_per_s / scale:5.1f} {unit} rows/s"
    return f"{rows_per_s:5.0f} rows/s"


class PassProgress(Callback):
    """Context manager that draws the progress line of one pass.

    Parameters
    ----------
    runner : PassRunner
        Gives ``n_rows``, ``n_blocks`` and ``n_passes`` (passes done before
        this one).
    label : str
        What the pass is for, e.g. ``"robust step 2"`` or
        ``"component 1 sigma=0.31"``.
    enabled : bool, default=True
        False draws nothing (``compute`` still computes).
    stream : file-like, default=sys.stderr
    total : int, optional
        Blocks the pass reads (default: all of the runner's).
    """

    def __init__(self, runner, label: str, *, enabled: bool = True, stream=None, total: int | None = None):
        super().__init__()
        self.runner, self.label, self.enabled = runner, label, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.total = max(1, runner.n_blocks if total is None else total)
        self._block_keys: frozenset = frozenset()
        self._last_draw = -float("inf")
        isatty = getattr(self.stream, "isatty", None)
        self._live = bool(isatty and isatty())

    # -- computing -----------------------------------------------------------
    def compute(self, result, *, blocks=()):
        """Compute the delayed ``result`` of a pass, counting ``blocks`` as they finish.

        Parameters
        ----------
        result : dask.delayed.Delayed
            The merged statistics of the pass.
        blocks : list of Delayed
            The per-block tasks that ``result`` depends on.
        """
        client = _active_client() if self.enabled else None
        if client is None:
            self._block_keys = frozenset(b.key for b in blocks)
            (value,) = dask.compute(result)
            return value
        from distributed import as_completed

        final, *parts = client.compute([result, *blocks])
        finished = as_completed(parts, loop=client.loop)
        del parts  # each block's future let go once counted: a held one pins its statistics in a worker
        for part in finished:
            if part.status == "finished":  # not a cancelled or errored one: as_completed yields those too
                self.advance(1)
            part.release()
        return final.result()

    # -- dask local scheduler hook -------------------------------------------
    def _posttask(self, key, result, dsk, state, worker_id):
        if key in self._block_keys:
            self.advance(1)

    # -- drawing -------------------------------------------------------------
    def advance(self, n: int) -> None:
        """Count ``n`` more finished blocks."""
        self.done += n
        if self._live and time.perf_counter() - self._last_draw >= REDRAW_SECONDS:
            self._draw()

    def restart(self) -> None:
        """Count the pass's blocks again from none: the pass is being made again."""
        self.done, self.t0 = 0, time.perf_counter()

    def _line(self) -> str:
        frac = min(1.0, self.done / self.total)
        elapsed = max(time.perf_counter() - self.t0, 1e-9)
        filled = int(round(BAR_WIDTH * frac))
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        width = len(str(self.total))
        return (
            f"pass {self.runner.n_passes + 1:>3}  {self.label:<24} [{bar}] "
            f"{self.done:>{width}}/{self.total} blocks  {_rate(self.runner.n_rows * frac / elapsed)}"
        )

    def _draw(self, final: bool = False, interrupted: bool = False) -> None:
        if not self.enabled:
            return
        self._last_draw = time.perf_counter()
        line = self._line() + (f"  {INTERRUPTED}" if interrupted else "")
        if self._live:
            self.stream.write("\r" + line + ("\n" if final else ""))
        elif final:
            self.stream.write(line + f"  {self._last_draw - self.t0:.2f} s\n")
        self.stream.flush()

    def __enter__(self):
        self.t0 = time.perf_counter()
        if self.enabled:
            super().__enter__()
            if self._live:
                self._draw()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            super().__exit__(*exc)
            if exc[0] is None:
                self.done = self.total
            self._draw(final=True, interrupted=exc[0] is not None)
        return False
