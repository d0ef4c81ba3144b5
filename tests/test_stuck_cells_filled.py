"""A cellwise model fills and completes a stuck sensor's cells, the cells :meth:`MCPCA.cell_outliers` flags
(review 6 of 2026-11-28, point 2): ``impute`` filled 24 of 54 flagged cells of a stuck run, ``transform`` used
the stuck readings in 30 rows.  Expected values from the documented rule, computed here with numpy: each
flagged or missing cell replaced by ``mean_M + S_MO S_OO^-1 (x_O - mean_O)`` (``S`` = ``get_covariance``), the
scores those of the completed row; the stuck cells those of the documented stuck run (``STUCK_RUN`` rows
holding one value)."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from dask_mcpca import MCPCA
from dask_mcpca._stuck import STUCK_RUN


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(0)
    n, p = 3_000, 6
    X = rng.normal(size=(n + 300, 2)) @ rng.normal(size=(2, p)) + 0.3 * rng.normal(size=(n + 300, p))
    model = MCPCA(cellwise=True, nan_policy="omit", random_state=0).fit(X[:n])
    Y = X[n:].copy()
    Y[100:160, 3] = Y[100, 3]  # channel 3 stuck for 60 rows at an ordinary reading
    Y[200, 1] = np.nan
    return model, Y


def _completed(model, Y, gaps):
    """Each row's ``gaps`` replaced by their conditional expectation given its other cells (numpy)."""
    S, mu = model.get_covariance(), model.mean_
    out = Y.copy()
    for i in np.flatnonzero(gaps.any(axis=1)):
        m, o = gaps[i], ~gaps[i]
        out[i, m] = mu[m] + S[np.ix_(m, o)] @ np.linalg.solve(S[np.ix_(o, o)], Y[i, o] - mu[o])
    return out


@pytest.mark.parametrize("lazy", [False, True])
def test_impute_and_transform_complete_a_stuck_sensors_cells(case, lazy):
    model, Y = case
    rows = da.from_array(Y, chunks=(130, -1)) if lazy else Y  # a block ends inside the run
    flags = np.asarray(model.cell_outliers(rows))
    assert flags[100 + STUCK_RUN - 1:160, 3].all()  # the documented stuck run
    gaps = flags | np.isnan(Y)
    expected = _completed(model, Y, gaps)
    np.testing.assert_allclose(np.asarray(model.impute(rows)), expected, rtol=1e-9, atol=1e-9)
    scores = (expected - model.mean_) @ model.components_.T
    np.testing.assert_allclose(np.asarray(model.transform(Y if not lazy else rows))[~np.isnan(Y).any(axis=1)],
                               scores[~np.isnan(Y).any(axis=1)], rtol=1e-9, atol=1e-9)
    got = np.asarray(model.score_rows(rows, outputs=("scores",))["scores"])
    np.testing.assert_allclose(got[~np.isnan(Y).any(axis=1)], scores[~np.isnan(Y).any(axis=1)], rtol=1e-9,
                               atol=1e-9)


def test_a_model_without_cellwise_projects_the_stuck_readings_as_given(case):
    """Only a cellwise model completes cells: the others' scores are the plain projection."""
    _, Y = case
    rng = np.random.default_rng(1)
    model = MCPCA(random_state=0).fit(rng.normal(size=(2_000, 6)))
    np.testing.assert_allclose(model.transform(Y[90:170]), (Y[90:170] - model.mean_) @ model.components_.T)
    np.testing.assert_array_equal(model.impute(Y[90:170]), Y[90:170])
