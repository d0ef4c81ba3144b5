"""``dask-mcpca report`` (the PNG, events and drift windows of a fitted archive) and ``dask-mcpca demo``."""

from __future__ import annotations

import importlib
import os
import threading
import time
import urllib.parse

import numpy as np

from .. import _malloc
from .._atomic import atomic_files
from .._urls import is_url
from .._urls import overlaps as _overlaps
from .common import (
    UsageError,
    check_channel_names,
    describe,
    fmt_seconds,
    load_model,
    open_archive_for,
    parse_storage_options,
    store_root,
)
from .outputs import check_output_location, refuse_inside_input

__all__ = ["MODE_STRETCHES", "PICTURE_EXTENSION", "cmd_report", "cmd_demo", "modes_text"]

#: The extension ``report --output`` must have: the figure is written as PNG (matplotlib's ``savefig``).
PICTURE_EXTENSION = ".png"


def _import_quietly(names) -> None:
    """Import ``names`` ahead of their use; a failure is left for the import where they are used to report."""
    try:
        for name in names:
            importlib.import_module(name)
    except Exception:  # matplotlib missing or broken: the later import says so in one line
        pass


def _check_picture_name(path: str) -> None:
    """Refuse an ``--output`` whose extension is not ``.png`` (any case): the figure is PNG bytes, which
    ``rep.html`` or ``rep.svg`` would hold under a name that says otherwise.  A URL's path is read as a file's."""
    name = urllib.parse.urlsplit(path).path if "://" in path else path
    ext = os.path.splitext(name)[1]
    if ext.lower() != PICTURE_EXTENSION:
        raise UsageError(
            f"--output {path!r}: the report is a PNG picture, "
            + (f"not {ext[1:]}" if ext else "and the name has no extension")
            + f"; name it with {PICTURE_EXTENSION} (e.g. {os.path.splitext(name)[0] or 'report'}{PICTURE_EXTENSION})"
        )


def cmd_report(args, out) -> int:
    """``dask-mcpca report``: the events file (CSV), the optional drift windows (CSV), the figure (PNG)
    and the printed summary of the model's judgement of the archive's rows.

    Rows are numbered as in the archive (``--rows 50:`` reports its first row as 50), as ``score``
    records them.  The files are written to temporaries and put in place together once the PNG is drawn
    (:func:`dask_mcpca._atomic.atomic_files`): the PNG first, the events CSV last, Ctrl-C and
    SIGTERM held meanwhile; an error or an interruption before leaves the previous set as it was.

    The output paths are checked to be distinct before any read; the archive is opened once and
    the model read once (:func:`.common.load_model`); the summary is one pass over the rows
    (:func:`dask_mcpca._report.summarize`).  Returns the exit status (0).
    """
    from .. import _report

    if args.max_events is None:  # left out: the report's own default
        args.max_events = _report.MAX_EVENTS
    events = args.events or os.path.splitext(args.output)[0] + ".csv"
    if _overlaps(args.output, events):
        raise UsageError(
            f"--output {args.output!r} and the events file {events!r} are one file; name the events with --events"
        )
    outputs = [(args.output, "--output"), (events, "--events")]
    window = None
    if args.window is not None:
        try:
            window = _report.parse_window(args.window)
        except ValueError as err:
            raise UsageError(str(err)) from None
        windows = args.windows or os.path.splitext(args.output)[0] + "_windows.csv"
        if any(_overlaps(windows, path) for path, _ in outputs):
            raise UsageError(f"--windows {windows!r} is the PNG or the events file; name another")
        outputs.append((windows, "--windows"))
    elif args.windows is not None:
        raise UsageError("--windows needs --window (the drift windows to write)")
    for path, what in outputs:
        refuse_inside_input(path, args.store, what)
        if _overlaps(path, args.model):
            raise UsageError(f"{what} {path!r} would overwrite the model {args.model!r} being read")
        check_output_location(path, is_file=True)
    _check_picture_name(args.output)
    options = parse_storage_options(args.storage_options)
    _malloc.return_large_frees_to_os()  # memory flat in the rows: see its docstring
    # the model and its SHA-256 (as a score store's segments name the model that scored each span of rows)
    model, digest = load_model(args.model, options)
    # blocks of about _report.BLOCK_VALUES values, and the time coordinate read with its rows (no index in memory)
    archive = open_archive_for(args, block_values=_report.BLOCK_VALUES, row_index=False)
    X = archive.X
    check_channel_names(model, X, args.store)
    from .._scale import scale_text

    print(f"report on {args.store}: {describe(X)}\nmodel {args.model} (SHA-256 "
          f"{digest[:12]}); {scale_text(model)}", file=out, flush=True)
    selection = archive.selection
    reference = _reference_rows(model, archive.span) if window is not None else None
    # rows are numbered as in the archive (as score records them), from the selection's first row in it;
    # rows that are not one run of the archive (time labels repeated out of order) from the first selected
    first_row = archive.span[0] if archive.span is not None else 0
    if archive.span is None:
        print(f"the rows {selection} selects are not one run of the archive: rows are numbered from the first "
              "selected (0), not the archive's", file=out)
    started = time.perf_counter()
    # matplotlib's import (about 1.4 s) runs while the pass's tasks read and compute, not after
    from .._report_plot import MATPLOTLIB_MODULES

    plotting = threading.Thread(target=_import_quietly, args=(MATPLOTLIB_MODULES,), daemon=True)
    plotting.start()
    title = args.store.rstrip("/").rpartition("/")[2] if is_url(args.store) else os.path.basename(
        os.path.normpath(store_root(args.store))
    )
    # the set is put in place together, once the PNG is drawn: the PNG, then the windows, the events last
    published = [args.output] + ([windows] if window is not None else []) + [events]
    with atomic_files(published, storage_options=options) as temporaries:
        staged = dict(zip(published, temporaries, strict=True))
        with open(staged[events], "w", newline="") as f:
            summary = _report.summarize(
                model, X, max_gap=args.max_gap, progress=not args.no_progress, events=f, window=window,
                max_events=args.max_events, reference_rows=reference, first_row=first_row,
                context=archive.context(model),  # the rows before --rows N: / --time, as score reads them
            )
        summary.selection = selection
        if window is not None:
            with open(staged[windows], "w", newline="") as f:
                _report.write_windows(summary.windows, f)
        plotting.join()
        from .._report_plot import render  # matplotlib is imported only there

        png = render(summary, title=title)
        with open(staged[args.output], "wb") as f:
            f.write(png)
    share = summary.n_flagged / max(summary.n_scored, 1)
    print(
        f"{summary.n_rows:,} rows in {fmt_seconds(time.perf_counter() - started)}: {summary.n_flagged:,} flagged "
        f"({share:.2%}) in {summary.n_events:,} events\nreport written to {args.output}, events to {events}"
        + (f" (the {args.max_events:,} most severe)" if 0 < args.max_events < summary.n_events else ""),
        file=out,
    )
    if summary.modes is not None:
        print(modes_text(summary), file=out)
    if window is not None:
        from .._drift import unmonitored_reason

        w = summary.windows
        n_drift = int(np.nansum(w["drift"])) if len(w["drift"]) else 0
        n_off = int((w["monitored"] == 0).sum()) if len(w["drift"]) else 0
        print(f"{len(w['drift']):,} windows of {args.window}, {n_drift:,} above the drift threshold"
              + (f", {n_off:,} not monitored ({unmonitored_reason(summary.modes is not None)})" if n_off else "")
              + f" (calibrated on {summary.drift_calibration}): {windows}", file=out)
    return 0


#: Stretches of the archive over which ``report`` prints the share of rows in each operating mode.
MODE_STRETCHES = 10


def modes_text(summary) -> str:
    """The operating modes of a report's model, their weights, and the share of the scored rows each judges
    in ``MODE_STRETCHES`` stretches of the archive (bins grouped), from the first row (or time) of each."""
    n_bins = len(summary.bin_count)
    heads = np.flatnonzero(np.diff(np.arange(n_bins) * min(n_bins, MODE_STRETCHES) // max(n_bins, 1), prepend=-1))
    shares = summary.mode_shares(heads)
    firsts = summary.row_values if summary.row_values is not None else summary.bin_rows
    labels = [str(v) for v in summary.modes]
    width = max(10, *(len(v) + 2 for v in labels))
    lines = ["operating modes (share of the fitted rows): " + ", ".join(
        f"{m} = {label} ({w:.1%})" for m, (label, w) in enumerate(zip(labels, summary.mode_weights, strict=True))),
        f"rows in each mode, from {summary.row_label}:",
        f"{'':>22}" + "".join(f"{label:>{width}}" for label in labels)]
    for head, row in zip(heads, shares, strict=True):
        first = firsts[head]
        if summary.row_values is None:
            start = f"{int(first):,}"
        elif np.asarray(first).dtype.kind == "M":
            start = np.datetime_as_string(first, unit="s")
        else:
            start = str(first)[:22]
        lines.append(f"{start:>22}" + "".join(f"{'-' if np.isnan(v) else f'{v:.1%}':>{width}}" for v in row))
    return "\n".join(lines)


def _reference_rows(model, span: tuple[int, int] | None) -> tuple[int, int] | None:
    """The rows of the report (their positions in the archive) the model was fitted on, from its
    ``archive_rows_`` and ``span``, the positions of the rows ``--rows``/``--time`` select: of the runs
    it records, the one that shares the most rows with them; None when either is unknown or they do not meet."""
    fitted = getattr(model, "archive_rows_", None)
    if fitted is None:
        return None
    if span is None:
        return None
    shared = [(max(int(a), span[0]), min(int(b), span[1]))
              for a, b in np.asarray(fitted).reshape(-1, 2)]
    a, b = max(shared, key=lambda r: r[1] - r[0])
    return (a, b) if a < b else None


def cmd_demo(args, out) -> int:
    from ..demo import run_demo
    from ..demo.run import MARKER

    # The demo writes only into a folder it makes: a new or empty one, or one it marked before.
    if os.path.lexists(args.out):
        if not os.path.isdir(args.out):
            raise UsageError(f"--out {args.out!r} exists and is not a folder; name a new or empty folder")
        entries = sorted(os.listdir(args.out))
        if entries and not os.path.isfile(os.path.join(args.out, MARKER)):
            shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
            raise UsageError(
                f"--out {args.out!r} is a folder the demo did not make: it holds {shown}, which the demo did not "
                "write; name a new or empty folder"
            )
    run_demo(rows=args.rows, out=args.out, seed=args.seed, progress=not args.no_progress, stream=out)
    return 0

