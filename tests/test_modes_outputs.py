"""A model with operating modes saved, loaded and used by ``score`` and ``report``, on real Zarr stores.

Expected values come from the generated truth (which state each row is
in: ``test_modes.two_states``) and from the estimator's own judgement of
rows in memory (``predict_mode``, ``is_outlier``), which tests/test_modes.py
checks against single-mode fits of each state's rows.
"""

import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from test_modes import two_states

from dask_mcpca import MCPCA, ModelFormatError, load
from dask_mcpca.cli import main


def _archive(path, seed=0, turns=3, lengths=(2400, 1600)):
    """A two-state recording in time, the states taking ``turns`` turns of ``lengths`` rows, as a Zarr store
    (xarray, a time coordinate); the rows and the truth of each."""
    X, truth = two_states(seed=seed, n=(turns * lengths[0], turns * lengths[1]))
    order = np.concatenate([np.flatnonzero(truth == s)[i * lengths[s] : (i + 1) * lengths[s]]
                            for i in range(turns) for s in (0, 1)])
    X, truth = X[order], truth[order]
    ds = xr.Dataset({"X": (("time", "channel"), X)},
                    coords={"time": pd.date_range("2024-01-01", periods=len(X), freq="1min"),
                            "channel": [f"c{j}" for j in range(X.shape[1])]})
    ds.chunk({"time": 1500}).to_zarr(path)
    return X, truth


@pytest.mark.parametrize("labels", ["auto", "strings"])
def test_save_load_round_trip_gives_the_same_modes_and_flags(tmp_path, labels):
    X, truth = two_states(seed=0)  # tests/test_modes.py: "auto" finds both states
    if labels == "auto":
        model = MCPCA(modes="auto").fit(X)
    else:
        model = MCPCA().fit(X, modes=np.where(truth == 0, "idle", "load"))
    model.save(tmp_path / "m.json")
    loaded = load(tmp_path / "m.json")
    assert json.loads((tmp_path / "m.json").read_text())["format_version"] == 3
    assert loaded.n_modes_ == model.n_modes_ == 2
    assert [str(v) for v in loaded.modes_] == [str(v) for v in model.modes_]
    np.testing.assert_array_equal(loaded.mode_weights_, model.mode_weights_)
    np.testing.assert_array_equal(loaded.predict_mode(X), model.predict_mode(X))
    np.testing.assert_array_equal(loaded.is_outlier(X), model.is_outlier(X))
    np.testing.assert_array_equal(loaded.decision_function(X), model.decision_function(X))
    assert np.mean(loaded.predict_mode(X) == truth) > 0.999  # the states, as generated (by size or by label)


def test_a_damaged_modes_file_is_refused(tmp_path):
    X, truth = two_states(seed=5, n=(1500, 1000))
    MCPCA().fit(X, modes=truth).save(tmp_path / "m.json")
    document = json.loads((tmp_path / "m.json").read_text())

    def refused(change, match):
        doc = json.loads(json.dumps(document))
        change(doc)
        (tmp_path / "bad.json").write_text(json.dumps(doc))
        with pytest.raises(ModelFormatError, match=match):
            load(tmp_path / "bad.json")

    attributes = "attributes"
    refused(lambda d: d[attributes]["mode_models_"].pop(), "n_modes_=2 but mode_models_ holds 1")
    refused(lambda d: d[attributes]["mode_weights_"]["data"].__setitem__(0, 0.7), "summing to 1")
    refused(lambda d: d[attributes]["mode_models_"][1][attributes]["components_"]["data"].__setitem__(0, 9.0),
            r"mode_models_\[1\]: components_ are not orthonormal")
    refused(lambda d: d[attributes].pop("modes_"), "modes_ missing")
    refused(lambda d: d[attributes]["mode_channels_"]["data"].__setitem__(0, False), "mode_channels_ must be")
    refused(lambda d: d.__setitem__("format_version", 2), "operating modes are version 3")


def test_a_model_without_modes_writes_the_same_file_as_before(tmp_path):
    X, _ = two_states(seed=6, n=(1500, 1000))
    MCPCA().fit(X).save(tmp_path / "m.json")
    document = json.loads((tmp_path / "m.json").read_text())
    assert document["format_version"] == 1
    assert not any(name.startswith("mode") for name in document["attributes"])


def test_score_rows_take_each_row_from_its_mode(tmp_path):
    X, truth = two_states(seed=7)
    model = MCPCA(modes="auto").fit(X)
    names = ("d2", "outlier", "weight", "contributions", "top_channel", "mode")
    rows = model.score_rows(X, outputs=names)
    np.testing.assert_array_equal(rows["mode"], model.predict_mode(X))
    assert rows["mode"].dtype == np.int16
    np.testing.assert_array_equal(rows["outlier"], model.is_outlier(X))
    np.testing.assert_allclose(rows["d2"], model.mahalanobis(X), rtol=1e-12)
    np.testing.assert_array_equal(rows["weight"], model.score_samples(X))
    np.testing.assert_allclose(rows["contributions"], model.channel_contributions(X), rtol=1e-12)
    for m, sub in enumerate(model.mode_models_):  # each row's contributions are its mode's model's
        mine = truth == m
        np.testing.assert_allclose(rows["contributions"][mine], sub.channel_contributions(X[mine]), rtol=1e-12)
    plain = MCPCA().fit(X).score_rows(X, outputs=("d2", "mode"))
    np.testing.assert_array_equal(plain["mode"], np.zeros(len(X), np.int16))


@pytest.mark.slow  # about 4 s: two fits, two scores and a report of a 12,000-row store
def test_cli_modes_fit_score_report_flag_few_clean_rows(tmp_path, capsys):
    store = tmp_path / "plant.zarr"
    X, truth = _archive(store)
    model, single = tmp_path / "modes.json", tmp_path / "one.json"
    assert main(["fit", str(store), "--modes", "auto", "-o", str(model), "--no-progress"]) == 0
    fitted = capsys.readouterr().out
    assert "operating modes: 2" in fitted
    assert main(["fit", str(store), "-o", str(single), "--no-progress"]) == 0
    for name, path in (("modes", model), ("one", single)):
        assert main(["score", str(store), "-m", str(path), "-o", str(tmp_path / f"{name}.zarr"),
                     "--no-progress"]) == 0
    scores = xr.open_zarr(tmp_path / "modes.zarr")
    one = xr.open_zarr(tmp_path / "one.zarr")
    assert "mode" not in one
    loaded = load(model)
    np.testing.assert_array_equal(scores["mode"].values, loaded.predict_mode(X))
    assert np.mean(scores["mode"].values == truth) > 0.999
    assert scores["mode"].attrs["modes"] == ["0", "1"]
    assert scores["outlier"].values.mean() < 0.02  # the rows are clean: each state judged by its own model
    assert 0.35 < one["outlier"].values.mean() < 0.45  # one model flags the smaller state (40 % of the rows)
    capsys.readouterr()
    assert main(["report", str(store), "-m", str(model), "-o", str(tmp_path / "r.png"), "--no-progress"]) == 0
    report = capsys.readouterr().out
    flagged = int(scores["outlier"].values.sum())  # the report judges the rows as score (and is_outlier) does
    assert f": {flagged:,} flagged" in report
    assert "operating modes (share of the fitted rows): 0 = 0 (60.0%), 1 = 1 (40.0%)" in report
    # 10 stretches of 1200 rows: the first two in state 0 (rows 0:2400), the third in state 1 (2400:4000)
    table = report[report.index("rows in each mode"):].splitlines()[2:]
    assert len(table) == 10
    assert [row.split()[1:] for row in table[:3]] == [["100.0%", "0.0%"], ["100.0%", "0.0%"], ["0.0%", "100.0%"]]
    assert (tmp_path / "r.png").stat().st_size > 0


@pytest.mark.slow  # about 2 s: a fit and a score of a 12,000-row store
def test_cli_modes_from_a_state_variable(tmp_path, capsys):
    X, truth = two_states(seed=0, n=(7200, 4800))
    store = tmp_path / "plant.zarr"
    variables = {f"c{j}": ("time", X[:, j]) for j in range(X.shape[1])}
    xr.Dataset({**variables, "state": ("time", (truth * 2 + 1).astype(np.int8))}).chunk({"time": 1500}).to_zarr(store)
    model = tmp_path / "m.json"
    assert main(["fit", str(store), "--modes-from", "state", "-o", str(model), "--no-progress"]) == 0
    assert "channels, in this order: c0, c1, c2, c3, c4" in capsys.readouterr().out
    fitted = load(model)
    assert list(fitted.feature_names_in_) == [f"c{j}" for j in range(X.shape[1])]
    assert list(fitted.modes_) == [1.0, 3.0]  # the state variable's values
    np.testing.assert_allclose(fitted.mode_weights_, [0.6, 0.4])
    out = tmp_path / "s.zarr"
    assert main(["score", str(store), "-m", str(model), "-o", str(out), "--variables", "c0,c1,c2,c3,c4",
                 "--no-progress"]) == 0
    scores = xr.open_zarr(out)
    assert np.mean(scores["mode"].values == truth) > 0.999
    assert scores["outlier"].values.mean() < 0.02
    assert main(["fit", str(store), "--modes-from", "valve", "-o", str(tmp_path / "x.json"), "--no-progress"]) == 2
    assert "--modes-from valve: no such channel" in capsys.readouterr().err


@pytest.mark.slow  # about 2 s: fit, update and score --append from the command line
def test_cli_update_and_append_with_modes(tmp_path, capsys):
    """The monitoring loop with modes: fit on the first rows, update by the next, append their scores."""
    store = tmp_path / "plant.zarr"
    X, truth = _archive(store)
    half = len(X) // 2
    model, scores = tmp_path / "modes.json", tmp_path / "scores.zarr"
    assert main(["fit", str(store), "--modes", "auto", "--rows", f"0:{half}", "-o", str(model), "--no-progress"]) == 0
    assert main(["score", str(store), "-m", str(model), "--rows", f"0:{half}", "-o", str(scores), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["update", str(store), "-m", str(model), "--rows", f"{half}:{len(X)}", "--no-progress"]) == 0
    assert f"now hold {len(X):,} rows in 2 modes" in capsys.readouterr().out
    updated = load(model)
    np.testing.assert_allclose(updated.mode_weights_, [0.6, 0.4], atol=0.01)  # the truth's shares
    assert main(["score", str(store), "-m", str(model), "-o", str(scores), "--append", "--no-progress"]) == 0
    stored = xr.open_zarr(scores)
    np.testing.assert_array_equal(stored["mode"].values[half:], updated.predict_mode(X[half:]))
    assert np.mean(stored["mode"].values == truth) > 0.999
    assert stored["outlier"].values.mean() < 0.02


@pytest.mark.slow  # about 2 s: a fit and a report of a 12,000-row store
def test_drift_windows_with_modes_watch_the_largest_mode(tmp_path, capsys):
    """Windows of the largest mode's rows are monitored against its model (no drift on clean rows); windows
    of another mode hold too few of its rows and are not monitored, rather than called drift."""
    store = tmp_path / "plant.zarr"
    X, truth = _archive(store)  # state 0 in stretches of 2,400 rows, state 1 in stretches of 1,600
    model = tmp_path / "modes.json"
    assert main(["fit", str(store), "--modes", "auto", "-o", str(model), "--no-progress"]) == 0
    windows = tmp_path / "w.csv"
    assert main(["report", str(store), "-m", str(model), "-o", str(tmp_path / "r.png"), "--window", "800",
                 "--windows", str(windows), "--no-progress"]) == 0
    table = pd.read_csv(windows)
    state = np.array([np.bincount(truth[r : r + 800], minlength=2).argmax() for r in table["first_row"]])
    largest = int(np.argmax(load(model).mode_weights_))
    assert (table["monitored"][state == largest] == 1).all()
    assert (table["monitored"][state != largest] == 0).all()
    assert (table["drift"][table["monitored"] == 1] == 0).all()
