"""The rows before a selection (``--rows N:``) cut after a row holding NaN or inf under ``nan_policy='raise'``
(:func:`dask_mcpca.cli.common.finite_context`): ``score`` and ``report`` cut them alike, so they flag the same
rows.  Expected values from the Python API on the numpy array cut where the context is cut (a full score of
the archive from the row after the NaN row)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dask_mcpca import MCPCA
from dask_mcpca.cli import main

P = 6


def _cli(capsys, *args) -> tuple[int, str, str]:
    rc = main([*map(str, args), "--no-progress"])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("nan_at", [1, 3])
def test_report_cuts_the_context_after_a_nan_row_as_score_does(tmp_path, capsys, nan_at):
    """A stuck run crossing row N, a NaN ``nan_at`` rows before it: ``report --rows N:`` judged the run from the
    rows before the NaN row too (41 flagged against score's 37 in the reviewer's case)."""
    import xarray as xr
    import zarr

    rng = np.random.default_rng(0)
    n, cut = 2_000, 1_500
    X = rng.normal(size=(n, 3)) @ rng.normal(size=(3, P)) + 0.3 * rng.normal(size=(n, P)) + 50
    X[cut - 8: cut + 40, 2] = X[cut - 9, 2]  # a stuck run from before the selection into it
    X[cut - nan_at, 4] = np.nan
    zarr.create_array(str(tmp_path / "a.zarr"), shape=X.shape, chunks=(500, P), dtype=X.dtype)[:] = X
    model = MCPCA().fit(X[:1_000])
    model.save(tmp_path / "m.json")
    start = cut - nan_at + 1  # the archive after the NaN row
    expected = np.asarray(model.is_outlier(X[start:]))[cut - start:]
    args = ("-m", tmp_path / "m.json", "--rows", f"{cut}:")
    rc, _, err = _cli(capsys, "score", tmp_path / "a.zarr", *args, "-o", tmp_path / "s.zarr")
    assert rc == 0, err
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "s.zarr").outlier.values, expected)
    rc, out, err = _cli(capsys, "report", tmp_path / "a.zarr", *args, "-o", tmp_path / "r.png")
    assert rc == 0, err
    assert int(re.search(r"([\d,]+) flagged", out).group(1).replace(",", "")) == expected.sum()
