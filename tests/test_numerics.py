"""Float64 range, property-based: a correct result or one named error, never numpy's.

Finite data anywhere in float64's range (subnormals, 1e308 and -1e308 in one
column, a single row of 1e160 among unit-scale rows) must give a fit whose
every fitted number is finite, or one error raised by the package
(``NumericalRangeError`` for what float64 cannot hold, a ``ValueError``
naming a parameter or the data's shape); never an error from inside numpy,
scipy or dask (``LinAlgError``, ``OverflowError``, ``ZeroDivisionError``,
scipy's "array must not contain infs or NaNs"), never a RuntimeWarning from
the package (``pyproject.toml`` makes those errors), and never a NaN
distance or score for a finite row.

Scaling: the fit works in units of a power of two near the bulk's spread
(:func:`dask_mcpca._robust_step.working_exponent`), so ``c * X`` for any ``c``
in [1e-150, 1e150] gives the same components and variances scaled by
``c**2``; for ``c`` a power of two, bit for bit.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sklearn.exceptions import ConvergenceWarning

from dask_mcpca import MCPCA, NumericalRangeError

SOLVERS = [
    pytest.param({}, id="auto"),
    pytest.param({"n_components": 1}, id="auto-k1"),  # fewer rows than p + 2: the fit in the rows' span
    pytest.param({"solver": "paper", "n_decay": 3, "max_iter": 10}, id="paper"),
    pytest.param({"solver": "paper", "n_decay": 3, "max_iter": 10, "center": "mean"}, id="paper-mean"),
]

#: Derandomized, so the run time is known.
SETTINGS = settings(
    max_examples=40, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

#: Errors that come from inside numpy, scipy or Python's float arithmetic: never allowed.
FOREIGN = (np.linalg.LinAlgError, OverflowError, ZeroDivisionError, FloatingPointError, RuntimeWarning)

#: Here a RuntimeWarning (overflow, invalid value) is an error wherever numpy raises it.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

PACKAGE = os.path.dirname(__import__("dask_mcpca").__file__)


def _bulk(seed: int, n: int, p: int) -> np.ndarray:
    """Gaussian rows with well-separated variances (9, 2.25, 0.56, ...), rotated and shifted."""
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(p, p)))
    return rng.normal(size=(n, p)) * (3.0 * 2.0 ** -np.arange(p)) @ Q.T + rng.normal(size=p)


@st.composite
def anywhere(draw):
    """Finite float64 data across the whole range, in one of three shapes.

    ``raw``: every value drawn from all finite float64 (subnormals and the
    extremes included), wide (fewer rows than p + 2) or not.  ``spiked``: a unit-scale bulk scaled by ``2**e``
    (e in [-1070, 1015]) with a few values replaced by arbitrary finite floats.
    ``extremes``: a unit-scale bulk with rows of +-1e308 and +-1e160.
    """
    kind = draw(st.sampled_from(["raw", "spiked", "extremes"]))
    p = draw(st.integers(1, 3))
    finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
    if kind == "raw":
        p = draw(st.integers(1, 6))
        n = draw(st.integers(3, 30))  # n < p + 2: wide data
        return draw(hnp.arrays(np.float64, (n, p), elements=finite))
    n = draw(st.integers(40, 120))
    X = _bulk(draw(st.integers(0, 2**32 - 1)), n, p)
    if kind == "spiked":
        X = np.ldexp(X, draw(st.integers(-1070, 1015)))  # ~1e-322 to ~1e306, subnormals included
        for _ in range(draw(st.integers(1, 3))):
            X[draw(st.integers(0, n - 1)), draw(st.integers(0, p - 1))] = draw(finite)
        return X
    for i, value in enumerate(draw(st.lists(st.sampled_from([1e308, -1e308, 1e160, -1e160]), min_size=1,
                                            max_size=3))):
        X[i] = value
    return X


def _check_fitted(model, X) -> None:
    """Every fitted float is finite; distances and scores of the (finite) rows are never NaN."""
    for name in ("components_", "explained_variance_", "explained_variance_ratio_", "mean_", "covariance_",
                 "noise_variance_", "kernel_scale_", "outlier_cutoff_", "outlier_threshold_"):
        value = np.asarray(getattr(model, name))
        assert np.all(np.isfinite(value)), name
    assert np.all(model.explained_variance_ >= 0)
    np.testing.assert_allclose(model.components_ @ model.components_.T, np.eye(model.n_components_), atol=1e-8)
    d2 = model.mahalanobis(X)
    assert not np.isnan(d2).any() and (d2 >= 0).all()
    scores = model.score_samples(X)
    assert not np.isnan(scores).any() and ((scores >= 0) & (scores <= 1)).all()
    assert model.is_outlier(X).dtype == bool
    assert not np.isnan(model.transform(X)).any()


def _fit_or_named_error(kw, X):
    """The fitted model, or None after an error raised by the package itself."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return MCPCA(**kw).fit(X)
    except FOREIGN:
        raise
    except ValueError as err:
        origin = _last_frame(err)
        assert origin.startswith(PACKAGE), f"{type(err).__name__} from {origin}: {err}"
        event(f"{type(err).__name__}: {str(err)[:60]}")
        return None


def _last_frame(err) -> str:
    tb = err.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename


@pytest.mark.slow  # CI tier: 200 hypothesis examples per solver (5 s)
@pytest.mark.parametrize("kw", SOLVERS)
@settings(SETTINGS, max_examples=200)  # cheap: most examples fit in milliseconds or fail at once
@given(X=anywhere())
def test_finite_data_anywhere_gives_a_fit_or_a_named_error(kw, X):
    model = _fit_or_named_error(kw, X)
    event("fitted" if model is not None else "named error")
    if model is not None:
        _check_fitted(model, X)


@pytest.mark.parametrize("kw", SOLVERS)
@pytest.mark.parametrize(
    "case",
    ["row 1e160", "rows 1e308 and -1e308", "X * 1e300", "X * 1e-160", "X * 1e-300"],
)
def test_reported_failures_now_fit_or_name_the_problem(kw, case):
    """The cases of the issue "Reliability 2", item 4 (they raised LinAlgError or returned zeros).

    Auto fits a bulk with a row of 1e160 or rows of +-1e308 as if those rows
    were absent and flags them; the paper's solver, whose kernel sizes start
    from the unweighted scatter (infinite in float64 here), says so.  Data
    whose variances float64 cannot hold (X * 1e300, * 1e-160, * 1e-300) get
    a ``NumericalRangeError`` saying by what to multiply them.
    """
    X = _bulk(0, 300, 3)
    expected, far = None, [5, 6]
    if case == "row 1e160":
        X[5], far = 1e160, [5]
    elif case == "rows 1e308 and -1e308":
        X[5], X[6] = 1e308, -1e308
    else:
        X = X * float(case.split()[-1])
        expected = "multiply the data by a power of two"
    if kw.get("solver") == "paper" and case.startswith("row"):
        expected = "unweighted scatter of the data about the centre (Algorithm 3, line 1"
    if expected is not None:
        with pytest.raises(NumericalRangeError, match=expected.replace("(", r"\(")):
            MCPCA(**kw).fit(X)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = MCPCA(**kw).fit(X)
    clean = MCPCA(**kw).fit(np.delete(X, far, axis=0))
    np.testing.assert_allclose(np.abs(np.sum(model.components_ * clean.components_, axis=1)), 1.0, atol=1e-3)
    np.testing.assert_allclose(model.explained_variance_, clean.explained_variance_, rtol=0.05)
    assert model.n_samples_ == 300  # finite rows, however large, are rows
    assert model.is_outlier(X[far]).all()
    _check_fitted(model, X)


# --------------------------------------------------------------- scaling
@pytest.mark.parametrize("kw", [SOLVERS[0], pytest.param(*SOLVERS[2].values, id="paper", marks=pytest.mark.slow)])
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), p=st.integers(2, 4), log_c=st.floats(-150, 150),
       outliers=st.booleans())
def test_extreme_scaling_gives_the_same_fit(kw, seed, p, log_c, outliers):
    """``c * X``, c in [1e-150, 1e150]: the same components (1e-6 in cosine), variances times c**2 (1e-6)."""
    X = _bulk(seed, 150, p)
    if outliers and kw.get("solver") != "paper":
        X[:8] = X.mean(axis=0) + 40.0 + np.random.default_rng(seed).normal(size=(8, p))
    c = 10.0**log_c
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fit, scaled = MCPCA(**kw).fit(X), MCPCA(**kw).fit(X * c)
    if kw.get("solver") == "paper":
        assume(fit.converged_ and scaled.converged_)  # see test_invariance: unconverged paper fits stop anywhere
    np.testing.assert_allclose(np.abs(np.sum(fit.components_ * scaled.components_, axis=1)), 1.0, atol=1e-6)
    np.testing.assert_allclose(scaled.explained_variance_ / c**2, fit.explained_variance_, rtol=1e-6)
    np.testing.assert_allclose(scaled.mean_ / c, fit.mean_, rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(scaled.is_outlier(X * c), fit.is_outlier(X))


@pytest.mark.parametrize("kw", [SOLVERS[0], SOLVERS[2]])
@pytest.mark.parametrize("k", [-480, -1, 3, 470])
def test_power_of_two_scaling_is_exact(kw, k):
    """``2**k * X`` gives bit for bit the same fit, scaled: the working unit absorbs the factor exactly."""
    X = _bulk(1, 200, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fit, scaled = MCPCA(**kw).fit(X), MCPCA(**kw).fit(np.ldexp(X, k))
    np.testing.assert_array_equal(scaled.components_, fit.components_)
    np.testing.assert_array_equal(scaled.explained_variance_, np.ldexp(fit.explained_variance_, 2 * k))
    np.testing.assert_array_equal(scaled.mean_, np.ldexp(fit.mean_, k))
    assert scaled.n_passes_ == fit.n_passes_


def test_outlier_cutoff_when_most_distances_are_infinite():
    """Found by the hypothesis test above (also on main before the performance merge):
    a degenerate bulk under which most sample rows are infinitely far made the outlier
    cutoff's calibration compute inf - inf; it now falls back to the Gaussian quantile."""
    from dask_mcpca._schedule import calibrated_cutoff, hotelling_quantile

    d2 = np.array([np.inf] * 11)
    assert calibrated_cutoff(d2, 0.998, p=1, n_effective=9.0) == hotelling_quantile(1, 9.0, 0.998)
    for far in np.linspace(3.9955e146, 3.9962e146, 15):  # around the 2**400 spreads of FAR_ROW
        X = np.full((11, 3), 2.0)
        X[0, 0], X[1, 0] = far, 9.0605e25
        model = _fit_or_named_error({}, X)
        if model is not None:
            _check_fitted(model, X)


@pytest.mark.parametrize("p", [3, 64, 150])  # one run of channels, exactly one, three (the client's threads)
def test_the_working_unit_is_the_power_of_two_nearest_the_largest_column_mad(p):
    from dask_mcpca._robust_step import working_exponent

    rng = np.random.default_rng(p)
    X = rng.normal(size=(999, p)) * rng.uniform(0.1, 10.0, p) + rng.normal(size=p) * 100
    widest = p - 1  # in the last run of channels
    X[:, widest] *= 37.0
    X[:5, 0] = 1e160  # a few far rows move no MAD
    top = int(np.frexp(np.abs(X).max())[1])  # the power of two above the largest magnitude
    Z = np.ldexp(X, -top)
    mad = np.median(np.abs(Z - np.median(Z, axis=0)), axis=0)  # each channel's, plainly
    assert int(np.argmax(mad)) == widest
    assert working_exponent(X, X.min(axis=0), X.max(axis=0)) == top + int(np.frexp(mad.max())[1])
