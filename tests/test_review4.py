"""Review 4: ``save`` and ``partial_fit`` after ``set_params``.

A parameter that defines the fitted model (``scale``, ``center``, ``solver``,
``cellwise``, ``n_components``), changed by ``set_params`` after the fit, made
``save`` write a file that ``load`` refused as damaged, and ``partial_fit``
update with another centre than the fit's (or ignore a new ``n_components``):
both now refuse it, naming the parameter.  Run-time parameters
(``nan_policy``, ``progress``) may change, and a model with modes hands them to
its modes' models.  Expected values come from the construction: which
parameter was changed, which rows hold NaN, how many rows each block holds.
"""

import numpy as np
import pytest

from dask_mcpca import MCPCA, load

#: Each parameter that defines a default fit of :func:`_rows`, and a value that contradicts that fit.
CHANGES = [("scale", "robust"), ("center", False), ("center", "mean"), ("n_components", 2),
           ("solver", "paper"), ("cellwise", True)]


#: The channels' mixing: every block of :func:`_rows` is drawn from one distribution.
MIXING = np.random.default_rng(0).normal(size=(4, 4))


def _rows(n=3000, seed=1):
    return np.random.default_rng(seed).normal(size=(n, 4)) @ MIXING + 3


def _two_states(rng, n):
    """60 % of the rows in one operating state, 40 % in another, every channel moved (as in r5.py)."""
    a, b = n * 6 // 10, n - n * 6 // 10
    return np.concatenate([rng.normal(size=(a, 4)), rng.normal(size=(b, 4)) * [1, 2, 1, 1] + [10, -8, 6, 0]])


@pytest.fixture(scope="module")
def fitted():
    return MCPCA().fit(_rows())


@pytest.fixture(scope="module")
def with_modes():
    rng = np.random.default_rng(0)
    return MCPCA(modes="auto").fit(_two_states(rng, 4000)), rng


def _copy(model):
    import copy

    return copy.deepcopy(model)  # the module's fits stay as fitted


@pytest.mark.parametrize(("name", "value"), CHANGES)
def test_save_refuses_a_parameter_changed_against_the_fit(fitted, tmp_path, name, value):
    model = _copy(fitted).set_params(**{name: value})
    with pytest.raises(ValueError, match=rf"MCPCA\.save: .*{name}={value!r} \(fitted with"):
        model.save(tmp_path / "model.json")
    assert not (tmp_path / "model.json").exists()


@pytest.mark.parametrize(("name", "value"), CHANGES)
def test_partial_fit_refuses_a_parameter_changed_against_the_fit(fitted, name, value):
    model = _copy(fitted).set_params(**{name: value})
    seen, mean = model.n_samples_seen_, model.mean_.copy()
    with pytest.raises(ValueError, match=rf"MCPCA\.partial_fit: .*{name}={value!r} \(fitted with"):
        model.partial_fit(_rows(200, seed=2))
    assert model.n_samples_seen_ == seen
    np.testing.assert_array_equal(model.mean_, mean)


@pytest.mark.filterwarnings("ignore:MCPCA\\(solver='paper'\\) stopped before converging")
def test_a_paper_fit_refuses_the_default_solver_and_a_centre_at_zero(tmp_path):
    model = MCPCA(solver="paper", center="mean", n_decay=4).fit(_rows())
    for name, value in [("solver", "auto"), ("center", False)]:
        with pytest.raises(ValueError, match=f"{name}={value!r}"):
            _copy(model).set_params(**{name: value}).save(tmp_path / "model.json")


def test_the_same_values_set_again_and_run_time_parameters_save_and_load(fitted, tmp_path):
    model = _copy(fitted).set_params(n_components=None, scale=None, center="robust", nan_policy="omit",
                                     progress=True, eta=0.5)
    model.save(tmp_path / "model.json")
    loaded = load(tmp_path / "model.json")
    assert (loaded.nan_policy, loaded.progress, loaded.eta) == ("omit", True, 0.5)
    np.testing.assert_array_equal(loaded.components_, fitted.components_)


def test_partial_fit_follows_a_nan_policy_set_after_the_fit(fitted):
    model = _copy(fitted).set_params(nan_policy="omit")
    X = _rows(200, seed=3)
    X[[5, 17], [1, 3]] = np.nan  # two rows left out, 198 kept
    model.partial_fit(X)
    assert model.n_samples_seen_ == fitted.n_samples_seen_ + 198


def test_modes_take_the_estimators_nan_policy_and_progress(with_modes):
    fitted, rng = with_modes
    model = _copy(fitted).set_params(nan_policy="omit", progress=False)
    B = _two_states(rng, 1000)
    B[5, 1] = np.nan  # a row of the first state: left out
    before = sum(m.n_samples_seen_ for m in model.mode_models_)
    model.partial_fit(B)
    assert [m.nan_policy for m in model.mode_models_] == ["omit"] * model.n_modes_
    assert sum(m.n_samples_seen_ for m in model.mode_models_) == before + 999
    assert model.n_samples_ == 999


def test_modes_refuse_a_changed_parameter(with_modes, tmp_path):
    model = _copy(with_modes[0]).set_params(scale="robust")
    with pytest.raises(ValueError, match=r"scale='robust' \(fitted with None\)"):
        model.save(tmp_path / "model.json")
    with pytest.raises(ValueError, match=r"scale='robust' \(fitted with None\)"):
        model.partial_fit(_two_states(with_modes[1], 500))


def test_modes_change_together_or_not_at_all(with_modes, monkeypatch):
    """One mode's update failing leaves every mode as it was (the first mode was updated before)."""
    fitted, rng = with_modes
    model = _copy(fitted)

    def fails(*args, **kwargs):
        raise RuntimeError("this mode's update failed")

    monkeypatch.setattr(model.mode_models_[1], "partial_fit", fails)
    before = [m.n_samples_seen_ for m in model.mode_models_]
    with pytest.raises(RuntimeError, match="this mode's update failed"):
        model.partial_fit(_two_states(rng, 1000))
    assert [m.n_samples_seen_ for m in model.mode_models_] == before


def test_a_kernel_factor_the_fitted_kernels_cannot_have_is_refused(tmp_path):
    """A fit with kernel_factor=100 has kernels 100 times wider than kernel_factor=1 allows (load checks that)."""
    model = MCPCA(kernel_factor=100.0).fit(_rows()).set_params(kernel_factor=1.0)
    with pytest.raises(ValueError, match=r"kernel_factor=1\.0 \(fitted with another"):
        model.save(tmp_path / "model.json")
    model.set_params(kernel_factor=100.0).save(tmp_path / "model.json")
    assert load(tmp_path / "model.json").kernel_factor == 100.0


def test_n_components_none_is_the_fit_with_every_component(tmp_path):
    model = MCPCA(n_components=4).fit(_rows()).set_params(n_components=None)
    model.save(tmp_path / "model.json")
    assert load(tmp_path / "model.json").n_components_ == 4
