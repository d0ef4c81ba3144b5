"""nan_policy='partial' with no row whose every cell is observed: the refusal says which of two cases it is.

A dead channel (missing in every row) is named and left out; a wide archive whose gaps are scattered over
every channel (each observed in most rows, yet every row missing a few cells) used to be told "every row
holds NaN or inf ... a channel missing in every row cannot be fitted", which was not so (review 3).
Expected figures come from the construction of each array.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pandas as pd
import pytest

from dask_mcpca import MCPCA

N, P = 1200, 120


def _scattered() -> np.ndarray:
    """Row i misses column i % 120 (each channel in 10 rows); column 99 also misses rows 0..59, column 50
    rows 100..139, column 7 rows 200..229 (no row among them misses that column already): so 70, 50 and
    40 rows, 130 rows with two gaps and 1,070 with one, and no row complete."""
    X = np.random.default_rng(0).normal(size=(N, P))
    X[np.arange(N), np.arange(N) % P] = np.nan
    X[0:60, 99] = X[100:140, 50] = X[200:230, 7] = np.nan
    return X


def _refusal(X) -> str:
    with pytest.raises(ValueError, match="no rows left to fit") as err:
        MCPCA(nan_policy="partial").fit(X)
    return str(err.value)


@pytest.mark.parametrize("kind", ["numpy", "dask"])
def test_gaps_in_every_row_are_told_apart_from_a_dead_channel(kind):
    X = _scattered()
    message = _refusal(X if kind == "numpy" else da.from_array(X, chunks=(250, P)))
    assert "every row holds NaN" not in message and "a channel missing in every row" not in message
    assert "each of the 1,200 rows misses some of its 120 cells" in message
    assert "1 at the fewest, 1 on the median" in message
    assert "no channel is missing in every row (each in 0.8% to 5.8% of the rows)" in message  # 10/1200, 70/1200
    assert ("leave out the channels with the most gaps (column 99: 5.8% of the rows, column 50: 4.2% of the "
            "rows, column 7: 3.3% of the rows)") in message


def test_the_sparsest_channels_are_named_by_name():
    X = pd.DataFrame(_scattered(), columns=[f"sensor{j:03d}" for j in range(P)])
    message = _refusal(X)
    assert "channel 'sensor099' (column 99): 5.8% of the rows, channel 'sensor050' (column 50)" in message


def test_the_reviewers_wide_archive_with_ten_percent_of_cells_missing():
    """p=120, each cell missing with probability 0.1: a row is complete with probability 0.9**120 (3e-6)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, P))
    X[rng.random(X.shape) < 0.1] = np.nan
    missing = np.isnan(X).sum(axis=0)
    assert np.isnan(X).any(axis=1).all() and missing.max() < 2000
    message = _refusal(X)
    assert "no channel is missing in every row" in message and "every row holds NaN" not in message
    assert f"(column {int(np.argmax(missing))}: {100 * missing.max() / 2000:.1f}% of the rows" in message


def test_a_dead_channel_is_named():
    X = pd.DataFrame(np.random.default_rng(1).normal(size=(300, 5)), columns=list("abcde"))
    X["d"] = np.nan
    X.iloc[::7, 0] = np.nan  # gaps elsewhere too: the dead channel is what leaves no row complete
    message = _refusal(X)
    assert "channel 'd' (column 3) is NaN or inf in every one of the 300 rows" in message
    assert "a channel missing in every row cannot be fitted: leave it out" in message and "'a'" not in message


def test_two_dead_channels_are_named_by_column():
    X = np.random.default_rng(2).normal(size=(300, 5))
    X[:, [1, 4]] = np.inf
    assert "column 1, column 4 are NaN or inf in every one of the 300 rows" in _refusal(X)


def test_the_omit_message_is_unchanged():
    X = _scattered()
    with pytest.raises(ValueError, match="^no rows left to fit: every row holds NaN or inf$"):
        MCPCA(nan_policy="omit").fit(X)


def test_every_cell_missing_says_so():
    assert _refusal(np.full((50, 3), np.nan)).endswith("and every cell of the 50 rows is NaN or inf")


def test_rows_read_without_the_complete_ones_are_not_called_the_data():
    """A pass over some rows only (one operating mode's) with the complete rows elsewhere: the message
    does not describe the whole array as gappy."""
    from dask_mcpca._no_complete_rows import gap_counts, no_complete_rows_message

    X = _scattered()
    X[-3:] = 1.0  # three complete rows
    message = no_complete_rows_message(gap_counts(X))
    assert message.endswith("none of the rows this fit reads has (3 of the data's 1,200 rows have, but are not "
                            "among them)")
