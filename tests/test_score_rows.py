"""``MCPCA.score_rows`` and ``dask-mcpca score --outputs``: chosen outputs from one function per block.

Every output of ``score_rows`` must equal the method it is named after, for
every input kind and NaN policy; ``top_channel`` is checked against a plain
numpy reimplementation of the reconstruction contributions,
``c_j = (P y)_j^2 / P_jj`` (Alcala and Qin 2009) with ``P`` the model's
precision.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

from dask_mcpca import MCPCA
from dask_mcpca.cli import main

N, P = 4_000, 4
POLICIES = ("raise", "omit", "partial")
KINDS = ("numpy", "dask", "xarray", "pandas")
METHODS = {"scores": "transform", "weight": "score_samples", "outlier": "is_outlier", "d2": "mahalanobis",
           "contributions": "channel_contributions", "n_observed": "n_observed"}


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(3).normal(size=(N, P)) * [3.0, 1.0, 0.5, 0.2]


def _as(kind: str, X: np.ndarray):
    if kind == "dask":
        return da.from_array(X, chunks=(700, P))
    if kind == "xarray":
        return xr.DataArray(X, dims=("time", "channel")).chunk(time=700)
    if kind == "pandas":
        return pd.DataFrame(X)
    return X


def _top_channel(model: MCPCA, X: np.ndarray) -> np.ndarray:
    """The reconstruction contributions' argmax, computed here from the precision; -1 for a row with no finite one."""
    Prec = np.linalg.inv(model.get_covariance())
    c = ((X - model.mean_) @ Prec) ** 2 / np.diag(Prec)
    top = np.argmax(np.where(np.isfinite(c), c, -np.inf), axis=1)
    return np.where(np.isfinite(c).any(axis=1), top, -1)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("policy", POLICIES)
def test_every_output_equals_its_method(data, policy, kind):
    model = MCPCA(nan_policy=policy).fit(data)
    X = data.copy()
    if policy != "raise":
        X[5, 1], X[7], X[9, 0] = np.nan, np.nan, np.inf
    rows = model.score_rows(_as(kind, X), outputs=(*METHODS, "top_channel"))
    for name, method in METHODS.items():
        got, expected = np.asarray(rows[name]), np.asarray(getattr(model, method)(_as(kind, X)))
        assert got.dtype == expected.dtype, name
        assert np.array_equal(got, expected, equal_nan=got.dtype.kind == "f"), name
    assert type(rows["d2"]) is type(model.mahalanobis(_as(kind, X)))
    clean = np.isfinite(X).all(axis=1)
    top = np.asarray(rows["top_channel"])
    assert top.dtype == np.int16
    np.testing.assert_array_equal(top[clean], _top_channel(model, X[clean]))


def test_a_bad_output_name_is_refused(data):
    with pytest.raises(ValueError, match="expected names from"):
        MCPCA().fit(data).score_rows(data, outputs=("d2", "d3"))


def test_score_writes_the_chosen_outputs(data, tmp_path, capsys):
    X = data.copy()
    X[100] += 50 * np.array([0, 0, 1.0, 0])  # a fault on channel 2
    store = str(tmp_path / "a.zarr")
    zarr.create_array(store, shape=X.shape, chunks=(500, P), dtype=X.dtype)[:] = X
    model = MCPCA().fit(data)
    model.save(tmp_path / "m.json")
    out = tmp_path / "s.zarr"
    # the defaults: the 'monitoring' outputs in float32
    assert main(["score", store, "-m", str(tmp_path / "m.json"), "-o", str(out), "--no-progress"]) == 0
    assert "d2 (4,000), outlier (4,000), top_channel (4,000), n_observed (4,000) in float32" in capsys.readouterr().out
    g = zarr.open_group(str(out), mode="r")
    assert sorted(g.array_keys()) == ["d2", "n_observed", "outlier", "top_channel"]
    assert g.attrs["outputs"] == ["d2", "outlier", "top_channel", "n_observed"] and g.attrs["dtype"] == "float32"
    assert g["d2"].dtype == np.float32 and g["top_channel"].dtype == np.int16
    np.testing.assert_array_equal(g["d2"][:], model.mahalanobis(X).astype(np.float32))
    np.testing.assert_array_equal(g["outlier"][:], model.is_outlier(X))
    np.testing.assert_array_equal(g["top_channel"][:], _top_channel(model, X))
    assert g["top_channel"][100] == 2 and g["outlier"][100]


def test_an_unknown_output_is_one_line(data, tmp_path, capsys):
    store = str(tmp_path / "a.zarr")
    zarr.create_array(store, shape=data.shape, chunks=(500, P), dtype=data.dtype)[:] = data
    with pytest.raises(SystemExit) as exit_:
        main(["score", store, "-m", "m.json", "-o", str(tmp_path / "s.zarr"), "--outputs", "d2,top"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown output(s) top" in err[0]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_nonfinite_rows_are_the_rows_a_cell_check_finds(dtype):
    """The rows found by their sums are those ``~isfinite(block).all(axis=1)`` finds, also where a sum of
    finite cells overflows or meets ``inf - inf``."""
    from dask_mcpca._missing import nonfinite_rows

    big = np.finfo(dtype).max
    rng = np.random.default_rng(3)
    X = rng.normal(size=(1000, 5)).astype(dtype)
    X[10] = [big, big, 0, 0, 0]  # finite, its sum overflows
    X[11, 2] = np.nan
    X[12, [0, 4]] = [np.inf, -np.inf]  # the sum is NaN, not a NaN cell
    X[13, 1] = -np.inf
    X[14] = [big, -big, big, -big, 1.0]  # finite, a sum that may overflow on the way
    X[15] = np.nan
    cells = ~np.isfinite(X)
    np.testing.assert_array_equal(nonfinite_rows(X), np.flatnonzero(cells.any(axis=1)))
    np.testing.assert_array_equal(nonfinite_rows(X, nan_only=True), np.flatnonzero(np.isnan(X).any(axis=1)))
    assert nonfinite_rows(X[:10]).size == 0


@pytest.mark.parametrize("shared", [False, True], ids=["own float32 product", "shift rule's float64 product"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_top_channel_from_a_product_is_the_loops(dtype, shared):
    """``top_channel`` ranked from one product is the channel the compiled float64 loop ranks first, row for row:
    a float32 product of its own (``_ranking.top_by_product``) or the float64 product the shift rule makes
    anyway (``_ranking.top_from_product``, given as ``product=`` times ``2^FIXED_POINT``).  On rows in units far
    from 1, on near ties that the product cannot resolve (handed back to the loop), on the centre itself and on
    rows too far out for float32."""
    from dask_mcpca import _compiled, _distances, _precision, _ranking, _shift

    rng = np.random.default_rng(11)
    p = 40
    X = rng.normal(size=(3000, p)) @ rng.normal(size=(p, p)) * np.geomspace(1e3, 1e-2, p) + 7e4
    model = MCPCA().fit(X)
    rows = rng.normal(size=(2000, p)) * X.std(axis=0) * 2 + model.mean_
    M = _ranking.top_matrix_of(model)
    lam, noise, unit = _precision.working_unit(model)
    tie = np.zeros((50, p))
    tie[:, 3] = tie[:, 17] = 5.0
    tie[:, 20:] = rng.normal(size=(50, p - 20)) * 0.1
    rows[:50] = model.mean_ + np.linalg.solve(M.T, tie.T).T * np.ldexp(1.0, unit)  # (y M)_3 = (y M)_17 to 1e-15
    rows[50] = model.mean_  # every contribution 0 (in float64)
    rows[51] = model.mean_ + 1e30 * X.std(axis=0)  # beyond the float32 product's range
    rows = rows.astype(dtype)
    complete = np.ascontiguousarray(rows.astype(np.float64) if dtype == np.float64 else rows)
    want_d2, want_top = np.empty(len(rows)), np.empty(len(rows), np.int16)
    _compiled.row_distances(complete, model.mean_, float(np.ldexp(1.0, -unit)), np.ascontiguousarray(model.components_),
                            1.0 / np.ldexp(lam, -2 * unit), 0.0, M, want_d2, want_top)
    # the product as the shift rule makes it: (y M) 2^FIXED_POINT, y about mean_ in float64
    product = ((complete.astype(np.float64) - model.mean_) @ np.ldexp(M, _shift.FIXED_POINT)) if shared else None
    if shared:
        np.testing.assert_array_equal(product, _shift.residual_product(model, rows, M))
        _, unsure = _ranking.top_from_product(complete, model.mean_, unit, M, product, _shift.FIXED_POINT)
        # ties and the centre (float64 reaches 1e30 x the spread); rounded to float32 they are ties no more
        vouched_against = set(range(51)) if dtype == np.float64 else set()
    else:
        _, unsure = _ranking.top_by_product(complete, model.mean_, unit, M)
        vouched_against = {*range(50), 51} | ({50} if dtype == np.float64 else set())  # float32's mean_ is off centre
    assert vouched_against <= set(unsure.tolist()) and len(unsure) < 0.5 * len(rows)
    if shared:
        assert 51 not in unsure and len(unsure) < 60  # far tighter than float32's bound
    d2, top = _distances.distances_and_top(model, rows, top=True, product=product, product_exp=_shift.FIXED_POINT)
    finite = ~np.isnan(want_d2)
    np.testing.assert_array_equal(top[finite], want_top[finite])
    assert d2[finite].tobytes() == want_d2[finite].tobytes()
    clear = np.setdiff1d(np.flatnonzero(finite), unsure)  # the plain definition, where no tie is near
    Y = rows[clear].astype(np.float64) - model.mean_
    np.testing.assert_array_equal(top[clear], np.argmax((Y @ M) ** 2, axis=1))
