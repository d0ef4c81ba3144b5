"""What one row block owes a pass: correntropy weights, weighted moments, small sums.

Every pass over the data, local or distributed, calls :func:`block_stats` once
per row block and merges the results with :func:`combine`.  The result of a
block is a small dict of numpy arrays (a few p x p matrices), never rows of
the data, except for an optional row sample that is bounded by design.

Weights
-------
A pass evaluates ``J`` kernels at once.  Kernel ``j`` is a symmetric p x p
matrix ``A_j`` and gives row ``x`` the exponent

    e_j(x) = -1/2 (x - c)^T A_j (x - c)

and the correntropy weight ``g_j(x) = exp(e_j(x))``.  With
``A = M^T M / sigma^2`` and ``M = I - P - v v^T`` this is the paper's
``[G_sigma]_kk`` (eqs. (8) and (13)); with ``A = Sigma^{-1} / s^2`` it is the
Mahalanobis kernel of eq. (1).  An optional offset ``z_j >= 0`` makes the
weight ``exp(min(z_j + e_j(x), 0))``: flat inside an ellipsoid, Gaussian
outside (the default solver's final efficiency step, :mod:`._robust`).

No underflow
------------
For a small kernel size, ``exp(e)`` is 0.0 in float64 for every row.  A block
therefore keeps a log-scale ``m = max_k e_k`` per kernel and accumulates
``exp(e_k - m)``; :func:`combine` rescales two partial results to their common
maximum, as a log-sum-exp does.  The weights of a pass are thus known up to one
common positive factor, which no estimate depends on.

Moments
-------
Weighted moments are kept as (total weight, weighted mean, scatter about that
mean) and merged with the pairwise formula of Chan, Golub and LeVeque, so no
large uncentred sum is ever formed.

Precision
---------
float32 rows are shifted, weighted and multiplied in float32 (twice the
arithmetic rate and half the bytes of float64), in GEMMs of ``GEMM_ROWS``
rows whose results are added in float64, as are all sums across GEMMs,
sub-blocks and blocks: a float32 fit gives the float64 fit of the same values
to float32 round-off (``tests/test_mcpca.py``).  Under a point mass's kernel,
which must tell rows apart at round-off, the pass works in float64.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["PassPlan", "block_stats", "combine"]

#: Rows handled at once inside a block: bounds the temporaries of a task and
#: keeps them in cache (32,768 rows ran 10-25 % faster than 65,536 at p = 10).
SUB_BLOCK_ROWS = 32_768

@dataclass(frozen=True)
class PassPlan:
    """The small, picklable parameters of one pass.

    Parameters
    ----------
    center : ndarray of shape (p,)
        Reference point ``c`` of the kernels.
    kernels : ndarray of shape (J, p, p) or None
        Kernel matrices ``A_j``; None gives unit weights (a moments pass).
    offsets : ndarray of shape (J,) or None
        Exponent offsets ``z_j >= 0`` (None: all 0).  Kernel ``j`` then gives
        the weight ``exp(min(z_j + e_j(x), 0))``: 1 inside the ellipsoid
        ``(x - c)^T A_j (x - c) <= 2 z_j`` and Gaussian beyond it.
    kernel_centers : ndarray of shape (J, p) or None
        A centre per kernel for its exponent (None: all ``center``); the
        moments of every kernel are still measured from ``center``, so they
        can be added and subtracted.
    sample_rate : float
        Probability with which each row is kept in the returned row sample.
    seed : int
        Seed of the row sample.  Whether a row is drawn depends only on the
        seed and the row's global index, so the sample does not depend on the
        chunking.

    Rows holding NaN or inf never enter the sums; they are counted in
    ``n_nonfinite`` and the caller decides (``nan_policy``).
    """

    center: np.ndarray
    kernels: np.ndarray | None = None
    offsets: np.ndarray | None = None
    kernel_centers: np.ndarray | None = None
    sample_rate: float = 0.0
    seed: int = 0
    n_kernels: int = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "n_kernels", 1 if self.kernels is None else len(self.kernels))
        if self.offsets is not None:
            offsets = np.asarray(self.offsets, dtype=np.float64)
            if self.kernels is None or offsets.shape != (self.n_kernels,) or not np.all(offsets >= 0):
                raise ValueError(f"offsets must be {self.n_kernels} values >= 0, one per kernel; got {self.offsets!r}")
            object.__setattr__(self, "offsets", offsets)
        if self.kernel_centers is not None:
            centers = np.asarray(self.kernel_centers, dtype=np.float64)
            if self.kernels is None or centers.shape != (self.n_kernels, len(self.center)):
                raise ValueError(f"kernel_centers must be {self.n_kernels} points, one per kernel")
            object.__setattr__(self, "kernel_centers", centers)


def _row_uniforms(rows: np.ndarray, seed: int) -> np.ndarray:
    """A uniform number in [0, 1) per global row index (splitmix64 hash)."""
    with np.errstate(over="ignore"):
        z = rows.astype(np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        z += np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _empty(plan: PassPlan, p: int) -> dict:
    J = plan.n_kernels
    out = {
        "n_rows": 0,
        "n_nonfinite": 0,
        "log_scale": np.full(J, -np.inf),
        "weight": np.zeros(J),
        "mean": np.zeros((J, p)),
        "scatter": np.zeros((J, p, p)),
    }
    if plan.kernels is None:  # a moments pass also finds each column's range (the data's fingerprint)
        out["col_min"], out["col_max"] = np.full(p, np.inf), np.full(p, -np.inf)
    if plan.sample_rate > 0:
        out["sample"] = np.empty((0, p))
    return out


def _sub_block_stats(Y: np.ndarray, shift: np.ndarray, plan: PassPlan) -> dict:
    """Moments of the finite rows ``Y = X - shift`` under each kernel.

    For kernel passes ``shift`` is the kernels' centre c; for a moments pass
    it is a row of the sub-block, so the raw sums below never cancel badly.
    The scatter is formed as ``sum g y y^T - w m m^T`` (no centred copy of
    the rows): ``y`` is measured from a point near the weighted mean.

    ``Y`` is float32 for float32 data: the products are then float32 and
    their sums float64 (:func:`_weighted_sums`).  Equal kernels share one
    quadratic form, and all kernels one weighted GEMM.
    """
    n, p = Y.shape
    if plan.kernels is None:
        G = None
        log_scale = np.zeros(1)
    else:
        E = np.empty((plan.n_kernels, n), dtype=Y.dtype)
        offsets = np.zeros(plan.n_kernels) if plan.offsets is None else plan.offsets
        centers = plan.kernel_centers
        wider = np.zeros(plan.n_kernels, bool)  # same quadratic form as kernel j - 1, wider flat top
        for j, A in enumerate(plan.kernels):
            same_center = centers is None or j == 0 or np.array_equal(centers[j], centers[j - 1])
            wider[j] = j > 0 and same_center and np.array_equal(A, plan.kernels[j - 1])
            wider[j] &= offsets[j] >= offsets[j - 1]
            if j == 0 or not (same_center and np.array_equal(A, plan.kernels[j - 1])):
                # y_k^T A y_k, reused by equal kernels; about the kernel's own centre
                Yj = Y if centers is None else Y - (centers[j] - plan.center).astype(Y.dtype)
                quad = np.einsum("ij,ij->i", Yj @ A.astype(Y.dtype), Yj)
            # e_k = z - 1/2 y_k^T A y_k, capped at 0 (for z = 0, A is PSD and
            # positive values are round-off).
            np.multiply(quad, -0.5, out=E[j])
            E[j] += offsets[j]
        np.minimum(E, 0.0, out=E)
        log_scale = E.max(axis=1).astype(np.float64)
        wider[1:] &= log_scale[:-1] == 0
        if np.any(log_scale):
            E -= log_scale.astype(Y.dtype)[:, None]
        # Weights below exp(LOG_TINY) would be subnormal, which slows the GEMM
        # many times over; they are far below the round-off of the sums.
        E[E < _LOG_TINY[Y.dtype.type]] = -np.inf
        G = np.exp(E, out=E)
    weight, wsum, scatter = _weighted_sums(Y, G, wider=None if G is None else wider)
    rel_mean = wsum / weight[:, None]
    scatter -= weight[:, None, None] * rel_mean[:, :, None] * rel_mean[:, None, :]
    return {
        "n_rows": n,
        "n_nonfinite": 0,
        "log_scale": log_scale,
        "weight": weight,
        "mean": rel_mean + shift,
        "scatter": scatter,
    }


#: Exponents below which a weight is set to 0 (exp would be subnormal).
_LOG_TINY = {np.float32: -80.0, np.float64: -700.0}

#: Rows per GEMM of the weighted sums: float32 products accumulate in float32
#: within one GEMM, so a short GEMM bounds their round-off (at worst about
#: ``GEMM_ROWS * 2^-24`` relative, typically its square root of that); the
#: GEMMs' results add in float64.  It also keeps a GEMM's operands in cache.
GEMM_ROWS = 4096


def _weighted_sums(
    Y: np.ndarray, G: np.ndarray | None, *, wider: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per kernel j: ``sum_k G_jk``, ``sum_k G_jk y_k`` and ``sum_k G_jk y_k y_k^T`` in float64.

    One GEMM per ``GEMM_ROWS`` rows for the kernels: the rows weighted by
    each kernel, side by side (n x Jp), times the rows.  ``G=None``: unit
    weights, one kernel (a moments pass).

    A kernel marked ``wider`` has the quadratic form of kernel ``j - 1``
    and a wider flat top, and kernel ``j - 1`` has a row inside its flat top
    (its log-scale is 0), so ``G_j >= G_(j-1)`` and they differ only on the
    rows outside kernel ``j - 1``'s flat top (``G_(j-1) < 1``): its sums are
    kernel ``j - 1``'s plus those rows' ``G_j - G_(j-1)`` terms, which are
    non-negative (no cancellation).  The final kernel of a robust step is
    such a kernel, so a step costs one weighted GEMM and a small one.
    """
    n, p = Y.shape
    J = 1 if G is None else G.shape[0]
    weight, wsum, scatter = np.zeros(J), np.zeros((J, p)), np.zeros((J, p, p))
    own = np.arange(J) if wider is None else np.flatnonzero(~wider)
    K = len(own)
    W = np.empty((min(n, GEMM_ROWS), K * p), dtype=Y.dtype)
    for start in range(0, n, GEMM_ROWS):
        y = Y[start : start + GEMM_ROWS]
        if G is None:
            wsum[0] += y.sum(axis=0, dtype=np.float64)
            scatter[0] += y.T @ y
            continue
        g = G[:, start : start + GEMM_ROWS]
        weight += g.sum(axis=1, dtype=np.float64)
        wsum += g @ y
        w = W[: len(y)]
        if K == 1:  # (sqrt(g) y)^T (sqrt(g) y): numpy makes it a SYRK, half the GEMM's work
            np.multiply(y, np.sqrt(g[own[0]])[:, None], out=w)
            scatter[own[0]] += w.T @ w
        else:
            for k, j in enumerate(own):
                np.multiply(y, g[j][:, None], out=w[:, k * p : (k + 1) * p])
            scatter[own] += (w.T @ y).reshape(K, p, p)
        for j in np.flatnonzero(wider) if wider is not None else ():
            rows = np.flatnonzero(g[j - 1] < 1)
            if len(rows):
                yr = y[rows]
                scatter[j] += (yr * (g[j, rows] - g[j - 1, rows])[:, None]).T @ yr
    if G is None:
        weight[0] = n
    for j in np.flatnonzero(wider) if wider is not None else ():
        scatter[j] += scatter[j - 1]
    return weight, wsum, scatter


def _work_dtype(dtype: np.dtype, plan: PassPlan) -> type:
    """float32 for float32 rows (the products then run at float32 speed; sums are
    float64), except under a point mass's kernel, which must resolve round-off."""
    return np.float32 if dtype == np.float32 and plan.kernel_centers is None else np.float64


def _finite_rows(Y: np.ndarray) -> np.ndarray | None:
    """Mask of rows without NaN/inf, or None when all are finite (the usual case)."""
    # A NaN or inf anywhere makes the grand total non-finite, so a finite total
    # proves every row finite.  The total is a contiguous reduction, ~18x cheaper
    # than per-row sums over p columns; overflow only sends us to the exact mask.
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, huge totals
        if np.isfinite(Y.sum()):
            return None
    return np.isfinite(Y).all(axis=1)


def block_stats(X: np.ndarray, plan: PassPlan, row_offset: int = 0) -> dict:
    """Everything one row block contributes to a pass.

    Parameters
    ----------
    X : ndarray of shape (n_block, p)
        One row block, any float dtype; it is read once and shifted one
        sub-block at a time into float32 (float32 data) or float64 (any
        other) working rows; the sums are float64 (the caller's array is
        never modified).
    plan : PassPlan
        The kernels and options of this pass.
    row_offset : int
        Global index of the block's first row (for the row sample).

    Returns
    -------
    dict
        ``n_rows``, ``n_nonfinite``, and per kernel ``log_scale``, ``weight``,
        ``mean``, ``scatter`` (see the module docstring); ``sample`` when the
        plan asks for one; ``col_min`` and ``col_max`` (over finite rows) for
        a moments pass (no kernels).
    """
    X = np.asarray(X)
    p = X.shape[1]
    work = _work_dtype(X.dtype, plan)
    result = _empty(plan, p)
    samples = []
    for start in range(0, X.shape[0], SUB_BLOCK_ROWS):
        sub = X[start : start + SUB_BLOCK_ROWS]
        if plan.kernels is None:
            first = np.asarray(sub[0], dtype=np.float64)
            shift = np.where(np.isfinite(first), first, 0.0)
        else:
            shift = plan.center
        shift = shift.astype(work).astype(np.float64)  # as subtracted
        Y = np.subtract(sub, shift, dtype=work)  # a new array
        n_seen = Y.shape[0]
        finite = _finite_rows(Y)
        n_bad = 0 if finite is None else int(n_seen - finite.sum())
        if plan.sample_rate > 0:
            rows = np.arange(row_offset + start, row_offset + start + n_seen)
            keep = _row_uniforms(rows, plan.seed) < plan.sample_rate
            if finite is not None:
                keep &= finite
            samples.append(np.asarray(sub[keep], dtype=np.float64))  # the rows as stored, exactly
        if n_bad:
            Y = Y[finite]
        part = _sub_block_stats(Y, shift, plan) if len(Y) else _empty(plan, p)
        if plan.kernels is None and len(Y):
            rows = sub if finite is None else sub[finite]
            part["col_min"], part["col_max"] = rows.min(axis=0).astype(np.float64), rows.max(axis=0).astype(np.float64)
        part["n_rows"] = n_seen - n_bad
        part["n_nonfinite"] = n_bad
        result = combine(result, part)
    if plan.sample_rate > 0:
        result["sample"] = np.concatenate([result["sample"], *samples])
    return result


def combine(a: dict, b: dict) -> dict:
    """Merge two partial pass results (associative and commutative up to round-off)."""
    out = {
        "n_rows": a["n_rows"] + b["n_rows"],
        "n_nonfinite": a["n_nonfinite"] + b["n_nonfinite"],
    }
    log_scale = np.maximum(a["log_scale"], b["log_scale"])
    finite = np.isfinite(log_scale)
    with np.errstate(invalid="ignore"):
        fa = np.where(finite, np.exp(a["log_scale"] - log_scale), 0.0)
        fb = np.where(finite, np.exp(b["log_scale"] - log_scale), 0.0)
    wa, wb = a["weight"] * fa, b["weight"] * fb
    weight = wa + wb
    safe = np.where(weight > 0, weight, 1.0)
    delta = b["mean"] - a["mean"]
    mean = a["mean"] + delta * (wb / safe)[:, None]
    scatter = (
        a["scatter"] * fa[:, None, None]
        + b["scatter"] * fb[:, None, None]
        + (wa * wb / safe)[:, None, None] * delta[:, :, None] * delta[:, None, :]
    )
    out.update(log_scale=log_scale, weight=weight, mean=mean, scatter=scatter)
    if "col_min" in a or "col_min" in b:
        out["col_min"] = np.minimum(*(x.get("col_min", np.inf) for x in (a, b)))
        out["col_max"] = np.maximum(*(x.get("col_max", -np.inf) for x in (a, b)))
    if "sample" in a or "sample" in b:
        out["sample"] = np.concatenate([x["sample"] for x in (a, b) if "sample" in x])
    return out
