"""``dask-mcpca score``: per-row outputs of a model written to a new Zarr store, or appended (``--append``).

The command says what is written (the outputs, their dtype, the attributes that say what they were
scored from); the score store's modules say how (:mod:`dask_mcpca._score_store`: a new store,
:mod:`dask_mcpca._score_append`: rows appended).
"""

from __future__ import annotations

import os
import time

from .._atomic import is_zarr_store
from .._urls import local_path
from .._urls import overlaps as _overlaps
from .common import (
    PROG,
    UsageError,
    check_channel_names,
    fmt_seconds,
    load_model,
    open_archive_for,
    parse_storage_options,
    rows_after,
    store_root,
)
from .outputs import (
    check_output_location,
    compute_settled,
    output_store,
    path_exists,
    refuse_inside_input,
    refuse_replacing_other_data,
)

__all__ = ["SCORE_ARRAYS", "OUTPUT_SETS", "DEFAULT_OUTPUTS", "DEFAULT_DTYPE", "LEGACY_OUTPUTS", "default_outputs",
           "all_outputs", "with_mode", "cmd_score"]

#: The arrays ``score`` writes, and what each holds (also in the output's attributes).
SCORE_ARRAYS = {
    "scores": "projections (X - mean_) @ components_.T",
    "weight": "score_samples: correntropy weight in (0, 1]",
    "outlier": "is_outlier: d^2 above outlier_cutoff_, a repeated value (stuck sensor) or row (frozen logger)",
    "d2": "mahalanobis: squared robust distance (on the observed cells of a row with gaps)",
    "contributions": "channel_contributions: drop in d2 when the channel is reconstructed from the others",
    "n_observed": "n_observed: cells not NaN in the row (what d2 and the flag were judged on)",
    "top_channel": "index of the channel at fault: the largest contribution, or a stuck value that explains the "
                   "flag (-1: none observed)",
    "mode": "predict_mode: the operating mode that judged the row, an index into the model's modes_ (the 'modes' "
            "attribute; -1: none, a row not scored; 0 for every row of a model without modes)",
    "cells": "cell_outliers: True where a cell lies far from what the row's other cells predict or a sensor stuck "
             "since the fit holds it (rows x channels, one byte a cell before compression, which leaves little of a "
             "mostly False array)",
}
#: ``score --outputs`` by a name: ``monitoring`` (the default: what an alarm needs, the distance,
#: the flag, the channel to look at and how many channels the row was judged on) and ``all``: every output
#: valid for the model (:func:`all_outputs` picks them from these, once the model is read).
OUTPUT_SETS = {
    "monitoring": ("d2", "outlier", "top_channel", "n_observed"),
    "all": tuple(SCORE_ARRAYS),
}
#: ``score``'s defaults: 9 bytes a row (float32 d2, the flag, two int16 counts), against 8 (k + p + 2) + 5
#: for ``--outputs all --dtype float64`` on a plain model.
DEFAULT_OUTPUTS, DEFAULT_DTYPE = "monitoring", "float32"
#: What a store written before the defaults changed holds when it records no ``outputs`` attribute (``all``
#: as it then was, in float64): ``--append`` goes on with that.
LEGACY_OUTPUTS = ("scores", "weight", "outlier", "d2", "contributions", "n_observed")


def cmd_score(args, out) -> int:
    from .._score_store import as_dataset, model_name, provenance, quiet_consolidated, write_new

    refuse_inside_input(args.output, args.store, "--output")
    if _overlaps(args.model, args.output):
        raise UsageError(f"--output {args.output!r} would overwrite the model {args.model!r} being read")
    check_output_location(args.output, is_file=False)
    options = parse_storage_options(args.storage_options)
    if args.append:
        if args.overwrite:
            raise UsageError("--append adds rows to --output and --overwrite replaces it; pass one of them")
        for option in ("rows", "time"):
            if getattr(args, option) is not None:
                raise UsageError(f"--append scores the rows after those in --output; it takes no --{option}")
        if path_exists(args.output, options):
            return _score_append(args, out, options)
    if path_exists(args.output, options):
        if not args.overwrite:
            raise UsageError(f"output {args.output!r} exists; pass --overwrite to replace it")
        refuse_replacing_other_data(args.output, options)
    model, digest = load_model(args.model, options)
    archive = open_archive_for(args)
    check_channel_names(model, archive.X, args.store)  # refused or warned of once, here
    # after the rows before a selection from row N > 0 (archive.lead), whose outputs are left out, as --append
    # reads them: a stuck run crossing row N is found as in a full score
    whole, lead = archive.with_context(model)  # the context cut after a NaN or inf row (finite_context)
    X = rows_after(whole, lead)
    started = time.perf_counter()
    names, dtype = _requested(model, args.outputs), args.dtype or DEFAULT_DTYPE
    outputs = {n: rows_after(a, lead) for n, a in _score_outputs(model, whole, names, dtype).items()}
    span = archive.span
    attrs = {
        "model": model_name(args.model),
        "created_by": f"{PROG} score",
        "arrays": {name: SCORE_ARRAYS[name] for name in names},
        "outputs": list(names),
        "dtype": dtype,
    }
    source = _score_source(args, model, digest)
    if span is not None:  # what --append checks and goes on from
        attrs.update(provenance(**source, rows=span, model=attrs["model"]))
    else:
        attrs.update({k: v for k, v in source.items() if k != "digest"})
    quiet_consolidated()
    with output_store(args.output, options, overwrite=args.overwrite) as tmp:
        # written by xarray whatever the input: dims, the channel names and coordinates (_score_store)
        ds = as_dataset(outputs, model=model, X=X, attrs=attrs, descriptions=SCORE_ARRAYS)
        pending = write_new(tmp, ds, X=X, span=span, storage_options=options)
        n_out = pending.finish(compute_settled(*pending.tasks, progress=not args.no_progress))
    elapsed = time.perf_counter() - started
    n = X.shape[0]
    shapes = {"scores": f" ({n:,} x {model.n_components_})", "contributions": f" ({n:,} x {model.n_features_in_})",
              "cells": f" ({n:,} x {model.n_features_in_})"}
    flagged = f": {n_out:,} outliers ({n_out / n:.2%})" if n_out is not None else ""
    print(
        f"scored {n:,} rows in {fmt_seconds(elapsed)}{flagged}\n"
        f"written to {args.output}: " + ", ".join(f"{name}{shapes.get(name, f' ({n:,})')}" for name in names)
        + (" in float32" if dtype == "float32" else ""),
        file=out,
    )
    return 0


def default_outputs(model) -> tuple[str, ...]:
    """What ``score`` writes without ``--outputs``: :data:`DEFAULT_OUTPUTS`, and ``cells`` for a model
    fitted with ``cellwise=True`` (its rows are judged on their good cells: the flags say which)."""
    names = OUTPUT_SETS[DEFAULT_OUTPUTS]
    return (*names, "cells") if getattr(model, "cell_cutoff_", None) is not None else names


def all_outputs(model) -> tuple[str, ...]:
    """What ``score --outputs all`` writes: every output of :data:`SCORE_ARRAYS` valid for the model, in that
    order: ``cells`` only for a model fitted with ``cellwise=True``; ``mode`` only for a model with operating
    modes, and then no ``scores`` (each mode has its own components)."""
    cellwise = getattr(model, "cell_cutoff_", None) is not None
    modes = getattr(model, "mode_models_", None) is not None
    left_out = {"cells"} if not cellwise else set()
    left_out |= {"scores"} if modes else {"mode"}
    return tuple(name for name in SCORE_ARRAYS if name not in left_out)


def _requested(model, outputs: tuple[str, ...] | None) -> tuple[str, ...]:
    """The outputs ``score`` writes for ``--outputs`` (None: the default; ``all``: :func:`all_outputs`)."""
    if outputs is None:
        return with_mode(model, default_outputs(model))
    if tuple(outputs) == OUTPUT_SETS["all"]:
        return all_outputs(model)
    return with_mode(model, tuple(outputs))


def with_mode(model, names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` with ``mode`` for a model with operating modes (refused with ``scores``: each mode has its own
    components)."""
    if getattr(model, "mode_models_", None) is None:
        return names
    if "scores" in names:
        raise UsageError("--outputs scores: a model with operating modes has its own components in each mode; "
                         "leave scores out (--outputs monitoring, or names without scores)")
    return names if "mode" in names else (*names, "mode")


def _score_outputs(model, X, names: tuple[str, ...], dtype: str) -> dict:
    """The lazy per-row outputs ``names`` that ``score`` writes (see :data:`SCORE_ARRAYS`), float ones in ``dtype``:
    one function per row block makes them all (:meth:`MCPCA.score_rows`)."""
    outputs = model.score_rows(X, outputs=names)
    if dtype != "float64":
        outputs = {n: a.astype(dtype) if a.dtype.kind == "f" else a for n, a in outputs.items()}
    return outputs


def _score_source(args, model, digest: str) -> dict:
    """What a score store is scored from (its input and model), as :func:`dask_mcpca._score_store.provenance`
    takes it; ``digest``: the model file's SHA-256.  A local store is named by its resolved path (symlinks
    followed), the dataset without its leading '/', from ``--dataset`` or ``file.h5:/dataset``: however spelled,
    one input is one provenance, as ``score --append`` compares it."""
    from .._io import split_store_path

    dataset = args.dataset if args.dataset is not None else split_store_path(args.store)[1]
    return {
        "source": args.store if "://" in args.store else os.path.realpath(store_root(args.store)),
        "dataset": dataset.strip("/") or None if dataset is not None else None,
        "variables": args.variables,
        "n_features": model.n_features_in_,
        "digest": digest,
    }


def _score_append(args, out, options) -> int:
    """``score --append`` to an existing ``--output``: the rows after those it holds, in a new version of it."""
    import dask.array as da

    from .._exceptions import AppendError
    from .._model import CONTEXT_ROWS
    from .._score_append import append_rows, open_for_append
    from .._score_store import CHANNELS_ATTR, MODEL_ATTR, channel_names, model_name, provenance, quiet_consolidated

    quiet_consolidated()  # before the store is first listed
    output = local_path(args.output)
    if output is None:
        raise UsageError(f"--append needs --output on a local disk (or a file:// URL), not {args.output!r}: an "
                         "object store cannot put a new version of a store in place without copying it whole")
    if not is_zarr_store(output):
        raise UsageError(f"--output {args.output!r} exists and is not a Zarr store; --append adds rows only to "
                         "a store written by score")
    model, digest = load_model(args.model, options)
    source = _score_source(args, model, digest)
    whole = check_channel_names(model, open_archive_for(args).X, args.store)
    # the channels compared by their resolved names (as the store records them), not by --variables' spelling
    expected = {**provenance(**source, rows=(0, 0)), CHANNELS_ATTR: channel_names(model, whole)}
    try:
        target = open_for_append(output, args.output, expected, LEGACY_OUTPUTS)
    except AppendError as err:
        raise UsageError(str(err)) from None
    start, stop = target.rows
    n_all = whole.shape[0]
    if n_all < stop:
        raise UsageError(f"{args.store!r} has {n_all:,} rows, fewer than the {stop:,} already scored in --output "
                         f"{args.output!r} (rows {start:,}:{stop:,}): is it the archive they were scored from?")
    if n_all == stop:
        print(f"nothing to append: --output {args.output} holds rows {start:,}:{stop:,}, the last of the "
              f"{n_all:,} in {args.store}", file=out)
        return 0
    # From the rows before the new ones, whose outputs are left out: a stuck run and top_channel's held-cell
    # rule read rows in order (_model.stuck_cells, _model.isolated_top), so the new rows' outputs are a full
    # score's.  It reads at most one stored chunk more than the new rows.
    # No cut after a NaN row here (finite_context): the rows before the new ones were scored into the store by
    # this model, so under nan_policy='raise' they hold none, and the check would read their chunks twice.
    lead = min(stop, CONTEXT_ROWS)
    X = whole[stop - lead :] if isinstance(whole, da.Array) else whole.isel({whole.dims[0]: slice(stop - lead, None)})
    n_new = X.shape[0] - lead
    names, dtype = target.names, target.dtype
    if args.outputs is not None and _requested(model, args.outputs) != names:
        raise UsageError(f"--outputs differs from what --output {args.output!r} holds ({','.join(names)}); "
                         "leave it out with --append")
    if args.dtype is not None and args.dtype != dtype:
        raise UsageError(f"--dtype {args.dtype} differs from what --output {args.output!r} holds ({dtype}); "
                         "leave it out with --append")
    started = time.perf_counter()
    try:
        target.check_arrays(SCORE_ARRAYS)
        outputs = {n: rows_after(a, lead) for n, a in _score_outputs(model, X, names, dtype).items()}
        n_out, segments = append_rows(
            target, outputs, model=model, X=X, whole=whole, digest=digest, model_name=model_name(args.model),
            descriptions=SCORE_ARRAYS, compute=lambda *tasks: compute_settled(*tasks, progress=not args.no_progress))
    except AppendError as err:
        raise UsageError(str(err)) from None
    elapsed = time.perf_counter() - started
    flagged = f": {n_out:,} outliers ({n_out / n_new:.2%})" if n_out is not None else ""
    began = segments[-1]["rows"][0] == stop and len(segments) > 1  # another model than the rows before
    print(
        f"scored {n_new:,} new rows ({stop:,}:{n_all:,}) in {fmt_seconds(elapsed)}{flagged}\n"
        f"appended to {args.output}, which now holds rows {start:,}:{n_all:,}"
        + (f"\nrows {stop:,}:{n_all:,} were scored with {args.model} (SHA-256 {digest[:12]}), rows "
           f"{segments[-2]['rows'][0]:,}:{stop:,} with another model (SHA-256 "
           f"{segments[-2][MODEL_ATTR][:12]}): segment {len(segments) - 1} (an index into the store's "
           "'segments' attribute)"
           if began else ""),
        file=out,
    )
    return 0
