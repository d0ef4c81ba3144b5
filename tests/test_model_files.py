"""Model files that cannot lie: every model the package writes loads, and a damaged one is refused.

A model file keeps, besides the model, the sums that ``partial_fit`` updates
from (``update_*``) and the rules it judges rows by (``quantization_steps_``,
``saturation_limits_``).  :func:`dask_mcpca.load` checks them against their own
invariants and against the model they belong to (``_persist._validate_update``,
``_persist._validate_steps``).  Here: models of a spread of fits (both solvers,
float32 and float64, gaps, cellwise, tiny data, constant, quantized and
at-rest channels, fixed centres, many updates) still load unchanged; and each
damage an adversarial campaign found loading silently (issue 35) is refused
by ``load`` and by ``dask-mcpca update`` and ``score``, in one line naming the
attribute.  The damages are set by hand (values that no fit gives: a
covariance of zeros or ``-I``, a radius of 1e300, a log weight of -1e308, a
mean moved by 100 working units, a quantization step of 1e6 for channels of
unit spread), not taken from the code under test.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import zarr
from conftest import assert_same_model

from dask_mcpca import MCPCA, ModelFormatError, load
from dask_mcpca.cli import main

N, P = 2000, 4


def _gauss(n=N, p=P, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p)) @ np.triu(np.full((p, p), 0.4), 1) + rng.normal(size=(n, p))
    X = X * np.linspace(3.0, 0.5, p) + 7.0
    X[: n // 25] += rng.normal(scale=20.0, size=(n // 25, p))  # 4 % outliers
    return X


def _with(X, column, values):
    X = X.copy()
    X[:, column] = values
    return X


def _gaps(X, share=0.05, seed=1):
    X = X.copy()
    X[np.random.default_rng(seed).random(X.shape) < share] = np.nan
    return X


_RNG = np.random.default_rng(5)
_AT_REST = np.where(_RNG.random(N) < 0.95, 3.0, 4.0)  # one level, rare one-step blips: robust spread ~0

#: name -> (data, estimator parameters, number of partial_fit updates after the fit, warm refit).
FITS = {
    "auto-f64": (_gauss(), {}, 0),
    "auto-f32": (_gauss().astype(np.float32), {}, 0),
    "auto-k2-updated": (_gauss(), {"n_components": 2}, 3),
    "auto-many-updates": (_gauss(), {}, 20),
    "mean-centre": (_gauss(), {"center": "mean", "n_components": 2}, 2),
    "no-centre": (_gauss(), {"center": False}, 2),
    "kernel-factor-0.5": (_gauss(), {"kernel_factor": 0.5}, 1),
    "kernel-factor-100": (_gauss(), {"kernel_factor": 100.0}, 1),
    "contamination": (_gauss(), {"contamination": 0.1}, 1),
    "cellwise": (_gauss(), {"cellwise": True}, 1),
    "partial": (_gaps(_gauss()), {"nan_policy": "partial"}, 2),
    "omit": (_gaps(_gauss()), {"nan_policy": "omit"}, 1),
    "paper": (_gauss(), {"solver": "paper", "n_decay": 4}, 0),
    "paper-k2-mean": (_gauss(), {"solver": "paper", "n_decay": 4, "n_components": 2, "center": "mean"}, 0),
    "tiny": (_gauss(4, 6), {"n_components": 2}, 0),  # fewer rows than features: fitted in their span
    "few-rows": (_gauss(7, 5), {}, 0),
    "constant-channel": (_with(_gauss(), 2, 4.0), {}, 2),
    "quantized": (_with(np.round(_gauss(), 1), 1, np.round(_gauss()[:, 1])), {}, 2),
    "quantized-paper": (_with(_gauss(), 1, np.round(_gauss()[:, 1])), {"solver": "paper", "n_decay": 4}, 0),
    "at-rest-channel": (_with(_gauss(), 3, _AT_REST), {}, 2),
    "at-rest-k2": (_with(_gauss(), 3, _AT_REST), {"n_components": 2}, 2),
    "at-rest-paper": (_with(_gauss(), 3, _AT_REST), {"solver": "paper", "n_decay": 4}, 0),
    "at-rest-cellwise": (_with(_gauss(), 3, _AT_REST), {"cellwise": True}, 1),
    "far-from-unit-scale": (_gauss() * 2.0**300, {}, 2),
}


def _fitted(name: str) -> MCPCA:
    X, params, updates = FITS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence and new-regime warnings are not what is tested
        model = MCPCA(random_state=0, **params).fit(X)
        rng = np.random.default_rng(9)
        for i in range(updates):
            rows = X[rng.integers(0, len(X), 150)]
            if i == updates - 1 and updates > 2:
                rows[:20] += 50.0  # outliers among the new rows: flagged, barely weighted
            model.partial_fit(rows)
    return model


@pytest.mark.parametrize("name", FITS)
def test_every_model_the_package_writes_loads_unchanged(tmp_path, name):
    model = _fitted(name)
    model.save(tmp_path / "model.json")
    loaded = load(tmp_path / "model.json")
    assert_same_model(model, loaded)


def test_a_warm_refit_loads(tmp_path):
    X = _gauss()
    model = MCPCA(warm_start=True, random_state=0).fit(X[:1000]).fit(X)
    model.save(tmp_path / "model.json")
    assert_same_model(model, load(tmp_path / "model.json"))


# The refactor-identity fits (Zarr stores, a dozen fits, two of them interrupted and resumed) are saved and loaded
# where they are made: tests/test_refactor_identity.py.


# ------------------------------------------------------------------ damaged files
def _set(doc, name, values):
    entry = doc["attributes"][name]
    entry["data"] = np.broadcast_to(np.asarray(values, float), entry["shape"]).ravel().tolist()


def _get(doc, name):
    entry = doc["attributes"][name]
    return np.array(entry["data"], float).reshape(entry["shape"])


def _minus_identity(doc, name):
    shape = doc["attributes"][name]["shape"]
    _set(doc, name, -np.broadcast_to(np.eye(shape[-1]), shape))


#: The damages the campaign found loading silently: name -> (change to the file, text the refusal names).
DAMAGES = {
    "covariances-zero": (lambda d: _set(d, "update_covariances_", 0.0), "update_covariances_"),
    "covariances-minus-identity": (lambda d: _minus_identity(d, "update_covariances_"), "update_covariances_"),
    "scatter-minus-identity": (lambda d: _minus_identity(d, "update_scatter_"), "update_scatter_"),
    "radii-1e300": (lambda d: _set(d, "update_radii_", 1e300), "update_radii_"),
    "core-radius-1e300": (lambda d: _set(d, "update_radii_", _get(d, "update_radii_") * [1, 0, 1] + [0, 1e300, 0]),
                          "update_radii_"),
    "final-radius-1e300": (lambda d: _set(d, "update_radii_", _get(d, "update_radii_") * [1, 1, 0] + [0, 0, 1e300]),
                           "update_radii_"),
    "log-weights-minus-1e308": (lambda d: _set(d, "update_log_weights_", -1e308), "update_log_weights_"),
    "means-plus-100": (lambda d: _set(d, "update_means_", _get(d, "update_means_") + 100.0), "update_means_"),
    "quantization-step-1e6": (lambda d: _set(d, "quantization_steps_", _get(d, "quantization_steps_") * 0 + 1e6),
                              "quantization_steps_"),
}


@pytest.fixture(scope="module")
def models():
    """Fitted models to damage: the default (robust centre), a fixed centre, the paper solver."""
    X = _gauss()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {"robust": MCPCA(random_state=0).fit(X),
                "mean": MCPCA(center="mean", n_components=2, random_state=0).fit(X),
                "paper": MCPCA(solver="paper", n_decay=4, random_state=0).fit(X)}


def _damaged(model, tmp_path, damage) -> str:
    path = tmp_path / "model.json"
    model.save(path)
    doc = json.loads(path.read_text())
    DAMAGES[damage][0](doc)
    path.write_text(json.dumps(doc))
    return str(path)


def _refused_in_one_line(path, fragment):
    with pytest.raises(ModelFormatError) as err:
        load(path)
    text = str(err.value)
    assert "\n" not in text and fragment in text and path in text, text
    return text


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("centre", ["robust", "mean"])
def test_a_damaged_file_is_refused_naming_the_attribute(models, tmp_path, damage, centre):
    _refused_in_one_line(_damaged(models[centre], tmp_path, damage), DAMAGES[damage][1])


def test_the_paper_solvers_quantization_steps_are_checked_too(models, tmp_path):
    text = _refused_in_one_line(_damaged(models["paper"], tmp_path, "quantization-step-1e6"), "quantization_steps_")
    assert "total variance" in text


def test_a_limit_on_a_quantized_channel_is_refused(tmp_path):
    X = _with(_gauss(), 1, np.round(_gauss()[:, 1]))
    model = MCPCA(random_state=0).fit(X)
    assert model.quantization_steps_[1] == 1.0 and np.isnan(model.saturation_limits_[1]).all()
    model.saturation_limits_[1] = [-3.0, 9.0]
    model.save(tmp_path / "model.json")
    _refused_in_one_line(str(tmp_path / "model.json"), "saturation_limits_[1]")


def test_support_must_be_the_final_kernels_share(models, tmp_path):
    path = tmp_path / "model.json"
    models["robust"].save(path)
    doc = json.loads(path.read_text())
    doc["attributes"]["support_"] = 0.5 * doc["attributes"]["support_"]
    path.write_text(json.dumps(doc))
    _refused_in_one_line(str(path), "support_")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    X = _gauss(4000)
    path = tmp_path_factory.mktemp("store") / "a.zarr"
    z = zarr.create_array(str(path), shape=X.shape, chunks=(1000, P), dtype=X.dtype)
    z[:] = X
    return str(path)


@pytest.mark.parametrize("damage", DAMAGES)
def test_the_cli_refuses_a_damaged_model_in_one_line(store, tmp_path, capsys, damage):
    model = tmp_path / "model.json"
    assert main(["fit", store, "--rows", ":3000", "-o", str(model), "--no-progress"]) == 0
    doc = json.loads(model.read_text())
    DAMAGES[damage][0](doc)
    model.write_text(json.dumps(doc))
    before = model.read_bytes()
    capsys.readouterr()
    for command in (["update", store, "-m", str(model)],
                    ["score", store, "--model", str(model), "--output", str(tmp_path / "scores.zarr")]):
        rc = main([*command, "--no-progress"])
        _, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1, err
        assert "Traceback" not in err and DAMAGES[damage][1] in lines[0] and "damaged" in lines[0], lines[0]
    assert model.read_bytes() == before  # the refused update left the file as it was
    assert not (tmp_path / "scores.zarr").exists()


# ------------------------------------------------------------------ fit checkpoints
@pytest.mark.parametrize("field, value, fragment", [
    ("robust:scatter", lambda S: -np.eye(len(S)), "scatter is not a covariance"),
    ("robust:resolution", lambda r: r * 0 - 1.0, "resolution"),
])
def test_a_checkpoint_whose_state_breaks_its_rules_is_refused(tmp_path, field, value, fragment):
    from dask_mcpca._checkpoint import CheckpointMismatchError

    X, path = _gauss(), tmp_path / "fit.ckpt.npz"
    MCPCA(checkpoint=path, random_state=0).fit(X)
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays[field] = value(arrays[field])
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(CheckpointMismatchError, match=fragment) as err:
        MCPCA(checkpoint=path, random_state=0).fit(X)
    assert "\n" not in str(err.value) and "delete it" in str(err.value)


def test_update_sums_without_the_quantization_steps_are_refused(models, tmp_path):
    """The steps came first: every model file that keeps partial_fit's sums has them."""
    path = tmp_path / "model.json"
    models["robust"].save(path)
    doc = json.loads(path.read_text())
    del doc["attributes"]["quantization_steps_"]
    path.write_text(json.dumps(doc))
    _refused_in_one_line(str(path), "quantization_steps_ missing")
