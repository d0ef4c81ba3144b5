"""The ``dask-mcpca`` command line (also ``python -m dask_mcpca``).

Subcommands::

    dask-mcpca fit   STORE [--dataset NAME] [--n-components K] [--solver auto|paper]
                     [--center robust|mean|none] [--nan-policy raise|omit|partial] [--cellwise]
                     [--scheduler ADDRESS] [--output model.json] [--overwrite] [--no-progress]
    dask-mcpca update STORE --model model.json [--output new.json] [--overwrite] [--dataset NAME]
                     [--scheduler ADDRESS] [--no-progress]
    dask-mcpca score STORE --model model.json --output scores.zarr [--dataset NAME]
                     [--overwrite | --append] [--scheduler ADDRESS] [--no-progress]
    dask-mcpca report STORE --model model.json --output report.png [--events events.csv] [--window 1D]
                     [--max-gap ROWS] [--max-events N] [--scheduler ADDRESS] [--no-progress]
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
(:func:`dask_mcpca._atomic.atomic_url_store`).  ``update`` is :meth:`MCPCA.partial_fit`
on new rows (by default those after the rows the model has read, which
``fit`` and ``update`` record in the model as ``archive_rows_``), the model
file then replaced atomically.  ``score --append`` scores only the rows after
those already in ``--output`` and adds them in a new version of the store,
put in place as ``score`` puts a new one (:mod:`dask_mcpca._score_append`).
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

This module is the parser, its argument types and :func:`main`; the commands
live in :mod:`.fit` (``fit``, ``update``), :mod:`.score` and
:mod:`.report` (``report``, ``demo``), what they share in
:mod:`.common` (the archive a command names, the one-line usage
error), :mod:`.scheduler` and :mod:`.outputs`.
"""

from __future__ import annotations

import _thread
import argparse
import asyncio
import importlib
import logging
import os
import re
import sys
import threading
import traceback

from .._choices import CLI_CENTERS, CLI_SCALES, NAN_POLICIES, SOLVERS
from .._version import __version__
from .common import PROG, Stdout, UsageError, one_line
from .scheduler import DEFAULT_CONNECT_TIMEOUT, MAX_CONNECT_TIMEOUT, SchedulerLost, use_scheduler
from .score import DEFAULT_OUTPUTS, OUTPUT_SETS, SCORE_ARRAYS

__all__ = ["main", "COMMANDS"]

#: Each command's function, as (module, name): imported when the command runs, so that the parser
#: (``--version``, ``--help``, a usage error) loads neither dask, scikit-learn, Zarr nor xarray.
COMMANDS = {
    "fit": (".fit", "cmd_fit"),
    "update": (".fit", "cmd_update"),
    "score": (".score", "cmd_score"),
    "report": (".report", "cmd_report"),
    "demo": (".report", "cmd_demo"),
}
#: ``report --max-events``'s default as its help states it; the number itself is ``_report.MAX_EVENTS``,
#: which the command reads when the option is left out (``_report`` loads numpy and dask).
_MAX_EVENTS_HELP = "10,000"


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
    """``--outputs``: ``all``, ``monitoring`` or names of :data:`SCORE_ARRAYS` separated by commas; None for
    ``monitoring``, the default, which is exactly no ``--outputs`` (``cells`` too for a cellwise model)."""
    if text.strip() == DEFAULT_OUTPUTS:
        return None
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


def _connect_timeout(text: str) -> float:
    value = _positive_float(text)
    if not value <= MAX_CONNECT_TIMEOUT:  # also refuses inf
        raise argparse.ArgumentTypeError(f"expected a number of seconds in (0, {MAX_CONNECT_TIMEOUT:g}], got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``dask-mcpca`` parser: one sub-command per job (``demo``, ``fit``, ``update``, ``score``,
    ``report``), each with the options docs/cli.md lists.  Options that take paths, numbers or
    choices are checked by their ``type`` here, so that a bad value fails before any data is read
    (exit code 2, one line on stderr)."""
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
    fit.add_argument("--center", choices=tuple(CLI_CENTERS), default="robust")
    fit.add_argument("--nan-policy", choices=NAN_POLICIES, default="raise",
                     help="rows holding NaN or inf: raise (refuse them, the default), omit (leave them out), or "
                     "partial (rows with some cells missing are used by their observed cells; rows with an inf "
                     "or no cell observed are left out)")
    fit.add_argument("--cellwise", action="store_true",
                     help="judge each cell on its own and leave out the ones the model cannot explain (glitches in "
                     "single channels of a wide archive); score then also writes the flagged cells")
    fit.add_argument("--output", "-o", default="model.json", metavar="PATH", help="model file (default model.json)")
    fit.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    fit.add_argument("--no-progress", action="store_true", help="do not draw a progress line per pass")
    fit.add_argument("--scale", choices=tuple(CLI_SCALES), default="none",
                     help="units of the model: none (the data's, the default) or robust (each channel over its "
                     "robust scale, learned in the first pass: flags that do not depend on the channels' units; "
                     "components, loadings and drift windows in those units)")
    fit.add_argument("--modes", choices=("auto",), default=None,
                     help="operating modes: auto (find the machine's states, up to 4, and fit one robust model per "
                     "state; each row is judged by the state that explains it best, and score writes it as 'mode')")
    fit.add_argument("--modes-from", metavar="NAME",
                     help="operating modes given by a channel of an xarray archive (a machine-state variable): one "
                     "robust model per value of NAME, which is left out of the fitted channels (score and report "
                     "then take --variables without it)")
    scheduler_options(fit)

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
    update.add_argument("--overwrite", action="store_true",
                        help="replace --output if it exists (not needed when --output is the --model file)")
    update.add_argument("--dataset", metavar="NAME", help="array inside the store")
    update.add_argument("--no-progress", action="store_true", help="do not draw a progress line")
    data_options(update)
    scheduler_options(update)

    score = sub.add_parser("score", help="write per-row scores, weights and outlier flags to a new Zarr store")
    score.add_argument("store", metavar="STORE", help="Zarr store or HDF5 file")
    score.add_argument("--model", "-m", required=True, metavar="PATH", help="model file (path or URL) written by 'fit'")
    score.add_argument("--output", "-o", required=True, metavar="PATH", help="new Zarr store (path or URL) to create")
    score.add_argument("--dataset", metavar="NAME", help="array inside the store")
    score.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    score.add_argument(
        "--append", action="store_true",
        help="score only the rows after those already in --output and add them (the store is put in place whole "
        "again; created when missing); --output must have been scored from the same STORE and channels; "
        "another --model (an updated one) starts a segment, recorded in the store's 'segments' attribute; "
        "takes no --rows or --time",
    )
    score.add_argument(
        "--outputs", type=_output_names, metavar="NAMES",
        help="what to write: 'monitoring' (default: d2, outlier, top_channel, n_observed, and cells for a model "
        "fitted with cellwise=True), 'all' (every output valid for the model: scores, weight, outlier, d2, "
        "contributions, n_observed, top_channel; cells for a cellwise model; mode, and no scores, for a model "
        f"with operating modes), or names separated by commas from {', '.join(SCORE_ARRAYS)}; all are computed "
        "from one read of each block.  "
        "Bytes per row, float64: scores 8 k, weight, d2 8, outlier 1, contributions 8 p, n_observed, "
        "top_channel 2, cells p before compression (k components, p channels); --dtype float32 halves the "
        "floats' share",
    )
    score.add_argument(
        "--dtype", choices=("float64", "float32"), metavar="{float64,float32}",
        help="of the float outputs (default float32: 7 significant digits, enough to rank and threshold rows; "
        "the outlier flag is decided in float64 either way); float64 gives the API's values bit for bit "
        "(rows with NaN cells: to 1e-13, their completion's rounding follows the blocks)",
    )
    score.add_argument("--no-progress", action="store_true", help="do not draw a progress bar")
    data_options(score)
    scheduler_options(score)

    report = sub.add_parser(
        "report", help="a PNG report and an events CSV for a fitted archive (one streaming pass, no truth needed)"
    )
    report.add_argument("store", metavar="STORE", help="Zarr store or HDF5 file")
    report.add_argument(
        "--model", "-m", required=True, metavar="PATH", help="model file (path or URL) written by 'fit'"
    )
    report.add_argument("--output", "-o", default="report.png", metavar="PATH",
                        help="the figure, written as PNG: a name ending in .png, others refused (default report.png)")
    report.add_argument("--events", metavar="PATH", help="events CSV (default: the PNG's name with .csv)")
    report.add_argument("--dataset", metavar="NAME", help="array inside the store")
    report.add_argument(
        "--max-gap", type=_non_negative_int, default=0, metavar="ROWS",
        help="flagged runs at most this many rows apart are one event (default 0)",
    )
    report.add_argument(
        "--max-events", type=_non_negative_int, metavar="N",
        help=f"the events CSV lists the N most severe events, worst first (default {_MAX_EVENTS_HELP}); "
        "0: every event, in row order",
    )
    report.add_argument(
        "--window", metavar="W",
        help="drift windows: a duration of the time coordinate (1D, 6h) or a row count; writes windows.csv",
    )
    report.add_argument("--windows", metavar="PATH", help="windows CSV (default: the PNG's name with _windows.csv)")
    report.add_argument("--no-progress", action="store_true", help="do not draw a progress bar")
    data_options(report)
    scheduler_options(report)

    demo = sub.add_parser(
        "demo", help="synthetic sensor archive with faults: MCPCA vs PCA, printed and as a PNG report"
    )
    demo.add_argument("--rows", type=_positive_int, default=1_000_000, metavar="N", help="rows (default 1_000_000)")
    demo.add_argument("--out", default="mcpca-demo", metavar="DIR", help="output folder (default ./mcpca-demo)")
    demo.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the generator (default 0)")
    demo.add_argument("--no-progress", action="store_true", help="do not draw a progress line per pass")
    demo.set_defaults(scheduler=None)
    return parser


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
    "cellwise": "--cellwise",
    "solver": "--solver",
    "center": "--center",
    "dataset": "--dataset",
    "scale": "--scale",
    "variables": "--variables",
}
_PARAMETER = re.compile(r"\b(" + "|".join(_OPTION_SPELLING) + r")=('[^']*'|\"[^\"]*\"|[^\s,;)]+)")


def _user_spelling(text: str, refused_options: frozenset[str] = frozenset()) -> str:
    """``text`` with the estimator's parameters written as the options the user typed, and the file
    system's "unexpected keyword argument" for a name in ``refused_options`` (:func:`_refused_options`)
    as the ``--storage-option`` that passed it."""

    def option(match: re.Match) -> str:
        name, value = match.group(1), match.group(2).strip("'\"")
        if name == "center" and value == "False":
            value = "none"
        return f"{_OPTION_SPELLING[name]} {value}"

    text = _PARAMETER.sub(option, text)

    def unknown(match: re.Match) -> str:
        name = match.group(1)
        return (f"--storage-option {name}=... is not an option of this store's file system"
                if name in refused_options else match.group(0))

    text = _UNKNOWN_OPTION.sub(unknown, text)
    return text.replace("storage_options", "--storage-option")


#: An fsspec file system refusing a storage option: ``TypeError: AioSession.__init__() got an unexpected ...``.
_UNKNOWN_OPTION = re.compile(r"(?:TypeError: )?[\w.]{1,200}\(\) got an unexpected keyword argument '([^']+)'")
#: The package's own folder: a TypeError raised in its code is no file system's refusal.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _refused_options(err: BaseException, args) -> frozenset[str]:
    """The ``--storage-option`` names that a file system refused while ``err`` was raised: a TypeError
    "got an unexpected keyword argument 'NAME'" in ``err``'s chain (its cause or context, the store's
    opening wraps it) raised in a file system's code, not the package's, for a NAME the user passed.
    A model file's unknown parameter, or any other unexpected keyword, is left as it is."""
    passed = {part for key, _ in getattr(args, "storage_options", None) or () for part in str(key).split(".")}
    refused, seen, todo = set(), set(), [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        todo += [e.__cause__, e.__context__]
        match = _UNKNOWN_OPTION.search(str(e)) if isinstance(e, TypeError) else None
        if match is None or match.group(1) not in passed or e.__traceback__ is None:
            continue
        *_, innermost = traceback.extract_tb(e.__traceback__)
        if not os.path.abspath(innermost.filename).startswith(_PACKAGE_DIR + os.sep):
            refused.add(match.group(1))
    return frozenset(refused)


def _quiet_unraisable(unraisable) -> None:
    """Drop what the interpreter would print as "Exception ignored in ...": s3fs's and zarr's abandoned
    requests (a closed port, an endpoint missing) print dozens of lines of tracebacks after the error line.

    A Ctrl-C whose KeyboardInterrupt was raised inside a finalizer (garbage collection runs them
    between any two bytecodes) lands here too: it is delivered again to the main thread, so the
    command still stops with 130 instead of running on."""
    if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
        # From another thread, a moment later: called here (or at once), the interrupt would be
        # raised inside this hook and ignored again; should it land in another finalizer, it
        # comes back here.
        timer = threading.Timer(0.05, _thread.interrupt_main)
        timer.daemon = True
        timer.start()


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status (0; 2 on error; 130 on Ctrl-C)."""
    parser = build_parser()
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
    status = None
    try:
        status = run_args(args)
        return status
    finally:
        if argv is not None:  # called from Python: give the hooks back (a program keeps them until it exits)
            if status != 0:  # abandoned reads come from a failed one: collected while still silenced
                import gc

                gc.collect()  # a full collection: 0.1-0.15 s in a large process (a test run), so not after a success
            sys.unraisablehook = hook
            asyncio_logger.setLevel(level)


def run_args(args) -> int:
    """Run the command ``args`` names (parsed by :func:`build_parser`); its errors become one line and a status."""
    try:
        command = _command(args.command)
        with use_scheduler(args.scheduler, getattr(args, "connect_timeout", DEFAULT_CONNECT_TIMEOUT)):
            return command(args, Stdout())
    except KeyboardInterrupt:
        _say(f"{PROG} {args.command}: interrupted")
        return 130
    except (UsageError, SchedulerLost, FileNotFoundError, KeyError, ValueError, OSError, TimeoutError) as err:
        text = one_line(err)
        if not isinstance(err, UsageError):
            text = _user_spelling(text, _refused_options(err, args))
        _say(f"{PROG} {args.command}: error: {text}")
        return 2
    except (Exception, asyncio.CancelledError) as err:  # the promise: one line, never a traceback
        text = _user_spelling(one_line(err), _refused_options(err, args))
        _say(f"{PROG} {args.command}: error: {type(err).__name__}: {text}")
        return 2


def _command(name: str):
    """The function that runs command ``name`` (:data:`COMMANDS`), its module imported now."""
    module, function = COMMANDS[name]
    return getattr(importlib.import_module(module, __package__), function)
