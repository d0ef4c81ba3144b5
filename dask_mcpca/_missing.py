"""Rows with missing cells (``nan_policy="partial"``): the Gaussian model restricted to what was observed.

A sensor archive loses one channel at a time: a row with a NaN cell still holds the other channels'
measurements.  Under a Gaussian model with mean 0 (rows are centred first) and covariance ``S``, the
observed cells ``O`` of a row and its missing cells ``M`` obey

    y_O ~ N(0, S_OO),     y_M | y_O ~ N(B y_O, C),
    B = S_MO S_OO^-1,     C = S_MM - S_MO S_OO^-1 S_OM

(Tipping and Bishop 1999, appendix; Little and Rubin 2002, ch. 11).  Hence:

- the squared distance on the observed cells, ``d^2_O = y_O^T S_OO^-1 y_O``,
  which for a Gaussian row is chi-square with ``k = |O|`` degrees of freedom;
- the conditional expectation of the missing cells, ``B y_O`` (what
  :meth:`MCPCA.impute` returns and :meth:`MCPCA.transform` projects);
- the E-step of a (weighted) EM fit: a row contributes ``w yhat yhat^T + w C``
  to the scatter, where ``yhat`` is the row completed by ``B y_O``
  (:func:`._block.block_stats` adds these terms for a plan's ``partial`` rows).

A robust fit weighs a row by its distance on the observed cells, so the weighted moments of ``y_O``
are shrunk (by the kernel's consistency factor in k dimensions, ``c_k``), while ``y_M - B y_O`` is
independent of the weight and is not: the weighted second moment of a completed row is ``c_k B~ S_OO
B~^T + C`` (``B~ = [I; B]``), not ``c_k S``.  The fit divides every row's moments by the p-channel
``c_p``, so an E-step that added ``C`` as it stands would inflate the missing cells' conditional
variance by ``1 / c_p`` at every EM step; with a share ``g`` of the rows missing a channel, EM's
fixed point multiplies it by ``(1 - g) / (1 - g / c_p)`` (about 1.4 at ``g = 0.9`` under the core
kernel, and without bound as ``g`` nears ``c_p``), which turned the components towards that channel.
Hence (:func:`estep_scales`) a row judged on k cells enters with its completed second moment times
``c_p / c_k`` and with ``c_p C``: its expected contribution is then ``c_p S``, as a complete row's
is, and the fit is consistent at the Gaussian however many rows have gaps.

Rows with different numbers of observed cells are compared on one scale by the chi-square
probability: :func:`equivalent_d2` maps ``d^2_O`` with k degrees of freedom to the p-channel
distance with the same upper-tail probability, and :func:`radius_for_count` maps a p-channel radius
to k channels.  A row's outlier cutoff is thus calibrated for the number of its observed channels at
the same false-alarm rate.

A row with m gaps is completed through the model's precision by an m x m solve
(:func:`conditional`), so rows with gaps each in their own place (wide archives) cost about what
complete rows do; a pattern many rows share gets its own p x p algebra once
(:class:`ConditionalModel`) or goes to the client's EM."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from scipy import stats
from scipy.special import gammaln

from . import _compiled
from ._blas import trmm_rows
from ._schedule import chi2_cdf, chi2_logsf

__all__ = [
    "partial_rows", "nonfinite_rows", "pattern_codes", "patterns", "ConditionalModel", "conditional_model",
    "observed_d2", "completed", "equivalent_d2", "radius_for_count", "pattern_key", "GapSums", "merge_gaps",
    "em_moments", "estep_scales", "MAX_PATTERNS", "EM_TOL", "Conditional", "conditional", "full_precision",
    "rare_pattern_rows", "rows_of_patterns",
]

#: Patterns of observed cells whose sums a pass returns for the client's EM
#: (:func:`em_moments`), the most frequent in the row sample; rows of other
#: patterns are completed in the pass with the current model (one EM step per
#: pass).  Bounds what a block returns: ``MAX_PATTERNS * J * p^2`` floats.
MAX_PATTERNS = 64

#: The client's EM stops when the covariance moves by less than this (relative): far below sampling error.
EM_TOL = 1e-7

#: Bound on the client's EM iterations per pass.
EM_MAX_ITER = 200


def pattern_codes(observed: np.ndarray) -> np.ndarray | None:
    """One integer per row of the boolean mask ``observed`` (bit j set: column j observed), or None
    beyond 62 columns.  A float64 product for up to 52 columns (exact: the sum of distinct powers
    of two below 2**52), faster than an integer one."""
    p = observed.shape[1]
    if p > 62:
        return None
    if p <= 52:
        return (observed.astype(np.float64) @ np.ldexp(1.0, np.arange(p))).astype(np.int64)
    return observed.astype(np.int64) @ (np.int64(1) << np.arange(p, dtype=np.int64))


def nonfinite_rows(block, *, nan_only: bool = False) -> np.ndarray:
    """Positions of the rows of a 2-D block holding NaN or inf (``nan_only``: NaN).

    Found as a row block's sums are (one product with a vector of ones, which NaN and inf reach), then checked
    cell by cell on the rows whose sum is not finite only: a sum can also overflow, or meet ``inf - inf``. The
    same rows as ``~np.isfinite(block).all(axis=1)`` for a fraction of its cost: on complete rows, a quarter of
    a sweep over the cells instead of a mask as large as the block and a reduction of it.
    """
    block = np.asarray(block)
    if block.dtype.kind != "f":
        block = block.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        sums = block @ np.ones(block.shape[1], block.dtype)
    rows = np.flatnonzero(~np.isfinite(sums))
    if not len(rows):
        return rows
    cells = block[rows]
    return rows[np.isnan(cells).any(axis=1) if nan_only else ~np.isfinite(cells).all(axis=1)]


def partial_rows(X: np.ndarray, observed: np.ndarray | None = None, codes: np.ndarray | None = None) -> np.ndarray:
    """Rows with at least one observed cell, some cells NaN and none inf: the rows ``"partial"`` keeps.

    ``observed`` (``~isnan(X)``) and its :func:`pattern_codes` may be given when known.
    """
    observed = ~np.isnan(X) if observed is None else observed
    p = observed.shape[1]
    codes = pattern_codes(observed) if codes is None else codes
    if codes is None:
        k = observed.sum(axis=1)
        keep = (k < p) & (k > 0)
    else:
        keep = (codes != (1 << p) - 1) & (codes != 0)
    if np.isinf(X).any():  # rare: the per-row check only then
        keep &= ~np.isinf(X).any(axis=1)
    return keep


#: Up to this many columns, :func:`patterns` counts the codes (an array of 2**p counts) and
#: collects each pattern's rows by one comparison, when there are at most ``_FEW_PATTERNS``.
_COUNTED_COLUMNS = 20
_FEW_PATTERNS = 32


def patterns(observed: np.ndarray, codes: np.ndarray | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(observed_columns_mask, row_indices)`` per distinct row of the boolean mask ``observed``.

    In a fixed order of the patterns (by their code, :func:`pattern_codes`, which may be given),
    rows in their order, so the same rows give the same groups whatever the chunking.
    """
    n, p = observed.shape
    if not n:
        return
    codes = pattern_codes(observed) if codes is None else codes
    if codes is None:  # wider than 62 columns: one byte string per row
        _, codes = np.unique(np.packbits(observed, axis=1), axis=0, return_inverse=True)
        codes = codes.reshape(-1)
    elif p <= _COUNTED_COLUMNS:
        distinct = np.flatnonzero(np.bincount(codes))
        if len(distinct) <= _FEW_PATTERNS:  # archives: a few sets of channels offline at once
            for code in distinct:
                rows = np.flatnonzero(codes == code)
                yield observed[rows[0]], rows
            return
    # A stable sort keeps the rows in order; on 16-bit keys numpy's is a radix sort.
    order = np.argsort(codes.astype(np.uint16) if p <= 16 else codes, kind="stable")
    starts = np.flatnonzero(np.diff(codes[order], prepend=codes[order[0]] - 1))
    for a, b in zip(starts, np.append(starts[1:], n), strict=True):
        rows = order[a:b]
        yield observed[rows[0]], rows


class ConditionalModel:
    """The Gaussian model ``N(0, S)`` seen through one pattern of observed cells.

    Attributes
    ----------
    observed, missing : ndarray of int
        Column indices of the observed and missing cells.
    precision : ndarray of shape (k, k)
        ``S_OO^-1`` (a pseudo-inverse: directions without spread count nothing).
    regression : ndarray of shape (p - k, k)
        ``B = S_MO S_OO^-1``.
    residual : ndarray of shape (p - k, p - k)
        ``C = S_MM - B S_OM``, the covariance of the missing cells given the observed ones.
    """

    def __init__(self, scatter: np.ndarray, observed: np.ndarray):
        obs = np.flatnonzero(observed)
        mis = np.flatnonzero(~np.asarray(observed, bool))
        S_OO = scatter[np.ix_(obs, obs)]
        self.observed, self.missing = obs, mis
        self.precision = _inverse((S_OO + S_OO.T) / 2)
        self.regression = scatter[np.ix_(mis, obs)] @ self.precision
        C = scatter[np.ix_(mis, mis)] - self.regression @ scatter[np.ix_(obs, mis)]
        self.residual = (C + C.T) / 2

    def d2(self, Y_obs: np.ndarray) -> np.ndarray:
        """``y_O^T S_OO^-1 y_O`` of centred observed cells (n x k)."""
        return np.einsum("ij,ij->i", Y_obs @ self.precision, Y_obs)


def _cholesky_inverse(S: np.ndarray) -> np.ndarray | None:
    """``S^-1`` of a symmetric matrix by Cholesky; None where ``S`` is singular or nearly so."""
    try:
        L = np.linalg.cholesky(S)
    except np.linalg.LinAlgError:
        return None
    d = np.abs(np.diag(L))
    if not len(d) or d.min() <= 1e-7 * d.max():
        return None
    Linv = np.linalg.inv(L)
    return Linv.T @ Linv if np.all(np.isfinite(Linv)) else None


def _inverse(S: np.ndarray) -> np.ndarray:
    """The inverse of a symmetric positive definite matrix; a pseudo-inverse where it is singular
    (directions without spread then count nothing)."""
    out = _cholesky_inverse(S)
    return np.linalg.pinv(S, hermitian=True) if out is None else out


def full_precision(scatter: np.ndarray) -> np.ndarray | None:
    """``S^-1`` of a well-conditioned scatter, for :func:`conditional`; None where ``S`` is singular or
    nearly so, where the per-pattern pseudo-inverses must serve."""
    S = np.asarray(scatter, np.float64)
    return _cholesky_inverse((S + S.T) / 2)


def rows_of_patterns(observed: np.ndarray, keys: tuple, codes: np.ndarray | None = None) -> np.ndarray:
    """Rows of the boolean mask ``observed`` whose pattern is one of ``keys`` (:func:`pattern_key`);
    ``codes`` (:func:`pattern_codes`) may be given."""
    out = np.zeros(len(observed), bool)
    if not keys or not len(observed):
        return out
    p = observed.shape[1]
    masks = [np.unpackbits(np.frombuffer(k, np.uint8), count=p).astype(bool) for k in keys]
    codes = pattern_codes(observed) if codes is None else codes
    if codes is not None:
        return np.isin(codes, pattern_codes(np.array(masks)))
    for mask in masks:
        out |= (observed == mask).all(axis=1)
    return out


def rare_pattern_rows(p: int) -> int:
    """Below this many rows in a block, a pattern of observed cells is completed through
    :func:`conditional` (about ``p^2`` more per row) rather than its own ``p x p`` algebra
    (about ``p^3`` per pattern): wide rows with gaps in many places rarely share a pattern."""
    return max(1, p // 2)


def conditional_model(scatter: np.ndarray, observed: np.ndarray) -> ConditionalModel:
    """:class:`ConditionalModel` of ``scatter`` for the observed columns ``observed`` (a boolean mask)."""
    return ConditionalModel(np.asarray(scatter, np.float64), np.asarray(observed, bool))


def observed_d2(Y: np.ndarray, scatter: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Squared distance on the observed cells of centred rows ``Y`` (NaN: missing), and their counts.

    Complete rows get ``y^T S^-1 y`` (k = p); rows with no observed cell get NaN and count 0.
    """
    Y = np.asarray(Y, np.float64)
    observed = ~np.isnan(Y)
    counts = observed.sum(axis=1)
    theta = full_precision(scatter)
    if theta is not None:  # one pass over the rows, an m x m solve per row with m gaps
        return conditional(Y, ~observed, theta).d2, counts
    d2 = np.full(len(Y), np.nan)
    for mask, rows in patterns(observed):
        if mask.any():
            d2[rows] = conditional_model(scatter, mask).d2(Y[np.ix_(rows, np.flatnonzero(mask))])
    return d2, counts


def completed(Y: np.ndarray, scatter: np.ndarray) -> np.ndarray:
    """Centred rows ``Y`` with each missing cell replaced by its conditional expectation ``B y_O``
    (rows with no observed cell stay NaN)."""
    out = np.array(Y, dtype=np.float64, copy=True)
    observed = ~np.isnan(out)
    incomplete = ~observed.all(axis=1)
    if not incomplete.any():
        return out
    sub = observed[incomplete]
    idx = np.flatnonzero(incomplete)
    theta = full_precision(scatter)
    if theta is not None:  # rows with no observed cell stay NaN there too
        out[idx] = conditional(out[idx], ~sub, theta).completed
        return out
    for mask, rows in patterns(sub):
        if mask.any():
            model = conditional_model(scatter, mask)
            r = idx[rows]
            out[np.ix_(r, model.missing)] = out[np.ix_(r, model.observed)] @ model.regression.T
    return out


def equivalent_d2(d2: np.ndarray, counts: np.ndarray, p: int) -> np.ndarray:
    """``d^2`` on ``counts`` observed channels mapped to p channels at the same chi-square upper-tail probability.

    Complete rows (``counts == p``) keep their value exactly; NaN stays NaN,
    inf stays inf; far rows (tail probabilities below float64's range) keep
    their order through the tail's asymptotic form.
    """
    d2 = np.asarray(d2, np.float64)
    counts = np.asarray(counts)
    out = d2.copy()
    part = (counts < p) & (counts > 0) & np.isfinite(d2)
    if part.any():
        out[part] = _chi2_isf_log(_chi2_logsf(d2[part], counts[part]), p)
    return out


def radius_for_count(radius: float, p: int, k: np.ndarray | int) -> np.ndarray:
    """A p-channel ``d^2`` radius mapped to ``k`` observed channels at the same upper-tail probability.

    An infinite radius stays infinite; ``k == p`` gives ``radius`` itself.
    """
    k = np.asarray(k)
    if not np.isfinite(radius):
        return np.full(k.shape, float(radius))
    with np.errstate(invalid="ignore"):
        out = stats.chi2.isf(stats.chi2.sf(radius, p), k)
    return np.where(k == p, radius, out)


#: Below this log tail probability the chi-square tail is taken in its asymptotic form.
_FAR_LOG_SF = -600.0


def _log_tail(x: np.ndarray, df) -> np.ndarray:
    """``log P(chi2_df > x)`` for large x: ``(df/2 - 1) log(x/2) - x/2 - lgamma(df/2) + log(1 + (df/2 - 1)/(x/2))``."""
    a = np.asarray(df, np.float64) / 2
    return (a - 1) * np.log(x / 2) - x / 2 - gammaln(a) + np.log1p((a - 1) / (x / 2))


def _chi2_logsf(x: np.ndarray, df) -> np.ndarray:
    """``log P(chi2_df > x)``, finite for every finite x (scipy's underflows to -inf far out)."""
    out = np.asarray(chi2_logsf(x, df), np.float64)
    far = out < _FAR_LOG_SF
    if np.any(far):
        out[far] = _log_tail(x[far], np.broadcast_to(df, np.shape(x))[far])
    return out


def _chi2_isf_log(log_sf: np.ndarray, df: int) -> np.ndarray:
    """The chi-square quantile whose log upper-tail probability is ``log_sf`` (to far tails)."""
    out = stats.chi2.isf(np.exp(log_sf), df)
    far = log_sf < _FAR_LOG_SF
    if np.any(far):
        x = -2.0 * log_sf[far]
        for _ in range(8):  # Newton on the asymptotic tail; it starts within a few per cent
            a = df / 2
            f = _log_tail(x, df) - log_sf[far]
            x = np.maximum(x - f / ((a - 1) / x - 0.5), 1.0)
        out[far] = x
    return out


def pattern_key(observed: np.ndarray) -> bytes:
    """A hashable key of a boolean mask of observed cells."""
    return np.packbits(np.asarray(observed, bool)).tobytes()


@dataclass
class GapSums:
    """Weighted sums of the observed cells of the rows that share one pattern, per kernel.

    ``y = x - centre`` (the pass's centre, working units), ``O`` the observed cells: ``weight[j] = sum w``,
    ``wsum[j] = sum w y_O``, ``second[j] = sum w y_O y_O^T``, ``w`` up to the pass's log-scale (``BlockStats``).
    """

    observed: np.ndarray
    weight: np.ndarray
    wsum: np.ndarray
    second: np.ndarray

    def scaled(self, f: np.ndarray) -> GapSums:
        return GapSums(self.observed, self.weight * f, self.wsum * f[:, None], self.second * f[:, None, None])


def merge_gaps(a: dict | None, fa: np.ndarray, b: dict | None, fb: np.ndarray) -> dict | None:
    """Two passes' pattern sums, each rescaled by its factor per kernel, added pattern by pattern."""
    if a is None and b is None:
        return None
    out = {k: g.scaled(fa) for k, g in (a or {}).items()}
    for k, g in (b or {}).items():
        g, h = g.scaled(fb), out.get(k)
        out[k] = g if h is None else GapSums(h.observed, h.weight + g.weight, h.wsum + g.wsum, h.second + g.second)
    return out


def estep_scales(offsets: np.ndarray, kernel_size2: float) -> tuple[np.ndarray, np.ndarray]:
    """The E-step's consistency scales of a pass's kernels (see the module docstring).

    ``offsets[j, k]`` is kernel j's flat-top radius for rows judged on k cells over ``2 kernel_size2``
    (:class:`._stats.PartialPlan`).  Returns ``shrink`` (J,), the p-channel kernel's shrink ``c_p`` of the
    covariance of Gaussian rows (1 / :func:`._schedule.flat_top_consistency`), which multiplies the conditional
    covariance ``C`` of a row's missing cells, and ``ratio`` (J, p + 1), ``c_p / c_k``, which multiplies the
    weighted second moment of a row judged on k cells (1 for k = 0 and k = p).
    """
    offsets = np.asarray(offsets, np.float64)
    J, p = offsets.shape[0], offsets.shape[1] - 1
    shrink = np.ones((J, p + 1))
    q = 2.0 * kernel_size2 * offsets[:, 1:]
    top = np.isfinite(q)  # else every row has weight 1
    shrink[:, 1:][top] = 1.0 / _flat_top_consistency(np.broadcast_to(np.arange(1, p + 1), q.shape)[top],
                                                     kernel_size2, q[top])
    return shrink[:, p].copy(), shrink[:, p:] / shrink


def _flat_top_consistency(k: np.ndarray, c2: float, q: np.ndarray) -> np.ndarray:
    """:func:`._schedule.flat_top_consistency` for arrays of dimensions ``k`` and finite radii ``q``
    (the same operations element by element, one scipy call for all of them)."""
    s = c2 / (1.0 + c2)
    log_tail = q / (2.0 * c2) + (k / 2.0) * np.log(s)
    weight = chi2_cdf(q, k) + np.exp(log_tail + chi2_logsf(q / s, k))
    return k * weight / (k * chi2_cdf(q, k + 2) + s * k * np.exp(log_tail + chi2_logsf(q / s, k + 2)))


def em_moments(
    weight: float, mean: np.ndarray, scatter: np.ndarray, gaps: list[tuple[np.ndarray, float, np.ndarray, np.ndarray]],
    center: np.ndarray, *, location: np.ndarray, covariance: np.ndarray, factor: float,
    fixed_center: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The weighted mean and covariance of a pass's rows with their missing cells completed, by EM.

    ``weight``, ``mean``, ``scatter`` are the sums of the rows that need no completion (the complete rows and
    the rows completed in the pass), about their mean; ``gaps`` holds, per pattern, ``(observed, sum w, sum w
    y_O, sum w y_O y_O^T)`` with ``y = x - center``.  For fixed weights, EM alternates the completion under the
    current model (the conditional expectation ``a + B y_O`` of the missing cells and their conditional
    covariance C) with the weighted moments of the completed rows:

        sum w yhat       = [s ; W a + B s]
        sum w yhat yhat' = [T, T B' + s a' ; B T + a s', B T B' + a s' B' + B s a' + W a a' + W C]

    (``W, s, T`` the pattern's sums), until the model moves by less than :data:`EM_TOL`.  The first completion
    uses ``(location, covariance)`` (the pass's model); later ones the weighted mean (or ``fixed_center``) and
    the covariance about it times ``factor`` (the kernel's consistency factor, as the fit applies it).  The
    conditional covariance enters as ``W C / factor`` (the module docstring: the pattern sums ``T`` come with
    their rows' ``c_p / c_k`` from the pass), so that EM's fixed point is the weighted fit's, however many rows
    have gaps.  Returns the weighted mean and the covariance about it, without ``factor``.
    """
    base_w = float(weight)
    d0 = mean - center
    base_y = base_w * d0
    base_yy = scatter + base_w * np.outer(d0, d0)
    total_w = base_w + sum(g[1] for g in gaps)
    if not total_w > 0 or not gaps:
        return mean, scatter / max(base_w, np.finfo(float).tiny)
    loc, cur = np.asarray(location, np.float64), np.asarray(covariance, np.float64)
    shrink = 1.0 / factor
    for _ in range(EM_MAX_ITER):
        sy, syy = base_y.copy(), base_yy.copy()
        for observed, W, s_o, T in gaps:
            model = conditional_model(cur, observed)
            obs, mis = model.observed, model.missing
            B = model.regression
            a = (loc[mis] - center[mis]) - B @ (loc[obs] - center[obs])
            TB = T @ B.T
            Bs = B @ s_o
            sy[obs] += s_o
            sy[mis] += W * a + Bs
            syy[np.ix_(obs, obs)] += T
            cross = TB + np.outer(s_o, a)
            syy[np.ix_(obs, mis)] += cross
            syy[np.ix_(mis, obs)] += cross.T
            syy[np.ix_(mis, mis)] += (B @ TB + np.outer(a, Bs) + np.outer(Bs, a)
                                      + W * np.outer(a, a) + (W * shrink) * model.residual)
        mean_new = center + sy / total_w
        d = mean_new - center
        cov = syy / total_w - np.outer(d, d)
        cov = (cov + cov.T) / 2
        new_loc = mean_new if fixed_center is None else np.asarray(fixed_center, np.float64)
        e = new_loc - mean_new
        new_cur = (cov + np.outer(e, e)) * factor
        scale = max(float(np.abs(np.diag(new_cur)).max()), np.finfo(float).tiny)
        done = np.abs(new_cur - cur).max() <= EM_TOL * scale and np.abs(new_loc - loc).max() <= EM_TOL * np.sqrt(scale)
        loc, cur = new_loc, new_cur
        if done:
            break
    return mean_new, cov


#: Bound on the floats of one batch of ``rows x m x max(m, p)`` in :func:`conditional`.
_BATCH_FLOATS = 4_000_000


@functools.lru_cache(maxsize=4)  # at p = 1000, 16 MB an entry (key and factor)
def _root(precision: bytes, p: int) -> np.ndarray | None:
    """Lower triangular ``L``, ``L L^T = `` the precision (Fortran order); None where there is none."""
    try:
        return np.asfortranarray(np.linalg.cholesky(np.frombuffer(precision, np.float64).reshape(p, p)))
    except np.linalg.LinAlgError:
        return None


@dataclass
class Conditional:
    """Rows completed under the model, from their observed cells (see the module docstring).

    Attributes
    ----------
    completed : ndarray of shape (n, p)
        Centred rows with their missing cells replaced by the conditional expectation.
    d2 : ndarray of shape (n,)
        Squared distance on the observed cells (NaN for a row with none): ``|L^T u|^2`` for the completed
        row ``u``, ``L L^T = T`` (half the work of ``u^T T u``), or that where ``T`` is semi-definite.
    n_observed : ndarray of shape (n,)
        Observed cells per row.
    groups : list of (rows, columns, covariance)
        Per batch of rows with the same number m of missing cells: their indices (r,),
        the missing columns (r, m) and the conditional covariance of those cells (r, m, m).
    residual : ndarray of shape (n, p)
        ``T u``: ``S_OO^-1 y_O`` on the observed cells, 0 on the missing ones.  It and ``d2`` are
        computed when first read (a partial fit's passes need only ``d2``, cell flags ``residual``).
    """

    completed: np.ndarray
    n_observed: np.ndarray
    groups: list
    precision: np.ndarray = field(repr=False)
    missing: np.ndarray = field(repr=False)

    @functools.cached_property
    def residual(self) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            t = self.completed @ self.precision
        t[self.missing] = 0.0  # exactly 0 there in exact arithmetic
        return t

    @functools.cached_property
    def d2(self) -> np.ndarray:
        U, p = self.completed, self.precision.shape[0]
        L = _root(self.precision.tobytes(), p) if len(U) else None
        with np.errstate(over="ignore", invalid="ignore"):
            V = self.residual.T if L is None else trmm_rows(L, np.array(U, np.float64, order="C")).T  # p x n
            d2 = np.einsum("ij,ij->j", U.T if L is None else V, V)
        d2[self.n_observed == 0] = np.nan
        return d2

    def variances(self) -> np.ndarray:
        """Each missing cell's conditional variance (0 at observed cells), the shape of ``completed``."""
        out = np.zeros(self.completed.shape)
        for rows, cols, cov in self.groups:
            out[rows[:, None], cols] = np.diagonal(cov, axis1=1, axis2=2)
        return out

    def covariance_sums(self, weights: np.ndarray, p: int) -> np.ndarray:
        """``sum_k w_jk C_k`` per row of ``weights`` (J, n), each row's conditional covariance
        embedded at its missing cells: the E-step's second term, (J, p, p)."""
        out = np.zeros((len(weights), p * p))
        for rows, cols, cov in self.groups:
            keys = (cols[:, :, None] * p + cols[:, None, :]).ravel()
            for j, w in enumerate(weights):
                out[j] += np.bincount(keys, (cov * w[rows][:, None, None]).ravel(), minlength=p * p)
        return out.reshape(len(weights), p, p)


def _complete_rows(U: np.ndarray, rows: np.ndarray, cols: np.ndarray, precision: np.ndarray) -> np.ndarray:
    """Rows ``rows`` of ``U`` (0 at their missing cells ``cols``) completed in place; returns their
    conditional covariances ``T_MM^-1`` (r, m, m).  Compiled row by row (:func:`._compiled.complete_gaps`),
    else, and for rows whose ``T_MM`` is singular, batched in numpy (a pseudo-inverse where one is)."""
    cov, ok = np.empty((*cols.shape, cols.shape[1])), np.zeros(len(rows), bool)
    if _compiled.AVAILABLE:
        _compiled.complete_gaps(U, rows, cols, precision, cov, ok)
    rest = np.flatnonzero(~ok)
    if len(rest):
        r, c = rows[rest], cols[rest]
        b = np.matmul(precision[c], U[r][:, :, None])[:, :, 0]  # (T y)_M, y_M = 0
        T = precision[c[:, :, None], c[:, None, :]]
        try:
            inv = np.linalg.inv(T)
        except np.linalg.LinAlgError:
            inv = np.full(T.shape, np.nan)
        cov[rest] = inv = inv if np.all(np.isfinite(inv)) else np.linalg.pinv(T, hermitian=True)
        U[r[:, None], c] = -np.einsum("rij,rj->ri", inv, b)
    return cov


def conditional(Y: np.ndarray, missing: np.ndarray, precision: np.ndarray) -> Conditional:
    """Rows ``Y`` (centred; cells under ``missing`` ignored) completed under the model with ``precision``.

    Rows are batched by their number m of missing cells, so each batch is one
    vectorised solve of small systems (see the module docstring): ``t0_M``
    needs only the m rows of the precision at a row's gaps (``m p`` per row),
    and the completed rows meet the precision's triangular factor once (``p^2 / 2``
    per row; :attr:`Conditional.residual`, the product by the whole precision, only
    when read).  Every step is row by row: a row's result depends on the other rows
    of its block only as a BLAS product's rounding may.
    """
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # far rows: inf, judged bad
        Y = np.asarray(Y, np.float64)
        n, p = Y.shape
        missing = np.asarray(missing, bool)
        precision = np.ascontiguousarray(precision, np.float64)
        U = np.where(missing, 0.0, Y)
        at, gaps = np.nonzero(missing)  # the missing cells, row after row
        counts = np.bincount(at, minlength=n)
        first = np.cumsum(counts) - counts
        groups = []
        for m in np.unique(counts):
            if m == 0 or m == p:
                continue
            rows_m = np.flatnonzero(counts == m)
            step = max(1, _BATCH_FLOATS // (m * max(m, p)))
            for a in range(0, len(rows_m), step):
                rows = rows_m[a:a + step]
                cols = gaps[first[rows][:, None] + np.arange(m)]
                groups.append((rows, cols, _complete_rows(U, rows, cols, precision)))
        U[counts == p] = np.nan
        return Conditional(U, p - counts, groups, precision, missing)
