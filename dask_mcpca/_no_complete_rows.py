"""Why a fit under ``nan_policy="partial"`` found no row to start from, in the user's terms.

The partial fit starts from the rows with every cell observed.  When there are
none, two archives fail alike and need different remedies: one with a channel
missing in every row (a dead sensor: leave it out), and a wide one with gaps
scattered over all channels, where every row misses a few cells although every
channel is observed in most rows.  :func:`gap_counts` reads the data once more,
on this error path only, to tell them apart; :func:`no_complete_rows_message`
says which it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import dask
import dask.array as da
import numpy as np

__all__ = ["NAMED_CHANNELS", "GapCounts", "gap_counts", "no_complete_rows_message"]

#: At most this many channels are named in the message (the sparsest first).
NAMED_CHANNELS = 3


@dataclass(frozen=True)
class GapCounts:
    """Counts of the cells missing (NaN or inf, as stored) in an array of ``n_rows`` rows.

    Attributes
    ----------
    n_rows : int
    per_channel : ndarray of shape (p,)
        Rows missing each channel.
    per_row : ndarray of shape (p + 1,)
        ``per_row[k]``: rows missing exactly ``k`` cells.
    """

    n_rows: int
    per_channel: np.ndarray
    per_row: np.ndarray


def gap_counts(X) -> GapCounts:
    """The :class:`GapCounts` of ``X`` (numpy or dask, rows x channels): one read."""
    n, p = X.shape
    if isinstance(X, da.Array):
        bad = ~da.isfinite(X)
        per_channel, per_row = dask.compute(bad.sum(axis=0), da.bincount(bad.sum(axis=1), minlength=p + 1))
    else:
        bad = ~np.isfinite(X)
        per_channel, per_row = bad.sum(axis=0), np.bincount(bad.sum(axis=1), minlength=p + 1)
    return GapCounts(int(n), np.asarray(per_channel, np.int64), np.asarray(per_row, np.int64))


def _channel(j: int, names) -> str:
    return f"column {j}" if names is None else f"channel {str(names[j])!r} (column {j})"


def _share(count: int, n: int) -> str:
    return f"{100 * count / n:.1f}%"


def no_complete_rows_message(counts: GapCounts, names=None) -> str:
    """Why no row has every cell observed, and what to do: the dead channels named, or else how many gaps
    the rows hold and the channels with the most (``names``: the channels' names, or None for columns)."""
    n, p = counts.n_rows, len(counts.per_channel)
    start = "no rows left to fit: nan_policy='partial' starts from the rows with every cell observed, and "
    if counts.per_row[p] == n:
        return f"{start}every cell of the {n:,} rows is NaN or inf"
    if counts.per_row[0]:  # the pass read some of the rows only (one operating mode's)
        return (f"{start}none of the rows this fit reads has ({counts.per_row[0]:,} of the data's {n:,} rows "
                "have, but are not among them)")
    dead = np.flatnonzero(counts.per_channel == n)
    if dead.size:
        named = ", ".join(_channel(int(j), names) for j in dead[:NAMED_CHANNELS])
        more = f" and {dead.size - NAMED_CHANNELS} more" if dead.size > NAMED_CHANNELS else ""
        verb = "is" if dead.size == 1 else "are"
        return (f"{start}{named}{more} {verb} NaN or inf in every one of the {n:,} rows, so a channel missing "
                f"in every row cannot be fitted: leave {'it' if dead.size == 1 else 'them'} out")
    below = np.cumsum(counts.per_row)  # below[k]: rows missing at most k cells
    fewest = int(np.argmax(below > 0))
    median = (np.searchsorted(below, (n - 1) // 2, side="right") + np.searchsorted(below, n // 2, side="right")) / 2
    order = np.argsort(-counts.per_channel, kind="stable")[:NAMED_CHANNELS]
    sparsest = ", ".join(f"{_channel(int(j), names)}: {_share(int(counts.per_channel[j]), n)} of the rows"
                         for j in order)
    every = (f"; {counts.per_row[p]:,} of them in every cell" if counts.per_row[p] else "")
    return (f"{start}none has: each of the {n:,} rows misses some of its {p} cells (NaN or inf; "
            f"{fewest} at the fewest, {median:g} on the median{every}), though no channel is missing in every "
            f"row (each in {_share(int(counts.per_channel.min()), n)} to "
            f"{_share(int(counts.per_channel.max()), n)} of the rows). The partial fit needs complete rows to "
            f"start from: leave out the channels with the most gaps ({sparsest}) until enough rows are "
            "complete, or fill the gaps before the fit")
