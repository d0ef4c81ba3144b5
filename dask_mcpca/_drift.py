"""Drift over time for ``dask-mcpca report --window``: per-window weighted scatter, principal angles, threshold.

Rows are cut into windows (:class:`Window`: a row count, or a duration of
the time coordinate anchored at the epoch).  Each row block of the
report's pass adds, per window its rows fall in, the model's kernel
weights and the weighted scatter of its rows (:class:`WindowSums`, p x p
per window).  On the client, :class:`WindowFold` folds them in row order and closes a
window as soon as the pass is past it: its share flagged, the robust
variance of each component and the largest principal angle between the
model's leading subspace and the window's weighted principal subspace.
The drift threshold (:func:`drift_threshold`) is the spread of that angle
for a stationary window under the model itself.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from typing import TextIO

import numpy as np

from . import _block, _kernels

__all__ = [
    "Window",
    "WindowSums",
    "WindowFold",
    "parse_window",
    "drift_components",
    "drift_threshold",
    "window_threshold",
    "largest_angle_deg",
    "window_columns",
    "write_windows",
    "add_windows",
    "window_sums",
    "DRIFT_QUANTILE",
]


@dataclass(frozen=True)
class Window:
    """How rows are cut into drift windows: ``rows`` rows each, or ``nanoseconds`` of the row coordinate.

    Windows of a duration start at multiples of it since 1970-01-01 (as
    pandas' ``resample(origin="epoch")``), so that every block finds a row's
    window from its time alone.
    """

    rows: int | None = None
    nanoseconds: int | None = None
    text: str = ""

    def ids(self, rows: np.ndarray, labels: np.ndarray | None) -> np.ndarray:
        """The window of each row (``rows``: their numbers in the archive, ``labels``: their times)."""
        if self.rows is not None:
            return rows // self.rows
        return np.asarray(labels).astype("datetime64[ns]").astype(np.int64) // self.nanoseconds

    def segments(self, first_row: int, n: int, labels: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``first_row .. first_row + n - 1`` (``labels``: their times) cut where the window
        changes: the position of each piece's first row, and its window (as :meth:`ids`)."""
        if self.rows is not None:  # by arithmetic: window k starts at row k * rows
            ids = np.arange(first_row // self.rows, (first_row + n - 1) // self.rows + 1, dtype=np.int64)
            return np.concatenate([[0], ids[1:] * self.rows - first_row]).astype(np.intp), ids
        ids = self.ids(np.arange(first_row, first_row + n), labels)
        heads = np.flatnonzero(np.diff(ids, prepend=ids[0] - 1))
        return heads, ids[heads]

    def start(self, window_id: int):
        """The first row number, or the time, at which window ``window_id`` starts."""
        if self.rows is not None:
            return int(window_id) * self.rows
        return np.datetime64(int(window_id) * self.nanoseconds, "ns")


def parse_window(text: str) -> Window:
    """A :class:`Window` from ``--window``: a row count (``100000``) or a duration (``1D``, ``6h``, ``30min``)."""
    text = str(text).strip()
    if text.isdigit():
        if int(text) < 2:
            raise ValueError(f"--window {text!r}: a window needs at least 2 rows")
        return Window(rows=int(text), text=text)
    import pandas as pd

    try:
        ns = pd.Timedelta(text).value
    except ValueError:
        ns = 0
    if ns <= 0:
        raise ValueError(f"--window {text!r}: expected a row count (e.g. 100000) or a positive duration (e.g. 1D, 6h)")
    return Window(nanoseconds=int(ns), text=text)


@dataclass
class WindowSums:
    """The kernel-weighted sums of the drift windows the rows of one block fall in (window-major arrays).

    Rows are centred on the model's ``mean_`` (``y = x - mean_``) and weighted
    by the model's correntropy weight ``w = exp(-d^2 / (2 c^2))`` (what
    :meth:`MCPCA.score_samples` returns); only rows without a missing cell
    enter the sums.
    """

    ids: np.ndarray  # (m,) window ids, increasing
    first_row: np.ndarray  # (m,) first row of the archive in the window (within this block)
    first_label: np.ndarray | None  # (m,) its row coordinate, if any
    rows: np.ndarray  # (m,) rows
    scored: np.ndarray  # (m,) scored rows
    flagged: np.ndarray  # (m,) flagged rows
    sw: np.ndarray  # (m,) sum of w
    sw2: np.ndarray  # (m,) sum of w^2
    swy: np.ndarray  # (m, p) sum of w y
    swyy: np.ndarray  # (m, p, p) sum of w y y^T


def add_windows(win: dict, window: Window, first_row: int, labels, Y, d2, ok, complete, flags,
                two_c2: float) -> None:
    """Add one slice's rows (from row ``first_row`` of the archive) to the per-window sums ``win``
    (see :class:`WindowSums`)."""
    if complete.all():
        w = np.exp(d2 * (-1.0 / two_c2))
    else:
        w = np.where(complete, np.exp(-np.where(complete, d2, np.inf) / two_c2), 0.0)
    heads, ids = window.segments(first_row, len(Y), labels)
    for h, t, wid in zip(heads, np.append(heads[1:], len(Y)), ids.tolist(), strict=True):
        Yw, ww = Y[h:t], w[h:t]
        sums = win.get(wid)
        if sums is None:
            label = None if labels is None else labels[h]
            p = Y.shape[1]
            sums = win[wid] = [first_row + int(h), label, 0, 0, 0, 0.0, 0.0, np.zeros(p), np.zeros((p, p))]
        sums[2] += t - h
        sums[3] += int(ok[h:t].sum())
        sums[4] += int(flags[h:t].sum())
        sw, swy, swyy = _weighted_sums(Yw, ww)
        sums[5] += sw
        sums[6] += float(ww @ ww)
        sums[7] += swy
        sums[8] += swyy


def _weighted_sums(Y: np.ndarray, w: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """``sum w``, ``sum w y`` and ``sum w y y^T`` over the rows ``Y`` (float64): by the compiled
    loops of a pass where they run (3-4 times faster than numpy's broadcast and product at p = 6),
    else in numpy."""
    if _block.COMPILED and Y.shape[1] <= _block.COMPILED_MAX_FEATURES:
        weight, wsum, scatter = _kernels._compiled_sums(np.ascontiguousarray(Y.T), np.ascontiguousarray(w[None, :]))
        return float(weight[0]), wsum[0], scatter[0]
    return float(w.sum()), w @ Y, (Y * w[:, None]).T @ Y


def window_sums(win: dict, p: int, labelled: bool) -> WindowSums:
    ids = np.array(sorted(win), dtype=np.int64)
    col = [win[i] for i in ids]
    return WindowSums(
        ids=ids,
        first_row=np.array([c[0] for c in col], dtype=np.int64),
        first_label=np.array([c[1] for c in col]) if labelled and col else None,
        rows=np.array([c[2] for c in col], dtype=np.int64),
        scored=np.array([c[3] for c in col], dtype=np.int64),
        flagged=np.array([c[4] for c in col], dtype=np.int64),
        sw=np.array([c[5] for c in col]),
        sw2=np.array([c[6] for c in col]),
        swy=np.array([c[7] for c in col]).reshape(len(col), p),
        swyy=np.array([c[8] for c in col]).reshape(len(col), p, p),
    )


#: Quantile of the largest principal angle of a stationary window taken as the drift threshold.
DRIFT_QUANTILE = 0.99
#: Simulated windows (Wishart draws) behind the drift threshold, and their effective rows.
DRIFT_DRAWS, DRIFT_REFERENCE_ROWS = 400, 10_000
#: Robust variances per component written to windows.csv (var_1, var_2, ...).
WINDOW_VARIANCES = 10


def drift_components(model) -> int:
    """How many leading components span the subspace whose drift is measured.

    The model's ``n_components_`` when it discarded some; otherwise (every
    direction kept, where the angle would be 0) the fewest leading
    components explaining 90 % of the robust variance, at most
    ``n_features - 1``.
    """
    p, k = model.n_features_in_, model.n_components_
    if k < p:
        return int(k)
    ratio = np.cumsum(model.explained_variance_ratio_)
    return int(min(np.searchsorted(ratio, 0.9) + 1, p - 1)) if p > 1 else 1


def largest_angle_deg(basis: np.ndarray, scatter: np.ndarray, k: int) -> float:
    """Largest principal angle (degrees) between the row space of ``basis`` (k x p, orthonormal)
    and the span of the ``k`` leading eigenvectors of the symmetric ``scatter``."""
    _, vectors = np.linalg.eigh(scatter)
    s = np.linalg.svd(basis[:k] @ vectors[:, ::-1][:, :k], compute_uv=False)
    return float(np.degrees(np.arccos(np.clip(s.min(), -1.0, 1.0))))


def drift_threshold(model, *, seed: int = 0) -> float:
    """The drift threshold, in degrees, for a window of ``DRIFT_REFERENCE_ROWS`` effective rows.

    The sampling spread of a weighted principal subspace under the model
    itself: ``DRIFT_DRAWS`` covariances of ``DRIFT_REFERENCE_ROWS`` Gaussian
    rows with the model's covariance (:meth:`MCPCA.get_covariance`) are drawn
    (Wishart), and the ``DRIFT_QUANTILE`` quantile of their largest
    principal angle to the model's subspace is returned.  (The kernel
    weights of Gaussian rows scale their covariance by one factor, leaving
    its eigenvectors alone; they lower the effective rows, which
    :func:`window_threshold` accounts for.)  A stationary window with
    independent rows then exceeds the threshold with probability about
    ``1 - DRIFT_QUANTILE``; autocorrelated rows carry less information
    than their count, so their windows exceed it more often.
    """
    from scipy.stats import wishart

    k = drift_components(model)
    cov = model.get_covariance()
    cov = (cov + cov.T) / 2
    draws = wishart(df=DRIFT_REFERENCE_ROWS, scale=cov / DRIFT_REFERENCE_ROWS).rvs(
        size=DRIFT_DRAWS, random_state=np.random.default_rng(seed)
    )
    draws = draws.reshape(DRIFT_DRAWS, *cov.shape)
    angles = [largest_angle_deg(model.components_, S, k) for S in draws]
    return float(np.quantile(angles, DRIFT_QUANTILE))


def window_threshold(reference_deg: float, n_eff: np.ndarray) -> np.ndarray:
    """The drift threshold of windows of ``n_eff`` effective rows: angles shrink as ``1 / sqrt(n_eff)``."""
    with np.errstate(divide="ignore"):
        return np.minimum(reference_deg * np.sqrt(DRIFT_REFERENCE_ROWS / np.asarray(n_eff, float)), 90.0)


def window_columns(n_variances: int) -> list[str]:
    """The header of windows.csv.

    window_start (the window's first time, or first row without a row
    coordinate), first_row, rows, scored_rows, flagged_rows, share_flagged,
    effective_rows (Kish's ``(sum w)^2 / sum w^2`` of the kernel weights),
    subspace_angle_deg (largest principal angle between the model's leading
    subspace and the window's weighted one), drift_threshold_deg, drift
    (1 above the threshold), then var_1, ... (the robust variance of each
    component in the window: ``c_j^T S c_j`` with S the weighted covariance).
    """
    return ["window_start", "first_row", "rows", "scored_rows", "flagged_rows", "share_flagged", "effective_rows",
            "subspace_angle_deg", "drift_threshold_deg", "drift"] + [f"var_{j + 1}" for j in range(n_variances)]


class WindowFold:
    """Window sums folded in row order; a window is closed (its statistics computed, the p x p sums
    dropped) as soon as a later block starts past it."""

    def __init__(self, model, window: Window):
        self.window, self.k = window, drift_components(model)
        self.basis = model.components_
        self.reference = drift_threshold(model)
        self.n_var = min(WINDOW_VARIANCES, model.n_components_)
        self.open: dict[int, list] = {}
        self.closed: list[tuple] = []
        self.last_closed = None

    def add(self, s: WindowSums) -> None:
        for i, wid in enumerate(s.ids.tolist()):
            if self.last_closed is not None and wid <= self.last_closed:
                raise ValueError(
                    f"--window {self.window.text!r}: the row coordinate is not increasing (a row at "
                    f"{s.first_label[i] if s.first_label is not None else s.first_row[i]} falls in a window already "
                    "closed); drift windows need rows in time order"
                )
            o = self.open.get(wid)
            fields = [s.first_row[i], None if s.first_label is None else s.first_label[i], s.rows[i], s.scored[i],
                      s.flagged[i], s.sw[i], s.sw2[i], s.swy[i].copy(), s.swyy[i].copy()]
            if o is None:
                self.open[wid] = fields
            else:
                for j in range(2, 9):
                    o[j] = o[j] + fields[j]
        if len(s.ids):
            for wid in sorted(w for w in self.open if w < s.ids[0]):
                self._close(wid)

    def finish(self) -> None:
        for wid in sorted(self.open):
            self._close(wid)

    def _close(self, wid: int) -> None:
        first_row, label, rows, scored, flagged, sw, sw2, swy, swyy = self.open.pop(wid)
        self.last_closed = wid
        start = self.window.start(wid) if self.window.nanoseconds is not None or label is None else label
        n_eff = sw**2 / sw2 if sw2 > 0 else 0.0
        angle, var = np.nan, np.full(self.n_var, np.nan)
        if n_eff > self.k + 1:
            m = swy / sw
            S = swyy / sw - np.outer(m, m)
            angle = largest_angle_deg(self.basis, S, self.k)
            var = np.einsum("ij,jk,ik->i", self.basis[: self.n_var], S, self.basis[: self.n_var])
        limit = float(window_threshold(self.reference, n_eff)) if n_eff > 0 else np.nan
        self.closed.append((start, int(first_row), int(rows), int(scored), int(flagged),
                            flagged / max(scored, 1), n_eff, angle, limit, int(angle > limit), *var))

    def table(self) -> dict[str, np.ndarray]:
        cols = window_columns(self.n_var)
        return {c: np.array([r[j] for r in self.closed]) for j, c in enumerate(cols)}


def write_windows(table: dict[str, np.ndarray], f: TextIO) -> None:
    """Write the drift windows (:attr:`ArchiveSummary.windows`) as CSV to the open text file ``f``."""
    writer = csv.writer(f)
    cols = list(table)
    writer.writerow(cols)
    for i in range(len(table[cols[0]]) if cols else 0):
        writer.writerow([_csv_value(table[c][i]) for c in cols])


def _csv_value(v) -> str:
    if isinstance(v, np.datetime64):
        return str(v)
    if isinstance(v, float | np.floating):
        return "" if np.isnan(v) else f"{v:.6g}"
    return str(v)
