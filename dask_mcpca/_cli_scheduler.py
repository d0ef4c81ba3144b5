"""``--scheduler``: connecting to a ``dask.distributed`` scheduler within ``--connect-timeout``, and its loss.

Without ``--scheduler`` a command runs on the local threaded scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from ._cli_common import _one_line

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "MAX_CONNECT_TIMEOUT", "CLOSE_TIMEOUT", "_SchedulerLost", "_scheduler"]

#: Seconds to wait for a ``--scheduler`` before giving up.
DEFAULT_CONNECT_TIMEOUT = 10.0
#: Largest ``--connect-timeout`` accepted (seconds).
MAX_CONNECT_TIMEOUT = 3600.0
#: Seconds ``Client.close`` may take (the scheduler may be gone).
CLOSE_TIMEOUT = 5.0


class _SchedulerLost(Exception):
    """The scheduler went away during the computation."""


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
        raise ValueError(f"bad scheduler address {address!r}: {_one_line(err)}") from None
    started = time.monotonic()
    try:
        reply = _identify(address, timeout)
    except (OSError, TimeoutError, asyncio.TimeoutError) as err:
        raise OSError(
            f"cannot reach the dask scheduler at {address!r} within {timeout:g} s ({_one_line(err)})"
        ) from None
    except Exception as err:  # whatever a non-Dask service makes the parser do
        raise OSError(
            f"{address!r} is not a dask scheduler: it did not answer the Dask handshake "
            f"({type(err).__name__}: {_one_line(err)})"
        ) from None
    if not isinstance(reply, dict) or reply.get("type") != "Scheduler":
        raise OSError(f"{address!r} is not a dask scheduler: it answered as {str(reply)[:80]!r}")
    remaining = max(1.0, timeout - (time.monotonic() - started))
    try:
        return Client(address, timeout=remaining, set_as_default=True)
    except (OSError, TimeoutError) as err:
        raise OSError(
            f"cannot reach the dask scheduler at {address!r} within {timeout:g} s ({_one_line(err)})"
        ) from None


def _is_scheduler_loss(err: BaseException) -> bool:
    """A cancelled future or a closed comm: what a client sees when its scheduler dies."""
    from distributed.client import FutureCancelledError
    from distributed.comm.core import CommClosedError

    return isinstance(err, (asyncio.CancelledError, FutureCancelledError, CommClosedError))


@contextlib.contextmanager
def _scheduler(address: str | None, timeout: float):
    """Use the distributed scheduler at ``address`` inside the block (None: local threads)."""
    if not address:
        yield None
        return
    import distributed  # noqa: F401 - configures its loggers on import; quieten them after

    # The client logs its reconnection attempts on stderr; the error line below says it once.
    for name in ["distributed", *logging.root.manager.loggerDict]:
        if name.split(".")[0] == "distributed":
            logging.getLogger(name).setLevel(logging.CRITICAL)
    client = _client(address, timeout)
    try:
        yield client
    except BaseException as err:
        if _is_scheduler_loss(err):
            raise _SchedulerLost(
                f"lost the dask scheduler at {address!r} during the computation ({type(err).__name__})"
            ) from None
        raise
    finally:
        with contextlib.suppress(Exception):
            client.close(timeout=CLOSE_TIMEOUT)

