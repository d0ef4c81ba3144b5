"""What the commands share: the archive a command names, its storage options, and the one-line error.

``STORE`` with ``--dataset``, ``--variables``, ``--rows`` and ``--time`` is opened
here (:func:`dask_mcpca._io.open_archive`); a usage error is an :class:`UsageError`,
which :func:`main` reports as one line with exit status 2.
"""

from __future__ import annotations

import argparse

__all__ = [
    "PROG", "UsageError", "one_line", "parse_storage_options", "store_root", "open_archive_for", "slice_text",
    "archive_span", "fmt_seconds", "describe", "listed", "check_channel_names",
]

PROG = "dask-mcpca"


class UsageError(Exception):
    """A command-line usage error, reported in one line."""


def one_line(err: BaseException) -> str:
    text = err.args[0] if isinstance(err, KeyError) and len(err.args) == 1 else str(err)
    text = " ".join(str(text).split())
    return text or type(err).__name__


def parse_storage_options(pairs: list[tuple[str, object]]) -> dict | None:
    """``[("a.b", 1)]`` -> ``{"a": {"b": 1}}`` (dotted keys nest, as ``client_kwargs.region_name``)."""
    options: dict = {}
    for key, value in pairs:
        *parents, last = (part.strip() for part in key.split("."))
        node = options
        for i, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UsageError(f"--storage-option {key}=...: {'.'.join(parents[: i + 1])} was given a value "
                                 "of its own; it cannot also hold keys")
        if isinstance(node.get(last), dict):
            raise UsageError(f"--storage-option {key}=...: {key} holds keys given by other --storage-option")
        node[last] = value
    return options or None


def store_root(store: str) -> str:
    """The file or directory of ``STORE`` (``file.h5:/data`` -> ``file.h5``)."""
    from .._io import split_store_path

    return split_store_path(store)[0]


def open_archive_for(args, **options):
    """The archive named on the command line: a DataArray for an xarray store, else a dask array.

    ``options`` go to :func:`open_archive` (``block_values``, ``row_index``).
    """
    from .._exceptions import SelectionError
    from .._io import open_archive

    try:
        return open_archive(
            args.store,
            dataset=args.dataset,
            variables=args.variables,
            rows=args.rows,
            time=args.time,
            storage_options=parse_storage_options(args.storage_options),
            **options,
        )
    except SelectionError as err:
        named = " with ".join(f"--{o} {slice_text(getattr(args, o), o)}" for o in err.options)
        reason = one_line(ValueError(err.reason))
        raise UsageError(f"{named} {reason}" if reason.startswith("select") else f"{named}: {reason}") from None


def slice_text(s: slice, option: str = "rows") -> str:
    """``slice(5, 2)`` as the user wrote it: ``5:2`` (times holding colons as ``START/STOP``)."""
    start, stop = ("" if v is None else str(v) for v in (s.start, s.stop))
    sep = "/" if option == "time" and ":" in start + stop else ":"
    return f"{start}{sep}{stop}"


def archive_span(args, X) -> tuple[int, int] | None:
    """``[start, stop)``: the positions in the whole archive of the rows ``X`` selected by ``--rows``
    and ``--time``; None when they are not one run of rows.

    ``--time`` is mapped to positions as xarray selects labels: from the first row holding the first
    label selected to the last holding the last, so a label repeated across rows (a sorted time
    coordinate with repeats) counts all of them.  None only where the labels repeat out of order.
    """
    n = X.shape[0]
    if args.rows is None and args.time is None:
        return 0, n
    whole_args = argparse.Namespace(**{**vars(args), "rows": None, "time": None})
    whole = open_archive_for(whole_args, row_index=args.time is not None)
    if args.time is None:
        start, stop, _ = args.rows.indices(whole.shape[0])
        return (start, stop) if stop - start == n else None
    row = X.dims[0]
    index, chosen, base = whole.indexes[row], X.indexes[row], 0
    if args.rows is not None:  # --rows, then --time within the rows it selects (as open_archive does)
        base, last, _ = args.rows.indices(whole.shape[0])
        index = index[base:last]
    try:  # a slice of positions: by get_loc on unique labels, by binary search on sorted ones (repeats too)
        start, stop, step = index.slice_indexer(chosen[0], chosen[-1]).indices(len(index))
    except (KeyError, ValueError, TypeError):
        return None  # labels repeated out of order: their positions are not one run
    if step != 1 or stop - start != n:
        return None
    return base + start, base + stop


def fmt_seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def describe(X) -> str:
    n, p = X.shape
    blocks = len(X.chunks[0]) if hasattr(X, "chunks") and X.chunks else 1
    return f"{n:,} rows x {p} features, {X.dtype}, {blocks} block{'s' * (blocks != 1)}"


def listed(names, limit: int = 8) -> str:
    """``a, b, c`` (the first ``limit``, then how many in all)."""
    names = [str(n) for n in names]
    more = f", ... ({len(names)} in all)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def check_channel_names(model, X, store: str, err=None):
    """``X`` with its channels matched to the model's: by name where both are named, else by position
    with one line on stderr.

    Both named: the same names in another order are taken in the model's
    order (an xarray archive's variables come back sorted, or in the order
    of ``--variables``); other names are refused in one line (a
    :class:`UsageError` naming them).  A model fitted on named channels and
    a store without names, or the other way round: the columns are taken in
    order, by position, and one line on stderr says so (it replaces
    scikit-learn's warning, which names neither the model's channels nor
    the store).

    Returns
    -------
    The archive ``X``, its channels in the model's order.
    """
    import sys
    import warnings

    from .._labels import feature_names_of, is_dataarray

    fitted = getattr(model, "feature_names_in_", None)
    names = feature_names_of(X) if is_dataarray(X) else None
    if fitted is not None and names is not None:
        want, have = [str(n) for n in fitted], [str(n) for n in names]
        if have == want:
            return X
        if sorted(have) != sorted(want):
            missing = [n for n in want if n not in set(have)]
            unseen = [n for n in have if n not in set(want)]
            differ = "; ".join(f"{what} {listed(items)}" for what, items in (
                ("the model's channels it lacks:", missing), ("its channels the model was not fitted on:", unseen))
                if items) or f"its channels {listed(have)} repeat names"
            raise UsageError(f"{store} has other channels than the model ({differ}); the model was fitted on "
                             f"{listed(want)} (--variables selects channels)")
        where = {n: j for j, n in enumerate(have)}
        return X.isel({X.dims[1]: [where[n] for n in want]})  # by name, in the model's order
    if (fitted is None) == (names is None):
        return X  # neither named
    err = sys.stderr if err is None else err
    if fitted is not None:
        line = (f"warning: the model was fitted on named channels ({listed(fitted)}) and {store} has no channel "
                "names: its columns are taken in that order, by position; score a store with those names "
                "(an xarray archive) to have them matched by name")
        warnings.filterwarnings("ignore", message="X does not have valid feature names")
    else:
        line = (f"warning: {store} has named channels ({listed(names)}) and the model was fitted without names: "
                "they are taken in the store's order, by position, which must be the fit's")
        warnings.filterwarnings("ignore", message="X has feature names, but")
    print(f"{PROG}: {line}", file=err, flush=True)
    return X
