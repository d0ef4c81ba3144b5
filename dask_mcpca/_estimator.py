"""The scikit-learn estimator :class:`MCPCA`.

``fit`` validates, opens the data as row blocks (:mod:`._io`), makes the first
pass (moments, a row sample and the NaN check), then hands over to one solver:
:func:`._paper.fit_paper` (Algorithms 1-3 as published) or
:func:`._robust.fit_robust` (the default).  Both run their passes through
:class:`._passes.PassRunner`, which counts them.
"""

from __future__ import annotations

import os
import warnings
from numbers import Integral, Real
from typing import Any, Literal

import dask.array as da
import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin, clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import Interval, Options, StrOptions, validate_parameter_constraints
from sklearn.utils.validation import check_is_fitted

from . import _checkpoint, _labels, _missing, _persist
from ._atomic import overlaps
from ._block import BlockStats, PassPlan
from ._contributions import contributions_with_gaps
from ._io import as_row_blocks, split_store_path
from ._paper import fit_paper
from ._passes import NonFiniteRowsError, NumericalRangeError, PassRunner, single_threaded_blas, spread_blocks
from ._power import descending_eigh, orient_rows, variance_floor
from ._robust import (
    FAR_ROW,
    SAMPLE_SIZE,
    RobustState,
    fit_robust,
    held_out,
    outlyingness,
    quantization_steps,
    update_robust,
    warm_step,
    working_exponent,
)
from ._schedule import OUTLIER_QUANTILE, calibrated_cutoff, outlier_cutoff_d2, robust_kernel_size2

__all__ = ["MCPCA", "check_params", "load"]

#: Fitted attributes that hold what :meth:`MCPCA.partial_fit` updates from (see its docstring).
UPDATE_ATTRIBUTES = ("update_log_weights_", "update_means_", "update_covariances_", "update_location_",
                     "update_scatter_", "update_radii_", "update_unit_", "n_samples_seen_")

#: ``partial_fit`` warns when the new rows' weighted share under the final kernel is below this:
#: most of them lie beyond it, where they are flagged and barely move the model (a new regime).
UPDATE_WARN_SHARE = 0.5

SOLVERS = ("auto", "paper")
CENTERS = ("robust", "mean", False)
NAN_POLICIES = ("raise", "omit", "partial")
DEFAULT_TOL = {"paper": 1e-6, "auto": 1e-3}
DEFAULT_MAX_ITER = {"paper": 100, "auto": 3}

#: Allowed ``kernel_factor``: its square scales kernel sizes and radii, and
#: beyond this range they leave float64's comfortable range (1e200 overflowed
#: in ``kernel_factor**2``) while the fit is long since ordinary PCA (above)
#: or rests on a handful of rows (below).
KERNEL_FACTOR_RANGE = (1e-3, 1e6)

#: Below this ``kernel_factor`` a fit rests on a few rows and ``fit`` warns.
#: The default solver's flat top then holds less than the half of the rows
#: its coverage guarantee keeps (the radius scales with ``kernel_factor**2``)
#: and its variances are biased: on Gaussian data (n = 20000, p = 3) 0.3 gave
#: the second variance 16 % too high and 0.1 the first 45 % too low, while
#: 0.5 was within 3 %.  The paper's solver (n = 2000, p = 3) flagged 53 % of
#: the clean rows at 0.01 and 98 % at 0.001, with ``converged_`` True.
MIN_KERNEL_FACTOR = 0.5


def check_params(estimator: MCPCA) -> None:
    """Check the parameters of ``estimator`` as :meth:`MCPCA.fit` does first.

    The rules are the declarative ``MCPCA._parameter_constraints`` (scikit-learn's
    mechanism); this is the public path to the same check for other callers,
    such as the command line, before any data is opened.

    Parameters
    ----------
    estimator : MCPCA
        The estimator whose constructor parameters are checked.

    Raises
    ------
    sklearn.utils._param_validation.InvalidParameterError
        A subclass of ``ValueError`` and ``TypeError`` whose message names the
        parameter, the expected values and the value given.

    Examples
    --------
    >>> from dask_mcpca import MCPCA, check_params
    >>> check_params(MCPCA(solver="paper"))
    >>> check_params(MCPCA(eta=1.5))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    sklearn.utils._param_validation.InvalidParameterError: The 'eta' parameter of MCPCA must be ... Got 1.5 instead.
    """
    validate_parameter_constraints(
        type(estimator)._parameter_constraints,
        estimator.get_params(deep=False),
        caller_name=type(estimator).__name__,
    )
    if estimator.nan_policy == "partial" and estimator.solver != "auto":
        raise ValueError(
            f"{type(estimator).__name__}: nan_policy='partial' needs solver='auto' (the paper's algorithm "
            f"weighs whole rows); got solver={estimator.solver!r}: use nan_policy='omit' with it"
        )


#: Accepted chance that the row sample of the robust start is too small.
SAMPLE_SHORT_PROB = 1e-9


def _least_sample_size(needed: int) -> int:
    """Smallest ``sample_size`` whose row sample holds ``needed`` rows but with ``SAMPLE_SHORT_PROB``.

    Each row is kept with probability ``sample_size / n``, so the sample's
    size is binomial, with a lower tail below that of Poisson(``sample_size``);
    checking the Poisson tail makes whether a fit can start independent of
    the seed (a ``sample_size`` just above ``needed`` failed on some seeds).
    """
    from scipy.stats import poisson

    lo, hi = needed, 2 * needed + 64
    while poisson.cdf(needed - 1, hi) > SAMPLE_SHORT_PROB:
        hi *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if poisson.cdf(needed - 1, mid) <= SAMPLE_SHORT_PROB else (mid + 1, hi)
    return lo


def _variances_in_data_units(lam_w: np.ndarray, unit: int) -> np.ndarray:
    """Variances from working units ``2**unit`` to the data's units, or a named error.

    The largest variance must be a normal float64; the smaller ones may
    underflow, as they would beside it in any float64 eigendecomposition.
    """
    with np.errstate(over="ignore", under="ignore"):
        lam = np.ldexp(lam_w, 2 * unit)
    top = lam.max(initial=0.0)
    if lam_w.max(initial=0.0) > 0 and not (np.isfinite(top) and top >= np.finfo(np.float64).tiny):
        where = "above the largest" if not np.isfinite(top) else "below the smallest normal"
        power = -100 if not np.isfinite(top) else 100
        exponent = float(np.log10(lam_w.max())) + 2 * unit * float(np.log10(2.0))
        raise NumericalRangeError(
            f"the robust variances of these data (the largest about 1e{exponent:.0f}) are {where} float64 "
            f"number and cannot be reported; multiply the data by a power of two such as 2**{power} "
            "before fitting: the components do not change and the variances scale by its square"
        )
    return lam


def _in_working_units(rows: np.ndarray) -> tuple[np.ndarray, int]:
    """In-memory rows (wide data) in the fit's working units ``2**unit``, or a named error.

    As for a fit by passes (:func:`._robust.working_exponent`); here every
    row enters the SVD, so a row beyond ``FAR_ROW`` spreads cannot be left
    out of the arithmetic and is refused instead.
    """
    unit = working_exponent(rows, np.zeros(0), np.zeros(0))
    with np.errstate(over="ignore"):
        scaled = np.ldexp(rows, -unit)
    if not np.all(np.abs(scaled) <= FAR_ROW):
        raise NumericalRangeError(
            "wide data (fewer rows than n_features + 2): some rows lie more than ~1e120 spreads from the "
            "others, too far for float64 to hold their distances in one fit; remove them"
        )
    return scaled, unit


def _nan_for_nonfinite_rows(func, nan_policy: str = "omit"):
    """Wrap a row-block function: rows holding NaN or inf give NaN (False for flags).

    Under ``nan_policy="raise"`` such rows raise :class:`NonFiniteRowsError`
    instead (for dask input, when the block is computed).  Under
    ``"partial"``, rows with some cells NaN (none inf) reach ``func`` as
    they are, which handles them by their observed cells; rows with every
    cell NaN, or an inf, give NaN.
    """

    def wrapped(block):
        bad = ~np.isfinite(block).all(axis=1)
        if bad.any() and nan_policy == "partial":
            bad &= ~_missing.partial_rows(np.asarray(block))
        if not bad.any():
            return func(block)
        if nan_policy == "raise":
            raise NonFiniteRowsError(
                f"{int(bad.sum())} of {len(bad)} rows hold NaN or inf; clean them, or fit with "
                "nan_policy='omit' to get NaN for such rows"
            )
        out = func(np.where(bad[:, None], 0.0, block))
        out[bad] = np.nan if out.dtype.kind == "f" else 0
        return out

    return wrapped


#: What :meth:`MCPCA.score_rows` computes: name -> dtype.
ROW_OUTPUTS = {
    "scores": np.float64,
    "weight": np.float64,
    "outlier": np.bool_,
    "d2": np.float64,
    "contributions": np.float64,
    "n_observed": np.int16,
    "top_channel": np.int16,
}


def _top_channel(contributions: np.ndarray) -> np.ndarray:
    """Index of each row's largest contribution (int16); -1 where they are all NaN."""
    empty = np.isnan(contributions).all(axis=1)
    top = np.argmax(np.where(np.isnan(contributions), -np.inf, contributions), axis=1).astype(np.int16)
    top[empty] = -1
    return top


def _picker(name: str):
    """A block function taking output ``name`` out of a block of :meth:`MCPCA.score_rows`'s dicts."""

    def pick(parts):
        return parts[name]

    return pick


def _observed_counts(block) -> np.ndarray:
    """Cells not NaN per row of an in-memory block (int16)."""
    return (~np.isnan(np.asarray(block, np.float64))).sum(axis=1).astype(np.int16)


def _frame_like(out: Any, X: Any) -> Any:
    """``out`` (n_samples x n_features) as a DataFrame with ``X``'s index and columns when ``X`` is one."""
    if _labels.is_dataframe(X):
        import pandas as pd

        return pd.DataFrame(np.asarray(out), index=X.index, columns=X.columns)
    return out


class MCPCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Robust PCA by maximum correntropy power iterations, on data of any size.

    Each row is weighted by a Gaussian kernel of its reconstruction error; the
    weighted scatter ``X^T G X`` gives the components.  Input may be a numpy
    array, a dask array, a Zarr or HDF5 store (opened read-only) or an
    ``xarray.DataArray``; every pass over the data is one task per row block
    and a tree reduction, so the data never has to fit in memory.

    Parameters
    ----------
    n_components : int or None, default=None
        Number of components to keep; None keeps all p (the paper's point: no
        need to choose in advance).
    solver : {"auto", "paper"}, default="auto"
        ``"paper"``: Algorithms 1-3 as published (kernel sizes from the EVD of
        ``X^T X / n``, ``n_decay`` sizes shrunk by ``eta``, each run to
        convergence; one pass per re-weighting).  ``"auto"``: the robust,
        pass-efficient default: a start from the least outlying half of a
        row sample (Stahel-Donoho outlyingness), then a re-weighting fixed
        point with a flat-top correntropy kernel of the Mahalanobis distance
        (eq. (1)) whose radius is calibrated on the data's own distances; all
        components at once, in 2-4 passes.
    center : {"robust", "mean"} or False, default="robust"
        ``"robust"``: the robust location (a weighted mean with weights
        from the fit).  ``"mean"``: the ordinary mean.  False: no centring,
        the paper's zero-mean setting.
    eta : float, default=0.95
        Kernel-size decay factor of the paper's schedule (``solver="paper"``).
    n_decay : int, default=65
        Number of kernel sizes per component (``solver="paper"``).
    kernel_factor : float, default=1.0
        Multiplies the solver's kernel sizes: the paper's starting sizes
        ``sqrt(lambda_i)``, or the default's flat-top radius and fall-off
        (their square roots).  Large values make all weights equal and the
        fit ordinary PCA; small values are more robust and less efficient.
        Must lie in [1e-3, 1e6] (beyond, kernel sizes leave float64's
        range while the fit has long been ordinary PCA or rests on a handful
        of rows); below 0.5 ``fit`` warns (``UserWarning``) that the fit
        rests on few rows, with biased variances and many clean rows
        flagged (measured: see ``MIN_KERNEL_FACTOR`` in the source).
    tol : float or None, default=None
        Convergence tolerance.  ``"paper"``: on ``||v_new - v||`` of the
        inner and outer loops (default 1e-6).  ``"auto"``: on the estimated
        distance to the fixed point, relative to the robust scatter (default:
        1e-3, or a tenth of the scatter's own sampling error,
        ``0.1 * sqrt(p / n)``, where that is larger).
    max_iter : int or None, default=None
        ``"paper"``: bound on re-weightings per kernel size (default 100).
        ``"auto"``: bound on full-data passes after the first (default 3, so
        a default fit reads the data at most 4 times).  A fit that stops
        unconverged warns with scikit-learn's ``ConvergenceWarning``.
    nan_policy : {"raise", "omit", "partial"}, default="raise"
        Rows with NaN or inf: raise a ``ValueError``; ``"omit"``: leave them
        out of the fit (their transform and score are NaN); ``"partial"``:
        rows with some NaN cells (a channel offline) take part by their
        observed cells, in the fit (EM: the missing cells' conditional
        expectation and covariance enter the weighted scatter) and in every
        per-row method (distances on the observed cells, the outlier cutoff
        calibrated for their number, scores of the completed row; see
        :meth:`impute`); rows with every cell NaN, or an inf, are left out
        as under ``"omit"``.  ``"partial"`` needs ``solver="auto"``.  Checked
        within the passes.
    checkpoint : str or path-like, optional
        Local file to which the small state of the fit is written after every
        step (atomically); a fit started again with the same data and
        parameters resumes there.  A URL other than ``file://`` is refused,
        as is a path inside the store being fitted.
    sample_size : int, default=20000
        Rows drawn during the first pass for the robust start (``"auto"``).
    random_state : int or None, default=None
        Seed of that row sample (None: 0, so fits are reproducible).
    progress : bool, default=False
        Draw a progress line per pass on stderr.
    warm_start : bool, default=False
        Refit from the previous call to ``fit`` (scikit-learn's convention):
        with ``solver="auto"`` and ``center`` robust or False, the previous
        fit's location, scatter and radii go straight into the full-data
        passes, with no sample stage; the first pass draws the new row
        sample.  For an archive grown by rows like the old ones this takes
        2 passes and gives the cold fit's components (within 0.1 degree in
        the tests).  A fit of another width, or a model loaded from a file,
        starts cold.  To add rows to a model without reading the old ones
        again, see :meth:`partial_fit`.
    contamination : "auto" or float in (0, 0.5], default="auto"
        The alarm rate of the outlier rule (scikit-learn's and PyOD's
        parameter): ``"auto"`` keeps the calibrated cutoff (the 99.8 %
        quantile of the fitted bulk's own law of ``d^2``, see
        ``outlier_cutoff_``: about 0.2 % of rows like the bulk flagged,
        whatever share of the data is contaminated); a float sets
        ``outlier_cutoff_`` to the ``1 - contamination`` quantile of the
        fitted row sample's distances (rows flagged as repeated counted as
        beyond it), so that this share of the sample (of every row when the
        data has at most ``sample_size`` rows) is flagged.  It changes only
        the cutoff (``is_outlier``, ``predict``, ``decision_function``),
        never the fit.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        Orthonormal rows, ordered by decreasing robust variance (``"auto"``)
        or as found (``"paper"``); the largest entry of each row is positive.
    explained_variance_ : ndarray of shape (n_components,)
        Robust variance along each component.  Normalised by the total weight
        of the rows (n when all weights are equal), as ``np.cov(X, bias=True)``
        and scikit-learn's ``EmpiricalCovariance`` and ``MinCovDet``; scikit-learn's
        ``PCA`` divides by n - 1 instead, so with equal weights this is
        ``PCA().explained_variance_ * (n - 1) / n``.
    explained_variance_ratio_ : ndarray of shape (n_components,)
        ``explained_variance_`` over the total robust variance.
    mean_ : ndarray of shape (n_features,)
        The centre subtracted from the data (zeros for ``center=False``).
    covariance_ : ndarray of shape (n_features, n_features)
        The robust scatter implied by the fit.
    noise_variance_ : float
        Mean robust variance of the discarded directions (0 if none).
    sigmas_ : ndarray of shape (n_components,)
        Final kernel size of each component, in data units (NaN for the
        paper's last component, which comes from a null space).
    kernel_scale_ : float
        ``c`` of the Mahalanobis kernel ``exp(-d^2 / (2 c^2))`` used by
        :meth:`score_samples`.
    outlier_cutoff_ : float
        ``d^2`` above which :meth:`is_outlier` flags a row.  ``"auto"``: the
        99.8 % quantile of the fitted bulk's own law of ``d^2`` (the cube
        roots of the sample's distances taken as normal, by median and MAD;
        never below the Gaussian quantile at the effective sample size), so
        heavy tails and several regimes are not flagged.  ``"paper"``: the
        chi-square 99.8 % quantile.
    outlier_threshold_ : float
        Score below which :meth:`is_outlier` flags a row:
        ``exp(-outlier_cutoff_ / (2 kernel_scale_^2))``.
    offset_ : float
        ``outlier_threshold_`` under scikit-learn's name (as in
        ``EllipticEnvelope``): ``decision_function = score_samples - offset_``.
    threshold_ : float
        ``outlier_cutoff_`` under PyOD's name: the ``d^2`` above which a row
        is an outlier.
    n_samples_seen_ : int
        ``"auto"``: rows in the sums the model keeps for :meth:`partial_fit`
        (those of ``fit`` and of every update since).
    update_log_weights_, update_means_, update_covariances_ : ndarray
        ``"auto"``: what the model keeps for :meth:`partial_fit`, in the
        working unit ``2**update_unit_``: for the core and the final kernel
        (rows 0 and 1), the log of the total weight of every row seen, shape
        (2,), their weighted mean, shape (2, n_features), and their weighted
        covariance about it, shape (2, n_features, n_features).
    update_location_, update_scatter_, update_radii_, update_unit_
        ``"auto"``: the robust state that weighs the next update's rows (the
        core's location, shape (n_features,), and scatter, shape
        (n_features, n_features), in the working unit ``2**update_unit_``;
        ``update_radii_`` holds the kernels' ``c^2`` and the core and final
        flat-top radii).  Absent for ``solver="paper"`` and wide data.
    support_ : float
        ``"auto"``: share of the rows' weight in the last re-weighting step
        (weighted rows over rows); at least half of the rows carry full
        weight in every step.
    quantization_steps_ : ndarray of shape (n_features,)
        Each channel's quantization step, found on the row sample (0 for a
        continuous channel; the median gap between its levels where half of
        the rows hold values that recur: an ADC's step, 1 for counts and
        one-hot columns).  ``is_outlier`` and ``score_samples`` judge a row
        by the point of its quantization cells nearest the centre: a reading
        says only that the value lies within half a step of it.
    repeated_values_ : ndarray of shape (n_repeated, 2)
        ``"auto"``: ``(column, value)`` pairs that a column of the sample holds
        exactly in at least max(5, 0.1 %) and at most 10 % of its rows, and
        at least 5 times as often as any of the 4 nearest distinct values of
        that column on either side: a stuck sensor's value (counted on the
        rows not equal to a ``repeated_rows_`` row).  Rows holding one carry
        no weight in the fit and :meth:`is_outlier` flags them.
    repeated_rows_ : ndarray of shape (n_repeated_rows, n_features)
        ``"auto"``: whole rows that the sample repeats exactly, in at least
        max(5, 0.1 %) and at most 10 % of its rows, and at least 5 times as
        often as each row equal to it but in one column, moved to one of that
        column's 4 nearest distinct values on either side: a frozen logger's
        record (the lattice neighbours keep the natural duplicates of
        quantized sensors at rest out).  At most 16, those repeated most.
        Rows equal to one carry no weight in the fit and :meth:`is_outlier`
        flags them.  Empty for ``"paper"``.
    n_passes_ : int
        Full passes over the data made by this call to ``fit`` (1 for an
        update by :meth:`partial_fit`: one pass over the new rows).
    n_partial_reads_ : int
        Reads of only some row blocks made by this call to ``fit``: 1 when
        the row sample was drawn from a spread of the blocks of a store of
        many blocks (see Notes), else 0.
    n_blocks_read_ : int
        Row blocks read by those partial reads.
    n_iter_ : int
        Re-weighting steps made on the full data.
    converged_ : bool
        Whether every iterative loop met ``tol`` within its bound.
    n_samples_ : int
        Rows used (rows with NaN or inf left out under ``nan_policy="omit"``;
        under ``"partial"``, rows with some observed cells included); after
        an update by :meth:`partial_fit`, the new rows it read.
    n_components_ : int
        Number of components kept: ``n_components``, or n_features if None.
    n_features_in_ : int
        Number of features (columns) seen during :meth:`fit`.
    feature_names_in_ : ndarray of shape ``(n_features_in_,)``
        Names of the features seen during :meth:`fit`: the columns of a
        pandas DataFrame, or the channel coordinate of an ``xarray.DataArray``
        (only when they are all strings).
    feature_dim_in_ : str
        Name of the channel dimension of an ``xarray.DataArray`` seen during
        :meth:`fit` (only for DataArray input).
    archive_rows_ : ndarray of shape ``(2,)``, dtype int64
        Set only by the command line (``dask-mcpca fit`` and ``update``):
        the span ``[start, stop)`` of archive rows, by position, that the
        model's sums were read from; ``dask-mcpca update`` reads the rows
        from ``stop`` on by default.  Removed by :meth:`fit` and
        :meth:`partial_fit`, which do not know where their rows come from.

    See Also
    --------
    sklearn.decomposition.PCA : Ordinary PCA, for data without outliers.
    sklearn.covariance.MinCovDet : Robust covariance by the MCD, in memory.
    dask_mcpca.load : Read a model written by :meth:`save`.

    Notes
    -----
    For component i the paper maximises the correntropy of the deflated
    reconstruction error (eq. (11)); its stationary point is the dominant
    eigenvector of ``K = Q_(i-1) (S - P S - S P)`` with ``S = X^T G X``
    (eq. (14)), found by power iteration after the shift by ``max|diag K|``
    (eq. (15)), and deflation updates P and Q by Woodbury (Algorithm 3).
    The weights are accumulated with a per-block log-scale, so they cannot
    all underflow for small kernel sizes.

    Every pass after the first, and the in-memory work, sees the data in
    units of a power of two near the bulk's spread (from the first pass's
    row sample): scaling by it is exact, so ``c * X`` gives the same fit as
    ``X`` (variances times ``c**2``) over float64's range, and rows far
    beyond the bulk (a finite 1e308) get weight 0 instead of overflowing.
    What float64 cannot hold (variances beyond its range, a pass whose
    weighted scatter overflows) raises :class:`NumericalRangeError`.

    The row sample of the robust start is drawn in a first full pass, except
    for ``solver="auto"`` (``center`` robust or False) on a store of at least
    16 row blocks: there it comes from a spread of the blocks (an eighth of
    them, 8 to 32, evenly spaced; ``n_partial_reads_``), so a default fit
    reads the store fully 2-3 times instead of 3-4.  What this changes: the
    sample, hence the start and the radii, sees the archive at 8-32 evenly
    spaced times, so a regime or a run of faults shorter than the gap
    between two of those blocks may be missing from it; the full-data
    passes still weigh every row (a missing regime is down-weighted as
    outlying, not fitted), and the outlier cutoff is calibrated on the
    sample.  Which blocks are read depends on the chunking, so two
    chunkings of such a store draw different samples and give components
    that agree within the sampling noise of the radii (0.1 degree in the
    tests) rather than to round-off; stores of fewer blocks, and numpy
    input, are unaffected.  The working unit is then chosen from that
    partial sample (a power of two near its spread, as from a full pass's).

    Unlike scikit-learn, ``random_state=None`` does not mean "fresh
    randomness": it means seed 0, so that two fits of the same data give the
    same model (and a checkpointed fit can resume).  The row sample is drawn
    from a hash of the seed and each row's global index, so it does not
    depend on the chunking either.  Pass another int for another sample.

    References
    ----------
    J. P. Chereau, B. Scalzo Dees, D. P. Mandic, "Robust principal component
    analysis based on maximum correntropy power iterations".
    M. Hubert, P. J. Rousseeuw, T. Verdonck, "A deterministic algorithm for
    robust location and scatter", JCGS 21 (2012).

    Examples
    --------
    >>> import numpy as np
    >>> from dask_mcpca import MCPCA
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(2000, 3)) * [3.0, 1.0, 0.3]
    >>> X[:100] = rng.normal(scale=30.0, size=(100, 3))   # 5 % outliers
    >>> model = MCPCA().fit(X)
    >>> axis = np.array([1.0, 0.0, 0.0])                  # the true first component
    >>> bool(abs(model.components_[0] @ axis) > 0.99)
    True
    >>> from sklearn.decomposition import PCA
    >>> bool(abs(PCA().fit(X).components_[0] @ axis) > 0.99)   # pulled off by the outliers
    False
    >>> bool(model.is_outlier(X[:100]).all()), bool(model.is_outlier(X[100:]).mean() < 0.01)
    (True, True)
    >>> model.n_passes_ <= 12
    True
    """

    _parameter_constraints: dict = {
        "n_components": [Interval(Integral, 1, None, closed="left"), None],
        "solver": [StrOptions(set(SOLVERS))],
        "center": [StrOptions({c for c in CENTERS if c}), Options(bool, {False})],
        "eta": [Interval(Real, 0, 1, closed="neither")],
        "n_decay": [Interval(Integral, 1, None, closed="left")],
        "kernel_factor": [Interval(Real, KERNEL_FACTOR_RANGE[0], KERNEL_FACTOR_RANGE[1], closed="both")],
        "tol": [Interval(Real, 0, None, closed="neither"), None],
        "max_iter": [Interval(Integral, 1, None, closed="left"), None],
        "nan_policy": [StrOptions(set(NAN_POLICIES))],
        "checkpoint": [str, os.PathLike, None],
        "sample_size": [Interval(Integral, 10, None, closed="left")],
        "random_state": [Interval(Integral, 0, 2**64 - 1, closed="both"), None],
        "progress": ["boolean"],
        "warm_start": ["boolean"],
        "contamination": [StrOptions({"auto"}), Interval(Real, 0, 0.5, closed="right")],
    }

    def __init__(
        self,
        n_components: int | None = None,
        *,
        solver: Literal["auto", "paper"] = "auto",
        center: Literal["robust", "mean", False] = "robust",
        eta: float = 0.95,
        n_decay: int = 65,
        kernel_factor: float = 1.0,
        tol: float | None = None,
        max_iter: int | None = None,
        nan_policy: Literal["raise", "omit"] = "raise",
        checkpoint: str | os.PathLike | None = None,
        sample_size: int = SAMPLE_SIZE,
        random_state: int | None = None,
        progress: bool = False,
        warm_start: bool = False,
        contamination: Literal["auto"] | float = "auto",
    ):
        self.n_components = n_components
        self.solver = solver
        self.center = center
        self.eta = eta
        self.n_decay = n_decay
        self.kernel_factor = kernel_factor
        self.tol = tol
        self.max_iter = max_iter
        self.nan_policy = nan_policy
        self.checkpoint = checkpoint
        self.sample_size = sample_size
        self.random_state = random_state
        self.progress = progress
        self.warm_start = warm_start
        self.contamination = contamination

    # ------------------------------------------------------------------ fit
    def fit(self, X: Any, y: None = None, *, storage_options: dict | None = None) -> MCPCA:
        """Fit the model to ``X``.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Shape (n_samples, n_features).  A string names a Zarr store or
            ``"file.h5:/dataset"``, or is a Zarr URL that fsspec understands
            (``"s3://bucket/archive.zarr"``, ``gs://``, ``abfs://``, ``https://``).
        y : None
            Ignored; present for scikit-learn's API.
        storage_options : dict, optional
            fsspec options for a URL (``{"endpoint_url": ...}``, credentials);
            without them the backend reads credentials from the environment.
            Every method that reads ``X`` takes the same argument.

        Returns
        -------
        self : MCPCA
            The fitted estimator.

        Raises
        ------
        NonFiniteRowsError
            Rows hold NaN or inf and ``nan_policy="raise"``.
        NumericalRangeError
            A result or a pass of the fit is beyond float64's range (the
            message names it and what to multiply the data by).
        CheckpointMismatchError
            ``checkpoint`` names a file written by another fit.

        See Also
        --------
        check_params : The parameter check ``fit`` makes before any pass.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> X = np.random.default_rng(0).normal(size=(500, 4))
        >>> model = MCPCA(n_components=2).fit(X)
        >>> model.components_.shape, model.n_components_, model.n_features_in_
        ((2, 4), 2, 4)
        """
        check_params(self)
        _labels.check_feature_names(self, X, reset=True)
        if self.checkpoint is not None and isinstance(X, str | os.PathLike):
            store = split_store_path(X)[0]
            if overlaps(self.checkpoint, store):
                raise ValueError(
                    f"checkpoint={os.fspath(self.checkpoint)!r} would be written inside the input store {store!r} "
                    "(an input store is never written to); name a path outside it"
                )
        X = as_row_blocks(X, storage_options=storage_options)
        if X.shape[0] < 2:
            raise ValueError(
                f"Found array with {X.shape[0]} sample(s) (shape={X.shape}) while a minimum of 2 is required "
                f"by {type(self).__name__}"
            )
        with single_threaded_blas():
            return self._fit(X)

    def fit_transform(self, X: Any, y: None = None, *, storage_options: dict | None = None):
        """Fit to ``X`` and project it: ``fit(X).transform(X)``, a URL read with ``storage_options`` both times.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Input kinds as for :meth:`fit`.
        y : None
            Ignored.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        Returns
        -------
        X_new : ndarray, dask array or DataArray of shape ``(n_samples, n_components_)``
            As :meth:`transform` returns it.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> X = np.random.default_rng(0).normal(size=(500, 4))
        >>> MCPCA(n_components=2).fit_transform(X).shape
        (500, 2)
        """
        return self.fit(X, y, storage_options=storage_options).transform(X, storage_options=storage_options)

    def partial_fit(self, X: Any, y: None = None, *, storage_options: dict | None = None) -> MCPCA:
        """Fit on the first call; on later calls, update the model from the new rows ``X`` only, in one pass.

        The first call (an unfitted model) is :meth:`fit`.  A fitted model
        keeps, for the default solver, the weighted sums of every row it has
        seen (``update_*`` attributes, saved by :meth:`save`): for the core
        and the final kernel, the total weight (with its log-scale), the
        weighted mean and the weighted covariance, in the fit's working unit,
        and the robust state whose kernels weigh new rows.  An update:

        1. reads the new rows once, weighting each by the current state's
           core and final kernels (``update_location_``,
           ``update_scatter_``, the radii of ``update_radii_``; rows holding
           a ``repeated_values_`` value or equal to a ``repeated_rows_`` row
           get none), as the next re-weighting pass of a fit would;
        2. merges their sums with the kept ones by the pairwise formula of
           Chan, Golub and LeVeque;
        3. sets ``mean_``, ``components_``, the variances and
           ``covariance_`` from the merged final kernel, as ``fit`` does
           (consistent at the Gaussian), and the next state from the merged
           core kernel; the merged sums are kept for the next update.

        Every row thus keeps the weight the model gave it when it arrived.
        For rows like those fitted this is the weight a refit would give
        them (a fit is a fixed point of that re-weighting), so updates by
        appended chunks give ``fit`` on all the rows within sampling noise
        (``benchmarks/MONITORING.md``).  The outlier cutoff
        (``outlier_cutoff_``, ``contamination``), the kernels' radii and the
        repeated values and rows are kept: they are calibrated on the fit's
        row sample, and recalibrating them on a day's rows would let that
        day's own faults (or a new regime) set what counts as normal.
        ``n_samples_`` and ``n_passes_`` then say what the update read (the
        new rows, 1 pass); ``n_samples_seen_`` counts every row in the sums.

        **A change of regime is not followed.**  Rows of a new operating
        regime lie far from the model, get little or no weight and are
        flagged; the model stays on the old regime.  When most of the new
        rows lie beyond the model's final kernel (their weighted share is
        below one half, so most would be flagged), ``partial_fit`` warns
        (``UserWarning``).  To follow the change, refit: ``fit`` on the
        rows of the new regime, or on the whole archive with
        ``warm_start=True`` (which re-reads it and recalibrates everything).

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            The new rows, shape (n_samples, n_features) with the fit's
            features; input kinds as for :meth:`fit`.
        y : None
            Ignored; present for scikit-learn's API.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        Returns
        -------
        self : MCPCA
            The fitted or updated estimator.

        Raises
        ------
        ValueError
            ``X`` has other features than the fit; or the model keeps no sums
            to update (``solver="paper"``, data with fewer rows than
            ``n_features + 2``, a model saved before ``partial_fit`` existed):
            refit it.

        See Also
        --------
        fit : A fit on all the rows (a refit follows a change of regime).

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(20000, 3)) * [3.0, 1.0, 0.3]
        >>> model = MCPCA().partial_fit(X[:10000])             # the first call fits
        >>> for day in np.array_split(X[10000:], 4):            # then one pass over each new chunk
        ...     model = model.partial_fit(day)
        >>> model.n_samples_, model.n_passes_, model.n_samples_seen_
        (2500, 1, 20000)
        >>> full = MCPCA().fit(X)
        >>> bool(np.allclose(model.explained_variance_, full.explained_variance_, rtol=0.02))
        True
        """
        if not hasattr(self, "components_"):
            return self.fit(X, y, storage_options=storage_options)
        check_params(self)
        _labels.check_feature_names(self, X, reset=False)
        X = as_row_blocks(X, storage_options=storage_options)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input"
            )
        if X.shape[0] < 1:
            raise ValueError(f"Found array with 0 sample(s) (shape={X.shape}) while a minimum of 1 is required "
                             f"by {type(self).__name__}.partial_fit")
        if not hasattr(self, "update_location_"):
            raise ValueError(
                f"{type(self).__name__}.partial_fit: this model keeps no sums to update (fitted with "
                f"solver={self.solver!r}, on fewer rows than n_features + 2, or saved by a version without "
                "partial_fit); refit it with fit, then update it with partial_fit"
            )
        with single_threaded_blas():
            return self._update(X)

    def _update(self, X):
        """An update by new rows; see :meth:`partial_fit`."""
        vars(self).pop("archive_rows_", None)  # the command line sets it again (it knows the archive)
        unit, k = int(self.update_unit_), self.n_components_
        state = self._update_state()
        sums = BlockStats(n_rows=int(self.n_samples_seen_), n_nonfinite=0, log_scale=self.update_log_weights_.copy(),
                          weight=np.ones(2), mean=self.update_means_.copy(), scatter=self.update_covariances_.copy())
        runner = PassRunner(X, nan_policy=self.nan_policy, progress=self.progress)
        runner.unit_exp = unit
        fixed = None if self.center == "robust" else state.location
        state, merged, new = update_robust(runner, state, sums, fixed_center=fixed)
        share = float(new.weight[1] * np.exp(new.log_scale[1]) / max(new.n_rows, 1))
        if share < UPDATE_WARN_SHARE:
            warnings.warn(
                f"MCPCA.partial_fit: most of the {new.n_rows} new rows lie beyond the model's final kernel "
                f"(their weighted share is {share:.1%}): they are flagged as outliers and barely move the "
                "model, which does not follow a change of regime; if the process changed, refit "
                "(fit on the new regime's rows, or warm_start=True and fit on the whole archive)",
                UserWarning,
                stacklevel=3,
            )
        cutoff, repeated, rows = self.outlier_cutoff_, self.repeated_values_, self.repeated_rows_
        lam, V = descending_eigh(state.final_scatter)
        lam = _variances_in_data_units(np.maximum(lam, 0.0), unit)
        self.components_ = orient_rows(V[:, :k].T)
        self._set_variances(lam[:k], lam[k:], lam.sum(), np.ldexp(state.final_location, unit), self.kernel_scale_)
        self.repeated_values_, self.repeated_rows_ = repeated, rows
        self._set_cutoff(cutoff)
        self.support_ = state.support
        self._keep_update_sums(state, merged, unit)
        self.n_samples_, self.n_passes_ = int(new.n_rows), runner.n_passes
        self.n_partial_reads_, self.n_blocks_read_, self.n_iter_ = 0, 0, 1
        self._robust_state, self._robust_unit = state, unit  # a warm_start refit continues from the update
        return self

    def _forget_update_sums(self) -> None:
        """Remove the sums kept for :meth:`partial_fit` (a refit sets them anew, or has none)."""
        for name in UPDATE_ATTRIBUTES:
            if name in vars(self):
                delattr(self, name)

    def _keep_update_sums(self, state, sums: BlockStats, unit: int) -> None:
        """Keep the core and final kernels' sums of every row seen, and the state that weighs new rows."""
        with np.errstate(divide="ignore"):
            self.update_log_weights_ = np.log(np.asarray(sums.weight, np.float64)) + sums.log_scale
        self.update_means_ = np.array(sums.mean, np.float64)
        self.update_covariances_ = np.stack([sums.covariance(j) for j in range(2)])
        self.update_location_ = np.array(state.location, np.float64)
        self.update_scatter_ = np.array(state.scatter, np.float64)
        self.update_radii_ = np.array([state.kernel_size2, state.cutoff, state.final_cutoff], np.float64)
        self.update_unit_ = int(unit)
        self.n_samples_seen_ = int(sums.n_rows)

    def _update_state(self) -> RobustState:
        """The robust state kept for :meth:`partial_fit`, in the working unit ``2**update_unit_``."""
        unit = int(self.update_unit_)
        repeated = self.repeated_values_.copy()
        repeated[:, 1] = np.ldexp(repeated[:, 1], -unit)  # exact: a power of two
        steps = np.ldexp(self.quantization_steps_, -unit)
        c2, cutoff, final_cutoff = (float(v) for v in self.update_radii_)
        return RobustState(
            location=self.update_location_.copy(), scatter=self.update_scatter_.copy(), kernel_size2=c2,
            cutoff=cutoff, final_cutoff=final_cutoff, repeated=repeated if len(repeated) else None,
            repeated_rows=np.ldexp(self.repeated_rows_, -unit) if len(self.repeated_rows_) else None,
            resolution=steps**2 / 12, converged=True,
        )

    def _fit(self, X):
        """The fit proper, on full-row blocks; see :meth:`fit`."""
        self._forget_update_sums()
        vars(self).pop("archive_rows_", None)  # the command line sets it again (it knows the archive)
        n, p = X.shape
        k = p if self.n_components is None else self.n_components
        if k > p:
            raise ValueError(f"MCPCA: parameter n_components={k} is invalid; X has only {p} features")
        needed = p + 2 if (self.solver == "auto" or self.center == "robust") else 2
        if n < needed and self.solver == "auto" and k <= n - 2:
            return self._fit_in_span(X, k)
        if n < needed:
            raise ValueError(
                f"X has {n} rows and {p} features; solver={self.solver!r} with center={self.center!r} "
                f"needs at least {needed} rows (or, with solver='auto', n_components <= {n - 2} to fit "
                "in the span of the rows)"
            )
        least = needed if n <= self.sample_size else _least_sample_size(needed)
        if n > self.sample_size < least:
            raise ValueError(
                f"MCPCA: parameter sample_size={self.sample_size} is invalid; the robust start "
                f"needs a row sample of at least {needed} rows (n_features + 2); the sample's size "
                f"varies with the seed, so sample_size must be at least {least}"
            )
        solver = self.solver
        if self.kernel_factor < MIN_KERNEL_FACTOR:
            warnings.warn(
                f"MCPCA: kernel_factor={self.kernel_factor} < {MIN_KERNEL_FACTOR} shrinks the kernels until the "
                "fit rests on a few rows: its variances are biased and many clean rows may be flagged; "
                f"use kernel_factor >= {MIN_KERNEL_FACTOR}",
                UserWarning,
                stacklevel=3,
            )
        tol = self.tol if self.tol is not None else DEFAULT_TOL[solver]
        max_iter = self.max_iter if self.max_iter is not None else DEFAULT_MAX_ITER[solver]
        runner = PassRunner(X, nan_policy=self.nan_policy, progress=self.progress)
        ckpt = _checkpoint.Checkpoint.open(
            self.checkpoint, params=self._fingerprint_params(), shape=(n, p), dtype=X.dtype
        )

        seed = 0 if self.random_state is None else self.random_state
        self.n_features_in_ = p
        warm = self._warm_state(p) if solver == "auto" else None
        refit = None if warm is None else self._warm_refit(runner, *warm, seed=seed, max_iter=max_iter)
        if refit is not None:
            robust, moments, unit = refit
            work = moments
        else:
            moments, work, unit, robust = self._cold_fit(runner, ckpt, seed=seed, max_iter=max_iter)
        fixed = {"mean": work.mean[0], False: np.zeros(p)}.get(self.center)
        center = robust.location if robust is not None else fixed
        sample = moments.sample if moments.sample is not None else np.empty((0, p))
        self.quantization_steps_ = quantization_steps(sample)  # before the cutoff, which is calibrated on cells
        if solver == "auto":
            self._set_from_robust(robust, k, moments, unit)
            self.n_iter_, self.converged_ = robust.n_iter, robust.converged
        else:
            scatter0 = work.covariance(about=center)
            if not np.all(np.isfinite(scatter0)):
                raise NumericalRangeError(
                    "solver='paper': the unweighted scatter of the data about the centre (Algorithm 3, line 1, "
                    "where its kernel sizes start) overflows float64: rows far beyond the bulk, near the "
                    "float64 limit, dominate it; use solver='auto', or remove those rows"
                )
            state = fit_paper(
                runner,
                center=center,
                scatter0=scatter0,
                n_components=k,
                eta=self.eta,
                n_decay=self.n_decay,
                kernel_factor=self.kernel_factor,
                tol=tol,
                max_iter=max_iter,
                state=ckpt.load("paper"),
                on_step=lambda s: ckpt.save("paper", s),
            )
            self._set_from_paper(state, center, scatter0, k, unit)
            self.n_iter_ = state.n_iter
            self.converged_ = state.converged and (robust is None or robust.converged)
        self.n_passes_ = runner.n_passes
        self.n_partial_reads_, self.n_blocks_read_ = runner.n_partial_reads, runner.n_blocks_read
        if self.contamination != "auto":
            self._set_cutoff(self._contamination_cutoff(sample))
        if solver == "auto" and getattr(runner, "last_sums", None) is not None:
            self._keep_update_sums(robust, runner.last_sums, unit)
        self._robust_state = robust if solver == "auto" else None
        self._robust_unit = unit  # the working unit the robust state is in (for warm_start)
        if not self.converged_:
            warnings.warn(
                f"MCPCA(solver={solver!r}) stopped before converging (tol={tol}, max_iter={max_iter}, "
                f"{self.n_passes_} passes); raise max_iter or tol",
                ConvergenceWarning,
                stacklevel=3,
            )
        return self

    def _cold_fit(self, runner, ckpt, *, seed: int, max_iter: int):
        """The first read (moments, the row sample, the NaN check), then the robust stage.

        The first read is a full pass, except for the default solver with
        ``center`` robust or False on a store of many row blocks: it then
        reads a spread of the blocks (:func:`._passes.spread_blocks`), and
        the robust stage's passes count the rows and check them for NaN.
        The working unit is chosen from the first read's row sample, full or
        partial alike, and the sample is mapped to it.

        Returns the first read's moments (as stored), the same in working
        units (``work``, with the mapped sample), the unit and the robust state.
        """
        n, p = runner.n_rows, runner.n_features
        solver = self.solver
        blocks = spread_blocks(runner.n_blocks) if solver == "auto" and self.center != "mean" else None
        rows_read = n if blocks is None else int(runner.block_rows()[blocks].sum())
        rate = min(1.0, self.sample_size / rows_read)
        plan = PassPlan(center=np.zeros(p), sample_rate=rate, seed=seed, sample_partial=self.nan_policy == "partial")
        moments = runner.run(plan, label="moments" if blocks is None else "row sample", blocks=blocks)
        gaps = np.isnan(moments.sample).any(axis=1)
        partial_sample = moments.sample[gaps]  # rows with missing cells ("partial"): the EM part of the sample stage
        moments.sample = moments.sample[~gaps]
        ckpt.check_data(moments.in_units(0))
        if moments.n_rows < 2:
            raise ValueError(f"only {moments.n_rows} usable row(s); at least 2 are needed")
        if blocks is not None:  # the share of usable rows in the blocks read, until a full pass counts them
            moments.n_rows = round(moments.n_rows * n / rows_read)

        # Working units (see _block): every later pass and the in-memory work
        # see X * 2**-unit, whose bulk has a spread near 1; results are mapped
        # back at the end.  A power of two, so the scaling is exact and c * X
        # for c a power of two gives bit for bit the same fit, scaled.
        unit = working_exponent(moments.sample, moments.col_min, moments.col_max)
        runner.unit_exp = unit
        work = moments.in_units(unit)
        with np.errstate(over="ignore"):  # far rows overflow to inf; fit_robust leaves them out
            work.sample = np.ldexp(moments.sample, -unit) if moments.sample is not None else None
        fixed = {"mean": work.mean[0], False: np.zeros(p)}.get(self.center)
        if fixed is not None and not np.all(np.isfinite(fixed)):
            raise NumericalRangeError(
                "center='mean': the mean of these data lies beyond float64's range in the units of their "
                "bulk (rows near the float64 limit dominate it); use center='robust'"
            )
        robust = None
        if solver == "auto" or self.center == "robust":
            with np.errstate(over="ignore"):
                partial_sample = np.ldexp(partial_sample, -unit)
            robust = fit_robust(
                runner,
                moments=work,
                partial_sample=partial_sample,
                fixed_center=fixed,
                kernel_factor=self.kernel_factor,
                tol=None if solver == "paper" else self.tol,
                max_passes=DEFAULT_MAX_ITER["auto"] if solver == "paper" else max_iter,
                state=ckpt.load("robust"),
                on_step=lambda s: ckpt.save("robust", s),
                seed=seed,
                final_step=solver == "auto",
            )
        if runner.n_usable_rows is not None:
            moments.n_rows = work.n_rows = runner.n_usable_rows
        self.n_samples_ = int(moments.n_rows)
        return moments, work, unit, robust

    def _warm_state(self, p: int):
        """The previous fit's robust state and its working unit, if ``warm_start`` and one of the same width exists."""
        state = getattr(self, "_robust_state", None)
        if not self.warm_start or self.center == "mean" or state is None or len(state.location) != p:
            return None
        return state, self._robust_unit  # set with every robust state

    def _warm_refit(self, runner, state, unit: int, *, seed: int, max_iter: int):
        """A warm start: the previous fit's state goes straight into the full-data passes.

        Units: the previous state is in the previous fit's working unit, so the
        warm step runs in that unit; :func:`._robust.warm_step` then chooses
        the unit from the new data's row sample, as a cold fit would, and maps
        the state to it (exactly: powers of two) if it changed, so a warm
        refit works in the unit a cold fit of the same data would.  Where the
        mapped state is not representable (the data's scale changed by
        ~1e150 or more) the warm start is refused: None, and the caller makes
        a cold fit (the warm step's pass then counts as one more pass).
        """
        n, p = runner.n_rows, runner.n_features
        fixed = {False: np.zeros(p)}.get(self.center)
        rate = min(1.0, self.sample_size / n)
        runner.unit_exp = unit
        moments, state = warm_step(runner, state, fixed_center=fixed, sample_rate=rate, seed=seed)
        if state is None:
            return None
        robust = fit_robust(
            runner,
            moments=moments,
            fixed_center=fixed,
            kernel_factor=self.kernel_factor,
            tol=self.tol,
            max_passes=max_iter,
            state=state,
            seed=seed,
        )
        self.n_samples_ = int(moments.n_rows)
        return robust, moments, runner.unit_exp

    def _fit_in_span(self, X, k: int):
        """Wide data (fewer than ``n_features + 2`` rows): a robust fit in k dimensions of the rows' span.

        As ROBPCA does: the rows, centred at their coordinatewise median,
        span at most n - 1 dimensions; their outlyingness in that span picks
        the least outlying half, whose principal axes give k robust
        directions; the default solver then fits the rows' coordinates along
        them (k <= n - 2, so it has the rows it needs), and the result is
        mapped back.  Distances (and flags) are measured within the k
        directions, plus the distance from them in units of
        ``noise_variance_``, the half's median squared residual per discarded
        direction; the cutoff is calibrated on the rows' distances.  The rows
        are read into memory (they are fewer than the features).
        """
        rows = np.asarray(X.compute() if isinstance(X, da.Array) else X, dtype=np.float64)
        finite = np.isfinite(rows).all(axis=1)
        if not finite.all():
            if self.nan_policy == "raise":
                raise NonFiniteRowsError(
                    f"{int((~finite).sum())} of {len(rows)} rows hold NaN or inf; "
                    "clean them, or pass nan_policy='omit' to leave such rows out of the fit"
                )
            rows = rows[finite]
        n, p = rows.shape
        if k > n - 2:
            raise ValueError(f"only {n} usable rows for n_components={k}: fitting in their span needs k <= n - 2")
        seed = 0 if self.random_state is None else self.random_state
        data_rows, rows, unit = rows, *_in_working_units(rows)
        origin = np.zeros(p) if self.center is False else np.median(rows, axis=0)
        _, sv, Vt = np.linalg.svd(rows - origin, full_matrices=False)
        span = Vt[: int(np.sum(sv > sv[0] * max(n, p) * np.finfo(float).eps))].T if sv[0] > 0 else Vt[:1].T
        scores = (rows - origin) @ span
        h = min(n, max(int(np.ceil(n / 2)), k + 2))
        half = np.argsort(outlyingness(scores, seed=seed), kind="stable")[:h]
        _, W = descending_eigh(np.atleast_2d(np.cov(scores[half], rowvar=False)))
        basis = span @ W[:, :k]  # p x k, orthonormal columns
        inner = clone(self).set_params(n_components=None, checkpoint=None).fit((rows - origin) @ basis)
        self.components_ = orient_rows(inner.components_ @ basis.T)
        self.n_features_in_ = p
        centred = rows[half] - origin
        residual2 = np.einsum("ij,ij->i", centred, centred) - np.sum((centred @ basis) ** 2, axis=1)
        noise = np.full(p - k, max(float(np.median(residual2)), 0.0) / (p - k)) if p > k else np.empty(0)
        lam = _variances_in_data_units(np.concatenate([inner.explained_variance_, noise]), unit)
        lam, noise = lam[:k], lam[k:]
        location = np.ldexp(origin + inner.mean_ @ basis.T, unit)
        self._set_variances(lam, noise, lam.sum() + noise.sum(), location, inner.kernel_scale_)
        self.support_ = inner.support_
        self.quantization_steps_ = np.zeros(p)  # too few rows to tell a lattice
        d2 = self._d2(data_rows)
        self._set_cutoff(calibrated_cutoff(d2, OUTLIER_QUANTILE, p=k, n_effective=inner.support_ * n, law="fitted"))
        if self.contamination != "auto":
            self._set_cutoff(self._contamination_cutoff(data_rows))
        self.n_samples_, self.n_iter_, self.converged_ = n, inner.n_iter_, inner.converged_
        self.n_passes_, self.n_partial_reads_, self.n_blocks_read_ = 1, 0, 0
        self._robust_state = None
        return self

    def _fingerprint_params(self) -> dict:
        params = self.get_params()
        params.pop("checkpoint"), params.pop("progress"), params.pop("contamination")  # no effect on the fit's state
        return params

    def _set_from_robust(self, robust, k, moments, unit) -> None:
        """Components and variances from the final, inclusive step of the last pass.

        Without a full-data step (a fit resumed from a checkpoint that had
        converged) the core fixed point gives them.  The robust state is in
        working units ``2**unit``; it is mapped back to the data's units here.
        The outlier cutoff is then calibrated on the sample's distances under
        the fitted model (:func:`._schedule.calibrated_cutoff`), at the
        effective number of rows.
        """
        final = robust.final_scatter is not None
        scatter = robust.final_scatter if final else robust.scatter
        location = robust.final_location if final else robust.location
        support = robust.support if final else robust.core_support
        lam, V = descending_eigh(scatter)
        lam = _variances_in_data_units(np.maximum(lam, 0.0), unit)
        self.components_ = orient_rows(V[:, :k].T)
        kernel_scale = np.sqrt(robust_kernel_size2(len(lam))) * self.kernel_factor
        self._set_variances(lam[:k], lam[k:], lam.sum(), np.ldexp(location, unit), kernel_scale)
        self.support_ = float(support)
        repeated = np.empty((0, 2)) if robust.repeated is None else robust.repeated.copy()
        repeated[:, 1] = np.ldexp(repeated[:, 1], unit)  # exact: a power of two
        self.repeated_values_ = repeated
        if robust.repeated_rows is not None:
            self.repeated_rows_ = np.ldexp(robust.repeated_rows, unit)
        rank = int(np.sum(lam > 0))
        free = moments.sample[~self._repeated(moments.sample)]  # both in data units
        n_effective = support * moments.n_rows
        cutoff = calibrated_cutoff(self._calibrated_d2(free), OUTLIER_QUANTILE, p=max(rank, 1),
                                   n_effective=n_effective, law="fitted")
        if not np.isfinite(cutoff):  # too few rows to calibrate on (n <= p + 1): the Gaussian quantile
            cutoff = outlier_cutoff_d2(max(rank, 1))
        self._set_cutoff(cutoff)

    def _set_from_paper(self, state, center, scatter0, k, unit) -> None:
        # The power iteration stops within tol of K's eigenvector, so rows are
        # orthogonal only to ~tol; Gram-Schmidt in order makes them exactly so.
        q, r = np.linalg.qr(np.array(state.components).T)
        self.components_ = orient_rows((q * np.sign(np.diag(r))).T)
        variances = np.maximum(np.array(state.variances), 0.0)
        total = max(float(np.trace(scatter0)), float(variances.sum()))
        rest = total - variances.sum()
        rest_lam = np.full(len(center) - k, rest / (len(center) - k)) if k < len(center) else np.empty(0)
        lam = _variances_in_data_units(np.concatenate([variances, rest_lam]), unit)
        kernel_scale = np.sqrt(robust_kernel_size2(len(center)))
        self._set_variances(lam[:k], lam[k:], np.ldexp(total, 2 * unit), np.ldexp(center, unit), kernel_scale)
        self.sigmas_ = np.ldexp(np.array(state.sigmas), unit)

    def _set_variances(self, lam, rest, total, center, kernel_scale) -> None:
        p = len(center)
        self.mean_ = np.asarray(center, dtype=np.float64)
        self.explained_variance_ = lam
        self.explained_variance_ratio_ = lam / total if total > 0 else np.zeros_like(lam)
        self.noise_variance_ = float(rest.mean()) if len(rest) else 0.0
        self.n_components_ = len(lam)
        self.kernel_scale_ = float(kernel_scale)
        self.sigmas_ = kernel_scale * np.sqrt(lam)
        with np.errstate(over="ignore"):
            C = (self.components_.T * lam) @ self.components_
            if len(rest):
                C += self.noise_variance_ * (np.eye(p) - self.components_.T @ self.components_)
        if not (np.all(np.isfinite(C)) and np.isfinite(total)):
            raise NumericalRangeError(
                "the robust covariance of these data overflows float64 (total variance "
                f"{total:.3g}); multiply the data by a power of two such as 2**-100 before fitting: "
                "the components do not change and the variances scale by its square"
            )
        self.covariance_ = C
        self.repeated_values_ = np.empty((0, 2))
        self.repeated_rows_ = np.empty((0, p))
        self._set_cutoff(outlier_cutoff_d2(p))

    def _set_cutoff(self, cutoff: float) -> None:
        self.outlier_cutoff_ = float(cutoff)
        self.outlier_threshold_ = float(np.exp(-cutoff / (2 * self.kernel_scale_**2)))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        tags.input_tags.allow_nan = self.nan_policy in ("omit", "partial")
        return tags

    def _more_tags(self) -> dict:  # scikit-learn < 1.6
        return {"allow_nan": self.nan_policy in ("omit", "partial")}

    @property
    def _n_features_out(self) -> int:
        """Columns of :meth:`transform` (for ``get_feature_names_out``: ``mcpca0``, ``mcpca1``, ...)."""
        return self.n_components_

    @property
    def loadings_(self):
        """The components as an ``xarray.DataArray`` of dims ``("component", channel)``.

        The channel dimension and its coordinate are those of the fit's input
        (``feature_dim_in_``, ``feature_names_in_``); ``"feature"`` and no
        coordinate when it had none.  Needs xarray (``pip install dask-mcpca[xarray]``).

        Examples
        --------
        >>> import numpy as np, xarray as xr
        >>> from dask_mcpca import MCPCA
        >>> X = xr.DataArray(np.random.default_rng(0).normal(size=(500, 3)) * [3.0, 1.0, 0.3],
        ...                  dims=("time", "channel"), coords={"channel": ["T1", "P1", "V1"]})
        >>> L = MCPCA(n_components=2).fit(X).loadings_
        >>> L.dims, list(L.channel.values)
        (('component', 'channel'), ['T1', 'P1', 'V1'])
        >>> str(abs(L.sel(component=0)).idxmax().item())
        'T1'
        """
        check_is_fitted(self, "components_")
        import xarray as xr

        dim = getattr(self, "feature_dim_in_", _labels.DEFAULT_FEATURE_DIM)
        coords = {_labels.COMPONENT_DIM: np.arange(self.n_components_)}
        names = getattr(self, "feature_names_in_", None)
        if names is not None:
            coords[dim] = names
        return xr.DataArray(self.components_, dims=(_labels.COMPONENT_DIM, dim), coords=coords, name="loadings")

    def _feature_columns(self, X: Any) -> tuple[str, Any]:
        """The channel dimension of per-channel outputs: its name and coordinate (None: none).

        Those of a DataArray ``X``; otherwise those of the fit's input.
        """
        if _labels.is_dataarray(X):
            dim = X.dims[1]
            return dim, (X.coords[dim].values if dim in X.coords else None)
        dim = getattr(self, "feature_dim_in_", _labels.DEFAULT_FEATURE_DIM)
        return dim, getattr(self, "feature_names_in_", None)

    # ---------------------------------------------------------- transforms
    def _map_rows(
        self, X, func, n_out: int | None, dtype=np.float64, *, columns=None, storage_options=None, nan_policy=None,
        frame_columns=None,
    ):
        """Apply ``func`` to row blocks: lazily for dask input, eagerly otherwise.

        A DataArray ``X`` gives a DataArray with its row coordinate (and
        ``columns``, the name and coordinate of a second dimension); a pandas
        DataFrame gives a Series or a DataFrame with its index (columns:
        ``frame_columns``, or ``X``'s for a per-channel result).
        ``nan_policy`` overrides the estimator's for this call.
        """
        check_is_fitted(self, "components_")
        _labels.check_feature_names(self, X, reset=False)
        out = self._map_row_blocks(X, func, n_out, dtype, storage_options, nan_policy=nan_policy)
        return _labels.like_rows(out, X, columns=columns, frame_columns=frame_columns)

    def _map_row_blocks(self, X, func, n_out: int | None, dtype, storage_options=None, *, nan_policy=None):
        X = as_row_blocks(X, storage_options=storage_options)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input"
            )
        func = _nan_for_nonfinite_rows(func, nan_policy or self.nan_policy)
        if isinstance(X, da.Array):
            if n_out is None:
                return X.map_blocks(func, drop_axis=1, dtype=dtype)
            return X.map_blocks(func, chunks=(X.chunks[0], (n_out,)), dtype=dtype)
        return func(X)

    def transform(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """Project ``X`` on the components: ``(X - mean_) @ components_.T``.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Shape (n_samples, n_features), the features of the fit; input
            kinds as for :meth:`fit`.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        Returns
        -------
        X_new : ndarray or dask array of shape ``(n_samples, n_components_)``
            A dask array (computed lazily, block by block) for dask or store input,
            a numpy array otherwise; for an ``xarray.DataArray`` ``X``, a DataArray
            of dims ``(row, "component")`` with ``X``'s row coordinates (time),
            lazy if ``X`` is.  For a pandas DataFrame ``X`` (or with
            ``set_output(transform="pandas")``), a DataFrame with ``X``'s index
            and columns ``get_feature_names_out()``.
            Rows with NaN or inf give NaN under ``nan_policy="omit"``; under
            ``"partial"``, a row with some NaN cells gives the scores of the
            row completed by :meth:`impute` (the conditional expectation of
            its missing cells given the observed ones).

        Raises
        ------
        NonFiniteRowsError
            Rows hold NaN or inf and ``nan_policy="raise"`` (for dask input,
            when the result is computed).

        See Also
        --------
        inverse_transform : Back from scores to the data space.
        impute : The missing cells' conditional expectation.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(1000, 3)) * [3.0, 1.0, 0.3]
        >>> model = MCPCA(n_components=2).fit(X)
        >>> model.transform(X).shape
        (1000, 2)
        >>> import dask.array as da
        >>> Z = model.transform(da.from_array(X, chunks=(250, 3)))   # lazy
        >>> bool(np.allclose(Z.compute(), model.transform(X)))
        True
        """
        check_is_fitted(self, "components_")
        comps = self.components_
        columns = (_labels.COMPONENT_DIM, np.arange(len(comps)))
        return self._map_rows(X, self._projector(), len(comps), columns=columns, storage_options=storage_options,
                              frame_columns=self.get_feature_names_out() if _labels.is_dataframe(X) else None)

    def _projector(self):
        """The row-block function of :meth:`transform`."""
        comps, mean = self.components_, self.mean_
        cov = self.get_covariance() if self.nan_policy == "partial" else None

        def func(b):
            Y = np.asarray(b, np.float64) - mean
            if cov is not None and np.isnan(Y).any():
                Y = _missing.completed(Y, cov)
            return Y @ comps.T

        return func

    def inverse_transform(self, X: Any) -> np.ndarray | da.Array:
        """Map scores back to the data space: ``X @ components_ + mean_``.

        Parameters
        ----------
        X : array-like or dask array of shape ``(n_samples, n_components_)``
            Scores, as returned by :meth:`transform`.

        Returns
        -------
        X_original : ndarray or dask array of shape ``(n_samples, n_features_in_)``
            The projection of the original rows on the components' affine
            subspace; a dask array for dask input; for an ``xarray.DataArray``
            of scores, a DataArray with its row coordinates and the channel
            dimension and names of the fit.

        See Also
        --------
        transform : From the data space to scores.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(1000, 3)) * [3.0, 1.0, 0.3]
        >>> model = MCPCA(n_components=2).fit(X)
        >>> X_back = model.inverse_transform(model.transform(X))
        >>> X_back.shape
        (1000, 3)
        >>> bool(np.abs(X_back - X)[:, 2].max() < 2.0)  # only the third, smallest axis is lost
        True
        """
        check_is_fitted(self, "components_")
        width = X.shape[-1] if getattr(X, "ndim", np.ndim(X)) == 2 else None
        if width != self.n_components_:
            shape = getattr(X, "shape", np.shape(X))
            raise ValueError(
                f"inverse_transform takes scores of shape (n_samples, {self.n_components_}) "
                f"(n_components_={self.n_components_}); got shape {tuple(shape)}"
            )
        if _labels.is_dataarray(X):
            return _labels.like_rows(X.data @ self.components_ + self.mean_, X, columns=self._feature_columns(None))
        if isinstance(X, da.Array):
            return X @ self.components_ + self.mean_
        return np.asarray(X) @ self.components_ + self.mean_

    def _floored_variances(self) -> tuple[np.ndarray, float]:
        """The fitted variances and noise variance, floored at the fit's round-off level.

        The floor is :func:`._power.variance_floor` of the largest variance:
        a direction in which the data never varied counts a row's deviation
        along it, consistently, as a huge distance when it is beyond round-off
        and as nothing when it is round-off.
        """
        lam = self.explained_variance_
        top = max(float(lam.max(initial=0.0)), self.noise_variance_)
        floor = variance_floor(top, self.n_features_in_) if top > 0 else np.finfo(float).tiny
        return np.maximum(lam, floor), max(self.noise_variance_, floor)

    def _d2(self, block):
        """Squared Mahalanobis distance ``y^T P y`` under the fitted model (see :meth:`_precision`).

        Computed in units of the fitted spread (a power of two: exact), so
        squares overflow only for rows ~1e150 spreads away; their distance,
        inf or NaN after an overflow, is inf.  Rows with NaN cells get the
        distance on their observed cells (:func:`._missing.observed_d2`), NaN
        if none is observed.
        """
        lam, noise = self._floored_variances()
        unit = int(np.frexp(np.sqrt(lam.max(initial=noise)))[1])
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            Y = np.ldexp(np.asarray(block, np.float64) - self.mean_, -unit)
            Z = Y @ self.components_.T
            d2 = (Z**2) @ (1.0 / np.ldexp(lam, -2 * unit))
            if self.n_components_ < self.n_features_in_:
                resid = np.einsum("ij,ij->i", Y, Y) - np.einsum("ij,ij->i", Z, Z)
                d2 += np.maximum(resid, 0.0) / np.ldexp(noise, -2 * unit)
        gaps = np.isnan(Y).any(axis=1)
        d2[np.isnan(d2)] = np.inf
        if gaps.any():
            with np.errstate(over="ignore", invalid="ignore", under="ignore"):
                part, _ = _missing.observed_d2(Y[gaps], np.ldexp(self.get_covariance(), -2 * unit))
            part[np.isnan(part) & (~np.isnan(Y[gaps])).any(axis=1)] = np.inf
            d2[gaps] = part
        return d2

    def _calibrated_d2(self, block, d2: np.ndarray | None = None) -> np.ndarray:
        """The distance the outlier rule judges, mapped for rows with missing cells to the
        n_features-channel distance with the same chi-square upper-tail probability
        (:func:`._missing.equivalent_d2`), so that one cutoff, ``outlier_cutoff_``, serves every row
        at the same false-alarm rate.

        With quantized channels (``quantization_steps_``), the distance of the row's quantization
        cells: a reading says only that the value lies within half a step of it, so the row is
        judged by the nearer to the centre of two points of its cells, the reading itself and the
        reading with each quantized value moved towards ``mean_`` by up to half a step
        (:meth:`_nearest_in_cells`; the nearer of the two, since with correlated channels, or
        channels bound by an exact relation such as one-hot columns, moving each value alone can
        lead away from the bulk).
        """
        d2 = self._d2(block) if d2 is None else d2  # ``d2``: this block's :meth:`_d2`, computed once by the caller
        steps = getattr(self, "quantization_steps_", None)
        if steps is not None and np.any(steps):
            d2 = np.fmin(d2, self._d2(self._nearest_in_cells(block)))
        counts = _observed_counts(block)
        if np.all(counts == self.n_features_in_):
            return d2
        return _missing.equivalent_d2(d2, counts, self.n_features_in_)

    def _nearest_in_cells(self, block) -> np.ndarray:
        """Each value of a quantized channel moved towards ``mean_`` by up to half a quantization step.

        A reading of a channel with step ``s`` says only that the value lies in
        ``[x - s/2, x + s/2]``; the point of that cell nearest the centre is
        ``mean + sign(y) max(|y| - s/2, 0)`` for ``y = x - mean``.  Continuous
        channels (step 0) and NaN cells are unchanged.
        """
        steps = getattr(self, "quantization_steps_", None)
        block = np.asarray(block, np.float64)
        if steps is None or not np.any(steps):
            return block
        Y = block - self.mean_
        with np.errstate(invalid="ignore"):
            return self.mean_ + np.sign(Y) * np.maximum(np.abs(Y) - steps / 2, 0.0)

    def n_observed(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """Number of observed (not NaN) cells in each row: the channels a row is judged on.

        Under ``nan_policy="partial"`` a row's distance, score and flag use
        these cells only; a row holding inf counts 0 (it is not used).

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Shape (n_samples, n_features); input kinds as for :meth:`fit`.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        Returns
        -------
        counts : ndarray or dask array of int16, shape (n_samples,)

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> model = MCPCA().fit(np.random.default_rng(0).normal(size=(500, 3)))
        >>> model.n_observed(np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, np.nan]]))
        array([2, 0], dtype=int16)
        """
        return self._map_rows(X, _observed_counts, None, dtype=np.int16, storage_options=storage_options,
                              nan_policy="partial")

    def get_covariance(self) -> np.ndarray:
        """The fitted robust covariance: ``components_.T @ diag(explained_variance_) @ components_``
        plus ``noise_variance_`` in the discarded directions (floored at the fit's round-off level).

        Its inverse, :meth:`get_precision`, gives :meth:`mahalanobis`'s ``d^2 = y^T P y``.

        Returns
        -------
        cov : ndarray of shape (n_features, n_features)

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(5000, 2)) * [2.0, 0.5]
        >>> bool(np.allclose(MCPCA().fit(X).get_covariance(), [[4.0, 0.0], [0.0, 0.25]], atol=0.2))
        True
        """
        check_is_fitted(self, "components_")
        return self._precision(-1.0)

    def get_precision(self) -> np.ndarray:
        """The inverse of :meth:`get_covariance`, whose quadratic form is :meth:`mahalanobis`'s ``d^2``.

        Returns
        -------
        precision : ndarray of shape (n_features, n_features)

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> model = MCPCA().fit(rng.normal(size=(2000, 3)))
        >>> bool(np.allclose(model.get_precision() @ model.get_covariance(), np.eye(3)))
        True
        """
        check_is_fitted(self, "components_")
        return self._precision(1.0)

    def impute(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """``X`` with each missing (NaN) cell replaced by its conditional expectation under the fitted model.

        For a row with observed cells ``O`` and missing cells ``M``:
        ``x_M = mean_M + S_MO S_OO^-1 (x_O - mean_O)``, with ``S`` =
        :meth:`get_covariance` (the best linear reconstruction from the
        observed channels; Tipping and Bishop 1999).  Observed cells are
        returned unchanged; rows with every cell missing stay NaN.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Shape (n_samples, n_features); input kinds as for :meth:`fit`.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        Returns
        -------
        X_filled : ndarray or dask array of shape (n_samples, n_features)
            Lazy for dask or store input; a DataArray or DataFrame (index
            kept) for such input.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> t = rng.normal(size=(4000, 1))
        >>> X = np.hstack([t, 2 * t, -t]) + 0.01 * rng.normal(size=(4000, 3))
        >>> model = MCPCA(nan_policy="partial").fit(X)
        >>> np.round(model.impute(np.array([[1.0, np.nan, np.nan]])), 1)
        array([[ 1.,  2., -1.]])
        """
        check_is_fitted(self, "components_")
        mean, cov = self.mean_, self.get_covariance()

        def func(b):
            b = np.asarray(b, np.float64)
            if not np.isnan(b).any():
                return b.copy()
            return _missing.completed(b - mean, cov) + mean

        out = self._map_rows(
            X, func, self.n_features_in_, columns=self._feature_columns(X), storage_options=storage_options,
            nan_policy="partial",
        )
        return _frame_like(out, X)

    def mahalanobis(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """Squared robust Mahalanobis distance of each row under the fitted model.

        ``d^2 = sum_j z_j^2 / explained_variance_[j]`` over the components,
        plus the squared residual over ``noise_variance_`` when components were
        discarded.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Shape (n_samples, n_features), the features of the fit; input
            kinds as for :meth:`fit`.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        Returns
        -------
        d2 : ndarray or dask array of shape (n_samples,)
            A dask array (computed lazily, block by block) for dask or store input,
            a numpy array otherwise; for an ``xarray.DataArray`` ``X``, a DataArray
            with ``X``'s row dimension and coordinates (time), lazy if ``X`` is;
            for a pandas DataFrame, a Series with its index.
            NaN for rows with NaN or inf under ``nan_policy="omit"``; under ``"partial"``,
            a row with some NaN cells gets its distance on the observed cells
            (chi-square with as many degrees of freedom as observed cells for a
            Gaussian row; NaN when none is observed).

        Raises
        ------
        NonFiniteRowsError
            Rows hold NaN or inf and ``nan_policy="raise"``.

        See Also
        --------
        score_samples : The correntropy weight ``exp(-d^2 / (2 c^2))``.
        is_outlier : ``d^2`` above ``outlier_cutoff_``.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(1000, 3)) * [3.0, 1.0, 0.3]
        >>> model = MCPCA(n_components=2).fit(X)
        >>> d2 = model.mahalanobis(X)
        >>> bool(abs(np.median(d2) / 2.37 - 1) < 0.2)   # about chi-square(3)'s median
        True
        """
        return self._map_rows(X, self._d2, None, storage_options=storage_options)

    def score_samples(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """Correntropy weight of each row, in [0, 1]: ``exp(-d^2 / (2 c^2))``.

        ``d^2`` is the squared robust Mahalanobis distance under the fitted
        components and variances (the discarded directions share
        ``noise_variance_``) and ``c = kernel_scale_``.  Low scores are
        outlying rows.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Shape (n_samples, n_features), the features of the fit; input
            kinds as for :meth:`fit`.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        Returns
        -------
        scores : ndarray or dask array of shape (n_samples,)
            A dask array (computed lazily, block by block) for dask or store input,
            a numpy array otherwise; for an ``xarray.DataArray`` ``X``, a DataArray
            with ``X``'s row dimension and coordinates (time), lazy if ``X`` is;
            for a pandas DataFrame, a Series with its index.
            NaN for rows with NaN or inf under ``nan_policy="omit"``; under ``"partial"``,
            a row with some NaN cells is scored by its observed cells, its
            distance first mapped to n_features channels at the same
            chi-square probability (so scores of rows with and without gaps
            compare).

        Raises
        ------
        NonFiniteRowsError
            Rows hold NaN or inf and ``nan_policy="raise"``.

        See Also
        --------
        mahalanobis : The ``d^2`` these weights come from.
        is_outlier : Scores below ``outlier_threshold_``.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(1000, 3)) * [3.0, 1.0, 0.3]
        >>> model = MCPCA(n_components=2).fit(X)
        >>> w = model.score_samples(np.vstack([X[:5], [[50.0, 50.0, 50.0]]]))
        >>> bool(((w[:5] > 0.01) & (w[:5] <= 1)).all()), bool(w[5] < 1e-10)
        (True, True)
        """
        check_is_fitted(self, "components_")
        return self._map_rows(X, lambda b: self._weight(self._calibrated_d2(b)), None, storage_options=storage_options)

    def is_outlier(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """True for rows whose ``d^2`` exceeds ``outlier_cutoff_``, or that hold a repeated value or row.

        Equivalently ``score_samples(X) < outlier_threshold_``, or the row
        holds one of ``repeated_values_`` (a stuck sensor's value) or equals
        one of ``repeated_rows_`` (a frozen logger's record), which the fit
        gave no weight.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Shape (n_samples, n_features), the features of the fit; input
            kinds as for :meth:`fit`.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        Returns
        -------
        flags : ndarray or dask array of bool, shape (n_samples,)
            A dask array (computed lazily, block by block) for dask or store input,
            a numpy array otherwise; for an ``xarray.DataArray`` ``X``, a DataArray
            with ``X``'s row dimension and coordinates (time), lazy if ``X`` is;
            for a pandas DataFrame, a Series with its index.
            False for rows with NaN or inf under ``nan_policy="omit"``; under
            ``"partial"``, a row with k < n_features observed cells is flagged
            when its distance on them exceeds the chi-square(k) quantile at
            the probability of ``outlier_cutoff_`` under chi-square(n_features):
            the same false-alarm rate for a Gaussian row, whatever k.

        Raises
        ------
        NonFiniteRowsError
            Rows hold NaN or inf and ``nan_policy="raise"``.

        See Also
        --------
        score_samples : The weight compared with ``outlier_threshold_``.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(1000, 3)) * [3.0, 1.0, 0.3]
        >>> model = MCPCA(n_components=2).fit(X)
        >>> model.is_outlier([[0.0, 0.0, 0.0], [0.0, 0.0, 30.0]])
        array([False,  True])
        """
        check_is_fitted(self, "components_")

        def flags(block):
            block = np.asarray(block, np.float64)
            return self._flags(block, self._calibrated_d2(block))

        return self._map_rows(X, flags, None, dtype=bool, storage_options=storage_options)

    def _weight(self, d2):
        """The correntropy weight ``exp(-d^2 / (2 c^2))`` of distances ``d2`` (any array type, NaN stays NaN)."""
        return np.exp(-d2 / (2 * self.kernel_scale_**2))

    def _flags(self, rows: np.ndarray, d2: np.ndarray) -> np.ndarray:
        """The outlier rule on ``rows`` (float64, data units) whose calibrated distances
        (:meth:`_calibrated_d2`) are ``d2``."""
        return (d2 > self.outlier_cutoff_) | self._repeated(rows)

    def _repeated(self, rows: np.ndarray) -> np.ndarray:
        """True for the rows (float64, data units) holding a repeated value or equal to a repeated row."""
        return held_out(rows, getattr(self, "repeated_values_", None), getattr(self, "repeated_rows_", None))

    def _precision(self, power: float) -> np.ndarray:
        """``P^power`` of the precision P whose quadratic form is :meth:`mahalanobis`'s ``d^2``."""
        lam, noise = self._floored_variances()
        C = self.components_
        P = (C.T * lam**-power) @ C
        if self.n_components_ < self.n_features_in_:
            P += noise**-power * (np.eye(self.n_features_in_) - C.T @ C)
        return P

    def channel_contributions(
        self,
        X: Any,
        *,
        method: Literal["reconstruction", "whitened", "product", "residual"] = "reconstruction",
        storage_options: dict | None = None,
    ) -> np.ndarray | da.Array:
        """Each channel's part in each row's robust distance: which channel makes a row an outlier.

        With ``y = x - mean_`` and P the fitted precision (the inverse of the
        robust covariance in the metric of :meth:`mahalanobis`, so that
        ``d^2 = y^T P y``):

        - ``"reconstruction"`` (default): ``c_j = (P y)_j^2 / P_jj``, the
          reconstruction-based contribution (Alcala and Qin 2009): how much
          ``d^2`` drops when channel j alone is replaced by its conditional
          expectation given all the others
          (:func:`dask_mcpca._contributions.reconstruction_contributions`).
          They are >= 0 and do not depend on the channels' units; a large
          enough fault on one channel is always named that channel (unless
          another channel is an exact copy of it that nothing else predicts);
          they do not sum to ``d^2``.  ``"residual"`` is the same method
          under its former name.
        - ``"whitened"`` (the default in 0.1.0): ``c_j = (P^(1/2) y)_j^2``,
          the squared coordinates of the row whitened by the symmetric root
          of P; >= 0 and summing to ``d^2``, but they depend on the channels'
          units and spread a fault over correlated channels.
        - ``"product"``: ``c_j = y_j (P y)_j``; they sum to ``d^2`` but may be
          negative (a channel that pulls the row back towards the bulk) and
          depend on the units too.

        Single-channel faults (spike, stuck, drift, bias; 8 channels with
        random loadings, near-collinear sensor pairs, or units 1e6 apart):
        ``"reconstruction"`` names the faulty channel in 96-100 % of the
        flagged rows (85 % for a stuck sensor of a near-duplicate pair, which
        only the other channels can tell apart), ``"whitened"`` in 55-100 %
        (benchmarks/ATTRIBUTION.md).
        Faults of two channels at once (the demo's swapped channels) are
        not what it is built for: the two largest are the swapped channels
        for about 65 % of the flagged swapped rows, against 96 % with
        ``"whitened"`` (``benchmarks/archives.py``).

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Shape (n_samples, n_features), the features of the fit.
        method : {"reconstruction", "whitened", "product", "residual"}, default="reconstruction"
            The decomposition, as above.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        Returns
        -------
        contributions : ndarray or dask array of shape (n_samples, n_features)
            A dask array (lazy) for dask or store input, numpy otherwise; for
            an ``xarray.DataArray`` ``X``, a DataArray with ``X``'s dims and
            coordinates; for a pandas DataFrame, a DataFrame with its index
            and columns.  NaN for rows with NaN or inf under ``nan_policy="omit"``;
            under ``"partial"``, a row with some NaN cells gets, by
            ``"reconstruction"``, its observed channels' contributions under
            their marginal model and NaN for each missing cell (the other
            methods give NaN for such rows).

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(2000, 4)) @ rng.normal(size=(4, 4))
        >>> model = MCPCA().fit(X)
        >>> row = X[:1].copy()
        >>> row[0, 2] += 40.0                                    # channel 2 goes wrong
        >>> c = model.channel_contributions(row)
        >>> int(c.argmax()), bool(c.max() <= model.mahalanobis(row)[0])
        (2, True)
        >>> w = model.channel_contributions(row, method="whitened")  # sums to d^2
        >>> bool(np.isclose(w.sum(), model.mahalanobis(row)[0]))
        True
        """
        check_is_fitted(self, "components_")
        out = self._map_rows(
            X, self._contributor(method), self.n_features_in_, columns=self._feature_columns(X),
            storage_options=storage_options,
        )
        if _labels.is_dataframe(X):
            import pandas as pd

            return pd.DataFrame(np.asarray(out), index=X.index, columns=X.columns)
        return out

    def _contributor(self, method: str):
        """The row-block function of :meth:`channel_contributions` by ``method``."""
        if method not in ("reconstruction", "whitened", "product", "residual"):
            raise ValueError(
                f"method={method!r} is invalid; expected 'reconstruction', 'whitened', 'product' or 'residual'"
            )
        mean = self.mean_
        if method in ("reconstruction", "residual"):
            P, cov = self.get_precision(), self.get_covariance()

            def func(b):  # a row with gaps ("partial"): on its observed channels, NaN for a missing cell
                return contributions_with_gaps(np.asarray(b, np.float64) - mean, P, cov)
        elif method == "whitened":
            root = self._precision(0.5)

            def func(b):
                return ((np.asarray(b, np.float64) - mean) @ root) ** 2
        else:
            P = self._precision(1.0)

            def func(b):
                Y = np.asarray(b, np.float64) - mean
                return Y * (Y @ P)

        return func

    def score_rows(
        self, X: Any, *, outputs: tuple[str, ...] = tuple(ROW_OUTPUTS), storage_options: dict | None = None
    ) -> dict:
        """Several per-row outputs at once, each row block read and its distance computed once.

        Each output equals the method it is named after; computed together,
        one function per row block makes them all (the distance ``d^2`` once,
        where :meth:`score_samples`, :meth:`is_outlier` and
        :meth:`mahalanobis` called apart compute it once each).

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Shape (n_samples, n_features), the features of the fit; input
            kinds as for :meth:`fit`.
        outputs : tuple of str
            Names from :data:`ROW_OUTPUTS`: ``"scores"`` (:meth:`transform`),
            ``"weight"`` (:meth:`score_samples`), ``"outlier"``
            (:meth:`is_outlier`), ``"d2"`` (:meth:`mahalanobis`),
            ``"contributions"`` (:meth:`channel_contributions`),
            ``"n_observed"`` (:meth:`n_observed`) and ``"top_channel"``: the
            index of the channel with the largest contribution (int16; -1
            where the contributions are all NaN).
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        Returns
        -------
        dict
            Name -> array, as the named method returns it (lazy for dask or
            store input; DataArrays for an ``xarray.DataArray``; numpy
            otherwise).

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> X = np.random.default_rng(0).normal(size=(500, 3))
        >>> model = MCPCA().fit(X)
        >>> rows = model.score_rows(X, outputs=("d2", "outlier", "top_channel"))
        >>> bool(np.array_equal(rows["d2"], model.mahalanobis(X))), rows["top_channel"].dtype
        (True, dtype('int16'))
        """
        check_is_fitted(self, "components_")
        unknown = [o for o in outputs if o not in ROW_OUTPUTS]
        if unknown or not outputs:
            raise ValueError(f"outputs={list(outputs)!r} is invalid; expected names from {list(ROW_OUTPUTS)}")
        _labels.check_feature_names(self, X, reset=False)
        blocks = as_row_blocks(X, storage_options=storage_options)
        if blocks.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {blocks.shape[1]} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input"
            )
        fused = self._row_outputs(tuple(outputs))
        if not isinstance(blocks, da.Array):
            parts = fused(blocks)
        else:
            packed = blocks.map_blocks(fused, drop_axis=1, dtype=object, meta=np.empty((0,), object))
        k, p = self.n_components_, self.n_features_in_
        columns = {"scores": (_labels.COMPONENT_DIM, np.arange(k)), "contributions": self._feature_columns(X)}
        result = {}
        for name in outputs:
            dtype, width = ROW_OUTPUTS[name], {"scores": k, "contributions": p}.get(name)
            if isinstance(blocks, da.Array):
                pick = _picker(name)
                out = packed.map_blocks(pick, dtype=dtype, meta=np.empty((0,) * (1 + (width is not None)), dtype),
                                        **({} if width is None else {"new_axis": 1, "chunks": (blocks.chunks[0],
                                                                                               (width,))}))
            else:
                out = parts[name]
            if _labels.is_dataframe(X) and name == "contributions":
                import pandas as pd

                result[name] = pd.DataFrame(np.asarray(out), index=X.index, columns=X.columns)
                continue
            frame = self.get_feature_names_out() if name == "scores" and _labels.is_dataframe(X) else None
            result[name] = _labels.like_rows(out, X, columns=columns.get(name), frame_columns=frame)
        return result

    def _row_outputs(self, outputs: tuple[str, ...]):
        """The row-block function of :meth:`score_rows`: a dict of the ``outputs`` of one block.

        Rows holding NaN or inf are handled as each method's own block function handles them
        (:func:`_nan_for_nonfinite_rows`; ``n_observed`` always under ``"partial"``).
        """
        project = self._projector() if "scores" in outputs else None
        contribute = self._contributor("reconstruction") if {"contributions", "top_channel"} & set(outputs) else None
        policy = self.nan_policy

        def distances(block):
            parts = {}
            if {"weight", "outlier", "d2"} & set(outputs):
                d2 = self._d2(block)
                if "d2" in outputs:
                    parts["d2"] = d2.copy()
                if {"weight", "outlier"} & set(outputs):
                    calibrated = self._calibrated_d2(block, d2)
                    if "weight" in outputs:
                        parts["weight"] = self._weight(calibrated)
                    if "outlier" in outputs:
                        parts["outlier"] = self._flags(np.asarray(block, np.float64), calibrated)
            if project is not None:
                parts["scores"] = project(block)
            if contribute is not None:
                c = contribute(block)
                if "contributions" in outputs:
                    parts["contributions"] = c
                if "top_channel" in outputs:
                    parts["top_channel"] = _top_channel(c)
            return parts

        def fused(block):
            bad = ~np.isfinite(block).all(axis=1)
            if bad.any() and policy == "partial":
                bad &= ~_missing.partial_rows(np.asarray(block))
            if bad.any() and policy == "raise":
                raise NonFiniteRowsError(
                    f"{int(bad.sum())} of {len(bad)} rows hold NaN or inf; clean them, or fit with "
                    "nan_policy='omit' to get NaN for such rows"
                )
            parts = distances(np.where(bad[:, None], 0.0, block) if bad.any() else block)
            for name, out in parts.items():
                if bad.any():
                    out[bad] = np.nan if out.dtype.kind == "f" else (-1 if name == "top_channel" else 0)
            if "n_observed" in outputs:
                parts["n_observed"] = _nan_for_nonfinite_rows(_observed_counts, "partial")(block)
            return parts

        return fused

    # ------------------------------------------------ outlier-detector API
    @property
    def offset_(self) -> float:
        """scikit-learn's name for ``outlier_threshold_``: ``decision_function = score_samples - offset_``."""
        check_is_fitted(self, "outlier_threshold_")
        return self.outlier_threshold_

    @property
    def threshold_(self) -> float:
        """PyOD's name for ``outlier_cutoff_``: the calibrated ``d^2`` above which a row is an outlier."""
        check_is_fitted(self, "outlier_cutoff_")
        return self.outlier_cutoff_

    def _contamination_cutoff(self, rows: np.ndarray) -> float:
        """The ``1 - contamination`` quantile of the calibrated distances of ``rows`` (data units),
        rows flagged as repeated counted as infinitely far, so that a share ``contamination`` of
        ``rows`` is flagged."""
        rows = np.asarray(rows, np.float64)
        rows = rows[np.isfinite(rows).all(axis=1)]
        if not len(rows):
            return self.outlier_cutoff_
        d2 = self._calibrated_d2(rows)
        d2[self._repeated(rows)] = np.inf
        with np.errstate(invalid="ignore"):
            cutoff = float(np.quantile(d2, 1.0 - self.contamination))
        if np.isnan(cutoff):  # between a finite distance and inf: past every finite one
            cutoff = float(np.max(d2[np.isfinite(d2)], initial=np.inf))
        return max(cutoff, np.finfo(np.float64).tiny)

    def predict(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """+1 for inliers, -1 for outliers (scikit-learn's outlier detectors' convention).

        ``-1`` exactly where :meth:`is_outlier` is True (``d^2`` above
        ``outlier_cutoff_``, set by ``contamination``, or a repeated value or
        row), where :meth:`decision_function` is negative.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Shape (n_samples, n_features), the features of the fit; input
            kinds as for :meth:`fit`.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        Returns
        -------
        labels : ndarray or dask array of int64, shape (n_samples,)
            Lazy for dask or store input; a DataArray (row coordinates kept)
            for a DataArray, a Series (index kept) for a DataFrame.  0 for
            rows with NaN or inf under ``nan_policy="omit"`` (no verdict).

        See Also
        --------
        is_outlier : The same verdict as booleans.
        decision_function : The margin from the cutoff.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> model = MCPCA().fit(rng.normal(size=(1000, 3)) * [3.0, 1.0, 0.3])
        >>> model.predict([[0.0, 0.0, 0.0], [0.0, 0.0, 30.0]])
        array([ 1, -1])
        """
        check_is_fitted(self, "components_")

        def labels(block):
            block = np.asarray(block, np.float64)
            return np.where(self._flags(block, self._calibrated_d2(block)), -1, 1).astype(np.int64)

        return self._map_rows(X, labels, None, dtype=np.int64, storage_options=storage_options)

    def decision_function(self, X: Any, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """``score_samples(X) - offset_``: negative exactly for the rows :meth:`is_outlier` flags.

        As scikit-learn's ``EllipticEnvelope``: ``offset_`` is
        ``outlier_threshold_``, the score at ``outlier_cutoff_``, so rows
        with ``d^2`` above the cutoff get a negative value, rows within it
        one >= 0.  A row flagged because it holds a repeated value or equals
        a repeated row, which the fit gave no weight, gets ``-offset_`` (the
        value of a score of 0) where its distance alone would give a value
        >= 0.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Shape (n_samples, n_features), the features of the fit; input
            kinds as for :meth:`fit`.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        Returns
        -------
        decision : ndarray or dask array of shape (n_samples,)
            In ``[-offset_, 1 - offset_]``; lazy for dask or store input; a
            DataArray or Series for such input.  NaN for rows with NaN or inf
            under ``nan_policy="omit"``.

        See Also
        --------
        predict : -1 where this is negative.
        score_samples : The score this is shifted from.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(1000, 3)) * [3.0, 1.0, 0.3]
        >>> model = MCPCA().fit(X)
        >>> d = model.decision_function(X)
        >>> bool(np.array_equal(d < 0, model.is_outlier(X)))
        True
        >>> bool(np.allclose(d, model.score_samples(X) - model.offset_))
        True
        """
        check_is_fitted(self, "components_")
        offset = self.outlier_threshold_

        def margin(block):
            block = np.asarray(block, np.float64)
            d2 = self._calibrated_d2(block)
            out = self._weight(d2) - offset
            flags = self._flags(block, d2)
            out[flags & ~(out < 0) & self._repeated(block)] = -offset  # a score of 0: the fit gave it no weight
            out[flags & ~(out < 0)] = -np.finfo(np.float64).tiny  # d2 above the cutoff, its score rounded to it
            return out

        return self._map_rows(X, margin, None, storage_options=storage_options)

    def fit_predict(self, X: Any, y: None = None, *, storage_options: dict | None = None) -> np.ndarray | da.Array:
        """Fit to ``X`` and label its rows: ``fit(X).predict(X)``.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Input kinds as for :meth:`fit`.
        y : None
            Ignored.
        storage_options : dict, optional
            fsspec options when ``X`` is a URL, as for :meth:`fit`.

        Returns
        -------
        labels : ndarray or dask array of int64, shape (n_samples,)
            As :meth:`predict` returns them.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> X = np.random.default_rng(0).normal(size=(1000, 2))
        >>> labels = MCPCA(contamination=0.05).fit_predict(X)
        >>> float((labels == -1).mean())
        0.05
        """
        return self.fit(X, y, storage_options=storage_options).predict(X, storage_options=storage_options)

    # ---------------------------------------------------------- persistence
    def save(self, path: str | os.PathLike, *, storage_options: dict | None = None) -> None:
        """Write the fitted model to ``path`` as JSON (no pickle).

        Read it back with :func:`dask_mcpca.load`; the format is described
        in :mod:`dask_mcpca._persist`.  The file is replaced atomically: a
        local file is written beside it and renamed; on an object store
        (``s3://bucket/model.json``) it is one object, which the store
        publishes whole or not at all.

        Parameters
        ----------
        path : str or path-like
            Destination file or fsspec URL; replaced atomically if it exists.
        storage_options : dict, optional
            fsspec options for a URL (``{"endpoint_url": ...}``, credentials).

        See Also
        --------
        dask_mcpca.load : Read the model back.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(1000, 3)) * [3.0, 1.0, 0.3]
        >>> model = MCPCA(n_components=2).fit(X)
        >>> import os, tempfile
        >>> from dask_mcpca import load
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     model.save(os.path.join(folder, "model.json"))
        ...     loaded = load(os.path.join(folder, "model.json"))
        >>> bool((loaded.transform(X) == model.transform(X)).all())
        True
        """
        _persist.save(self, path, storage_options=storage_options)


def load(path: str | os.PathLike, *, storage_options: dict | None = None) -> MCPCA:
    """Read a model written by :meth:`MCPCA.save`.

    Parameters
    ----------
    path : str or path-like
        The model file, or an fsspec URL (``s3://bucket/model.json``).
    storage_options : dict, optional
        fsspec options for a URL.

    Returns
    -------
    model : MCPCA
        Fitted, with the saved parameters and attributes; it computes bit for
        bit what the saved model did.

    Raises
    ------
    FileNotFoundError
        No file at ``path``.
    ModelFormatError
        The file is not a dask-mcpca model, is damaged, or was written by a
        newer format version.

    See Also
    --------
    MCPCA.save : Write a model.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> from dask_mcpca import MCPCA, load
    >>> X = np.random.default_rng(0).normal(size=(500, 3))
    >>> model = MCPCA().fit(X)
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     model.save(os.path.join(folder, "model.json"))
    ...     loaded = load(os.path.join(folder, "model.json"))
    >>> bool((loaded.components_ == model.components_).all())
    True
    """
    return _persist.load(path, MCPCA, storage_options=storage_options)
