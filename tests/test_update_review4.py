"""``partial_fit`` / ``dask-mcpca update`` of review 4 of 2026-11-28: a ``center="mean"`` model's centre
follows the rows seen, and an update with no usable rows is a no-op that warns.

Expected values come from plain numpy (the mean of every row), from ``fit`` on all the rows
(within docs/monitoring.md's 1.1 % in variance) and from the model as it was before the call.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import zarr

from dask_mcpca import MCPCA, NonFiniteRowsError, NoUsableRowsWarning, load
from dask_mcpca.cli import main

#: docs/monitoring.md: appended chunks give ``fit`` on all the rows within 1.1 % in variance.
VARIANCE_RTOL = 0.011


def _drifting(n: int = 6000, seed: int = 2) -> np.ndarray:
    """Gaussian rows (sd 3, 1, 0.5) whose second half is shifted by half an sd on channel 0."""
    X = np.random.default_rng(seed).standard_normal((n, 3)) * [3.0, 1.0, 0.5]
    X[n // 2:, 0] += 1.5
    return X


def test_center_mean_update_takes_the_plain_mean_of_every_row():
    # before: mean_ stayed the first half's mean (0.70 off on channel 0) and the covariance was taken
    # about it (variance 4 % high)
    X = _drifting()
    h = len(X) // 2
    model = MCPCA(center="mean").fit(X[:h])
    for chunk in np.array_split(X[h:], 2):
        model.partial_fit(chunk)
    np.testing.assert_allclose(model.mean_, X.mean(axis=0), rtol=0, atol=1e-9 * 3.0)
    full = MCPCA(center="mean").fit(X)
    np.testing.assert_allclose(model.explained_variance_, full.explained_variance_, rtol=VARIANCE_RTOL)
    assert model.n_samples_seen_ == len(X)


def _all_nan(X):
    return np.full_like(X, np.nan)


def _dead_channel(X):
    X = X.copy()
    X[:, 1] = np.nan
    return X


@pytest.mark.parametrize(("policy", "spoil"), [("omit", _all_nan), ("omit", _dead_channel),
                                               ("partial", _all_nan)])
def test_an_update_with_no_usable_rows_is_a_noop_that_warns(policy, spoil):
    # before: ValueError "no rows left to fit: every row holds NaN or inf" (under "partial": a message
    # about how the fit starts), raised again at every update of a monitoring loop
    X = np.random.default_rng(3).standard_normal((3000, 3)) * [3.0, 1.0, 0.5]
    model = MCPCA(nan_policy=policy).fit(X[:2000])
    before = copy.deepcopy(vars(model))
    before_ids = dict(vars(model))
    with pytest.warns(NoUsableRowsWarning, match="none of the 200 new rows can be used"):
        model.partial_fit(spoil(X[2000:2200]))
    assert vars(model).keys() == before.keys()
    for name, value in before.items():
        if isinstance(value, (np.ndarray, int, float, str)):
            np.testing.assert_array_equal(vars(model)[name], value, err_msg=name)
        else:
            assert vars(model)[name] is before_ids[name], name
    with warnings.catch_warnings():  # the next rows with readings update it as usual
        warnings.simplefilter("error", NoUsableRowsWarning)
        model.partial_fit(X[2200:])
    assert model.n_samples_seen_ == 2800 and model.n_samples_ == 800  # the 200 unusable rows not counted


def test_no_usable_rows_under_raise_still_raises():
    X = np.random.default_rng(3).standard_normal((2100, 3))
    model = MCPCA().fit(X[:2000])
    with pytest.raises(NonFiniteRowsError):
        model.partial_fit(_all_nan(X[2000:]))


def test_cli_update_with_no_usable_rows_keeps_the_model_file(tmp_path, capsys):
    X = np.random.default_rng(4).standard_normal((4000, 3)) * [3.0, 1.0, 0.5]
    X[3000:] = np.nan  # the logger offline since the fit
    z = zarr.create_array(str(tmp_path / "a.zarr"), shape=X.shape, chunks=(1000, 3), dtype=X.dtype)
    z[:] = X
    store, model = str(tmp_path / "a.zarr"), tmp_path / "m.json"
    assert main(["fit", store, "--rows", ":3000", "--nan-policy", "omit", "-o", str(model), "--no-progress"]) == 0
    before = model.read_bytes()
    capsys.readouterr()
    with pytest.warns(NoUsableRowsWarning):
        rc = main(["update", store, "-m", str(model), "--no-progress"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "no usable rows in rows 3,000:4,000" in out and "left as it is" in out
    assert model.read_bytes() == before
    assert load(model).archive_rows_.tolist() == [[0, 3000]]


@pytest.mark.parametrize("name", ["rep.html", "rep.svg", "rep"])
def test_report_refuses_an_output_named_for_another_format(tmp_path, capsys, name):
    # before: PNG bytes were written into rep.html, exit 0
    X = np.random.default_rng(5).standard_normal((600, 3))
    z = zarr.create_array(str(tmp_path / "a.zarr"), shape=X.shape, chunks=(300, 3), dtype=X.dtype)
    z[:] = X
    model = tmp_path / "m.json"
    MCPCA().fit(X).save(model)
    capsys.readouterr()
    rc = main(["report", str(tmp_path / "a.zarr"), "-m", str(model), "-o", str(tmp_path / name), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "PNG" in err and ".png" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / name).exists() and not (tmp_path / "rep.csv").exists()
