"""Saved models: MCPCA.save / dask_mcpca.load round trips, the file format, errors."""

import json
import os

import dask.array as da
import numpy as np
import pytest
from conftest import assert_same_model
from sklearn.exceptions import NotFittedError

import dask_mcpca
from dask_mcpca import MCPCA, load
from dask_mcpca._persist import FORMAT, FORMAT_VERSION

#: (solver, n_components, center): the fits whose models are round-tripped.
VARIANTS = [
    ("auto", None, "robust"),
    ("auto", 2, "mean"),
    ("paper", None, False),  # the paper's last component has sigma = NaN
    ("paper", 2, "robust"),
]


def _data(seed=0, n=1500, p=4):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p)) * np.linspace(3.0, 0.5, p)
    X[: n // 20] = rng.normal(scale=25.0, size=(n // 20, p))
    return X


def _fit(solver, n_components, center, X):
    extra = {"n_decay": 8, "max_iter": 30} if solver == "paper" else {}
    return MCPCA(n_components, solver=solver, center=center, random_state=3, nan_policy="omit", **extra).fit(X)


@pytest.mark.parametrize("solver, n_components, center", VARIANTS)
def test_round_trip_is_exact(tmp_path, solver, n_components, center):
    X = _data()
    model = _fit(solver, n_components, center, X)
    path = tmp_path / "model.json"
    model.save(path)
    loaded = load(path)
    assert isinstance(loaded, MCPCA)
    assert_same_model(model, loaded)

    X_new = _data(seed=1, n=700)
    X_new[5, 1] = np.nan
    for method in ("transform", "score_samples", "is_outlier", "mahalanobis"):
        expected = getattr(model, method)(X_new)
        got = getattr(loaded, method)(X_new)
        assert np.array_equal(expected, got, equal_nan=expected.dtype.kind == "f"), method
        lazy = getattr(loaded, method)(da.from_array(X_new, chunks=(200, X_new.shape[1])))
        assert isinstance(lazy, da.Array)
        assert np.array_equal(lazy.compute(), expected, equal_nan=expected.dtype.kind == "f"), method


def test_nan_sigma_survives_as_strict_json(tmp_path):
    model = _fit("paper", None, False, _data())
    assert np.isnan(model.sigmas_[-1])  # the case this test is about
    path = tmp_path / "m.json"
    model.save(path)

    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name} in the model file")

    document = json.loads(path.read_text(), parse_constant=refuse)
    assert document["attributes"]["sigmas_"]["data"][-1] == "NaN"
    assert np.isnan(load(path).sigmas_[-1])


def test_file_layout_is_the_documented_one(tmp_path):
    model = _fit("auto", 2, "robust", _data())
    path = tmp_path / "m.json"
    dask_mcpca.MCPCA.save(model, path)
    doc = json.loads(path.read_text())
    assert doc["format"] == FORMAT == "dask-mcpca-model"
    assert doc["format_version"] == 1 and FORMAT_VERSION == 3  # no repeated rows nor modes: version 1
    assert doc["library_version"] == dask_mcpca.__version__
    assert doc["class"] == "MCPCA"
    assert doc["params"]["n_components"] == 2 and doc["params"]["center"] == "robust"
    comp = doc["attributes"]["components_"]
    assert comp["shape"] == [2, 4] and np.dtype(comp["dtype"]) == np.float64
    assert np.array_equal(np.array(comp["data"]).reshape(2, 4), model.components_)
    assert doc["attributes"]["n_passes_"] == model.n_passes_
    assert doc["attributes"]["converged_"] is bool(model.converged_)


def test_extra_attribute_dtypes_round_trip(tmp_path):
    model = _fit("auto", None, "robust", _data())
    # What a later version or a subclass might add: names, float32, ints, bools, inf.
    model.feature_names_in_ = np.array(["a", "b", "c", "d"], dtype=object)
    model.extra_f32_ = np.array([[1.5, -np.inf], [np.nan, 3.25]], dtype=np.float32)
    model.extra_i8_ = np.array([-3, 7], dtype=np.int8)
    model.extra_mask_ = np.array([True, False])
    model.extra_inf_ = float("inf")
    model.save(tmp_path / "m.json")
    loaded = load(tmp_path / "m.json")
    assert list(loaded.feature_names_in_) == ["a", "b", "c", "d"]
    assert loaded.extra_f32_.dtype == np.float32
    assert np.array_equal(loaded.extra_f32_, model.extra_f32_, equal_nan=True)
    assert loaded.extra_i8_.dtype == np.int8 and list(loaded.extra_i8_) == [-3, 7]
    assert loaded.extra_mask_.dtype == bool and list(loaded.extra_mask_) == [True, False]
    assert loaded.extra_inf_ == float("inf")


def test_checkpoint_path_is_saved_as_text_and_dropped_on_load(tmp_path):
    """A refit of a loaded model must not resume from a checkpoint path the file names."""
    model = MCPCA(checkpoint=tmp_path / "ck.npz").fit(_data())
    model.save(tmp_path / "m.json")
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["params"]["checkpoint"] == os.fspath(tmp_path / "ck.npz")
    assert load(tmp_path / "m.json").checkpoint is None


def test_save_replaces_atomically_and_a_failed_save_keeps_the_old_file(tmp_path):
    path = tmp_path / "m.json"
    first = _fit("auto", 1, "robust", _data(seed=0))
    second = _fit("auto", 1, "robust", _data(seed=5))
    first.save(path)
    second.save(path)
    assert np.array_equal(load(path).components_, second.components_)
    before = path.read_bytes()
    second.unsupported_ = object()
    with pytest.raises(TypeError, match="unsupported_"):
        second.save(path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["m.json"]  # no temporary left behind


def test_unfitted_model_cannot_be_saved(tmp_path):
    with pytest.raises(NotFittedError):
        MCPCA().save(tmp_path / "m.json")
    assert not (tmp_path / "m.json").exists()


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nowhere" / "model.json"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load(path)


@pytest.mark.parametrize(
    "content, match",
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00binary", "not JSON|not a dask-mcpca model"),
        (b"[1, 2, 3]", "not a dask-mcpca model"),
        (b'{"format": "something-else", "format_version": 1}', "not a dask-mcpca model"),
        (b'{"format": "dask-mcpca-model", "format_version": 99, "class": "MCPCA"}', "version 99"),
        (b'{"format": "dask-mcpca-model", "format_version": 1, "class": "PCA"}', "not an MCPCA"),
        (b'{"format": "dask-mcpca-model", "format_version": 1, "class": "MCPCA", "params": {}}', "damaged"),
        (
            b'{"format": "dask-mcpca-model", "format_version": 1, "class": "MCPCA", '
            b'"params": {"no_such_parameter": 1}, "attributes": {}}',
            "damaged",
        ),
        (b'{"format": "dask-mcpca-model", "format_version": NaN}', "not JSON|non-standard"),
    ],
)
def test_unknown_format_is_refused_naming_the_path(tmp_path, content, match):
    path = tmp_path / "weird.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match) as info:
        load(path)
    assert "weird.json" in str(info.value)


def test_a_directory_is_not_a_model(tmp_path):
    with pytest.raises(ValueError, match="directory"):
        load(tmp_path)


def test_repeated_rows_round_trip_and_older_files(tmp_path):
    """A model that found a frozen record flags it after loading; a file written before repeated rows
    existed loads with none; a file whose repeated rows do not fit the features is refused."""
    X = _data(n=3000)
    frozen = np.arange(100, 3000, 40)  # 73 rows, 2.4 %
    X[frozen] = X[1000]  # a clean row
    model = _fit("auto", None, "robust", X)
    np.testing.assert_array_equal(model.repeated_rows_, X[1000:1001])
    path = tmp_path / "m.json"
    model.save(path)
    loaded = load(path)
    assert_same_model(model, loaded)
    assert np.asarray(loaded.is_outlier(X))[frozen].all()

    doc = json.loads(path.read_text())
    assert doc["format_version"] == 2  # a version-1 reader must refuse it, not drop the rows silently
    del doc["attributes"]["repeated_rows_"]
    doc["format_version"] = 1
    path.write_text(json.dumps(doc))
    older = load(path)
    assert older.repeated_rows_.shape == (0, X.shape[1])

    doc["attributes"]["repeated_rows_"] = {"dtype": "<f8", "shape": [1, 2], "data": [1.0, 2.0]}
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"repeated_rows_ must be a finite float array of shape \(m, 4\)"):
        load(path)


def test_a_bad_wait_limit_is_named_when_a_model_url_is_read(monkeypatch):
    """The variable is checked before the read, whose errors a model file's message wraps."""
    monkeypatch.setenv("DASK_MCPCA_WAIT_LIMIT", "abc")
    with pytest.raises(ValueError, match="DASK_MCPCA_WAIT_LIMIT='abc'"):
        load("s3://bucket/model.json")
