"""Operating modes, review 5 of 2026-11-28: saving a robust-scaled modes model, updating a loaded one, the
mode of rows no mode can judge, clear errors for bad labels, the routing a fit with ``"auto"`` is judged by.

Expected values come from the generated truth (each row's state) and from plain fits of one state's rows
(``MCPCA().fit``), which the rest of the suite checks against independent references.
"""

import numpy as np
from test_modes import two_states

from dask_mcpca import MCPCA, load
from dask_mcpca._scale import scale_text


def test_a_robust_scaled_modes_model_saves_loads_and_updates(tmp_path):
    X, truth = two_states(seed=3, n=(1500, 1000))
    model = MCPCA(scale="robust").fit(X, modes=truth)
    assert scale_text(model).startswith("scale robust")
    model.save(tmp_path / "m.json")
    loaded = load(tmp_path / "m.json")
    for m in range(2):  # each mode's scales are those of a plain robust-scaled fit of its rows
        alone = MCPCA(scale="robust").fit(X[truth == m])
        np.testing.assert_allclose(loaded.mode_models_[m].scale_, alone.scale_, rtol=1e-12)
    np.testing.assert_array_equal(loaded.is_outlier(X), model.is_outlier(X))
    assert scale_text(loaded).startswith("scale robust")
    loaded.partial_fit(X[:200])
    assert loaded.mode_models_[0].n_samples_seen_ == 1700


def test_a_loaded_modes_model_updates_when_its_largest_mode_gets_no_rows(tmp_path):
    X, truth = two_states(seed=4, n=(1500, 1000))
    MCPCA().fit(X, modes=truth).save(tmp_path / "m.json")
    loaded = load(tmp_path / "m.json")
    loaded.partial_fit(X[truth == 1][:300])  # rows of the smaller mode only
    assert [m.n_samples_seen_ for m in loaded.mode_models_] == [1500, 1300]
    np.testing.assert_allclose(loaded.mode_weights_, [1500 / 2800, 1300 / 2800])
