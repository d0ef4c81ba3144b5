"""``dask-mcpca fit`` and ``dask-mcpca update``: a model from an archive, and new rows into it.

Both record in the model the archive rows it has read (``archive_rows_``: runs,
gaps kept) and their fingerprint (``archive_samples_``, :mod:`dask_mcpca._rowprints`);
``update`` goes on after the last run by default, refuses rows already read,
and refuses an archive whose rows read have changed.
"""

from __future__ import annotations

import io
import os
import time

import numpy as np

from .. import _rowprints
from .._choices import CLI_CENTERS as _CENTERS
from .._choices import CLI_SCALES as _SCALES
from .._estimator import MCPCA
from .._exceptions import NonFiniteRowsError
from .._labels import feature_names_of
from .._params import check_params
from .._scale import scale_text
from .._urls import local_path
from .common import (
    UsageError,
    check_channel_names,
    describe,
    fmt_seconds,
    listed,
    load_model,
    open_archive_for,
    parse_storage_options,
    slice_text,
)
from .outputs import check_output_location, path_exists, refuse_inside_input

__all__ = ["MAX_TABLE_ROWS", "summary_table", "modes_table", "cmd_fit", "cmd_update"]

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


def modes_table(model) -> str:
    """The operating modes a fit with ``--modes`` found: each mode's label, share of the rows and model."""
    if getattr(model, "mode_models_", None) is None:
        return "\noperating modes: one state found (the model above judges every row)"
    lines = [f"\noperating modes: {model.n_modes_} (the table above is the largest mode's; each row is judged by "
             "the mode that explains it best)",
             f"{'mode':>9}  {'label':>12}  {'share':>7}  {'components':>10}  {'cutoff d2':>10}"]
    for m, (label, weight, sub) in enumerate(zip(model.modes_, model.mode_weights_, model.mode_models_,
                                                 strict=True)):
        lines.append(f"{m:>9}  {str(label):>12}  {weight:>7.2%}  {sub.n_components_:>10}  "
                     f"{sub.outlier_cutoff_:>10.4g}")
    return "\n".join(lines)


def cmd_fit(args, out) -> int:
    refuse_inside_input(args.output, args.store, "--output")
    check_output_location(args.output, is_file=True)
    if not args.overwrite and path_exists(args.output, parse_storage_options(args.storage_options)):
        raise UsageError(f"--output {args.output!r} exists; pass --overwrite to replace it")
    model = MCPCA(
        args.n_components,
        solver=args.solver,
        center=_CENTERS[args.center],
        nan_policy=args.nan_policy,
        cellwise=args.cellwise,
        scale=_SCALES[args.scale],
        progress=not args.no_progress,
        modes=getattr(args, "modes", None),
    )
    check_params(model)
    state = getattr(args, "modes_from", None)
    if model.modes is not None or state is not None:
        from .._fit_modes import check_modes

        if model.modes is not None and state is not None:
            raise UsageError("--modes auto finds the modes and --modes-from reads them from a channel; pass one")
        option = f"--modes {model.modes}" if state is None else f"--modes-from {state}"
        try:
            check_modes(model, model.modes)
        except ValueError as err:
            raise UsageError(f"{option}: {str(err).removeprefix('MCPCA: ')}") from None
    archive = open_archive_for(args, row_index=False)  # a fit never uses the time index (built anyway for --time)
    X = archive.X
    print(f"fitting {args.store}: {describe(X)}", file=out, flush=True)
    if (names := feature_names_of(X)) is not None:  # the order the model keeps (docs/archives.md)
        if state is not None:
            if type(X).__name__ != "DataArray" or state not in [str(n) for n in names]:
                raise UsageError(f"--modes-from {state}: no such channel in {args.store} (channels: "
                                 f"{listed(names, limit=12)}); name a variable of an xarray archive")
            names = [n for n in names if str(n) != state]
        print(f"channels, in this order: {listed(names, limit=12)}", file=out, flush=True)
    elif state is not None:
        raise UsageError(f"--modes-from {state} names a channel, and {args.store} has no channel names (an xarray "
                         "archive has them)")
    started = time.perf_counter()
    model.fit(X, modes=state)
    elapsed = time.perf_counter() - started
    _record_span(model, archive.span, _model_channels(model, X, state, args.store))
    model.set_params(progress=False)  # the command's progress line, not a setting a notebook should inherit
    model.save(args.output, storage_options=parse_storage_options(args.storage_options))
    subs = getattr(model, "mode_models_", None) or [model]  # with modes, the rows of every mode
    n_used = sum(sub.n_samples_ for sub in subs)
    used = f"{n_used:,}" + (f" of {X.shape[0]:,}" if n_used != X.shape[0] else "")
    cellwise = ", cellwise=True" if args.cellwise else ""
    scale = f", scale={args.scale!r}" + (f", modes={model.modes!r}" if model.modes is not None else "") + (
        f"; modes from {state}" if state is not None else "")
    print(f"\nMCPCA(solver={args.solver!r}, center={args.center!r}{cellwise}{scale}): robust explained variance",
          file=out)
    print(summary_table(model), file=out)
    if model.modes is not None or state is not None:
        print(modes_table(model), file=out)
    print(
        f"\npasses {model.n_passes_}   rows {used}   time {fmt_seconds(elapsed)}   "
        f"converged {'yes' if model.converged_ else 'no'}",
        file=out,
    )
    if args.nan_policy == "partial" or args.cellwise:  # elsewhere every row used is whole
        why = " or ".join(w for w, on in (("missing", args.nan_policy == "partial"), ("flagged", args.cellwise)) if on)
        print(f"rows judged on fewer channels {model.n_samples_partial_:,} of {model.n_samples_:,} (some cells "
              f"{why}: judged by their other cells)", file=out)
    if args.cellwise:
        print(f"cells above the cutoff are left out (r^2 > {model.cell_cutoff_:.2f}); score writes them as 'cells'",
              file=out)
    print(scale_text(model), file=out)
    print(f"model written to {args.output}", file=out)
    return 0


def _model_channels(model, X, state: str | None, store: str):
    """The archive ``X`` as ``update`` reads it for the fingerprint: the model's channels, in its order
    (:func:`.common.check_channel_names`), so without the ``--modes-from`` channel ``state``, which gave the
    modes and is no channel of the model (a fingerprint over it too matched no row ``update`` read)."""
    if state is not None:
        names = [str(n) for n in feature_names_of(X)]
        X = X.isel({X.dims[1]: [j for j, n in enumerate(names) if n != state]})  # lazy: no column read
    return check_channel_names(model, X, store, err=io.StringIO())


def _read_rows(X, positions: list[int]) -> np.ndarray:
    """The rows of ``X`` (an archive as :func:`.common.open_archive_for` gives it) at ``positions``: one
    small read, of the chunks that hold them."""
    data = getattr(X, "data", X)
    if not positions:
        return np.empty((0, X.shape[1]))
    rows = data[list(positions)]
    return np.asarray(rows.compute() if hasattr(rows, "compute") else rows)


def _record_span(model, span: tuple[int, int] | None, X=None, *, runs=(), samples=()) -> None:
    """Record in ``model`` the archive rows it has read (``archive_rows_``, runs; see :class:`MCPCA`) and
    their fingerprint (``archive_samples_``, :mod:`dask_mcpca._rowprints`): ``runs`` and ``samples`` it read before,
    with ``span`` added, whose sampled rows are read from ``X`` (the rows ``span`` selects) unless
    ``samples`` already holds them."""
    runs, samples = list(runs), list(samples)
    if span is not None:
        if X is not None:
            positions = _rowprints.run_positions(*span)
            rows = _read_rows(X, [pos - span[0] for pos in positions])
            samples += zip(positions, _rowprints.digests(rows), strict=True)
        runs = _rowprints.add_run(runs, span)
    if runs:
        model.archive_rows_ = np.array(runs, dtype=np.int64).reshape(-1, 2)
        model.archive_samples_ = np.array(_rowprints.thin(sorted(samples)), dtype=np.int64).reshape(-1, 2)


def _model_runs(model) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The runs of archive rows a model file records (``archive_rows_``, checked by :func:`load`) and
    their fingerprint's samples; empty where it records none (a model fitted in Python)."""
    recorded = getattr(model, "archive_rows_", None)
    if recorded is None:
        return [], []
    runs = _rowprints.as_runs(recorded)
    samples = getattr(model, "archive_samples_", np.empty((0, 2), dtype=np.int64))
    return runs, [(int(pos), int(digest)) for pos, digest in samples]


def _check_fingerprint(args, whole, runs, samples, new_positions: list[int]) -> list[tuple[int, int]]:
    """Refuse when rows the model read changed in the archive ``whole`` (:func:`dask_mcpca._rowprints.checked`: the
    newest row read and one older sample); return the samples of the new rows at ``new_positions``,
    read in the same small read."""
    check = _rowprints.checked(samples, salt=runs[-1][1]) if runs else []
    n_all = whole.shape[0]
    if any(pos >= n_all for pos, _ in check):
        raise UsageError(f"{args.store!r} has {n_all:,} rows, fewer than the model has read (rows "
                         f"{_rowprints.runs_text(runs)}): is it the archive the model was fitted on?")
    got = _rowprints.digests(_read_rows(whole, [pos for pos, _ in check] + list(new_positions)))
    changed = _rowprints.changed_rows(check, got[: len(check)])
    if changed:
        run = next(r for r in runs if r[0] <= changed[0] < r[1])
        raise UsageError(
            f"{args.store}'s rows {run[0]:,}:{run[1]:,} changed since the model read them (row {changed[0]:,} "
            "differs from the model's fingerprint), or it is another archive: the model no longer describes "
            "them; fit it again"
        )
    return list(zip(new_positions, got[len(check):], strict=True))


def _same_file(output: str, model: str) -> bool:
    """Whether ``-o`` names the ``--model`` file itself (the same string, or the same local file)."""
    if output == model:
        return True
    local_output, local_model = local_path(output), local_path(model)
    if local_output is None or local_model is None:
        return False
    return os.path.realpath(local_output) == os.path.realpath(local_model)


def _seen(model) -> int:
    """Rows in the sums ``model`` keeps for ``partial_fit`` (each mode keeps its own)."""
    modes = getattr(model, "mode_models_", None)
    return sum(m.n_samples_seen_ for m in modes) if modes else getattr(model, "n_samples_seen_", 0)


def cmd_update(args, out) -> int:
    """``dask-mcpca update``: the model file's ``partial_fit`` with the archive's new rows.

    The new rows are those after the rows the model has seen (its recorded row runs), or ``--rows`` /
    ``--time``; the archive is opened once, checked against the model's channels, and the rows already
    seen are refused.  The model is written (atomically) to ``--model`` or ``--output``; an update with
    no usable row warns and leaves the file as it is (exit 0).
    """
    options = parse_storage_options(args.storage_options)
    output = args.output or args.model
    refuse_inside_input(output, args.store, "--output" if args.output else "--model")
    check_output_location(output, is_file=True)
    elsewhere = args.output is not None and not _same_file(args.output, args.model)
    if elsewhere and not getattr(args, "overwrite", False) and path_exists(args.output, options):
        raise UsageError(f"--output {args.output!r} exists; pass --overwrite to replace it")
    model = load_model(args.model, options)[0]
    model.set_params(progress=not args.no_progress)
    runs, samples = _model_runs(model)
    # opened once: the whole archive (the rows read are checked in it), then the new rows selected from it
    archive = open_archive_for(args, row_index=args.time is not None, select=False)
    whole = check_channel_names(model, archive.X, args.store)
    if args.rows is None and args.time is None:
        if not runs:
            raise UsageError(
                f"--model {args.model!r} does not record which rows of the archive it has read (it was not "
                "written by 'dask-mcpca fit' or 'update'); name the new rows with --rows START:STOP or "
                "--time START:STOP"
            )
        n_all, last = whole.shape[0], runs[-1][1]
        if n_all < last:
            raise UsageError(
                f"{args.store!r} has {n_all:,} rows, fewer than the {last:,} the model has read "
                f"(rows {_rowprints.runs_text(runs)}): is it the archive the model was fitted on? Name the new "
                "rows with --rows"
            )
        if n_all == last:
            print(f"no new rows: the model has read rows {_rowprints.runs_text(runs)} of the {n_all:,} in "
                  f"{args.store}; {args.model} left as it is"
                  + (f", nothing written to --output {args.output}" if elsewhere else ""), file=out)
            return 0
        args.rows = slice(last, None)
    selected = archive.select(args.rows, args.time)
    X = check_channel_names(model, selected.X, args.store, err=io.StringIO())
    span = selected.span
    chosen = " with ".join(f"--{o} {slice_text(getattr(args, o), o)}" for o in ("rows", "time")
                           if getattr(args, o) is not None)
    if span is None and runs:  # its rows could not be recorded, nor checked against those read
        raise UsageError(
            f"{chosen} selects rows that are not one run of positions (the row coordinate repeats labels out "
            "of order); select the new rows with --rows START:STOP"
        )
    if span is not None and (read := _rowprints.overlap(runs, span)):
        raise UsageError(
            f"{chosen} selects rows {span[0]:,}:{span[1]:,}, which include rows {_rowprints.runs_text(read)} the "
            "model has already read (they would be counted twice); select rows it has not read"
        )
    new_samples = [] if whole.shape[1] != model.n_features_in_ else _check_fingerprint(  # partial_fit says so
        args, whole, runs, samples, _rowprints.run_positions(*span, n=1) if span is not None else [])
    where = f"rows {span[0]:,}:{span[1]:,}" if span is not None else "the rows selected"
    print(f"updating {args.model} with {where} of {args.store}: {describe(X)}", file=out, flush=True)
    started = time.perf_counter()
    seen_before = _seen(model)
    try:
        model.partial_fit(X)  # removes archive_rows_ (partial_fit does not know the archive): recorded again here
    except NonFiniteRowsError as err:  # its advice, nan_policy='omit', is fit's: update takes no --nan-policy
        found = str(err).partition(";")[0]
        raise UsageError(
            f"{found} in {where} of {args.store}; the model was fitted with --nan-policy raise and update keeps "
            "its policy: clean them, refit with 'dask-mcpca fit ... --nan-policy omit' (rows with NaN left out) "
            "or '--nan-policy partial' (such rows fitted by their observed cells), or leave them out of the "
            "update with --rows START:STOP"
        ) from None
    elapsed = time.perf_counter() - started
    if _seen(model) == seen_before:  # no usable row (partial_fit warned): nothing to record, the file kept
        print(f"no usable rows in {where} of {args.store}; {args.model} left as it is"
              + (f", nothing written to --output {args.output}" if elsewhere else "")
              + "; they are read again by the next update", file=out)
        return 0
    _record_span(model, span, runs=runs, samples=samples + new_samples)
    model.set_params(progress=False)
    model.save(output, storage_options=options)
    recorded = _model_runs(model)[0]
    modes = getattr(model, "mode_models_", None)
    seen = _seen(model)
    passes = f"{model.n_passes_} pass" + ("es" if model.n_passes_ > 1 else "")
    print(
        f"read {model.n_samples_:,} new rows in {passes} ({fmt_seconds(elapsed)}); the model's sums "
        f"now hold {seen:,} rows" + (f" in {len(modes)} modes" if modes else "")
        + (f", archive rows {_rowprints.runs_text(recorded)}" if recorded else "")
        + f"\nmodel written to {output}",
        file=out,
    )
    return 0
