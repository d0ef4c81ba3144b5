"""``update`` and ``score --append`` of a model fitted with ``--modes-from``, on a real xarray Zarr archive.

A fit with ``--modes-from state`` leaves the label channel out of the model's
channels; ``update`` and ``score`` read the archive with ``--variables``
naming the model's channels.  The fingerprint of the rows the fit read must be
of those channels, as ``update`` reads them: it held the label channel too, so
every update of such a model was refused as "rows 0:N changed" on an archive
that had not changed.  Expected values come from the generated archive (its
row counts and each row's state), not from the code under test.
"""

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from dask_mcpca import load
from dask_mcpca.cli import main

CHANNELS = ["c0", "c1", "c2", "c3"]


def _rows(start, n, seed):
    """``n`` rows of a two-state machine from ``start`` on: states in turns of 500 rows, state 1 shifted
    and narrower on every channel; the rows as the archive's variables, and the state of each."""
    rng = np.random.default_rng(seed)
    state = ((np.arange(start, start + n) // 500) % 2).astype(np.int8)
    X = rng.normal(size=(n, len(CHANNELS))) * np.where(state[:, None] == 1, 0.5, 2.0)
    X += np.where(state[:, None] == 1, [8.0, -6.0, 5.0, 3.0], 0.0)
    variables = {c: ("time", X[:, j]) for j, c in enumerate(CHANNELS)}
    times = pd.date_range("2024-01-01", periods=start + n, freq="1min")[start:]
    return xr.Dataset({**variables, "state": ("time", state)}, coords={"time": times}), state


@pytest.mark.slow  # about 4 s: two fits, two updates and two scores from the command line
def test_update_and_append_of_a_modes_from_model(tmp_path, capsys):
    store, model, scores = tmp_path / "plant.zarr", tmp_path / "m.json", tmp_path / "s.zarr"
    first, truth = _rows(0, 3000, seed=1)
    first.chunk({"time": 1000}).to_zarr(store)
    assert main(["fit", str(store), "--modes-from", "state", "-o", str(model), "--no-progress"]) == 0
    assert list(load(model).feature_names_in_) == CHANNELS  # the label channel left out
    variables = ["--variables", ",".join(CHANNELS)]
    assert main(["score", str(store), "-m", str(model), "-o", str(scores), *variables, "--no-progress"]) == 0

    more, truth_more = _rows(3000, 1000, seed=2)  # the archive grows by 1,000 rows
    more.chunk({"time": 1000}).to_zarr(store, append_dim="time")
    capsys.readouterr()
    assert main(["update", str(store), "-m", str(model), *variables, "--no-progress"]) == 0, capsys.readouterr().err
    assert "now hold 4,000 rows in 2 modes, archive rows 0:4,000" in capsys.readouterr().out
    updated = load(model)
    np.testing.assert_allclose(updated.mode_weights_, [0.5, 0.5])  # 2,000 rows of each state
    assert main(["score", str(store), "-m", str(model), "-o", str(scores), "--append", *variables,
                 "--no-progress"]) == 0, capsys.readouterr().err
    stored = xr.open_zarr(scores)
    assert stored.sizes["time"] == 4000
    assert np.mean(stored["mode"].values == np.r_[truth, truth_more]) > 0.999  # mode 0 is state 0

    # the model's rows recalibrated (channel c1 rewritten), and 1,000 new rows: refused, nothing written
    recal = xr.open_zarr(store).compute()
    recal["c1"] = recal["c1"] * 1.01
    recal.chunk({"time": 1000}).to_zarr(store, mode="w")
    _rows(4000, 1000, seed=3)[0].chunk({"time": 1000}).to_zarr(store, append_dim="time")
    before = model.read_bytes()
    capsys.readouterr()
    assert main(["update", str(store), "-m", str(model), *variables, "--no-progress"]) == 2
    assert "rows 0:4,000 changed since the model read them" in capsys.readouterr().err
    assert model.read_bytes() == before
