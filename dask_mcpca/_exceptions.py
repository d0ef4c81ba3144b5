"""The package's public errors and warnings, in one place (all exported by :mod:`dask_mcpca`).

Each is raised by one part of the package (named below) and caught by the
command line, which turns it into one line and an exit status
(``docs/errors.md``).  The command line's own usage error is internal
(:mod:`.cli.common`).
"""

from __future__ import annotations

__all__ = [
    "AppendError",
    "BreakdownWarning",
    "CheckpointMismatchError",
    "ModelFormatError",
    "NoUsableRowsWarning",
    "NonFiniteRowsError",
    "NumericalRangeError",
    "SelectionError",
]


class NonFiniteRowsError(ValueError):
    """Raised when rows hold NaN or inf and ``nan_policy="raise"``."""


class NumericalRangeError(ValueError):
    """A quantity of the fit is not representable in float64 (it overflows or underflows).

    Raised with the pass or the quantity named, instead of an error from
    inside numpy or a non-finite result; the message says what to change.
    """


class CheckpointMismatchError(ValueError):
    """The checkpoint on disk belongs to another fit."""


class ModelFormatError(ValueError):
    """The file is not a model this version of dask-mcpca can read."""


class SelectionError(ValueError):
    """``rows`` or ``time`` of :func:`open_archive` select nothing, or cannot select (``options``: which)."""

    def __init__(self, message: str, options: tuple[str, ...], reason: str | None = None):
        super().__init__(message)
        self.options = options
        self.reason = reason or message  #: what is wrong, without the parameters' Python spelling


class AppendError(ValueError):
    """Rows cannot be appended to this score store (``dask-mcpca score --append``); the message says why,
    in one line."""


class BreakdownWarning(UserWarning):
    """A fit that found no clean majority: its components may be those of the faults.

    Raised as a warning by :meth:`MCPCA.fit` when, under the fitted model,
    half of the row sample or more holds a cell the model cannot explain
    (a row-wise fit then has no majority of clean rows), when a cellwise fit
    left out a quarter of the cells or more, or when fewer than half of the
    rows keep weight in the final step.  The message says what to try.
    """


class NoUsableRowsWarning(UserWarning):
    """``partial_fit`` was given rows of which none can be used (each holds NaN or inf, or under
    ``nan_policy="partial"`` no observed cell): the model is left as it was (a no-op).

    ``dask-mcpca update`` prints it and leaves the model file as it is; the next update reads
    those rows again with the new ones.
    """
