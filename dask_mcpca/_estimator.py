"""The scikit-learn estimator :class:`MCPCA`: its parameters and the entry points of a fit.

``fit`` validates the parameters (:func:`._params.check_params`), opens the
data as row blocks (:mod:`._io`) and hands them to :func:`._fit.fit_rows`,
which makes the passes and returns the fitted attributes as a typed
:class:`._fit.FitResult` (:func:`._fit_modes.fit_modes` for a fit with
modes); ``MCPCA`` copies the result onto itself.  Its other parts are mixed
in by job: ``partial_fit`` (:mod:`._partial_fit`, through
:func:`._update.update_rows`), the operating modes (:mod:`._mode_methods`),
``save`` (:mod:`._save`; ``load`` is :mod:`._load`).  What a fitted model
computes for rows (transform, distances, flags, contributions) is inherited
from :class:`._base._BaseMCPCA`, over the model's algebra in :mod:`._model`.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Literal

from sklearn.exceptions import ConvergenceWarning

from . import _labels, _modes
from ._base import _BaseMCPCA
from ._exceptions import BreakdownWarning
from ._fit import FitResult, fit_rows
from ._fit_modes import ModesResult, fit_modes
from ._io import as_row_blocks, split_store_path
from ._mode_methods import ModesMixin
from ._params import PARAMETER_CONSTRAINTS, check_params
from ._partial_fit import PartialFitMixin
from ._passes import single_threaded_blas
from ._robust import SAMPLE_SIZE
from ._save import SaveMixin
from ._urls import overlaps

__all__ = ["MCPCA"]

#: The fitted attributes ``fit`` sets from its input before clearing the previous fit's (:mod:`._labels`).
INPUT_NAMES = ("feature_names_in_", "feature_dim_in_")


class MCPCA(ModesMixin, PartialFitMixin, SaveMixin, _BaseMCPCA):
    """Robust PCA by maximum correntropy power iterations, on data of any size.

    Each row is weighted by a Gaussian kernel of its reconstruction error; the
    weighted scatter ``X^T G X`` gives the components.  Input may be a numpy
    array, a dask array, a Zarr or HDF5 store (opened read-only) or an
    ``xarray.DataArray``; every pass over the data is one task per row block
    and a tree reduction, so the data never has to fit in memory.

    Parameters
    ----------
    n_components : int or None, default=None
        Number of components to keep; None keeps all p at any width (the paper's
        point; a smaller k judges a wide archive's rows faster but weighs every
        discarded direction by one variance: docs/performance.md).
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
        from the fit).  ``"mean"``: the ordinary mean (not with
        ``nan_policy="partial"`` or ``cellwise=True``, whose rows keep only
        some of their cells).  False: no centring, the paper's zero-mean
        setting.
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
        flagged (measured: see ``MIN_KERNEL_FACTOR`` in ``dask_mcpca/_fit.py``).
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
    cellwise : bool, default=False
        Judge each cell on its own (``solver="auto"`` only): a cell far from
        what the row's other cells predict, on its channel's conditional
        spread, is flagged and left out of the fit as a missing cell is,
        and the row keeps its other cells (a glitch in one channel of a
        wide archive no longer costs the whole row; see
        :meth:`cell_outliers`).  Rows are then judged on their good cells
        (``outlier_cutoff_`` and :meth:`is_outlier` by the distance on them,
        mapped to n_features channels).  NaN cells are missing cells with
        ``nan_policy="partial"``.  Off by default until its cost on the
        continuous benchmarks is measured (``benchmarks/cellwise.py``).
    checkpoint : str or path-like, optional
        Local file to which the small state of the fit is written after every
        step (atomically); a fit started again with the same data (its first
        read covers every block) and parameters resumes there.  A URL other
        than ``file://`` is refused, as is a path inside the fitted store.
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
        sample.  An archive grown by rows like the old ones, with a
        Gaussian-like bulk, takes 2 passes and gives the cold fit's
        components (0.1 degree); heavier tails may take more and warn
        (t(3) rows: 3 passes and a ``ConvergenceWarning`` in 4 of 5 draws).
        A fit of another width, a ``cellwise`` fit, or a model loaded from
        a file, starts cold.  To add rows to a model without reading the old ones
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
        data has at most ``sample_size`` rows) is flagged, with no shift
        rule (``shift_scale_``) adding to it; never the fit.
    scale : {None, "robust"}, default=None
        The units the model works in.  None: the data's own units (a
        channel in small units, volts beside kilowatts, counts for little
        in the components and, where ``n_components < n_features`` or
        channels differ by many orders of magnitude, in the flags).
        ``"robust"``: each channel divided by its robust scale
        (``scale_``: the MAD times 1.4826 on the first pass's row sample,
        no extra pass), so that multiplying a channel by a constant changes
        no flag.  Then, as for scikit-learn's ``StandardScaler`` followed
        by ``PCA``, ``mean_``, ``components_``, the variances,
        ``covariance_``, :meth:`get_precision`, :meth:`transform`'s scores,
        the contributions, ``quantization_steps_``, ``repeated_values_``,
        ``repeated_rows_``, ``saturation_limits_`` and the ``update_*``
        sums are in those units (a channel's value over ``scale_``); every
        method takes rows in the data's units, and :meth:`inverse_transform`
        and :meth:`impute` return them.  A ``warm_start`` refit and
        :meth:`partial_fit` keep the fit's ``scale_``.
    modes : {None, "auto"}, default=None
        Operating modes (states of the machine: idle and loaded, two
        speeds), each with its own robust centre, components and
        calibrated cutoff, fitted in the same passes.  None: one state.
        ``"auto"``: the states are found on the first read's row sample
        (Gaussian mixtures of 2-4 components, accepted only on the
        evidence of a state, not of a fault: see docs/algorithm.md,
        "Operating modes"); one state found gives the fit of
        ``modes=None``, the same model.  The user's labels of the rows go
        to :meth:`fit` (``fit(X, modes=labels)``).  Each row is judged
        against the mode that explains it best (:meth:`predict_mode`).
        Modes need ``solver="auto"``, ``center="robust"``, ``cellwise=False``,
        no ``checkpoint`` and no ``warm_start``; ``nan_policy="partial"``
        and :meth:`transform` (whose scores are each mode's own) are not
        built for them yet and say so.  :meth:`partial_fit` updates each
        mode by its new rows.

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
        ``outlier_cutoff_`` under PyOD's name: the ``d^2`` above which a row is an outlier.
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
    saturation_limits_ : ndarray of shape (n_features, 2)
        Each channel's lower and upper saturation limit (NaN: none), the
        extreme a continuous channel holds exactly in at least 0.2 % of its
        rows (a clipped sensor); a reading there is judged as censored.
    shift_scale_ : ndarray of shape (n_features,)
        Spread of each channel's mean residual over 64 rows (runs of the
        fitted rows): a mean 5 of these from 0 is a lasting shift that
        :meth:`is_outlier` and :meth:`cell_outliers` flag (:mod:`._shift`).
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
        Reads of only some row blocks by this ``fit``: 1 where the row sample
        came from a spread of a store's many blocks (see Notes), else 0.
    n_blocks_read_ : int
        Row blocks read by those partial reads.
    n_modes_ : int
        Operating modes of a fit with ``modes``; then also ``modes_`` (each
        mode's label: the user's, or 0 .. ``n_modes_ - 1`` by size for
        ``"auto"``), ``mode_weights_`` (each mode's share of the rows),
        ``mode_models_`` (one fitted single-mode ``MCPCA`` per mode, whose
        attributes are that mode's: ``mean_``, ``components_``,
        ``outlier_cutoff_`` ...), ``mode_means_`` and ``mode_channels_`` (the
        channels that tell the modes apart, on which a row's mode is decided:
        :meth:`predict_mode`).  The top-level fitted attributes are then those
        of the largest mode; ``n_passes_`` counts the whole fit's passes.
    n_iter_ : int
        Re-weighting steps made on the full data.
    converged_ : bool
        Whether every iterative loop met ``tol`` within its bound.
    n_samples_ : int
        Rows used (rows with NaN or inf left out under ``nan_policy="omit"``;
        under ``"partial"``, rows with some observed cells included); after
        an update by :meth:`partial_fit`, the new rows it read.
    n_samples_partial_ : int
        Of those rows, the ones judged on fewer channels, by their observed
        cells only in the final pass: rows with some cells missing
        (``nan_policy="partial"``) and, with ``cellwise=True``, rows with
        some cells flagged; 0 when every row was judged whole (always for
        ``"raise"`` and ``"omit"`` without ``cellwise``, and for
        ``solver="paper"``).  ``dask-mcpca fit`` prints it.
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
    archive_rows_ : ndarray of shape ``(n_runs, 2)``, dtype int64
        Set only by the command line (``dask-mcpca fit`` and ``update``):
        the runs ``[start, stop)`` of archive rows, by position, sorted and
        apart, that the model's sums were read from (a file written before
        runs were kept holds one ``[start, stop)``, read as one run);
        ``dask-mcpca update`` reads the rows after the last run by default.
        ``archive_samples_``, ``(m, 2)`` ``[position, digest]`` pairs, is
        their fingerprint (a few rows' digests, checked by ``update``).
        Both removed by :meth:`fit` and :meth:`partial_fit`, which do not
        know where their rows come from.
    scale_ : ndarray of shape (n_features,)
        Set only with ``scale="robust"``: each channel's robust scale in
        the data's units (its MAD on the first pass's row sample times
        1.4826; where that is 0, its interquartile range over 1.349, then
        its mean absolute deviation times 1.2533, then 1).  The model's
        units are the data's divided by it.
    cell_cutoff_ : float
        Set only with ``cellwise=True``: the squared standardized residual
        above which :meth:`cell_outliers` flags a cell (the chi-square(1)
        99.9 % quantile, 10.83: a clean Gaussian cell is flagged with
        probability 0.1 %).

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
    16 row blocks (7 for rows of 33 or more columns): there it comes from a spread of the blocks (an eighth of
    them, 4 to 32, evenly spaced; ``n_partial_reads_``), so a default fit
    reads the store fully 2-3 times instead of 3-4.  What this changes: the
    sample, hence the start and the radii, sees the archive at 4-32 evenly
    spaced times, so a regime or a run of faults shorter than the gap
    between two of those blocks may be missing from it; the full-data
    passes still weigh every row (a missing regime is down-weighted as
    outlying, not fitted), and the outlier cutoff is calibrated on the
    sample.  The first full-data pass draws a second row sample, from the
    whole archive, in which the repeated values and rows (stuck sensors,
    frozen records) are found, as a full first pass finds them
    (``benchmarks/spread.py`` compares spreads of 4 and 8 blocks with a
    full first pass on time-clustered faults and regimes).  Which blocks are
    read depends on the chunking, so two chunkings of such a store draw
    different samples and give components that agree within the sampling
    noise of the radii (0.1 degree in the tests) rather than to round-off; stores of fewer blocks, and numpy
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

    _parameter_constraints: dict = PARAMETER_CONSTRAINTS

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
        nan_policy: Literal["raise", "omit", "partial"] = "raise",
        checkpoint: str | os.PathLike | None = None,
        sample_size: int = SAMPLE_SIZE,
        random_state: int | None = None,
        progress: bool = False,
        warm_start: bool = False,
        contamination: Literal["auto"] | float = "auto",
        cellwise: bool = False,
        scale: Literal["robust"] | None = None,
        modes: Literal["auto"] | None = None,
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
        self.cellwise = cellwise
        self.scale = scale
        self.modes = modes

    # ------------------------------------------------------------------ fit
    def fit(self, X: Any, y: None = None, *, modes: Any = None, storage_options: dict | None = None) -> MCPCA:
        """Fit the model to ``X``.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Shape (n_samples, n_features).  A string names a Zarr store or
            ``"file.h5:/dataset"``, or is a Zarr URL that fsspec understands
            (``"s3://bucket/archive.zarr"``, ``gs://``, ``abfs://``, ``https://``).
        y : None
            Ignored; present for scikit-learn's API.
        modes : array-like of shape (n_samples,) or str, optional
            The operating mode of each row (any labels: a machine-state
            channel, a schedule); each mode gets a model of its own, fitted
            in the same passes (see the ``modes`` parameter).  A string
            names a channel of a DataArray ``X`` (a machine-state channel),
            whose values are the labels and which is left out of the fitted
            channels.  None: the constructor's ``modes``.
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
        X, modes = _modes.labels_from_channel(X, modes)
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
        self._forget_update_sums()
        warm = ((self._robust_state, self._robust_unit, getattr(self, "scale_", None))
                if getattr(self, "_robust_state", None) is not None else None)
        # nothing of a previous fit survives a refit (a cellwise model's cell_cutoff_ judged a row-wise
        # refit's rows cell by cell); the command line sets archive_rows_ again, it knows the archive
        for name in [n for n in vars(self) if n.endswith("_") and not n.startswith("_") and n not in INPUT_NAMES]:
            del self.__dict__[name]
        modes = self.modes if modes is None else modes
        with single_threaded_blas():
            if modes is None:
                result = fit_rows(X, self, warm=warm)
            else:
                result = fit_modes(X, self, None if isinstance(modes, str) and modes == "auto" else modes)
        for one in result.results if isinstance(result, ModesResult) else (result,):
            if one.unconverged:
                warnings.warn(one.unconverged, ConvergenceWarning, stacklevel=2)
            if one.breakdown:
                warnings.warn(one.breakdown, BreakdownWarning, stacklevel=2)
        if isinstance(result, ModesResult):
            self._set_modes(result)
        else:
            self._set_fitted(result)
        return self

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

    def _set_fitted(self, result: FitResult) -> None:
        """Copy a fit's or an update's attributes onto the estimator (see :class:`._fit.FitResult`)."""
        for name, value in result.fitted_attributes().items():
            setattr(self, name, value)
        self._robust_state = result.robust_state  # what a warm_start refit continues from
        if result.robust_unit is not None:
            self._robust_unit = result.robust_unit  # the working unit the robust state is in

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        tags.input_tags.allow_nan = self.nan_policy in ("omit", "partial")
        return tags

    def _more_tags(self) -> dict:  # scikit-learn < 1.6
        return {"allow_nan": self.nan_policy in ("omit", "partial")}

