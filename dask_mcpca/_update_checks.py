"""The checks that a model read passes on the sums it keeps for ``partial_fit`` (``update_*``).

An update recomputes the model from these sums (:func:`._update.update_rows`),
so sums that do not give the model, or break their own rules, would move
the next update anywhere.  :func:`._persist.validate_fitted` checks their
shapes; here, :func:`check_update_sums`: their own invariants (covariances
positive semi-definite, weights per row at most 1, radii ordered, the
kernel size that ``kernel_scale_`` implies) and that they give the model's
mean, components, variances and the state that weighs new rows.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ._power import PSD_TOL
from ._robust_step import FALL_OFF2, floored, kernel_rank
from ._schedule import flat_top_consistency, robust_kernel_size2

__all__ = ["UPDATE_ARRAYS", "UPDATE_SUMS_TOL", "FIX", "check_update_sums"]

#: What ``MCPCA.partial_fit`` updates from: name -> shape in terms of p (all or none of them).
UPDATE_ARRAYS = {
    "update_log_weights_": (2,),
    "update_means_": (2, "p"),
    "update_covariances_": (2, "p", "p"),
    "update_location_": ("p",),
    "update_scatter_": ("p", "p"),
    "update_radii_": (3,),
}
#: Relative disagreement accepted between the update sums and what a fit or an update derives
#: from them (the model's mean, covariance and variances, the kernel's state and size).  Every
#: fit and update computes those from the sums by the same float64 formulas: a fit and three
#: updates of each kind of fit in tests/test_model_files.py disagree by at most ~2e-15.
UPDATE_SUMS_TOL = 1e-9
_KERNELS = ("the core kernel's", "the final kernel's")
#: What a message of a failed check tells the user to do.
FIX = "the file was changed after it was saved, or mixes two models; restore it, or refit"


def check_update_sums(model, p: int) -> None:
    """The sums' own rules (:func:`_check_update_invariants`), then that they give the model
    (:func:`_check_update_gives_model`); ``model`` holds every ``update_*`` array, of the right shape.

    Raises
    ------
    ValueError
        Naming the sum that breaks a rule or does not give the model, and by how much.
    """
    _check_update_invariants(model, p)
    _check_update_gives_model(model, p)


def _check_psd(name: str, what: str, M: np.ndarray) -> None:
    """``M`` (p x p) symmetric and positive semi-definite, as a covariance is."""
    scale = max(float(np.abs(np.diag(M)).max()), np.finfo(float).tiny)
    if not np.allclose(M, M.T, rtol=1e-9, atol=1e-12 * max(1.0, float(np.abs(M).max()))):
        raise ValueError(f"{name} ({what}) is not symmetric, as a covariance is; {FIX}")
    low = float(np.linalg.eigvalsh(M).min())
    if not low >= -PSD_TOL * scale:
        raise ValueError(f"{name} ({what}) is not positive semi-definite, as a covariance is (an eigenvalue "
                         f"{low:.3g} against a largest variance {scale:.3g}); {FIX}")


def _check_update_invariants(model, p: int) -> None:
    """The sums' own rules: covariances, kernel size and radii, weights.

    Each kept covariance is a weighted covariance of rows: symmetric and
    positive semi-definite.  The kernels' size ``c^2`` is ``FALL_OFF2 *
    kernel_factor**2``, and ``kernel_scale_`` is ``sqrt(c^2(p)) *
    kernel_factor`` (:func:`._schedule.robust_kernel_size2`), so one gives
    the other.  The radii are the core's flat top and the final kernel's,
    which includes it: ``0 < radii[1] <= radii[2]``.  A kernel's weight is at
    most 1 per row, so each kernel's total weight ``exp(update_log_weights_)``
    is above 0 (the kernels held rows) and at most ``n_samples_seen_``; the
    final kernel's is at least the core's (same distances, larger radius);
    and ``support_`` is the final kernel's share.
    """
    for j in (0, 1):
        _check_psd(f"update_covariances_[{j}]", f"{_KERNELS[j]} weighted covariance of the rows partial_fit has "
                   "seen", model.update_covariances_[j])
    _check_psd("update_scatter_", "the scatter that weighs partial_fit's new rows", model.update_scatter_)
    c2, core, final = (float(v) for v in model.update_radii_)
    expected = FALL_OFF2 * model.kernel_scale_**2 / robust_kernel_size2(p)
    if not math.isclose(c2, expected, rel_tol=UPDATE_SUMS_TOL):
        raise ValueError(f"update_radii_[0]={c2!r} (the kernels' size c^2) does not match kernel_scale_="
                         f"{model.kernel_scale_!r}, which gives {expected!r}; {FIX}")
    if not 0 < core <= final:
        raise ValueError(f"update_radii_ (the core and the final kernel's flat-top radii {core!r}, {final!r}) "
                         f"must be > 0, the final one at least the core's; {FIX}")
    n = model.n_samples_seen_
    with np.errstate(under="ignore", over="ignore"):
        shares = np.exp(model.update_log_weights_ - math.log(n))
    for j in (0, 1):
        if not 0 < shares[j] <= 1 + UPDATE_SUMS_TOL:
            raise ValueError(f"update_log_weights_[{j}]={float(model.update_log_weights_[j])!r} gives "
                             f"{_KERNELS[j]} weight {shares[j]:.3g} per row seen; a kernel weighs each row by "
                             f"at most 1 and held some of the {n} rows (0 < share <= 1); {FIX}")
    if not shares[0] <= shares[1] * (1 + UPDATE_SUMS_TOL):
        raise ValueError(f"update_log_weights_ give the core kernel more weight ({shares[0]:.6g} per row) than the "
                         f"final kernel ({shares[1]:.6g}), which includes it; {FIX}")
    support = getattr(model, "support_", None)
    if isinstance(support, numbers.Real) and not math.isclose(support, shares[1], rel_tol=UPDATE_SUMS_TOL):
        raise ValueError(f"update_log_weights_[1] gives the final kernel a share {float(shares[1])!r} of the rows "
                         f"seen, not support_={support!r}; {FIX}")


def _check_update_gives_model(model, p: int) -> None:
    """The sums give the model, as an update with no new rows would compute it (``_fit.update_rows``).

    The sums are in the working unit ``2**update_unit_``.  About the centre
    (their own means for ``center="robust"``, else ``update_location_``, the
    fixed centre), each kernel's covariance times its Gaussian consistency
    factor (:func:`._schedule.flat_top_consistency` of ``c^2``, its radius
    and the rank of the scatter that weighs rows), floored at the quantized channels' rounding error
    ``quantization_steps_**2 / 12``, is the core's ``update_scatter_`` and
    the final kernel's scatter, whose eigenvalues are ``explained_variance_``
    (and the noise variance), its eigenvectors ``components_``; the core's
    mean is ``update_location_`` and the final kernel's is ``mean_``.
    """
    unit, M = model.update_unit_, model.update_means_
    fixed = None if getattr(model, "center", "robust") == "robust" else model.update_location_
    c2, *radii = (float(v) for v in model.update_radii_)
    resolution = np.ldexp(model.quantization_steps_, -unit) ** 2 / 12
    rank = kernel_rank(model.update_scatter_)  # the kernels' dimension, as the fit's steps took it

    def scatter(j: int) -> np.ndarray:
        cov = model.update_covariances_[j]
        if fixed is not None:
            d = M[j] - fixed
            cov = cov + np.outer(d, d)
        return floored(cov * flat_top_consistency(rank, c2, radii[j]), resolution)

    final = np.ldexp(scatter(1), 2 * unit)  # the model's units
    spread = math.sqrt(max(float(np.diag(final).max()), float(np.diag(model.covariance_).max())))
    centre = np.ldexp(M[1] if fixed is None else fixed, unit)
    off = float(np.abs(centre - model.mean_).max())
    if not off <= UPDATE_SUMS_TOL * spread:
        which = "update_means_[1] (the final kernel's weighted mean" if fixed is None else \
            "update_location_ (the fixed centre"
        raise ValueError(f"{which} of the rows partial_fit has seen, in units of 2**update_unit_) is not the model's "
                         f"mean_: off by {off / spread:.3g} of the largest spread; {FIX}")
    lam = model.explained_variance_
    total = float(np.trace(model.covariance_))
    scale = max(float(lam[0]), total)
    C = model.components_
    off = max(float(np.abs(C @ final @ C.T - np.diag(lam)).max()), abs(float(np.trace(final)) - total)) / scale
    if not off <= UPDATE_SUMS_TOL:
        raise ValueError("update_covariances_[1] (the final kernel's weighted covariance of the rows partial_fit "
                         "has seen, with update_means_[1], update_radii_ and quantization_steps_) does not give the "
                         f"model's components_, explained_variance_ and covariance_: off by {off:.3g} of the total "
                         f"variance; {FIX}")
    core = scatter(0)
    scale = max(float(np.abs(np.diag(model.update_scatter_)).max()), float(np.abs(np.diag(core)).max()),
                np.finfo(float).tiny)
    off = float(np.abs(core - model.update_scatter_).max()) / scale
    if not off <= UPDATE_SUMS_TOL:
        raise ValueError("update_covariances_[0] (the core kernel's weighted covariance of the rows partial_fit has "
                         "seen, with update_means_[0] and update_radii_) does not give update_scatter_ (the scatter "
                         f"that weighs new rows): off by {off:.3g} of the largest variance; {FIX}")
    if fixed is None:
        off = float(np.abs(M[0] - model.update_location_).max()) / math.sqrt(scale)
        if not off <= UPDATE_SUMS_TOL:
            raise ValueError("update_means_[0] (the core kernel's weighted mean of the rows partial_fit has seen) "
                             f"is not update_location_ (the centre that weighs new rows): off by {off:.3g} of the "
                             f"largest spread; {FIX}")
