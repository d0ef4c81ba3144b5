"""Review 6 of ``dask-mcpca report``: its numbers against the Python API and the construction.

- a sensor stuck after the fit: the report's flagged rows are :meth:`MCPCA.is_outlier`'s, row for row,
  whatever the chunking (the stuck-run rule reads the rows before each block);
"""

from __future__ import annotations

import io

import dask.array as da
import numpy as np
import pandas as pd
import pytest

from dask_mcpca import MCPCA
from dask_mcpca import _report as report


def _flagged_rows(events_csv: str, n: int) -> np.ndarray:
    """The rows the events CSV (``max_gap=0``, every event) marks flagged: each event's rows are one run."""
    flags = np.zeros(n, bool)
    for start, stop, rows, flagged in pd.read_csv(io.StringIO(events_csv))[
            ["start_row", "stop_row", "rows", "flagged_rows"]].itertuples(index=False):
        assert rows == flagged == stop - start  # max_gap=0: an event is a run of flagged rows
        flags[start:stop] = True
    return flags


@pytest.fixture(scope="module")
def stuck_after_fit():
    """Rows of 5 correlated channels; a model fitted on the first 5,000; channel 2 held at one value on
    rows 6,000-6,299, after the fit (the review's construction)."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(8_000, 5)) @ rng.normal(size=(5, 5))
    model = MCPCA(n_components=3).fit(X[:5_000])
    Y = X.copy()
    Y[6_000:6_300, 2] = Y[6_000, 2]
    return model, Y


@pytest.mark.parametrize("chunk", [None, 500, 5_000, 1_000])
def test_stuck_sensor_after_the_fit_flags_is_outliers_rows(stuck_after_fit, chunk):
    model, Y = stuck_after_fit
    expected = np.asarray(model.is_outlier(Y))
    assert expected[6_000:6_300].sum() >= 290  # the stuck-run rule flags the stretch from its tenth row on
    X = Y if chunk is None else da.from_array(Y, chunks=(chunk, 5))
    f = io.StringIO()
    s = report.summarize(model, X, events=f, max_events=0)
    got = _flagged_rows(f.getvalue(), len(Y))
    np.testing.assert_array_equal(got, expected)
    assert s.n_flagged == expected.sum()
