"""One limit for every wait on something outside the process: an object store, or a cluster's workers.

A wait whose end the user cannot see is a hang.  Every such wait of
dask-mcpca ends within one limit, :func:`wait_limit` seconds
(:data:`DEFAULT_WAIT_LIMIT`; the environment variable
:data:`WAIT_LIMIT_ENV` changes it, for the command line and the Python
API alike):

- a request to an ``s3://`` object store (a store's chunks, a model file,
  an output; from this process or a worker) that gets no answer: its
  connect and read timeouts (:func:`s3_config`) are sized so that the
  attempts botocore and s3fs make, with their backoff, end within the
  limit; an upload is also given :data:`SECONDS_PER_MIB` per MiB it sends;
- a ``--scheduler`` that has no worker left (:mod:`.cli.scheduler`): the
  computation is cancelled once it has had none for the limit.

Reaching a ``--scheduler`` has its own, shorter bound, ``--connect-timeout``.
"""

from __future__ import annotations

import asyncio
import math
import os

__all__ = [
    "WAIT_LIMIT_ENV", "DEFAULT_WAIT_LIMIT", "MIN_WAIT_LIMIT", "SECONDS_PER_MIB", "wait_limit", "s3_config",
    "is_timeout", "fix_hint",
]

#: The environment variable that sets the limit, in seconds.
WAIT_LIMIT_ENV = "DASK_MCPCA_WAIT_LIMIT"
#: Seconds any wait on an object store or on a cluster's workers may last, unless ``WAIT_LIMIT_ENV`` says.
DEFAULT_WAIT_LIMIT = 120.0
#: The smallest limit accepted: below it the retries' own backoff (:data:`_BACKOFF`) would be most of it.
MIN_WAIT_LIMIT = 10.0
#: Seconds an upload to an object store is given per MiB it sends, on top of the timeouts (128 KiB/s).
SECONDS_PER_MIB = 8.0

#: Attempts of one request to ``s3://``: botocore's (``retries.total_max_attempts``) within each of
#: s3fs's tries (its ``S3FileSystem.retries``, 5, which no option changes) of a request that timed out.
_BOTOCORE_ATTEMPTS, _S3FS_TRIES = 2, 5
#: Seconds of backoff between those attempts, at most: s3fs's 0.1 * 1.7**i (1.9 s over 5 tries) and
#: botocore's standard mode (up to 1 s before its second attempt, in each try).
_BACKOFF = 7.0


def wait_limit() -> float:
    """The limit in seconds: ``$DASK_MCPCA_WAIT_LIMIT``, or :data:`DEFAULT_WAIT_LIMIT` when it is unset or empty.

    A value that is no number, or under :data:`MIN_WAIT_LIMIT`, or infinite is a ValueError naming
    the variable (an infinite wait is what the limit is there to prevent).
    """
    text = os.environ.get(WAIT_LIMIT_ENV, "").strip()
    if not text:
        return DEFAULT_WAIT_LIMIT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not MIN_WAIT_LIMIT <= value < math.inf:
        raise ValueError(
            f"{WAIT_LIMIT_ENV}={text!r} must be a number of seconds, at least {MIN_WAIT_LIMIT:g} and finite"
        )
    return value


def s3_config(limit: float | None = None, *, session: bool = True) -> dict:
    """botocore ``Config`` keywords (s3fs's ``config_kwargs``) that end an unanswered request within ``limit``.

    Connect and read timeouts of ``(limit - backoff) / 10`` (11.3 s at the default limit): s3fs tries a
    request that timed out 5 times, botocore twice in each.  The HTTP session (:class:`_BoundedSession`,
    where aiobotocore lets one be named) sends no ``Expect: 100-continue`` (aiohttp would wait for the
    answer to it forever, before its read timeout starts) and gives each attempt the two timeouts plus
    :data:`SECONDS_PER_MIB` per MiB of its body (an endpoint that stops reading an upload).
    ``session=False`` leaves the session out (and aiobotocore unimported).
    """
    limit = wait_limit() if limit is None else limit
    timeout = round((limit - _BACKOFF) / (_BOTOCORE_ATTEMPTS * _S3FS_TRIES), 3)
    config = {
        "connect_timeout": timeout,
        "read_timeout": timeout,
        "retries": {"mode": "standard", "total_max_attempts": _BOTOCORE_ATTEMPTS},
    }
    session = _session_class() if session else None
    if session is not None:
        config["http_session_cls"] = session
    return config


def _session_class():
    """:class:`_BoundedSession` where aiobotocore takes ``http_session_cls`` (2.15 on), else None."""
    try:
        import inspect

        from aiobotocore.config import AioConfig
    except ImportError:
        return None
    if "http_session_cls" not in inspect.signature(AioConfig.__init__).parameters:
        return None
    return _bounded_session()


_SESSION = None


def _bounded_session():
    """The class, made once (its base is imported only when an ``s3://`` URL is used)."""
    global _SESSION
    if _SESSION is None:
        from aiobotocore.httpsession import AIOHTTPSession
        from botocore.exceptions import ReadTimeoutError

        class _BoundedSession(AIOHTTPSession):
            """aiobotocore's aiohttp session with every attempt bounded (see :func:`s3_config`)."""

            async def send(self, request):
                if "Expect" in request.headers:  # aiohttp awaits "100 Continue" with no timeout at all
                    del request.headers["Expect"]
                timeout = getattr(self, "_timeout", None)
                seconds = (getattr(timeout, "sock_connect", None) or 0) + (getattr(timeout, "sock_read", None) or 0)
                if not seconds:
                    return await super().send(request)
                try:
                    size = int(request.headers.get("Content-Length") or 0)
                except ValueError:
                    size = 0
                seconds += SECONDS_PER_MIB * size / 2**20
                try:
                    return await asyncio.wait_for(super().send(request), seconds)
                except asyncio.TimeoutError as err:  # botocore's and s3fs's retries know this one
                    raise ReadTimeoutError(endpoint_url=request.url, error=err) from None

        _BoundedSession.__module__ = __name__
        _BoundedSession.__qualname__ = "_BoundedSession"
        _SESSION = _BoundedSession
    return _SESSION


def __getattr__(name: str):
    # pickle finds the session class by name (storage options travel to the workers with the tasks)
    if name == "_BoundedSession":
        return _bounded_session()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_timeout(err: BaseException) -> bool:
    """Whether ``err``, or an error it was raised from, is a timeout (Python's, asyncio's, fsspec's,
    botocore's ``ReadTimeoutError`` / ``ConnectTimeoutError``)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, (TimeoutError, asyncio.TimeoutError)) or type(err).__name__.endswith(
            ("TimeoutError", "Timeout")
        ):
            return True
        err = err.__cause__ or err.__context__
    return False


def fix_hint() -> str:
    """What to do about a wait that reached the limit, in words."""
    return f"{WAIT_LIMIT_ENV}=SECONDS waits longer (now {wait_limit():g} s)"
