"""The scikit-learn estimator :class:`MCPCA`.

``fit`` validates, opens the data as row blocks (:mod:`._io`), makes the first
pass (moments, a row sample and the NaN check), then hands over to one solver:
:func:`._paper.fit_paper` (Algorithms 1-3 as published) or
:func:`._robust.fit_robust` (the default).  Both run their passes through
:class:`._passes.PassRunner`, which counts them.
"""

from __future__ import annotations

import numbers
import os
from typing import Literal

import dask.array as da
import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from . import _checkpoint
from ._block import PassPlan
from ._io import as_row_blocks
from ._paper import fit_paper
from ._passes import PassRunner, single_threaded_blas
from ._power import descending_eigh, orient_rows
from ._robust import SAMPLE_SIZE, fit_robust
from ._schedule import outlier_cutoff_d2, robust_kernel_size2

__all__ = ["MCPCA"]

SOLVERS = ("auto", "paper")
CENTERS = ("robust", "mean", False)
NAN_POLICIES = ("raise", "omit")
DEFAULT_TOL = {"paper": 1e-6, "auto": 1e-3}
DEFAULT_MAX_ITER = {"paper": 100, "auto": 10}


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


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


# name -> (check, what was expected); checked in this order before any pass.
_PARAMETER_CONSTRAINTS = {
    "n_components": (lambda v: v is None or (_is_int(v) and v >= 1), "None or an int >= 1"),
    "solver": (lambda v: isinstance(v, str) and v in SOLVERS, f"one of {SOLVERS}"),
    "center": (lambda v: (isinstance(v, str) and v in CENTERS) or v is False, "'robust', 'mean' or False"),
    "eta": (lambda v: _is_real(v) and 0 < v < 1, "a float in the open interval (0, 1)"),
    "n_decay": (lambda v: _is_int(v) and v >= 1, "an int >= 1"),
    "tol": (lambda v: v is None or (_is_real(v) and v > 0), "None or a float > 0"),
    "max_iter": (lambda v: v is None or (_is_int(v) and v >= 1), "None or an int >= 1"),
    "nan_policy": (lambda v: isinstance(v, str) and v in NAN_POLICIES, f"one of {NAN_POLICIES}"),
    "kernel_factor": (lambda v: _is_real(v) and 0 < v < np.inf, "a float > 0"),
    "sample_size": (lambda v: _is_int(v) and v >= 10, "an int >= 10"),
    "random_state": (lambda v: v is None or (_is_int(v) and 0 <= v < 2**64), "None or an int in [0, 2**64)"),
    "checkpoint": (lambda v: v is None or isinstance(v, (str, os.PathLike)), "None or a file path"),
    "progress": (lambda v: isinstance(v, bool), "True or False"),
}


def _nan_for_nonfinite_rows(func):
    """Wrap a row-block function: rows holding NaN or inf give NaN (False for flags)."""

    def wrapped(block):
        bad = ~np.isfinite(block).all(axis=1)
        if not bad.any():
            return func(block)
        out = func(np.where(bad[:, None], 0.0, block))
        out[bad] = np.nan if out.dtype.kind == "f" else 0
        return out

    return wrapped


class MCPCA(TransformerMixin, BaseEstimator):
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
        pass-efficient default: a DetMCD start on a row sample, then the
        correntropy fixed point with the Mahalanobis kernel of eq. (1) and a
        final flat-top re-weighting in the same passes, all components at
        once, in a handful of passes (2-3 with the default ``tol``).
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
        ``sqrt(lambda_i)``, or the default's ``c``.  Large values make all
        weights equal and the fit ordinary PCA; small values are more robust
        and less efficient.
    tol : float or None, default=None
        Convergence tolerance.  ``"paper"``: on ``||v_new - v||`` of the
        inner and outer loops (default 1e-6).  ``"auto"``: on the relative
        change of the robust scatter per pass (default 1e-3).
    max_iter : int or None, default=None
        ``"paper"``: bound on re-weightings per kernel size (default 100).
        ``"auto"``: bound on full-data passes after the first (default 10).
    nan_policy : {"raise", "omit"}, default="raise"
        Rows with NaN or inf: raise a ``ValueError``, or leave them out of the
        fit (their transform and score are NaN).  Checked within the passes.
    checkpoint : str or path-like, optional
        File to which the small state of the fit is written after every step
        (atomically); a fit started again with the same data and parameters
        resumes there.
    sample_size : int, default=20000
        Rows drawn during the first pass for the robust start (``"auto"``).
    random_state : int or None, default=None
        Seed of that row sample (None: 0, so fits are reproducible).
    progress : bool, default=False
        Draw a progress line per pass on stderr.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        Orthonormal rows, ordered by decreasing robust variance (``"auto"``)
        or as found (``"paper"``); the largest entry of each row is positive.
    explained_variance_ : ndarray of shape (n_components,)
        Robust variance along each component.
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
    outlier_threshold_ : float
        Score below which :meth:`is_outlier` flags a row: the weight of a row
        at the 99.9 % chi-square quantile of ``d^2``.
    n_passes_ : int
        Full passes over the data made by this call to ``fit``.
    n_iter_ : int
        Re-weighting steps made on the full data.
    converged_ : bool
        Whether every iterative loop met ``tol`` within its bound.
    n_samples_ : int
        Rows used (rows with NaN or inf left out under ``nan_policy="omit"``).
    n_features_in_ : int

    Notes
    -----
    For component i the paper maximises the correntropy of the deflated
    reconstruction error (eq. (11)); its stationary point is the dominant
    eigenvector of ``K = Q_(i-1) (S - P S - S P)`` with ``S = X^T G X``
    (eq. (14)), found by power iteration after the shift by ``max|diag K|``
    (eq. (15)), and deflation updates P and Q by Woodbury (Algorithm 3).
    The weights are accumulated with a per-block log-scale, so they cannot
    all underflow for small kernel sizes.

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
    >>> np.abs(model.components_[0]).round(2)
    array([1.  , 0.01, 0.  ])
    >>> model.n_passes_ <= 12
    True
    """

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
        checkpoint=None,
        sample_size: int = SAMPLE_SIZE,
        random_state: int | None = None,
        progress: bool = False,
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

    # ------------------------------------------------------------------ fit
    def _validate_params(self) -> None:
        for name, (ok, expected) in _PARAMETER_CONSTRAINTS.items():
            value = getattr(self, name)
            if not ok(value):
                raise ValueError(f"MCPCA: parameter {name}={value!r} is invalid; expected {expected}")

    def fit(self, X, y=None):
        """Fit the model to ``X``.

        Parameters
        ----------
        X : array-like, dask array, zarr.Array, h5py.Dataset, xarray.DataArray or str
            Shape (n_samples, n_features).  A string names a Zarr store or
            ``"file.h5:/dataset"``.
        y : ignored

        Returns
        -------
        self : MCPCA
        """
        self._validate_params()
        X = as_row_blocks(X)
        with single_threaded_blas():
            return self._fit(X)

    def _fit(self, X):
        """The fit proper, on full-row blocks; see :meth:`fit`."""
        n, p = X.shape
        k = p if self.n_components is None else self.n_components
        if k > p:
            raise ValueError(f"MCPCA: parameter n_components={k} is invalid; X has only {p} features")
        needed = p + 2 if (self.solver == "auto" or self.center == "robust") else 2
        if n < needed:
            raise ValueError(
                f"X has {n} rows and {p} features; solver={self.solver!r} with center={self.center!r} "
                f"needs at least {needed} rows"
            )
        least = needed if n <= self.sample_size else _least_sample_size(needed)
        if n > self.sample_size < least:
            raise ValueError(
                f"MCPCA: parameter sample_size={self.sample_size} is invalid; the robust start "
                f"needs a row sample of at least {needed} rows (n_features + 2); the sample's size "
                f"varies with the seed, so sample_size must be at least {least}"
            )
        solver = self.solver
        tol = self.tol if self.tol is not None else DEFAULT_TOL[solver]
        max_iter = self.max_iter if self.max_iter is not None else DEFAULT_MAX_ITER[solver]
        runner = PassRunner(X, nan_policy=self.nan_policy, progress=self.progress)
        ckpt = _checkpoint.Checkpoint.open(self.checkpoint, params=self._fingerprint_params(), shape=(n, p))

        # Pass 1: moments, a row sample for the robust start, the NaN check.
        seed = 0 if self.random_state is None else self.random_state
        rate = min(1.0, self.sample_size / n)
        moments = runner.run(PassPlan(center=np.zeros(p), sample_rate=rate, seed=seed), label="moments")
        ckpt.check_data(moments)
        self.n_samples_ = int(moments.n_rows)
        if self.n_samples_ < 2:
            raise ValueError(f"only {self.n_samples_} usable row(s); at least 2 are needed")

        fixed = {"mean": moments.mean[0], False: np.zeros(p)}.get(self.center)
        robust = None
        if solver == "auto" or self.center == "robust":
            robust = fit_robust(
                runner,
                moments=moments,
                fixed_center=fixed,
                kernel_factor=self.kernel_factor,
                tol=DEFAULT_TOL["auto"] if solver == "paper" else tol,
                max_passes=DEFAULT_MAX_ITER["auto"] if solver == "paper" else max_iter,
                state=ckpt.load("robust"),
                on_step=lambda s: ckpt.save("robust", s),
                final_step=solver == "auto",
            )
        center = robust.location if robust is not None else fixed
        if solver == "auto":
            self._set_from_robust(robust, k)
            self.n_iter_, self.converged_ = robust.n_iter, robust.converged
        else:
            scatter0 = moments.covariance(about=center)
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
            self._set_from_paper(state, center, scatter0, k)
            self.n_iter_ = state.n_iter
            self.converged_ = state.converged and (robust is None or robust.converged)
        self.n_passes_ = runner.n_passes
        self.n_features_in_ = p
        return self

    def _fingerprint_params(self) -> dict:
        params = self.get_params()
        params.pop("checkpoint"), params.pop("progress")
        return params

    def _set_from_robust(self, robust, k) -> None:
        """Components from the final re-weighting step, variances from the fixed point.

        The flat-top covariance of the final step (see :mod:`._robust`) gives
        the more accurate directions; the fixed point's scatter gives the
        more robust variance along each of them, because the flat top takes
        moderate outliers in at full weight (median over 20 seeds at p = 3:
        its own eigenvalues were 1.29x the truth on multivariate t3 data and
        1.14x with 20 % paper-type outliers; the fixed point's 1.16x and
        1.10x).  Without a full-data step (a fit resumed from a checkpoint
        that had converged on the sample) the fixed point gives both.
        """
        kernel_scale = np.sqrt(robust.kernel_size2)
        if robust.final_scatter is None:
            lam, V = descending_eigh(robust.scatter)
            center = robust.location
        else:
            _, V = descending_eigh(robust.final_scatter)
            lam = np.einsum("ij,ik,kj->j", V, robust.scatter, V)  # v_j^T Sigma v_j
            order = np.argsort(-lam, kind="stable")
            lam, V = lam[order], V[:, order]
            center = robust.final_location
        lam = np.maximum(lam, 0.0)
        self.components_ = orient_rows(V[:, :k].T)
        self._set_variances(lam[:k], lam[k:], lam.sum(), center, kernel_scale)

    def _set_from_paper(self, state, center, scatter0, k) -> None:
        # The power iteration stops within tol of K's eigenvector, so rows are
        # orthogonal only to ~tol; Gram-Schmidt in order makes them exactly so.
        q, r = np.linalg.qr(np.array(state.components).T)
        self.components_ = orient_rows((q * np.sign(np.diag(r))).T)
        variances = np.maximum(np.array(state.variances), 0.0)
        total = max(float(np.trace(scatter0)), float(variances.sum()))
        rest = total - variances.sum()
        rest_lam = np.full(len(center) - k, rest / (len(center) - k)) if k < len(center) else np.empty(0)
        self._set_variances(variances, rest_lam, total, center, np.sqrt(robust_kernel_size2(len(center))))
        self.sigmas_ = np.array(state.sigmas)

    def _set_variances(self, lam, rest, total, center, kernel_scale) -> None:
        p = len(center)
        self.mean_ = np.asarray(center, dtype=np.float64)
        self.explained_variance_ = lam
        self.explained_variance_ratio_ = lam / total if total > 0 else np.zeros_like(lam)
        self.noise_variance_ = float(rest.mean()) if len(rest) else 0.0
        self.n_components_ = len(lam)
        self.kernel_scale_ = float(kernel_scale)
        self.sigmas_ = kernel_scale * np.sqrt(lam)
        C = (self.components_.T * lam) @ self.components_
        if len(rest):
            C += self.noise_variance_ * (np.eye(p) - self.components_.T @ self.components_)
        self.covariance_ = C
        self.outlier_threshold_ = float(np.exp(-outlier_cutoff_d2(p) / (2 * kernel_scale**2)))

    # ---------------------------------------------------------- transforms
    def _map_rows(self, X, func, n_out: int | None, dtype=np.float64):
        """Apply ``func`` to row blocks: lazily for dask input, eagerly otherwise."""
        check_is_fitted(self, "components_")
        X = as_row_blocks(X)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features; the model was fitted on {self.n_features_in_}")
        func = _nan_for_nonfinite_rows(func)
        if isinstance(X, da.Array):
            if n_out is None:
                return X.map_blocks(func, drop_axis=1, dtype=dtype)
            return X.map_blocks(func, chunks=(X.chunks[0], (n_out,)), dtype=dtype)
        return func(X)

    def transform(self, X):
        """Project ``X`` on the components: ``(X - mean_) @ components_.T``.

        Returns a lazy dask array for dask or store input.
        """
        check_is_fitted(self, "components_")
        comps, mean = self.components_, self.mean_
        return self._map_rows(X, lambda b: (np.asarray(b, np.float64) - mean) @ comps.T, len(comps))

    def inverse_transform(self, X):
        """Map scores back to the data space: ``X @ components_ + mean_``."""
        check_is_fitted(self, "components_")
        width = X.shape[-1] if getattr(X, "ndim", np.ndim(X)) == 2 else None
        if width != self.n_components_:
            shape = getattr(X, "shape", np.shape(X))
            raise ValueError(
                f"inverse_transform takes scores of shape (n_samples, {self.n_components_}) "
                f"(n_components_={self.n_components_}); got shape {tuple(shape)}"
            )
        if isinstance(X, da.Array):
            return X @ self.components_ + self.mean_
        return np.asarray(X) @ self.components_ + self.mean_

    def _d2(self, block):
        Y = np.asarray(block, np.float64) - self.mean_
        Z = Y @ self.components_.T
        lam = self.explained_variance_
        inv = np.where(lam > 0, 1.0 / np.where(lam > 0, lam, 1.0), 0.0)
        d2 = (Z**2) @ inv
        if self.n_components_ < self.n_features_in_ and self.noise_variance_ > 0:
            resid = np.einsum("ij,ij->i", Y, Y) - np.einsum("ij,ij->i", Z, Z)
            d2 += np.maximum(resid, 0.0) / self.noise_variance_
        return d2

    def mahalanobis(self, X):
        """Squared robust Mahalanobis distance of each row under the fitted model."""
        return self._map_rows(X, self._d2, None)

    def score_samples(self, X):
        """Correntropy weight of each row, in [0, 1]: ``exp(-d^2 / (2 c^2))``.

        ``d^2`` is the squared robust Mahalanobis distance under the fitted
        components and variances (the discarded directions share
        ``noise_variance_``) and ``c = kernel_scale_``.  Low scores are
        outlying rows; NaN for rows with NaN.  Lazy for dask input.
        """
        check_is_fitted(self, "components_")
        c2 = self.kernel_scale_**2
        return self._map_rows(X, lambda b: np.exp(-self._d2(b) / (2 * c2)), None)

    def is_outlier(self, X):
        """True for rows whose ``d^2`` exceeds the 99.9 % chi-square quantile.

        Equivalently ``score_samples(X) < outlier_threshold_``.
        """
        check_is_fitted(self, "components_")
        cut = outlier_cutoff_d2(self.n_features_in_)
        return self._map_rows(X, lambda b: self._d2(b) > cut, None, dtype=bool)

    # ---------------------------------------------------------- persistence
    def save(self, path) -> None:
        """Write the fitted model to ``path`` as JSON (no pickle).

        Read it back with :func:`dask_mcpca.load`; the format is described
        in :mod:`dask_mcpca._persist`.  The file is replaced atomically.
        """
        from ._persist import save

        save(self, path)
