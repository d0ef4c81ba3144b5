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

Working units
-------------
A fit's passes see the data in working units ``X * 2**-unit_exp``
(``PassPlan.unit_exp``, chosen by the fit from the first pass's row
sample): scaling by a power of two is exact in floating point, so the bulk
of any data, whatever its magnitude, has a spread near 1 and its squares
neither overflow nor underflow.  A block subtracts the kernels' centre in
the data's own units (one rounding, as without scaling) and then scales.
A row that is finite as stored but whose deviation, or exponent, overflows
in working units is more than ~1e150 spreads from the centre: it gets
weight exactly 0 and is still a finite row (``n_far`` counts them).  A
moments pass (no kernels) cannot know the fit's unit yet: each sub-block
uses its own, the power of two above its largest magnitude, so its moments
cannot overflow, and the result's ``unit_exp`` says in which unit the
merged mean and scatter are (:func:`combine` rescales to the larger one).

Moments
-------
Weighted moments are kept as (total weight, weighted mean, scatter about that
mean) and merged with the pairwise formula of Chan, Golub and LeVeque, so no
large uncentred sum is ever formed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["PassPlan", "block_stats", "combine"]

#: Rows handled at once inside a block: bounds the temporaries of a task.
SUB_BLOCK_ROWS = 65_536

#: ``unit_exp`` of an empty moments result: any unit, its weight is 0.
_NO_UNIT = -(2**20)


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
    excluded : tuple of (int, float) pairs
        ``(column, value)``: a row whose ``column`` holds exactly ``value`` (in
        working units) enters no kernel's sums: a repeated value, such as a
        stuck sensor's or a frozen logger's (see :mod:`._robust`).
    unit_exp : int
        The pass sees ``X * 2**-unit_exp`` (working units; see the module
        docstring); ``center``, ``kernels`` and ``excluded`` are in those
        units.  Ignored by a moments pass, which picks its own units.
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
    excluded: tuple = ()
    unit_exp: int = 0
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
        excluded = tuple((int(c), float(v)) for c, v in self.excluded)
        if any(not 0 <= c < len(self.center) for c, _ in excluded) or (excluded and self.kernels is None):
            raise ValueError(f"excluded must be (column, value) pairs of a kernel pass; got {self.excluded!r}")
        object.__setattr__(self, "excluded", excluded)


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
        "n_far": 0,
        "unit_exp": _NO_UNIT if plan.kernels is None else 0,
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
    """Moments of the finite float64 rows ``Y = X - shift`` under each kernel.

    For kernel passes ``shift`` is the kernels' centre c; for a moments pass
    it is a row of the sub-block, so the raw sums below never cancel badly.
    Both are in the units of ``Y``.
    The scatter is formed as ``sum g y y^T - w m m^T`` (one GEMM, no centred
    copy of the rows): ``y`` is measured from a point near the weighted mean.
    """
    n, p = Y.shape
    if plan.kernels is None:
        weight = np.array([float(n)])
        log_scale = np.zeros(1)
        rel_mean = Y.sum(axis=0)[None] / n
        scatter = (Y.T @ Y)[None]
    else:
        J = plan.n_kernels
        log_scale, weight = np.empty(J), np.empty(J)
        rel_mean, scatter = np.empty((J, p)), np.empty((J, p, p))
        offsets = np.zeros(J) if plan.offsets is None else plan.offsets
        for j, A in enumerate(plan.kernels):
            if j == 0 or not np.array_equal(A, plan.kernels[j - 1]):
                quad = np.einsum("ij,ij->i", Y @ A, Y)  # y_k^T A y_k, reused by equal kernels
                # Overflow (inf, or inf - inf = NaN) only for rows ~1e150
                # spreads away: infinitely far, weight 0.
                quad[np.isnan(quad)] = np.inf
            # e_k = z - 1/2 y_k^T A y_k, capped at 0 (for z = 0, A is PSD and
            # positive values are round-off).
            e = -0.5 * quad
            e += offsets[j]
            np.minimum(e, 0.0, out=e)
            log_scale[j] = e.max()
            if log_scale[j] == -np.inf:  # every row infinitely far
                weight[j], rel_mean[j], scatter[j] = 0.0, 0.0, 0.0
                continue
            g = np.exp(e - log_scale[j], out=e)
            weight[j] = g.sum()
            rel_mean[j] = (g @ Y) / weight[j]
            scatter[j] = (Y * g[:, None]).T @ Y
    scatter -= weight[:, None, None] * rel_mean[:, :, None] * rel_mean[:, None, :]
    return {
        "n_rows": n,
        "n_nonfinite": 0,
        "n_far": 0,
        "unit_exp": 0,
        "log_scale": log_scale,
        "weight": weight,
        "mean": rel_mean + shift,
        "scatter": scatter,
    }


def _finite_rows(Y: np.ndarray) -> np.ndarray | None:
    """Mask of rows without NaN/inf, or None when all are finite (the usual case).

    ``Y`` is the data as stored (cast to float64), never a difference or a
    scaled copy, which can overflow for finite rows such as 1e308 and -1e308.
    """
    # A NaN or inf anywhere makes the grand total non-finite, so a finite total
    # proves every row finite.  The total is a contiguous reduction, ~18x cheaper
    # than per-row sums over p columns; overflow only sends us to the exact mask.
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, huge totals
        if np.isfinite(Y.sum()):
            return None
    return np.isfinite(Y).all(axis=1)


def _top_exponent(Y: np.ndarray) -> int:
    """The exponent e of the power of two 2**e above every magnitude in ``Y`` (0 if all are 0)."""
    top = float(np.max(np.abs(Y))) if Y.size else 0.0
    return int(np.frexp(top)[1]) if top > 0 else 0


def _excluded_rows(X64: np.ndarray, plan: PassPlan) -> np.ndarray:
    """Rows holding one of the plan's excluded values (compared exactly, in working units)."""
    hit = np.zeros(len(X64), bool)
    for column, value in plan.excluded:
        hit |= np.ldexp(X64[:, column], -plan.unit_exp) == value
    return hit


def _working_rows(X64: np.ndarray, plan: PassPlan):
    """Rows of a kernel pass in working units, and the mask of the rows that stay finite there."""
    with np.errstate(over="ignore", invalid="ignore"):
        center = np.ldexp(plan.center, plan.unit_exp)  # in data units (within the data's range)
        Y = np.ldexp(X64 - center, -plan.unit_exp)
        return Y, _finite_rows(Y)


def block_stats(X: np.ndarray, plan: PassPlan, row_offset: int = 0) -> dict:
    """Everything one row block contributes to a pass.

    Parameters
    ----------
    X : ndarray of shape (n_block, p)
        One row block, any float dtype; it is read once and cast to float64
        one sub-block at a time (the caller's array is never modified).
    plan : PassPlan
        The kernels and options of this pass.
    row_offset : int
        Global index of the block's first row (for the row sample).

    Returns
    -------
    dict
        ``n_rows``, ``n_nonfinite``, ``n_far``, ``unit_exp``, and per kernel
        ``log_scale``, ``weight``, ``mean``, ``scatter`` (see the module
        docstring; the mean and scatter are in units of ``2**unit_exp`` of
        the working units); ``sample`` (as stored) when the plan asks for
        one; ``col_min`` and ``col_max`` (over finite rows, as stored) for a
        moments pass (no kernels).
    """
    X = np.asarray(X)
    p = X.shape[1]
    result = _empty(plan, p)
    samples = []
    for start in range(0, X.shape[0], SUB_BLOCK_ROWS):
        sub = X[start : start + SUB_BLOCK_ROWS]
        X64 = np.asarray(sub, dtype=np.float64)
        n_seen = X64.shape[0]
        finite = _finite_rows(X64)  # on the values as stored
        n_bad = 0 if finite is None else int(n_seen - finite.sum())
        if plan.sample_rate > 0:
            rows = np.arange(row_offset + start, row_offset + start + n_seen)
            keep = _row_uniforms(rows, plan.seed) < plan.sample_rate
            if finite is not None:
                keep &= finite
            samples.append(np.array(X64[keep]))  # the rows as stored, exactly
        good = X64 if finite is None else X64[finite]
        n_far = 0
        if plan.kernels is None:
            # measured from the sub-block's first row (its finite entries), so
            # the sums below never cancel badly; |Y| <= 2 in this unit
            first = np.where(np.isfinite(X64[0]), X64[0], 0.0) if n_seen else np.zeros(p)
            unit = max(_top_exponent(good), _top_exponent(first))
            shift = np.ldexp(first, -unit)
            Y = np.ldexp(good, -unit) - shift
        else:
            unit, shift = 0, plan.center
            if plan.excluded:
                good = good[~_excluded_rows(good, plan)]
            Y, near = _working_rows(good, plan)
            if near is not None:
                Y, n_far = Y[near], int(len(near) - near.sum())
        with np.errstate(over="ignore", invalid="ignore"):  # far rows; the runner checks the result
            part = _sub_block_stats(Y, shift, plan) if len(Y) else _empty(plan, p)
        if plan.kernels is None and len(good):
            part["col_min"], part["col_max"] = good.min(axis=0), good.max(axis=0)
            part["unit_exp"] = unit
        part["n_rows"] = n_seen - n_bad
        part["n_nonfinite"] = n_bad
        part["n_far"] = n_far
        result = combine(result, part)
    if plan.sample_rate > 0:
        result["sample"] = np.concatenate([result["sample"], *samples])
    return result


def combine(a: dict, b: dict) -> dict:
    """Merge two partial pass results (associative and commutative up to round-off)."""
    out = {
        "n_rows": a["n_rows"] + b["n_rows"],
        "n_nonfinite": a["n_nonfinite"] + b["n_nonfinite"],
        "n_far": a.get("n_far", 0) + b.get("n_far", 0),
    }
    a, b, out["unit_exp"] = _same_unit(a, b)
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


def _same_unit(a: dict, b: dict):
    """``a`` and ``b`` with their mean and scatter in the larger of their units (exact, powers of two)."""
    ua, ub = a.get("unit_exp", 0), b.get("unit_exp", 0)
    unit = max(ua, ub)

    def rescale(x, u):
        if u == unit:
            return x
        d = max(u - unit, _NO_UNIT)  # <= 0: a shrink, at worst to 0 (negligible beside the other part)
        return {**x, "mean": np.ldexp(x["mean"], d), "scatter": np.ldexp(x["scatter"], 2 * d)}

    return rescale(a, ua), rescale(b, ub), unit
