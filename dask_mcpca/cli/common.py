"""What the commands share: the archive and model a command names, its storage options, the one-line error.

``STORE`` with ``--dataset``, ``--variables``, ``--rows`` and ``--time`` is opened
here once (:class:`Archive`, over :class:`dask_mcpca._archive.OpenedArchive`):
a command that needs other rows of it (``update``: the whole archive and the
new rows) selects them from the same opening.  ``--model`` is read once
(:func:`load_model`: the model and its file's SHA-256).  A usage error is an
:class:`UsageError`, which :func:`main` reports as one line with exit status 2.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "PROG", "UsageError", "one_line", "parse_storage_options", "store_root", "Archive", "finite_context",
    "rows_after", "open_archive_for",
    "load_model", "slice_text", "fmt_seconds", "describe", "listed", "check_channel_names", "Stdout",
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


@dataclass(frozen=True)
class Archive:
    """The archive a command names, opened once, and the rows it selects.

    Attributes
    ----------
    store : str
        ``STORE`` as given on the command line.
    X : xarray.DataArray or dask.array.Array
        The rows selected (``--rows``, ``--time``; all without them), lazy, in full-row
        blocks (``X.chunks``); a DataArray carries the channel names and the time coordinate.
    span : tuple of int or None
        ``[start, stop)``: their positions in the whole archive; None where they are not one
        run of rows (time labels repeated out of order).
    n_all : int
        The rows of the whole archive.
    selection : str
        The selection as the user wrote it (``--rows 0:10 --time A/B``); empty for all rows.
    """

    store: str
    X: Any
    span: tuple[int, int] | None
    n_all: int
    selection: str
    opened: Any  # the dask_mcpca._archive.OpenedArchive the rows come from
    block_values: int | None = None

    def select(self, rows: slice | None = None, time: slice | None = None) -> Archive:
        """Other rows of the same archive, without opening it again (:meth:`OpenedArchive.select`)."""
        chosen = " ".join(f"--{o} {slice_text(s, o)}" for o, s in (("rows", rows), ("time", time)) if s is not None)
        with _usage_errors(rows, time):
            got = self.opened.select(rows, time, block_values=self.block_values)
        return replace(self, X=got.X, span=got.span, n_all=got.n_all, selection=chosen)

    @property
    def lead(self) -> int:
        """How many rows before the selection a full score reads too: at most
        :data:`dask_mcpca._model.CONTEXT_ROWS`, fewer near the archive's start, none for a selection from
        row 0 or one that is not one run of rows.

        A stuck run and ``top_channel``'s held-cell rule read the rows in order (:func:`dask_mcpca._model.row_outputs`):
        a selection scored without the rows before it would judge its first rows as the archive's first;
        ``score --append`` reads them too, so ``--rows N:``, ``--time`` and ``--append`` agree row for row."""
        from .._model import CONTEXT_ROWS

        return 0 if self.span is None else min(self.span[0], CONTEXT_ROWS)

    def context(self, model):
        """The :attr:`lead` rows before the selection, channels in the model's order (:func:`check_channel_names`,
        which has spoken for the selection already), cut as :func:`finite_context` cuts them; None where there
        are none."""
        import io

        if not self.lead:
            return None
        rows = self.select(rows=slice(self.span[0] - self.lead, self.span[0])).X
        rows, lead = finite_context(model, check_channel_names(model, rows, self.store, err=io.StringIO()),
                                    self.lead)
        return rows if lead else None

    def with_context(self, model):
        """``(whole, lead)``: ``X`` after the :attr:`lead` rows before it, read as one selection (their shared
        blocks are read once), channels in the model's order (:func:`check_channel_names`, which has spoken for
        the selection already), and how many rows before ``X`` it holds: the context cut as
        :func:`finite_context` cuts it (as :meth:`context`)."""
        import io

        if not self.lead:
            return check_channel_names(model, self.X, self.store, err=io.StringIO()), 0
        whole = self.select(rows=slice(self.span[0] - self.lead, self.span[1])).X
        return finite_context(model, check_channel_names(model, whole, self.store, err=io.StringIO()), self.lead)

    def with_rows(self, X) -> Archive:
        """The same rows as ``X`` (the channels reordered or the rows cut by the command)."""
        return replace(self, X=X)


def rows_after(a, lead: int):
    """The rows of the dask array or DataArray ``a`` after its first ``lead``."""
    if not lead:
        return a
    return a.isel({a.dims[0]: slice(lead, None)}) if hasattr(a, "isel") else a[lead:]


def finite_context(model, X, lead: int):
    """``X`` and ``lead`` (its first rows, the context before the rows scored) with the context cut after its
    last row holding NaN or inf where the model was fitted with ``nan_policy='raise'``: the rows scored are the
    user's to clean, not the rows before them (``score --rows 5501:`` leaves out a NaN row 5500), and a
    stuck run that such a row interrupts is judged from the rows after it.  Reads the context (at most
    :data:`dask_mcpca._model.CONTEXT_ROWS` rows: a chunk or two) once more, only then.  The one cut of
    ``score --rows N:`` and ``report --rows N:`` (:meth:`Archive.context`, :meth:`Archive.with_context`), so
    that they flag the same rows; ``score --append`` needs none (its context rows were scored by the same
    model, so under 'raise' they hold no NaN or inf)."""
    import numpy as np

    if not lead or getattr(model, "nan_policy", "raise") != "raise":
        return X, lead
    rows = np.asarray(_head(X, lead))
    bad = np.flatnonzero(~np.isfinite(rows).all(axis=1)) if rows.dtype.kind in "fc" else []
    if not len(bad):
        return X, lead
    return rows_after(X, int(bad[-1]) + 1), lead - int(bad[-1]) - 1


def _head(a, n: int):
    """The first ``n`` rows of the dask array or DataArray ``a``, computed."""
    part = a.isel({a.dims[0]: slice(0, n)}).data if hasattr(a, "isel") else a[:n]
    return part.compute() if hasattr(part, "compute") else part


def open_archive_for(args, *, block_values: int | None = None, row_index: bool = True,
                     select: bool = True) -> Archive:
    """The archive ``args`` name, opened once: the rows ``--rows`` and ``--time`` select (all rows with
    ``select=False``, for a command that selects later, :meth:`Archive.select`).

    ``block_values``: the values of one dask block; ``row_index``: build the row coordinate's index
    (needed by ``--time``; built whatever it says when ``--time`` is given).
    """
    from .._archive import OpenedArchive

    rows, time = (args.rows, args.time) if select else (None, None)
    with _usage_errors(rows, time):
        opened = OpenedArchive(args.store, dataset=args.dataset, variables=args.variables,
                               storage_options=parse_storage_options(args.storage_options),
                               row_index=row_index or args.time is not None)
    return Archive(args.store, None, None, 0, "", opened, block_values).select(rows, time)


@contextmanager
def _usage_errors(rows, time):
    """A :class:`dask_mcpca.SelectionError` of ``rows``/``time`` as the user's usage error, naming the options."""
    from .._exceptions import SelectionError

    try:
        yield
    except SelectionError as err:
        given = {"rows": rows, "time": time}
        named = " with ".join(f"--{o} {slice_text(given[o], o)}" for o in err.options)
        reason = one_line(ValueError(err.reason))
        raise UsageError(f"{named} {reason}" if reason.startswith("select") else f"{named}: {reason}") from None


def load_model(path: str, options: dict | None):
    """The model file ``--model`` read once: the model and its file's SHA-256 (hex), as a score
    store's segments and ``report``'s header name it.  Loaded with single-threaded BLAS: the file's
    p x p checks (three eigendecompositions at p = 300) took 0.75-3.4 s instead of 0.25 s with
    OpenBLAS's threads spinning against a busy core."""
    from .._estimator import MCPCA
    from .._passes import single_threaded_blas
    from .._persist import load_with_digest

    with single_threaded_blas():
        return load_with_digest(path, MCPCA, storage_options=options)


def slice_text(s: slice, option: str = "rows") -> str:
    """``slice(5, 2)`` as the user wrote it: ``5:2`` (times holding colons as ``START/STOP``)."""
    start, stop = ("" if v is None else str(v) for v in (s.start, s.stop))
    sep = "/" if option == "time" and ":" in start + stop else ":"
    return f"{start}{sep}{stop}"


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


class Stdout:
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
