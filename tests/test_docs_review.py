"""What the docs say the command line and the estimator do, checked against them (review 5).

``score --outputs all`` writes every output valid for the model, the rule the docs state
(docs/cli.md, docs/monitoring.md): every name of ``SCORE_ARRAYS``, ``cells`` only for a cellwise
model, ``mode`` only for a model with operating modes, and ``scores`` not for one.  The expected
sets are derived here from ``SCORE_ARRAYS`` by that rule, not taken from ``all_outputs``.
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from dask_mcpca import MCPCA
from dask_mcpca.cli import main
from dask_mcpca.cli.score import SCORE_ARRAYS

N, P, CHUNK = 2_000, 4, 500
#: The model kinds ``--outputs all`` differs for.
KINDS = ("plain", "cellwise", "modes")


def _data(kind: str) -> np.ndarray:
    rng = np.random.default_rng(11)
    X = rng.normal(size=(N, P)) @ rng.normal(size=(P, P))
    if kind == "modes":  # two operating states, far apart
        X[N // 2:] = X[N // 2:] * 0.5 + 40
    return X


def _fit(kind: str, X: np.ndarray) -> MCPCA:
    if kind == "modes":
        return MCPCA().fit(X, modes=np.repeat([0, 1], N // 2))
    return MCPCA(cellwise=kind == "cellwise").fit(X)


def _expected_all(kind: str) -> set[str]:
    names = set(SCORE_ARRAYS)
    if kind != "cellwise":
        names.discard("cells")
    if kind == "modes":
        names.discard("scores")
    else:
        names.discard("mode")
    return names


def _score(tmp_path, store, model_path, name, *extra) -> set[str]:
    out = tmp_path / name
    assert main(["score", str(store), "--model", str(model_path), "--output", str(out), "--no-progress",
                 *extra]) == 0
    g = zarr.open_group(str(out), mode="r")
    assert set(g.attrs["outputs"]) <= set(g.array_keys())  # each output recorded is written
    return set(g.attrs["outputs"])


@pytest.mark.parametrize("kind", KINDS)
def test_outputs_all_writes_every_output_valid_for_the_model(kind, tmp_path, capsys):
    X = _data(kind)
    store, model_path = tmp_path / "archive.zarr", tmp_path / "model.json"
    zarr.create_array(str(store), shape=X.shape, chunks=(CHUNK, P), dtype=X.dtype)[:] = X
    _fit(kind, X).save(model_path)
    everything = _score(tmp_path, store, model_path, "all.zarr", "--outputs", "all")
    default = _score(tmp_path, store, model_path, "default.zarr")
    assert everything == _expected_all(kind)
    assert default <= everything
    capsys.readouterr()


def test_append_takes_outputs_all_to_a_store_scored_with_it(tmp_path, capsys):
    """``--append --outputs all`` names what a store scored with ``--outputs all`` holds: accepted."""
    X = _data("plain")
    store, model_path, out = tmp_path / "archive.zarr", tmp_path / "model.json", tmp_path / "scores.zarr"
    z = zarr.create_array(str(store), shape=(N - CHUNK, P), chunks=(CHUNK, P), dtype=X.dtype)
    z[:] = X[: N - CHUNK]
    _fit("plain", X).save(model_path)
    assert _score(tmp_path, store, model_path, "scores.zarr", "--outputs", "all") == _expected_all("plain")
    z.resize(X.shape)
    z[N - CHUNK:] = X[N - CHUNK:]
    assert main(["score", str(store), "--model", str(model_path), "--output", str(out), "--append", "--outputs",
                 "all", "--no-progress"]) == 0
    assert zarr.open_group(str(out), mode="r").attrs["rows"] == [0, N]
    capsys.readouterr()
