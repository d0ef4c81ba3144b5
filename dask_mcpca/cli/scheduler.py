"""``--scheduler``: connecting to a ``dask.distributed`` scheduler within ``--connect-timeout``, and its loss.

Without ``--scheduler`` a command runs on the local threaded scheduler.  With
it, a thread watches the scheduler's workers while the command runs
(:class:`_WorkerWatch`): a scheduler with no worker holds its tasks until
one comes, which may be never, so once it has had none for the wait limit
(:func:`dask_mcpca._waits.wait_limit`, 120 s, ``$DASK_MCPCA_WAIT_LIMIT``) the
command's tasks are cancelled and it ends with one line (:class:`NoWorkers`).
A long computation with workers is never cut short.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

from .._waits import WAIT_LIMIT_ENV, wait_limit
from .common import one_line

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT", "MAX_CONNECT_TIMEOUT", "CLOSE_TIMEOUT", "WORKER_POLL", "SchedulerLost", "NoWorkers",
    "use_scheduler",
]

#: Seconds to wait for a ``--scheduler`` before giving up.
DEFAULT_CONNECT_TIMEOUT = 10.0
#: Largest ``--connect-timeout`` accepted (seconds).
MAX_CONNECT_TIMEOUT = 3600.0
#: Seconds ``Client.close`` may take (the scheduler may be gone).
CLOSE_TIMEOUT = 5.0
#: Seconds between two looks at the scheduler's workers (:class:`_WorkerWatch`).
WORKER_POLL = 1.0


class SchedulerLost(Exception):
    """The scheduler went away during the computation."""


class NoWorkers(SchedulerLost):
    """The scheduler had no worker for the wait limit; the computation was cancelled."""


class _WorkerWatch:
    """A daemon thread that cancels ``client``'s tasks once its scheduler has had no worker for ``limit`` s.

    It asks the scheduler how many workers it has every :data:`WORKER_POLL` seconds; a question
    that fails (the scheduler gone) is left to the computation, which says so itself.  Once it
    has fired, it cancels whatever the client holds at each look, so nothing waits after it.
    """

    def __init__(self, client, limit: float):
        self.client, self.limit = client, limit
        self.fired, self.most = False, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="dask-mcpca-worker-watch", daemon=True)

    def __enter__(self) -> _WorkerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(CLOSE_TIMEOUT)

    def _count(self) -> int:
        info = self.client.scheduler_info(n_workers=1)
        return int(info.get("n_workers", len(info.get("workers", {}))))

    def _watch(self) -> None:
        since = time.monotonic()
        while not self._stop.wait(WORKER_POLL):
            try:
                n = self._count()
            except Exception:
                continue
            if n:
                self.most, since = max(self.most, n), time.monotonic()
                continue
            if self.fired or time.monotonic() - since >= self.limit:
                self.fired = True
                with contextlib.suppress(Exception):
                    self._cancel()

    def _cancel(self) -> None:
        from distributed import Future

        keys = list(self.client.futures)
        if keys:
            futures = [Future(key, self.client) for key in keys]
            self.client.cancel(futures, force=True, reason="no workers", msg=f"no workers for {self.limit:g} s")

    def error(self, address: str) -> NoWorkers:
        """The one-line error: what happened, and what to do."""
        had = f"it lost its {self.most} worker{'s' * (self.most != 1)}" if self.most else "it had none"
        return NoWorkers(
            f"the dask scheduler at {address!r} has had no workers for {self.limit:g} s ({had}), so the "
            f"computation was cancelled and nothing written; start workers for it (dask worker {address}), "
            f"or set {WAIT_LIMIT_ENV}=SECONDS to wait longer for them"
        )


def _identify(address: str, timeout: float) -> dict:
    """Ask ``address`` who it is, handshake included, within ``timeout`` seconds.

    ``distributed``'s own connect bounds the TCP connection but not the
    handshake that follows, so a listener that accepts and never answers
    would hang a ``Client`` forever; and a service that talks first (an SSH
    banner) is read as a message header.  Everything here runs under one
    ``asyncio.wait_for``.
    """
    from distributed.comm import connect
    from distributed.security import Security

    # the client's TLS settings from the Dask config, as Client(address) uses them
    connection_args = Security().get_connection_args("client")

    async def identity():
        comm = await connect(address, timeout=timeout, **connection_args)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    async def bounded():
        return await asyncio.wait_for(identity(), timeout)

    return asyncio.run(bounded())


def _client(address: str, timeout: float):
    """A ``distributed.Client`` of the scheduler at ``address``, or a one-line error within ``timeout``."""
    from distributed import Client
    from distributed.comm import parse_address

    try:
        parse_address(address)
    except ValueError as err:
        raise ValueError(f"bad scheduler address {address!r}: {one_line(err)}") from None
    started = time.monotonic()
    try:
        reply = _identify(address, timeout)
    except (OSError, TimeoutError, asyncio.TimeoutError) as err:
        raise OSError(
            f"cannot reach the dask scheduler at {address!r} within {timeout:g} s ({one_line(err)})"
        ) from None
    except Exception as err:  # whatever a non-Dask service makes the parser do
        raise OSError(
            f"{address!r} is not a dask scheduler: it did not answer the Dask handshake "
            f"({type(err).__name__}: {one_line(err)})"
        ) from None
    if not isinstance(reply, dict) or reply.get("type") != "Scheduler":
        raise OSError(f"{address!r} is not a dask scheduler: it answered as {str(reply)[:80]!r}")
    remaining = max(1.0, timeout - (time.monotonic() - started))
    try:
        return Client(address, timeout=remaining, set_as_default=True)
    except (OSError, TimeoutError) as err:
        raise OSError(
            f"cannot reach the dask scheduler at {address!r} within {timeout:g} s ({one_line(err)})"
        ) from None


def _is_scheduler_loss(err: BaseException) -> bool:
    """A cancelled future or a closed comm: what a client sees when its scheduler dies."""
    from distributed.client import FutureCancelledError
    from distributed.comm.core import CommClosedError

    return isinstance(err, (asyncio.CancelledError, FutureCancelledError, CommClosedError))


@contextlib.contextmanager
def use_scheduler(address: str | None, timeout: float):
    """Use the distributed scheduler at ``address`` inside the block (None: local threads)."""
    if not address:
        yield None
        return
    import distributed  # noqa: F401 - configures its loggers on import; quieten them after

    # The client logs its reconnection attempts on stderr; the error line below says it once.
    for name in ["distributed", *logging.root.manager.loggerDict]:
        if name.split(".")[0] == "distributed":
            logging.getLogger(name).setLevel(logging.CRITICAL)
    limit = wait_limit()  # a bad $DASK_MCPCA_WAIT_LIMIT is refused before connecting
    client = _client(address, timeout)
    watch = _WorkerWatch(client, limit)
    try:
        with watch:
            yield client
    except BaseException as err:
        if watch.fired and not isinstance(err, KeyboardInterrupt):
            raise watch.error(address) from None
        if _is_scheduler_loss(err):
            raise SchedulerLost(
                f"lost the dask scheduler at {address!r} during the computation ({type(err).__name__})"
            ) from None
        raise
    finally:
        with contextlib.suppress(Exception):
            client.close(timeout=CLOSE_TIMEOUT)

