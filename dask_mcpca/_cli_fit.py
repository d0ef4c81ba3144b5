"""``dask-mcpca fit`` and ``dask-mcpca update``: a model from an archive, and new rows into it.

Both record in the model the archive rows it has read (``archive_rows_``),
from which ``update`` goes on by default.
"""

from __future__ import annotations

import time

import numpy as np

from ._choices import CLI_CENTERS as _CENTERS
from ._cli_common import (
    _archive_span,
    _describe,
    _fmt_seconds,
    _listed,
    _open,
    _slice_text,
    _storage_options,
    _UsageError,
    check_channel_names,
)
from ._cli_outputs import _check_output_location, _exists, _refuse_inside_input
from ._estimator import MCPCA, check_params, load
from ._labels import feature_names_of

__all__ = ["MAX_TABLE_ROWS", "_CENTERS", "summary_table", "_cmd_fit", "_cmd_update"]

#: Rows of the summary table shown before it is cut short.
MAX_TABLE_ROWS = 20


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
        cellwise=args.cellwise,
        progress=not args.no_progress,
    )
    check_params(model)
    X = _open(args, row_index=False)  # a fit never uses the time index (built anyway for --time)
    print(f"fitting {args.store}: {_describe(X)}", file=out, flush=True)
    if (names := feature_names_of(X)) is not None:  # the order the model keeps (docs/archives.md)
        print(f"channels, in this order: {_listed(names, limit=12)}", file=out, flush=True)
    started = time.perf_counter()
    model.fit(X)
    elapsed = time.perf_counter() - started
    _record_span(model, _archive_span(args, X))
    model.set_params(progress=False)  # the command's progress line, not a setting a notebook should inherit
    model.save(args.output, storage_options=_storage_options(args.storage_options))
    used = f"{model.n_samples_:,}" + (f" of {X.shape[0]:,}" if model.n_samples_ != X.shape[0] else "")
    cellwise = ", cellwise=True" if args.cellwise else ""
    print(f"\nMCPCA(solver={args.solver!r}, center={args.center!r}{cellwise}): robust explained variance", file=out)
    print(summary_table(model), file=out)
    print(
        f"\npasses {model.n_passes_}   rows {used}   time {_fmt_seconds(elapsed)}   "
        f"converged {'yes' if model.converged_ else 'no'}",
        file=out,
    )
    if args.cellwise:
        print(f"cells above the cutoff are left out (r^2 > {model.cell_cutoff_:.2f}); score writes them as 'cells'",
              file=out)
    print(f"model written to {args.output}", file=out)
    return 0


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
    X = check_channel_names(model, _open(args, row_index=args.time is not None), args.store)
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
    model.set_params(progress=False)
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

