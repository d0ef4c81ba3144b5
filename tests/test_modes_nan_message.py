"""A modes model's :class:`NonFiniteRowsError` under ``nan_policy='raise'`` does not suggest
``nan_policy='partial'``, which a fit with modes refuses (review 6 of 2026-11-28, point 3); a model without
modes still does."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from dask_mcpca import MCPCA
from dask_mcpca._exceptions import NonFiniteRowsError


def _two_states(seed: int = 0):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(2, 5))
    X = rng.normal(size=(1_200, 2)) @ A + 0.2 * rng.normal(size=(1_200, 5))
    X[600:] += 6.0
    return X, np.repeat([0, 1], 600)


def test_partial_is_refused_for_a_fit_with_modes():
    """The documented rule the message follows: modes cannot be combined with ``nan_policy='partial'``."""
    X, labels = _two_states()
    with pytest.raises(ValueError, match="nan_policy='partial'"):
        MCPCA(nan_policy="partial").fit(X, modes=labels)


@pytest.mark.parametrize("method", ["predict_mode", "is_outlier", "mahalanobis", "score_samples"])
@pytest.mark.parametrize("lazy", [False, True])
def test_a_modes_models_nan_error_leaves_out_partial(method, lazy):
    X, labels = _two_states()
    model = MCPCA().fit(X, modes=labels)
    Y = X[:10].copy()
    Y[3, 1] = np.nan
    if lazy:
        Y = da.from_array(Y, chunks=(5, -1))
    with pytest.raises(NonFiniteRowsError) as err:
        np.asarray(getattr(model, method)(Y))
    assert "nan_policy='omit'" in str(err.value)
    assert "partial" not in str(err.value)


def test_a_model_without_modes_still_suggests_partial():
    X, _ = _two_states()
    Y = X[:10].copy()
    Y[3, 1] = np.nan
    with pytest.raises(NonFiniteRowsError, match="nan_policy='partial'"):
        MCPCA().fit(X).mahalanobis(Y)
