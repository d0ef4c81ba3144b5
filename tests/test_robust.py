"""The default solver in realistic dimensions (issue 4), against the truth of generated data.

The scenarios are those of ``benchmarks/accuracy.py`` (eigenvalues
10 * 0.7**i along a random basis, centre away from the origin), at a smaller
n so the file stays quick; the expected values are the generator's truth and
scikit-learn's PCA.
"""


import numpy as np
import pytest
from sklearn.decomposition import PCA

from dask_mcpca import MCPCA
from dask_mcpca.testing import make_scenario

CONTAMINATED = ["paper5", "paper20", "orthogonal10", "cluster10", "cluster25", "t3"]
LABELLED = ["orthogonal10", "cluster10", "cluster25"]
N = 8000


def top3_angle(est, true):
    cos = np.abs(np.sum(est[:3] * true[:3], axis=1))
    return np.degrees(np.arccos(np.clip(cos, 0, 1))).max()


@pytest.mark.parametrize("p", [3, 10])
@pytest.mark.parametrize("scenario", CONTAMINATED)
def test_default_finds_true_components_under_contamination(scenario, p):
    sample = make_scenario(scenario, n=N, p=p, seed=1)
    model = MCPCA().fit(sample.X)
    pca = PCA().fit(sample.X)
    assert model.converged_
    assert top3_angle(model.components_, sample.components) < 10
    if scenario != "t3":  # heavy tails hurt PCA less; contamination ruins it
        assert top3_angle(pca.components_, sample.components) > 20


@pytest.mark.parametrize("p", [3, 10])
def test_default_is_nearly_as_efficient_as_pca_on_clean_data(p):
    ours, theirs = [], []
    for seed in range(8):
        sample = make_scenario("clean", n=N, p=p, seed=seed)
        ours.append(top3_angle(MCPCA().fit(sample.X).components_, sample.components))
        theirs.append(top3_angle(PCA().fit(sample.X).components_, sample.components))
    assert np.median(ours) <= 1.3 * np.median(theirs), (np.median(ours), np.median(theirs))


@pytest.mark.parametrize("p, bound", [(3, 0.6), (10, 0.3)])
def test_default_is_efficient_on_clean_data(p, bound):
    """On clean data the default's extra error over PCA is small next to PCA's own.

    PCA is efficient at the Gaussian, so an estimator of efficiency ``e``
    strays from it by about ``sqrt(1/e - 1)`` times PCA's own error: the
    bounds ask for ``e >= 0.74`` at p = 3 and ``e >= 0.92`` at p = 10.  The
    flat top of the re-weighting (weight 1 up to the calibrated 97.5 %
    quantile of d^2) is what makes it so; a Gaussian kernel alone, which
    weighs typical rows down too, has ``e`` near 0.75 at p = 10.
    """
    stray, own = [], []
    for seed in range(8):
        sample = make_scenario("clean", n=N, p=p, seed=seed)
        pca = PCA().fit(sample.X).components_
        stray.append(top3_angle(MCPCA().fit(sample.X).components_, pca))
        own.append(top3_angle(pca, sample.components))
    ratio = np.sqrt(np.mean(np.square(stray)) / np.mean(np.square(own)))
    assert ratio < bound, ratio


@pytest.mark.parametrize("scenario", ["paper20", "orthogonal10", "cluster25"])
def test_explained_variance_is_robust(scenario):
    sample = make_scenario(scenario, n=N, p=10, seed=2)
    model = MCPCA().fit(sample.X)
    ratio = model.explained_variance_[:3] / sample.eigenvalues[:3]
    assert np.all(np.abs(ratio - 1) < 0.15), ratio
    assert np.max(np.abs(model.mean_ - sample.center)) < 0.2


@pytest.mark.parametrize("scenario", LABELLED)
def test_outlier_flags_precision_and_recall(scenario):
    sample = make_scenario(scenario, n=N, p=10, seed=3)
    model = MCPCA().fit(sample.X)
    flags = model.is_outlier(sample.X)
    recall = flags[sample.outliers].mean()
    precision = sample.outliers[flags].mean()
    assert recall > 0.95 and precision > 0.95, (precision, recall)


def test_default_lands_near_full_convergence():
    sample = make_scenario("paper20", n=60_000, p=10, seed=4)
    fast = MCPCA(sample_size=5000).fit(sample.X)
    full = MCPCA(sample_size=5000, tol=1e-10, max_iter=200).fit(sample.X)
    assert fast.n_passes_ < full.n_passes_
    assert top3_angle(fast.components_, full.components_) < 0.5


@pytest.mark.parametrize("n", [1, 2, 7, 20_000, 20_001])
def test_row_medians_are_numpys_medians(n):
    """The outlyingness start's medians (one selection per row, the lower middle value of an
    even length taken as the largest below the upper one) equal np.median's, ties included."""
    from dask_mcpca._start import _row_medians

    rng = np.random.default_rng(n)
    A = rng.normal(size=(6, n))
    A[1] = np.round(A[1])  # many ties
    A[2] = 3.0  # all equal
    np.testing.assert_array_equal(_row_medians(A), np.median(A, axis=1))
