"""The ``dask-mcpca`` command line (also ``python -m dask_mcpca``).

Subcommands::

    dask-mcpca fit   STORE [--dataset NAME] [--n-components K] [--solver auto|paper]
                     [--center robust|mean|none] [--nan-policy raise|omit|partial]
                     [--scheduler ADDRESS] [--output model.json] [--overwrite] [--no-progress]
    dask-mcpca update STORE --model model.json [--output new.json] [--dataset NAME]
                     [--scheduler ADDRESS] [--no-progress]
    dask-mcpca score STORE --model model.json --output scores.zarr [--dataset NAME]
                     [--overwrite | --append] [--scheduler ADDRESS] [--no-progress]
    dask-mcpca report STORE --model model.json --output report.png [--events events.csv] [--window 1D]
                     [--max-gap ROWS] [--scheduler ADDRESS] [--no-progress]
    dask-mcpca demo  [--rows N] [--out DIR] [--seed S] [--no-progress]

``fit``, ``update``, ``score`` and ``report`` also take ``--variables a,b,c`` (1-D
variables of an archive written by xarray, stacked as channels), ``--rows
START:STOP`` and ``--time START:STOP`` (rows by position or by the label of
the row coordinate) and ``--storage-option KEY=VALUE`` (fsspec options for a
URL such as ``s3://bucket/archive.zarr``; credentials otherwise come from the
environment, as fsspec's backends read them).

``STORE`` is a Zarr store (a directory or a URL) or an HDF5 file, opened read-only;
nothing is ever written into it.  ``fit`` writes the model as JSON
(:mod:`dask_mcpca._persist`); ``score`` writes a new Zarr group with the
per-row ``scores`` (projections on the components), ``weight``
(``score_samples``), ``outlier`` (``is_outlier``), ``d2`` and ``contributions``,
computed lazily block by block into a temporary that appears under
``--output`` only when complete: renamed into place on a local disk,
published root metadata last on an object store
(:func:`._atomic.atomic_url_store`).  ``update`` is :meth:`MCPCA.partial_fit`
on new rows (by default those after the rows the model has read, which
``fit`` and ``update`` record in the model as ``archive_rows_``), the model
file then replaced atomically.  ``score --append`` scores only the rows after
those already in ``--output`` and adds them in a new version of the store,
put in place as ``score`` puts a new one (:mod:`._append`).
``STORE``, ``--model`` and ``--output``
may be URLs; one ``--storage-option`` set serves them all.  ``--scheduler`` connects to
a running ``dask.distributed`` scheduler (its workers must see the same
paths); without it the local threaded scheduler is used.

Every failure (a missing store, a wrong dataset name, an unreachable
scheduler or one lost mid-fit, a bad parameter value, a damaged model file)
is reported as one line on stderr, with exit status 2; Ctrl-C exits 130.
Waiting for ``--scheduler`` is bounded by ``--connect-timeout``, the
handshake included: an address that accepts connections but is no Dask
scheduler (a dashboard port, an SSH server) fails within that time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import sys
import time

import numpy as np

from ._atomic import atomic_open, check_file_target, is_url, is_zarr_store, local_path, with_timeouts
from ._atomic import overlaps as _overlaps
from ._estimator import CENTERS, MCPCA, NAN_POLICIES, SOLVERS, check_params, load
from ._io import split_store_path
from ._version import __version__

__all__ = ["main"]

PROG = "dask-mcpca"
#: Rows of the summary table shown before it is cut short.
MAX_TABLE_ROWS = 20
#: Seconds to wait for a ``--scheduler`` before giving up.
DEFAULT_CONNECT_TIMEOUT = 10.0
#: Largest ``--connect-timeout`` accepted (seconds).
MAX_CONNECT_TIMEOUT = 3600.0
#: Seconds ``Client.close`` may take (the scheduler may be gone).
CLOSE_TIMEOUT = 5.0

#: The arrays ``score`` writes, and what each holds (also in the output's attributes).
SCORE_ARRAYS = {
    "scores": "projections (X - mean_) @ components_.T",
    "weight": "score_samples: correntropy weight in (0, 1]",
    "outlier": "is_outlier: d^2 above outlier_cutoff_, a repeated value (stuck sensor) or row (frozen logger)",
    "d2": "mahalanobis: squared robust distance (on the observed cells of a row with gaps)",
    "contributions": "channel_contributions: drop in d2 when the channel is reconstructed from the others",
    "n_observed": "n_observed: cells not NaN in the row (what d2 and the flag were judged on)",
    "top_channel": "index of the channel with the largest contribution (-1: none observed)",
}
#: ``score --outputs`` by a name: ``all`` (the default) and ``monitoring`` (what an alarm needs).
OUTPUT_SETS = {
    "all": ("scores", "weight", "outlier", "d2", "contributions", "n_observed"),
    "monitoring": ("d2", "outlier", "top_channel"),
}

#: ``--center`` choices: the estimator's, with ``none`` for ``center=False``.
_CENTERS = {("none" if c is False else c): c for c in CENTERS}


class _UsageError(Exception):
    """A command-line usage error, reported in one line."""


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (usage is on ``--help``)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _int_at_least(low: int):
    """An argparse type: a whole number >= ``low`` (``1_000_000`` allowed)."""

    def parse(text: str) -> int:
        try:
            value = int(text.replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {low}, got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _name_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected names separated by commas, got {text!r}")
    return names


def _row_slice(text: str) -> slice:
    """``START:STOP`` by position (either may be empty)."""
    start, sep, stop = text.partition(":")
    try:
        if not sep:
            raise ValueError
        rows = slice(int(start) if start.strip() else None, int(stop) if stop.strip() else None)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected START:STOP (whole numbers, either may be empty), got {text!r}"
        ) from None
    if rows.start is not None and rows.stop is not None and (rows.start < 0) == (rows.stop < 0) and (
        rows.start >= rows.stop
    ):
        raise argparse.ArgumentTypeError(f"START must be below STOP, got {text!r}, which selects no rows")
    return rows


def _label_slice(text: str) -> slice:
    """``START:STOP`` by label (times such as ``2024-01-01T00:00:2024-02-01``: split at ``/`` if given)."""
    sep = "/" if "/" in text else ":"
    if sep == ":" and text.count(":") != 1:
        raise argparse.ArgumentTypeError(f"write times with colons as START/STOP, got {text!r}")
    start, _, stop = text.partition(sep)
    return slice(start.strip() or None, stop.strip() or None)


def _output_names(text: str) -> tuple[str, ...]:
    """``--outputs``: ``all``, ``monitoring`` or names of :data:`SCORE_ARRAYS` separated by commas."""
    if text.strip() in OUTPUT_SETS:
        return OUTPUT_SETS[text.strip()]
    names = _name_list(text)
    unknown = [n for n in names if n not in SCORE_ARRAYS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown output(s) {', '.join(unknown)}; expected {' or '.join(OUTPUT_SETS)}, or names from "
            f"{','.join(SCORE_ARRAYS)}"
        )
    return tuple(dict.fromkeys(names))


def _key_value(text: str) -> tuple[str, object]:
    import json

    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not all(part.strip() for part in key.split(".")):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (KEY dotted names, as config_kwargs.read_timeout), "
                                         f"got {text!r}")
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    return key.strip(), parsed


def _storage_options(pairs: list[tuple[str, object]]) -> dict | None:
    """``[("a.b", 1)]`` -> ``{"a": {"b": 1}}`` (dotted keys nest, as ``client_kwargs.region_name``)."""
    options: dict = {}
    for key, value in pairs:
        *parents, last = (part.strip() for part in key.split("."))
        node = options
        for i, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise _UsageError(f"--storage-option {key}=...: {'.'.join(parents[: i + 1])} was given a value "
                                  "of its own; it cannot also hold keys")
        if isinstance(node.get(last), dict):
            raise _UsageError(f"--storage-option {key}=...: {key} holds keys given by other --storage-option")
        node[last] = value
    return options or None


def _connect_timeout(text: str) -> float:
    value = _positive_float(text)
    if not value <= MAX_CONNECT_TIMEOUT:  # also refuses inf
        raise argparse.ArgumentTypeError(f"expected a number of seconds in (0, {MAX_CONNECT_TIMEOUT:g}], got {text!r}")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Robust PCA (maximum correntropy power iterations) of Zarr / HDF5 archives.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{fit,update,score,report,demo}", parser_class=_Parser
    )

    def scheduler_options(p):
        p.add_argument(
            "--scheduler", metavar="ADDRESS", help="address of a dask.distributed scheduler (tcp://host:8786)"
        )
        p.add_argument(
            "--connect-timeout",
            type=_connect_timeout,
            default=DEFAULT_CONNECT_TIMEOUT,
            metavar="SECONDS",
            help=f"how long to try to reach --scheduler (default {DEFAULT_CONNECT_TIMEOUT:g})",
        )

    def data_options(p):
        p.add_argument(
            "--variables",
            type=_name_list,
            metavar="A,B,C",
            help="1-D variables of an xarray archive to use as the channels (default: all, or its 2-D variable)",
        )
        p.add_argument("--rows", type=_row_slice, metavar="START:STOP", help="rows to use, by position")
        p.add_argument(
            "--time", type=_label_slice, metavar="START:STOP", help="rows to use, by the row coordinate (xarray)"
        )
        p.add_argument(
            "--storage-option",
            dest="storage_options",
            type=_key_value,
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="fsspec option for the command's URLs: store, model, outputs "
            "(repeatable; VALUE read as JSON when it parses)",
        )

    fit = sub.add_parser("fit", help="fit a model to a Zarr store or HDF5 file and save it")
    fit.add_argument("store", metavar="STORE", help="Zarr store or HDF5 file (file.h5 or file.h5:/dataset)")
    fit.add_argument("--dataset", metavar="NAME", help="array inside the store (needed when it holds several)")
    data_options(fit)
    fit.add_argument("--n-components", type=_positive_int, metavar="K", help="components to keep (default: all)")
    fit.add_argument("--solver", choices=SOLVERS, default="auto")
    fit.add_argument("--center", choices=tuple(_CENTERS), default="robust")
    fit.add_argument("--nan-policy", choices=NAN_POLICIES, default="raise")
    fit.add_argument("--output", "-o", default="model.json", metavar="PATH", help="model file (default model.json)")
    fit.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    fit.add_argument("--no-progress", action="store_true", help="do not draw a progress line per pass")
    scheduler_options(fit)
    fit.set_defaults(func=_cmd_fit)

    update = sub.add_parser(
        "update",
        help="update a model with new rows (partial_fit: one pass over them) and replace the model file atomically",
        description="Update a model with new rows of STORE (MCPCA.partial_fit: one pass over the new rows, each "
        "weighted under the current model) and replace the model file atomically; a failed update leaves it "
        "as it was.  Without --rows or --time the new rows are those after the last row the model has read "
        "from STORE (recorded by 'fit' and 'update'); with them, rows the model has already read are refused "
        "(they would be counted twice).  The model keeps its outlier cutoff; a change of regime is not "
        "followed (it warns): refit then.",
    )
    update.add_argument("store", metavar="STORE", help="Zarr store or HDF5 file holding the new rows")
    update.add_argument("--model", "-m", required=True, metavar="PATH", help="model file (path or URL) to update")
    update.add_argument(
        "--output", "-o", metavar="PATH", help="write the updated model here (default: replace --model)"
    )
    update.add_argument("--dataset", metavar="NAME", help="array inside the store")
    update.add_argument("--no-progress", action="store_true", help="do not draw a progress line")
    data_options(update)
    scheduler_options(update)
    update.set_defaults(func=_cmd_update)

    score = sub.add_parser("score", help="write per-row scores, weights and outlier flags to a new Zarr store")
    score.add_argument("store", metavar="STORE", help="Zarr store or HDF5 file")
    score.add_argument("--model", "-m", required=True, metavar="PATH", help="model file (path or URL) written by 'fit'")
    score.add_argument("--output", "-o", required=True, metavar="PATH", help="new Zarr store (path or URL) to create")
    score.add_argument("--dataset", metavar="NAME", help="array inside the store")
    score.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    score.add_argument(
        "--append", action="store_true",
        help="score only the rows after those already in --output and add them (the store is put in place whole "
        "again; created when missing); --output must have been scored from the same STORE with the same model "
        "file, and takes no --rows or --time",
    )
    score.add_argument(
        "--outputs", type=_output_names, metavar="NAMES",
        help="what to write: 'all' (default: scores, weight, outlier, d2, contributions, n_observed), "
        "'monitoring' (d2, outlier, top_channel), or names separated by commas from "
        f"{', '.join(SCORE_ARRAYS)}; all are computed from one read of each block.  Bytes per row, "
        "float64: scores 8 k, weight, d2 8, outlier 1, contributions 8 p, n_observed, top_channel 2 "
        "(k components, p channels); --dtype float32 halves the floats' share",
    )
    score.add_argument(
        "--dtype", choices=("float64", "float32"), metavar="{float64,float32}",
        help="of the float outputs (default float64); float32 keeps 7 significant digits, enough to rank "
        "and threshold rows (the outlier flag is decided in float64 either way)",
    )
    score.add_argument("--no-progress", action="store_true", help="do not draw a progress bar")
    data_options(score)
    scheduler_options(score)
    score.set_defaults(func=_cmd_score)

    report = sub.add_parser(
        "report", help="a PNG report and an events CSV for a fitted archive (one streaming pass, no truth needed)"
    )
    report.add_argument("store", metavar="STORE", help="Zarr store or HDF5 file")
    report.add_argument(
        "--model", "-m", required=True, metavar="PATH", help="model file (path or URL) written by 'fit'"
    )
    report.add_argument("--output", "-o", default="report.png", metavar="PATH", help="PNG (default report.png)")
    report.add_argument("--events", metavar="PATH", help="events CSV (default: the PNG's name with .csv)")
    report.add_argument("--dataset", metavar="NAME", help="array inside the store")
    report.add_argument(
        "--max-gap", type=_non_negative_int, default=0, metavar="ROWS",
        help="flagged runs at most this many rows apart are one event (default 0)",
    )
    report.add_argument(
        "--window", metavar="W",
        help="drift windows: a duration of the time coordinate (1D, 6h) or a row count; writes windows.csv",
    )
    report.add_argument("--windows", metavar="PATH", help="windows CSV (default: the PNG's name with _windows.csv)")
    report.add_argument("--no-progress", action="store_true", help="do not draw a progress bar")
    data_options(report)
    scheduler_options(report)
    report.set_defaults(func=_cmd_report)

    demo = sub.add_parser(
        "demo", help="synthetic sensor archive with faults: MCPCA vs PCA, printed and as a PNG report"
    )
    demo.add_argument("--rows", type=_positive_int, default=1_000_000, metavar="N", help="rows (default 1_000_000)")
    demo.add_argument("--out", default="mcpca-demo", metavar="DIR", help="output folder (default ./mcpca-demo)")
    demo.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the generator (default 0)")
    demo.add_argument("--no-progress", action="store_true", help="do not draw a progress line per pass")
    demo.set_defaults(func=_cmd_demo, scheduler=None)
    return parser


# ---------------------------------------------------------------- helpers
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


def _one_line(err: BaseException) -> str:
    text = err.args[0] if isinstance(err, KeyError) and len(err.args) == 1 else str(err)
    text = " ".join(str(text).split())
    return text or type(err).__name__


def _store_root(store: str) -> str:
    """The file or directory of ``STORE`` (``file.h5:/data`` -> ``file.h5``)."""
    return split_store_path(store)[0]


def _refuse_inside_input(output: str, store: str, what: str) -> None:
    """Refuse an output inside the input store, or one that holds it (replacing that output would
    delete the store), for paths and URLs alike (an input store is never written to)."""
    root = _store_root(store)
    if _overlaps(output, root):
        raise _UsageError(f"{what} {output!r} would overlap the input store {root!r}; choose another path")


def _check_output_location(output: str, *, is_file: bool) -> None:
    """Refuse, before any work, an output that could not be written (read-only, not a folder)."""
    if is_url(output):  # the object store says so when it is written, except for a key it cannot hold
        key = output.split("://", 1)[1].rstrip("/")
        if "" in key.split("/"):
            raise _UsageError(f"--output {output!r} has an empty path segment ('//'), which an object store "
                              "cannot hold; write each '/' once")
        return
    path = os.path.abspath(output)
    if is_file and os.path.isdir(path):
        raise _UsageError(f"--output {output!r} is a directory; name a file")
    if is_file:
        try:
            check_file_target(path)  # a device node, a FIFO, a socket: never replaced by a file
        except OSError as err:
            raise _UsageError(f"--output {output!r}: {_one_line(err)}") from None
    parent = os.path.dirname(path)
    while not os.path.lexists(parent):  # atomic_path creates the missing folders
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise _UsageError(f"--output {output!r} cannot be created: {parent!r} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _UsageError(f"--output {output!r} cannot be created: directory {parent!r} is not writable")


def _open(args, **options):
    """The archive named on the command line: a DataArray for an xarray store, else a dask array.

    ``options`` go to :func:`open_archive` (``block_values``, ``row_index``).
    """
    from ._io import SelectionError, open_archive

    try:
        return open_archive(
            args.store,
            dataset=args.dataset,
            variables=args.variables,
            rows=args.rows,
            time=args.time,
            storage_options=_storage_options(args.storage_options),
            **options,
        )
    except SelectionError as err:
        named = " with ".join(f"--{o} {_slice_text(getattr(args, o), o)}" for o in err.options)
        reason = _one_line(ValueError(err.reason))
        raise _UsageError(f"{named} {reason}" if reason.startswith("select") else f"{named}: {reason}") from None


def _slice_text(s: slice, option: str = "rows") -> str:
    """``slice(5, 2)`` as the user wrote it: ``5:2`` (times holding colons as ``START/STOP``)."""
    start, stop = ("" if v is None else str(v) for v in (s.start, s.stop))
    sep = "/" if option == "time" and ":" in start + stop else ":"
    return f"{start}{sep}{stop}"


def _fmt_seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def _describe(X) -> str:
    n, p = X.shape
    blocks = len(X.chunks[0]) if hasattr(X, "chunks") and X.chunks else 1
    return f"{n:,} rows x {p} features, {X.dtype}, {blocks} block{'s' * (blocks != 1)}"


def summary_table(model) -> str:
    """The per-component table printed by ``fit``."""
    lines = [f"{'component':>9}  {'variance':>12}  {'ratio':>7}  {'cumulative':>10}  {'kernel size':>11}"]
    cum = 0.0
    k = len(model.explained_variance_)
    for i in range(min(k, MAX_TABLE_ROWS)):
        ratio = model.explained_variance_ratio_[i]
        cum += ratio
        lines.append(
            f"{i + 1:>9}  {model.explained_variance_[i]:>12.6g}  {ratio:>7.2%}  {cum:>10.2%}  {model.sigmas_[i]:>11.4g}"
        )
    if k > MAX_TABLE_ROWS:
        lines.append(f"{'...':>9}  ({k - MAX_TABLE_ROWS} more components in the model file)")
    return "\n".join(lines)


# --------------------------------------------------------------- commands
def _cmd_fit(args, out) -> int:
    _refuse_inside_input(args.output, args.store, "--output")
    _check_output_location(args.output, is_file=True)
    if not args.overwrite and _exists(args.output, _storage_options(args.storage_options)):
        raise _UsageError(f"--output {args.output!r} exists; pass --overwrite to replace it")
    model = MCPCA(
        args.n_components,
        solver=args.solver,
        center=_CENTERS[args.center],
        nan_policy=args.nan_policy,
        progress=not args.no_progress,
    )
    check_params(model)
    X = _open(args, row_index=False)  # a fit never uses the time index (built anyway for --time)
    print(f"fitting {args.store}: {_describe(X)}", file=out, flush=True)
    started = time.perf_counter()
    model.fit(X)
    elapsed = time.perf_counter() - started
    _record_span(model, _archive_span(args, X))
    model.save(args.output, storage_options=_storage_options(args.storage_options))
    used = f"{model.n_samples_:,}" + (f" of {X.shape[0]:,}" if model.n_samples_ != X.shape[0] else "")
    print(f"\nMCPCA(solver={args.solver!r}, center={args.center!r}): robust explained variance", file=out)
    print(summary_table(model), file=out)
    print(
        f"\npasses {model.n_passes_}   rows {used}   time {_fmt_seconds(elapsed)}   "
        f"converged {'yes' if model.converged_ else 'no'}",
        file=out,
    )
    print(f"model written to {args.output}", file=out)
    return 0


def _archive_span(args, X) -> tuple[int, int] | None:
    """``[start, stop)``: the positions in the whole archive of the rows ``X`` selected by ``--rows``
    and ``--time``; None when they are not one run of rows (``--time`` on a row coordinate with
    repeated labels)."""
    n = X.shape[0]
    if args.rows is None and args.time is None:
        return 0, n
    whole = _open(argparse.Namespace(**{**vars(args), "rows": None, "time": None}), row_index=args.time is not None)
    if args.time is None:
        start, stop, _ = args.rows.indices(whole.shape[0])
        return (start, stop) if stop - start == n else None
    row = X.dims[0]
    index = whole.indexes[row]
    try:
        start = index.get_loc(X.indexes[row][0])
        stop = index.get_loc(X.indexes[row][-1])
    except KeyError:
        return None
    if not (isinstance(start, int) and isinstance(stop, int)) or stop + 1 - start != n:
        return None  # a repeated label (get_loc gives a slice or a mask): positions are not known
    return start, stop + 1


def _record_span(model, span: tuple[int, int] | None) -> None:
    """Record in ``model`` the archive rows it has read (``archive_rows_``; see :class:`MCPCA`)."""
    if span is not None:
        model.archive_rows_ = np.array(span, dtype=np.int64)


def _model_span(model, model_path: str) -> tuple[int, int] | None:
    """The ``archive_rows_`` a model file records, checked; None when it records none."""
    span = getattr(model, "archive_rows_", None)
    if span is None:
        return None
    if not (isinstance(span, np.ndarray) and span.shape == (2,) and span.dtype.kind in "iu"
            and 0 <= span[0] < span[1]):
        raise _UsageError(f"--model {model_path!r}: archive_rows_ must be two whole numbers 0 <= start < stop, "
                          f"got {span!r}")
    return int(span[0]), int(span[1])


def _cmd_update(args, out) -> int:
    options = _storage_options(args.storage_options)
    output = args.output or args.model
    _refuse_inside_input(output, args.store, "--output" if args.output else "--model")
    _check_output_location(output, is_file=True)
    model = load(args.model, storage_options=options)
    model.set_params(progress=not args.no_progress)
    seen = _model_span(model, args.model)
    if args.rows is None and args.time is None:
        if seen is None:
            raise _UsageError(
                f"--model {args.model!r} does not record which rows of the archive it has read (it was not "
                "written by 'dask-mcpca fit' or 'update'); name the new rows with --rows START:STOP or "
                "--time START:STOP"
            )
        n_all = _open(args, row_index=False).shape[0]
        if n_all < seen[1]:
            raise _UsageError(
                f"{args.store!r} has {n_all:,} rows, fewer than the {seen[1]:,} the model has read "
                f"(rows {seen[0]:,}:{seen[1]:,}): is it the archive the model was fitted on? Name the new rows "
                "with --rows"
            )
        if n_all == seen[1]:
            print(f"no new rows: the model has read rows {seen[0]:,}:{seen[1]:,} of the {n_all:,} in {args.store}; "
                  f"{args.model} left as it is", file=out)
            return 0
        args.rows = slice(seen[1], None)
    X = _open(args, row_index=args.time is not None)
    span = _archive_span(args, X)
    if seen is not None and span is not None and span[0] < seen[1] and seen[0] < span[1]:
        chosen = " with ".join(f"--{o} {_slice_text(getattr(args, o), o)}" for o in ("rows", "time")
                               if getattr(args, o) is not None)
        raise _UsageError(
            f"{chosen} selects rows {span[0]:,}:{span[1]:,}, which overlap rows {seen[0]:,}:{seen[1]:,} the model "
            "has already read (they would be counted twice); select rows it has not read"
        )
    where = f"rows {span[0]:,}:{span[1]:,}" if span is not None else "the rows selected"
    print(f"updating {args.model} with {where} of {args.store}: {_describe(X)}", file=out, flush=True)
    started = time.perf_counter()
    model.partial_fit(X)
    elapsed = time.perf_counter() - started
    if span is not None:
        _record_span(model, span if seen is None else (min(seen[0], span[0]), max(seen[1], span[1])))
    model.save(output, storage_options=options)
    recorded = getattr(model, "archive_rows_", None)
    print(
        f"read {model.n_samples_:,} new rows in {model.n_passes_} pass ({_fmt_seconds(elapsed)}); the model's sums "
        f"now hold {model.n_samples_seen_:,} rows"
        + (f", archive rows {recorded[0]:,}:{recorded[1]:,}" if recorded is not None else "")
        + f"\nmodel written to {output}",
        file=out,
    )
    return 0


def _cmd_score(args, out) -> int:
    import dask.array as da
    import zarr

    from . import _append

    _refuse_inside_input(args.output, args.store, "--output")
    if _overlaps(args.model, args.output):
        raise _UsageError(f"--output {args.output!r} would overwrite the model {args.model!r} being read")
    _check_output_location(args.output, is_file=False)
    options = _storage_options(args.storage_options)
    if args.append:
        if args.overwrite:
            raise _UsageError("--append adds rows to --output and --overwrite replaces it; pass one of them")
        for option in ("rows", "time"):
            if getattr(args, option) is not None:
                raise _UsageError(f"--append scores the rows after those in --output; it takes no --{option}")
        if _exists(args.output, options):
            return _score_append(args, out, options)
    if _exists(args.output, options):
        if not args.overwrite:
            raise _UsageError(f"output {args.output!r} exists; pass --overwrite to replace it")
        _refuse_replacing_other_data(args.output, options)
    model = load(args.model, storage_options=options)
    X = _open(args)
    started = time.perf_counter()
    names, dtype = args.outputs or OUTPUT_SETS["all"], args.dtype or "float64"
    outputs = _score_outputs(model, X, names, dtype)
    span = _archive_span(args, X)
    attrs = {
        "model": args.model if is_url(args.model) else os.path.abspath(args.model),
        "created_by": f"{PROG} score",
        "arrays": {name: SCORE_ARRAYS[name] for name in names},
        "outputs": list(names),
        "dtype": dtype,
    }
    if span is not None:  # what --append checks and goes on from
        attrs.update(_append.provenance(**_score_source(args, model, options), rows=span))
    else:
        attrs.update({k: v for k, v in _score_source(args, model, options).items() if k != "digest"})
    with _output_store(args.output, options, overwrite=args.overwrite) as tmp:
        so = {"storage_options": with_timeouts(tmp, options)} if is_url(tmp) else {}
        if isinstance(next(iter(outputs.values())), da.Array):
            root = zarr.open_group(tmp, mode="w", **so)
            root.attrs.update(attrs)
            writes = [da.to_zarr(a, tmp, component=name, compute=False, **so) for name, a in outputs.items()]
        else:  # DataArrays: written by xarray, with their dims and coordinates
            import xarray as xr

            ds = xr.Dataset(outputs, attrs={k: v for k, v in attrs.items() if v is not None})
            for name in names:
                ds[name].attrs["description"] = SCORE_ARRAYS[name]
            writes = [ds.to_zarr(tmp, mode="w", compute=False, consolidated=True, **so)]
        _compute_settled(*writes, progress=not args.no_progress)
        n_out = int(da.from_zarr(tmp, component="outlier", **so).sum().compute()) if "outlier" in names else None
    elapsed = time.perf_counter() - started
    n = X.shape[0]
    shapes = {"scores": f" ({n:,} x {model.n_components_})", "contributions": f" ({n:,} x {model.n_features_in_})"}
    flagged = f": {n_out:,} outliers ({n_out / n:.2%})" if n_out is not None else ""
    print(
        f"scored {n:,} rows in {_fmt_seconds(elapsed)}{flagged}\n"
        f"written to {args.output}: " + ", ".join(f"{name}{shapes.get(name, f' ({n:,})')}" for name in names)
        + (" in float32" if dtype == "float32" else ""),
        file=out,
    )
    return 0


def _score_outputs(model, X, names: tuple[str, ...], dtype: str) -> dict:
    """The lazy per-row outputs ``names`` that ``score`` writes (see :data:`SCORE_ARRAYS`), float ones in ``dtype``:
    one function per row block makes them all (:meth:`MCPCA.score_rows`)."""
    outputs = model.score_rows(X, outputs=names)
    if dtype != "float64":
        outputs = {n: a.astype(dtype) if a.dtype.kind == "f" else a for n, a in outputs.items()}
    return outputs


def _score_source(args, model, options) -> dict:
    """What a score store is scored from (its input and model), as :func:`._append.provenance` takes it."""
    from . import _append

    return {
        "source": args.store if "://" in args.store else os.path.abspath(_store_root(args.store)),
        "dataset": args.dataset,
        "variables": args.variables,
        "n_features": model.n_features_in_,
        "digest": _append.model_digest(args.model, options),
    }


def _score_append(args, out, options) -> int:
    """``score --append`` to an existing ``--output``: the rows after those it holds, in a new version of it."""
    import dask.array as da
    import zarr

    from . import _append
    from ._atomic import atomic_path

    output = local_path(args.output)
    if output is None:
        raise _UsageError(f"--append needs --output on a local disk (or a file:// URL), not {args.output!r}: an "
                          "object store cannot put a new version of a store in place without copying it whole")
    if not is_zarr_store(output):
        raise _UsageError(f"--output {args.output!r} exists and is not a Zarr store; --append adds rows only to "
                          "a store written by score")
    model = load(args.model, storage_options=options)
    source = _score_source(args, model, options)
    attrs = dict(zarr.open_group(output, mode="r").attrs)
    try:
        start, stop = _append.check_appendable(attrs, _append.provenance(**source, rows=(0, 0)), args.output)
    except _append.AppendError as err:
        raise _UsageError(str(err)) from None
    whole = _open(args)
    n_all = whole.shape[0]
    if n_all < stop:
        raise _UsageError(f"{args.store!r} has {n_all:,} rows, fewer than the {stop:,} already scored in --output "
                          f"{args.output!r} (rows {start:,}:{stop:,}): is it the archive they were scored from?")
    if n_all == stop:
        print(f"nothing to append: --output {args.output} holds rows {start:,}:{stop:,}, the last of the "
              f"{n_all:,} in {args.store}", file=out)
        return 0
    X = whole[stop:] if isinstance(whole, da.Array) else whole.isel({whole.dims[0]: slice(stop, None)})
    n_old, n_new = stop - start, X.shape[0]
    names, dtype = tuple(attrs.get("outputs", OUTPUT_SETS["all"])), attrs.get("dtype", "float64")
    if args.outputs is not None and tuple(args.outputs) != names:
        raise _UsageError(f"--outputs differs from what --output {args.output!r} holds ({','.join(names)}); "
                          "leave it out with --append")
    if args.dtype is not None and args.dtype != dtype:
        raise _UsageError(f"--dtype {args.dtype} differs from what --output {args.output!r} holds ({dtype}); "
                          "leave it out with --append")
    old = zarr.open_group(output, mode="r")
    if not set(names) <= set(SCORE_ARRAYS) or not set(names) <= set(old.array_keys()):
        raise _UsageError(f"--output {args.output!r} does not hold the arrays its attributes name "
                          f"({', '.join(map(str, names))}); score it again with --overwrite")
    started = time.perf_counter()
    outputs = _score_outputs(model, X, names, dtype)
    labelled = not isinstance(next(iter(outputs.values())), da.Array)
    row_dim = next(iter(outputs.values())).dims[0] if labelled else None
    row_arrays = [name for name, arr in old.arrays() if arr.shape and arr.shape[0] == n_old and (
        not labelled or (getattr(arr.metadata, "dimension_names", None) or arr.attrs.get("_ARRAY_DIMENSIONS")
                         or [None])[0] == row_dim)]
    with atomic_path(output, replace=is_zarr_store) as tmp:
        _append.clone_for_append(output, tmp, n_old, row_arrays)
        if labelled:
            import xarray as xr

            chunk = old[names[0]].chunks[0]
            ds = xr.Dataset(outputs, attrs=attrs)  # the group's attributes are rewritten by an append
            for name in names:
                ds[name].attrs["description"] = SCORE_ARRAYS[name]
            ds = ds.chunk({row_dim: _append.aligned_chunks(n_old, n_new, chunk)})
            writes = [ds.to_zarr(tmp, append_dim=row_dim, compute=False, consolidated=True)]
        else:
            writes = []
            for name, arr in outputs.items():
                z = zarr.open_array(tmp, path=name, mode="r+")
                z.resize((n_old + n_new, *z.shape[1:]))
                arr = arr.rechunk({0: _append.aligned_chunks(n_old, n_new, z.chunks[0])})
                region = (slice(n_old, n_old + n_new),) + (slice(None),) * (arr.ndim - 1)
                writes.append(arr.store(z, regions=[region], lock=False, compute=False))
        flags = outputs.get("outlier")
        counted = [(flags.data if labelled else flags).sum()] if flags is not None else []  # the blocks written
        results = _compute_settled(*writes, *counted, progress=not args.no_progress)
        n_out = int(results[-1]) if counted else None
        group = zarr.open_group(tmp, mode="r+")
        group.attrs.update({_append.ROWS_ATTR: [start, n_all], "complete": True})
        if labelled:
            zarr.consolidate_metadata(tmp)
    elapsed = time.perf_counter() - started
    flagged = f": {n_out:,} outliers ({n_out / n_new:.2%})" if n_out is not None else ""
    print(
        f"scored {n_new:,} new rows ({stop:,}:{n_all:,}) in {_fmt_seconds(elapsed)}{flagged}\n"
        f"appended to {args.output}, which now holds rows {start:,}:{n_all:,}",
        file=out,
    )
    return 0


def _compute_settled(*collections, progress: bool):
    """Compute ``collections``; on a failure, return only once no local task still runs.

    When one task fails, dask's threaded scheduler raises while the tasks
    already running go on and write their chunks; the temporary output
    deleted on the way out would get them after it was deleted.  So the
    local threads are a pool of this call's own, shut down (the running
    tasks waited for, the queued ones cancelled) before the error goes on.
    On a distributed scheduler the workers' running tasks cannot be waited
    for: a few chunks may land in the temporary after it is deleted, and the
    next write of the same output from this host deletes them.
    """
    from concurrent.futures import ThreadPoolExecutor

    import dask
    import dask.threaded

    from ._passes import single_threaded_blas
    from ._progress import _active_client, compute_with_progress

    if _active_client() is not None:
        return compute_with_progress(*collections, enabled=progress)
    executor = getattr(dask.threaded, "ContextAwareThreadPoolExecutor", ThreadPoolExecutor)  # dask's own kind
    pool = executor(int(dask.config.get("num_workers", None) or os.cpu_count() or 1))
    try:
        # one task per core already: nested BLAS threads slow each block's products (see single_threaded_blas)
        with dask.config.set(pool=pool), single_threaded_blas():
            return compute_with_progress(*collections, enabled=progress)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _refuse_replacing_other_data(path: str, options: dict | None = None) -> None:
    """``--overwrite`` replaces a Zarr store, never another directory, file or prefix:
    ``--output ~/projects --overwrite`` would otherwise delete the folder, and
    ``--output s3://bucket/projects --overwrite`` every object under it.

    A local store is a folder with root Zarr metadata that parses (:func:`._atomic.is_zarr_store`);
    on an object store, a prefix with root metadata or an interrupted publication, recognised by
    its own marker (:data:`._atomic.PUBLISHING_MARKER`), not by missing metadata.  Checked again
    when the new store is put in place (:func:`_output_store`).
    """
    from ._atomic import url_store_state, url_to_fs

    local = local_path(path)
    if local is None:
        fs, root = url_to_fs(path, options)
        if url_store_state(fs, root) in ("zarr", "interrupted", "absent"):
            return
    elif is_zarr_store(local):
        return
    raise _UsageError(
        f"--output {path!r} exists and is not a Zarr store; --overwrite replaces only a Zarr store "
        "(remove it yourself if you mean to replace it)"
    )


def _exists(path: str, options: dict | None) -> bool:
    from ._atomic import local_path, url_to_fs

    local = local_path(path)
    if local is not None:
        return os.path.lexists(local)
    fs, root = url_to_fs(path, options)
    fs.invalidate_cache(root)
    return fs.exists(root)


@contextlib.contextmanager
def _output_store(path: str, options: dict | None, *, overwrite: bool = False):
    """Where ``score`` writes: a temporary that appears under ``path`` only when complete.

    A local path (or ``file://`` URL) is a temporary sibling renamed into
    place (:func:`._atomic.atomic_path`); an object store URL a hidden
    sibling prefix published by copies inside the store, root metadata last
    (:func:`._atomic.atomic_url_store`, which says what a reader may see
    after an interruption).  The group attribute ``complete: true`` is set
    in the temporary once every array is written.  What is at ``path`` when
    the store is put in place is replaced only with ``overwrite`` and only if
    it is a Zarr store (on an object store, also an interrupted publication).
    """
    import zarr

    from ._atomic import atomic_path, atomic_url_store, local_path

    def replaceable(existing: str) -> bool:
        return overwrite and is_zarr_store(existing)

    local = local_path(path)
    with atomic_path(local, replace=replaceable) if local is not None else atomic_url_store(
        path, storage_options=options, overwrite=overwrite
    ) as tmp:
        yield tmp
        so = {"storage_options": with_timeouts(tmp, options)} if is_url(tmp) else {}
        zarr.open_group(tmp, mode="r+", **so).attrs["complete"] = True


def _cmd_report(args, out) -> int:
    from . import _report

    events = args.events or os.path.splitext(args.output)[0] + ".csv"
    if _overlaps(args.output, events):
        raise _UsageError(
            f"--output {args.output!r} and the events file {events!r} are one file; name the events with --events"
        )
    outputs = [(args.output, "--output"), (events, "--events")]
    window = None
    if args.window is not None:
        try:
            window = _report.parse_window(args.window)
        except ValueError as err:
            raise _UsageError(str(err)) from None
        windows = args.windows or os.path.splitext(args.output)[0] + "_windows.csv"
        if any(_overlaps(windows, path) for path, _ in outputs):
            raise _UsageError(f"--windows {windows!r} is the PNG or the events file; name another")
        outputs.append((windows, "--windows"))
    elif args.windows is not None:
        raise _UsageError("--windows needs --window (the drift windows to write)")
    for path, what in outputs:
        _refuse_inside_input(path, args.store, what)
        if _overlaps(path, args.model):
            raise _UsageError(f"{what} {path!r} would overwrite the model {args.model!r} being read")
        _check_output_location(path, is_file=True)
    options = _storage_options(args.storage_options)
    _report.return_large_frees_to_os()  # memory flat in the rows: see its docstring
    model = load(args.model, storage_options=options)
    # blocks of about _report.BLOCK_VALUES values, and the time coordinate read with its rows (no index in memory)
    X = _open(args, block_values=_report.BLOCK_VALUES, row_index=False)
    print(f"report on {args.store}: {_describe(X)}", file=out, flush=True)
    started = time.perf_counter()
    with atomic_open(events, "w", storage_options=options, newline="") as f:  # written as the pass goes
        summary = _report.summarize(
            model, X, max_gap=args.max_gap, progress=not args.no_progress, events=f, window=window
        )
    if window is not None:
        with atomic_open(windows, "w", storage_options=options, newline="") as f:
            _report.write_windows(summary.windows, f)
    title = args.store.rstrip("/").rpartition("/")[2] if is_url(args.store) else os.path.basename(
        os.path.normpath(_store_root(args.store))
    )
    from ._report_plot import plot  # matplotlib is imported only there

    plot(summary, args.output, title=title, storage_options=options)
    share = summary.n_flagged / max(summary.n_scored, 1)
    print(
        f"{summary.n_rows:,} rows in {_fmt_seconds(time.perf_counter() - started)}: {summary.n_flagged:,} flagged "
        f"({share:.2%}) in {summary.n_events:,} events\nreport written to {args.output}, events to {events}",
        file=out,
    )
    if window is not None:
        n_drift = int(summary.windows["drift"].sum()) if len(summary.windows["drift"]) else 0
        print(f"{len(summary.windows['drift']):,} windows of {args.window}, {n_drift:,} above the drift threshold: "
              f"{windows}", file=out)
    return 0


def _cmd_demo(args, out) -> int:
    from .demo import run_demo
    from .demo.run import MARKER

    # The demo writes only into a folder it makes: a new or empty one, or one it marked before.
    if os.path.lexists(args.out):
        if not os.path.isdir(args.out):
            raise _UsageError(f"--out {args.out!r} exists and is not a folder; name a new or empty folder")
        entries = sorted(os.listdir(args.out))
        if entries and not os.path.isfile(os.path.join(args.out, MARKER)):
            shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
            raise _UsageError(
                f"--out {args.out!r} is a folder the demo did not make: it holds {shown}, which the demo did not "
                "write; name a new or empty folder"
            )
    run_demo(rows=args.rows, out=args.out, seed=args.seed, progress=not args.no_progress, stream=out)
    return 0


# ------------------------------------------------------------------ main
def _say(line: str) -> None:
    """Write one line on stderr; with stderr closed, say nothing rather than fail."""
    try:
        sys.stdout.flush()
    except (AttributeError, OSError, ValueError):
        pass
    try:
        print(line, file=sys.stderr, flush=True)
    except (AttributeError, OSError, ValueError):
        pass


#: Parameters as the command line spells them: ``nan_policy='omit'`` in an error is ``--nan-policy omit``.
_OPTION_SPELLING = {
    "n_components": "--n-components",
    "nan_policy": "--nan-policy",
    "solver": "--solver",
    "center": "--center",
    "dataset": "--dataset",
    "variables": "--variables",
}
_PARAMETER = re.compile(r"\b(" + "|".join(_OPTION_SPELLING) + r")=('[^']*'|\"[^\"]*\"|[^\s,;)]+)")


def _user_spelling(text: str) -> str:
    """``text`` with the estimator's parameters written as the options the user typed."""

    def option(match: re.Match) -> str:
        name, value = match.group(1), match.group(2).strip("'\"")
        if name == "center" and value == "False":
            value = "none"
        return f"{_OPTION_SPELLING[name]} {value}"

    text = _PARAMETER.sub(option, text)
    text = _UNKNOWN_OPTION.sub(r"--storage-option \1=... is not an option of this store's file system", text)
    return text.replace("storage_options", "--storage-option")


#: An fsspec file system refusing a storage option: ``TypeError: AioSession.__init__() got an unexpected ...``.
_UNKNOWN_OPTION = re.compile(r"(?:TypeError: )?\S+\(\) got an unexpected keyword argument '([^']+)'")


def _quiet_unraisable(unraisable) -> None:
    """Drop what the interpreter would print as "Exception ignored in ...": s3fs's and zarr's abandoned
    requests (a closed port, an endpoint missing) print dozens of lines of tracebacks after the error line."""


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status (0; 2 on error; 130 on Ctrl-C)."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command in ("fit", "update", "demo", "report") and sys.stderr is None:
        args.no_progress = True  # nowhere to draw it
    hook = sys.unraisablehook
    sys.unraisablehook = _quiet_unraisable
    # After a failed read from an object store, zarr's abandoned reads are logged at exit as
    # "Task was destroyed but it is pending!" (dozens of lines after the error line).
    asyncio_logger = logging.getLogger("asyncio")
    level = asyncio_logger.level
    asyncio_logger.setLevel(logging.CRITICAL)
    try:
        return _run(args)
    finally:
        if argv is not None:  # called from Python: give the hooks back (a program keeps them until it exits)
            import gc

            gc.collect()  # the abandoned coroutines are collected while they are still silenced
            sys.unraisablehook = hook
            asyncio_logger.setLevel(level)


def _run(args) -> int:
    try:
        with _scheduler(args.scheduler, getattr(args, "connect_timeout", DEFAULT_CONNECT_TIMEOUT)):
            return args.func(args, _Stdout())
    except KeyboardInterrupt:
        _say(f"{PROG} {args.command}: interrupted")
        return 130
    except (_UsageError, _SchedulerLost, FileNotFoundError, KeyError, ValueError, OSError, TimeoutError) as err:
        text = _one_line(err)
        _say(f"{PROG} {args.command}: error: {text if isinstance(err, _UsageError) else _user_spelling(text)}")
        return 2
    except (Exception, asyncio.CancelledError) as err:  # the promise: one line, never a traceback
        _say(f"{PROG} {args.command}: error: {type(err).__name__}: {_user_spelling(_one_line(err))}")
        return 2


class _Stdout:
    """``sys.stdout`` that tolerates being closed (``>&-``): output is dropped, the work goes on."""

    def write(self, text: str) -> int:
        try:
            return sys.stdout.write(text)
        except (AttributeError, OSError, ValueError):
            return len(text)

    def flush(self) -> None:
        try:
            sys.stdout.flush()
        except (AttributeError, OSError, ValueError):
            pass
