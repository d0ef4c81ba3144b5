"""Monitoring a growing archive (issue 22): ``partial_fit`` and the outlier-detector conventions.

Expected values come from the generated data's known truth (the planted
subspace, the planted outliers), from plain formulas written here (the
quantile of the Mahalanobis distances, ``score - offset``), or from ``fit`` on
all the rows, which an update by appended chunks must reproduce.
"""

from __future__ import annotations

import warnings
from collections import Counter

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest
import xarray as xr

from dask_mcpca import MCPCA, load
from dask_mcpca._persist import ModelFormatError

P = 6
SCALES = np.array([4.0, 2.5, 1.5, 0.6, 0.4, 0.3])


def _rotation(seed: int = 7) -> np.ndarray:
    return np.linalg.qr(np.random.default_rng(seed).normal(size=(P, P)))[0]


def _archive(n: int, *, seed: int = 0, outliers: float = 0.02, rotation=None) -> np.ndarray:
    """Gaussian rows of known principal axes (``rotation``'s columns, variances ``SCALES**2``), a share
    of them replaced by far rows."""
    rng = np.random.default_rng(seed)
    R = _rotation() if rotation is None else rotation
    X = (rng.normal(size=(n, P)) * SCALES) @ R.T + 5.0
    bad = rng.random(n) < outliers
    X[bad] = 5.0 + rng.normal(scale=25.0, size=(int(bad.sum()), P))
    return X


def _largest_angle_deg(A: np.ndarray, B: np.ndarray) -> float:
    """Largest principal angle between the row spaces of A and B (orthonormal rows)."""
    s = np.linalg.svd(A @ B.T, compute_uv=False)
    return float(np.degrees(np.arccos(np.clip(s.min(), -1.0, 1.0))))


def _counted(chunks: list[np.ndarray], reads: Counter, tag: str) -> da.Array:
    """A dask array of ``chunks`` (row blocks) whose every block read is counted in ``reads[(tag, i)]``."""

    def read(i):
        reads[(tag, i)] += 1
        return chunks[i]

    parts = [da.from_delayed(dask.delayed(read, pure=False)(i), shape=c.shape, dtype=c.dtype)
             for i, c in enumerate(chunks)]
    return da.concatenate(parts, axis=0)


# ------------------------------------------------------------------ partial_fit
def test_updates_by_appended_chunks_equal_a_fit_on_all_rows():
    X = _archive(120_000)
    half = len(X) // 2
    model = MCPCA().fit(X[:half])
    for chunk in np.array_split(X[half:], 4):
        model.partial_fit(chunk)
    full = MCPCA().fit(X)
    truth = _rotation()[:, :3].T
    assert _largest_angle_deg(model.components_[:3], full.components_[:3]) < 1.0
    assert _largest_angle_deg(model.components_[:3], truth) < 1.0
    np.testing.assert_allclose(model.explained_variance_, full.explained_variance_, rtol=0.05)
    np.testing.assert_allclose(model.explained_variance_[:3], SCALES[:3] ** 2, rtol=0.05)
    agree = np.mean(model.is_outlier(X) == full.is_outlier(X))
    assert agree >= 0.99
    assert model.n_samples_seen_ == len(X)


def test_an_update_reads_only_the_new_rows_once():
    X = _archive(48_000, seed=1)
    blocks = np.array_split(X, 8)
    reads: Counter = Counter()
    old, new = _counted(blocks[:6], reads, "old"), _counted(blocks[6:], reads, "new")
    with dask.config.set(scheduler="synchronous"):
        model = MCPCA().fit(old)
        reads.clear()
        model.partial_fit(new)
    assert reads == Counter({("new", 0): 1, ("new", 1): 1})  # each new block once, no old block
    assert model.n_passes_ == 1
    assert model.n_samples_ == sum(len(b) for b in blocks[6:])
    assert model.n_samples_seen_ == len(X)


def test_first_call_fits():
    X = _archive(20_000, seed=2)
    a, b = MCPCA().partial_fit(X), MCPCA().fit(X)
    np.testing.assert_array_equal(a.components_, b.components_)
    assert a.n_samples_seen_ == len(X)


def test_the_kept_sums_survive_save_and_load(tmp_path):
    X = _archive(40_000, seed=3)
    model = MCPCA(n_components=3).fit(X[:30_000])
    model.save(tmp_path / "model.json")
    loaded = load(tmp_path / "model.json")
    model.partial_fit(X[30_000:])
    loaded.partial_fit(X[30_000:])
    np.testing.assert_array_equal(loaded.components_, model.components_)
    np.testing.assert_array_equal(loaded.explained_variance_, model.explained_variance_)
    assert loaded.n_samples_seen_ == model.n_samples_seen_ == len(X)


def test_damaged_update_sums_are_refused(tmp_path):
    import json

    model = MCPCA().fit(_archive(5_000, seed=4))
    path = tmp_path / "model.json"
    model.save(path)
    doc = json.loads(path.read_text())
    del doc["attributes"]["update_means_"]
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelFormatError, match="update_means_"):
        load(path)
    doc = json.loads((model.save(path), path.read_text())[1])
    doc["attributes"]["update_radii_"]["data"][1] = -1.0
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelFormatError, match="update_radii_"):
        load(path)


def test_a_new_regime_warns_and_is_not_followed():
    X = _archive(40_000, seed=5, outliers=0.0)
    model = MCPCA().fit(X)
    before = model.components_.copy()
    other = _archive(10_000, seed=6, outliers=0.0, rotation=np.roll(_rotation(), 3, axis=1)) + 30.0
    with pytest.warns(UserWarning, match="most of the 10000 new rows"):
        model.partial_fit(other)
    assert _largest_angle_deg(model.components_[:3], before[:3]) < 0.5
    assert model.is_outlier(other).mean() > 0.9


def test_rows_like_the_fit_do_not_warn():
    X = _archive(30_000, seed=8)
    model = MCPCA().fit(X[:20_000])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.partial_fit(X[20_000:])


def test_fixed_centre_stays_fixed():
    X = _archive(20_000, seed=9, outliers=0.0) - 5.0
    model = MCPCA(center=False).fit(X[:10_000]).partial_fit(X[10_000:])
    np.testing.assert_array_equal(model.mean_, np.zeros(P))
    np.testing.assert_allclose(model.explained_variance_[:3], SCALES[:3] ** 2, rtol=0.06)


def test_partial_fit_refuses_what_it_cannot_update():
    X = _archive(3_000, seed=10)
    with pytest.raises(ValueError, match="keeps no sums"):
        MCPCA(solver="paper", n_decay=2).fit(X).partial_fit(X)
    model = MCPCA().fit(X)
    with pytest.raises(ValueError, match="expecting 6 features"):
        model.partial_fit(X[:, :5])


# ------------------------------------------------------------ outlier detector
def test_predict_and_decision_function_follow_is_outlier():
    X = _archive(20_000, seed=11, outliers=0.0)
    far = 5.0 + np.random.default_rng(12).normal(scale=40.0, size=(200, P))
    Y = np.vstack([X[:2000], far])
    model = MCPCA().fit(np.vstack([X, far]))
    flags, labels, dec = model.is_outlier(Y), model.predict(Y), model.decision_function(Y)
    assert labels.dtype.kind == "i"
    np.testing.assert_array_equal(labels, np.where(flags, -1, 1))
    np.testing.assert_array_equal(dec < 0, flags)
    np.testing.assert_allclose(dec, model.score_samples(Y) - model.offset_)
    assert (labels[2000:] == -1).mean() > 0.99  # the planted rows
    assert (labels[:2000] == 1).mean() > 0.99
    assert model.offset_ == model.outlier_threshold_ and model.threshold_ == model.outlier_cutoff_
    np.testing.assert_array_equal(MCPCA().fit_predict(np.vstack([X, far])), model.predict(np.vstack([X, far])))


def test_contamination_sets_the_alarm_rate_of_the_fitted_rows():
    X = _archive(5_000, seed=13, outliers=0.0)
    model = MCPCA(contamination=0.05).fit(X)
    Y = X - model.mean_
    d2 = np.einsum("ij,jk,ik->i", Y, model.get_precision(), Y)  # the plain Mahalanobis formula
    assert model.outlier_cutoff_ == pytest.approx(np.quantile(d2, 0.95), rel=1e-9)
    assert (model.predict(X) == -1).sum() == round(0.05 * len(X))
    auto = MCPCA().fit(X)
    assert auto.is_outlier(X).mean() < 0.01
    np.testing.assert_array_equal(auto.components_, model.components_)  # the fit itself is unchanged


def test_a_repeated_row_has_a_negative_decision():
    X = _archive(20_000, seed=14, outliers=0.0)
    X[::50] = X[1]  # a frozen logger's record, 2 % of the rows, inside the bulk
    model = MCPCA().fit(X)
    assert len(model.repeated_rows_) == 1
    frozen = X[::50][:5]
    assert model.is_outlier(frozen).all()
    assert (model.decision_function(frozen) < 0).all() and (model.predict(frozen) == -1).all()


def test_pandas_in_pandas_out():
    X = _archive(4_000, seed=15)
    names = [f"plant3_channel_{i}" for i in range(P)]
    index = pd.date_range("2024-01-01", periods=len(X), freq="min")
    frame = pd.DataFrame(X, index=index, columns=names)
    model = MCPCA(n_components=3).fit(frame)
    plain = MCPCA(n_components=3).fit(X)  # numpy in, numpy out: the values to match
    for method in ("score_samples", "mahalanobis", "is_outlier", "predict", "decision_function"):
        out = getattr(model, method)(frame)
        assert isinstance(out, pd.Series), method
        assert out.index.equals(index), method
        np.testing.assert_allclose(out.to_numpy(), getattr(plain, method)(X), rtol=1e-9, atol=1e-12)
    Z = model.transform(frame)
    assert isinstance(Z, pd.DataFrame) and Z.index.equals(index)
    assert list(Z.columns) == list(model.get_feature_names_out())
    np.testing.assert_allclose(Z.to_numpy(), plain.transform(X), rtol=1e-9, atol=1e-9)
    C = model.channel_contributions(frame)
    assert isinstance(C, pd.DataFrame) and C.index.equals(index) and list(C.columns) == names


def test_xarray_in_xarray_out_for_the_new_methods():
    X = _archive(4_000, seed=16)
    arr = xr.DataArray(X, dims=("time", "channel"),
                       coords={"time": pd.date_range("2024-01-01", periods=len(X), freq="min")})
    model = MCPCA().fit(arr)
    for method in ("predict", "decision_function"):
        out = getattr(model, method)(arr)
        assert isinstance(out, xr.DataArray) and out.dims == ("time",)
        np.testing.assert_array_equal(out.values, getattr(model, method)(X))


def test_dask_in_dask_out_for_the_new_methods():
    X = _archive(4_000, seed=17)
    model = MCPCA().fit(X)
    lazy = da.from_array(X, chunks=(1000, P))
    for method in ("predict", "decision_function"):
        out = getattr(model, method)(lazy)
        assert isinstance(out, da.Array)
        np.testing.assert_array_equal(out.compute(), getattr(model, method)(X))
