"""Drift over time for ``dask-mcpca report --window``: per-window weighted sums, a residual statistic, a threshold.

Rows are cut into windows (:class:`Window`: a row count, or a duration of
the time coordinate anchored at the epoch).  Each row block of the
report's pass adds, per window its rows fall in, the model's kernel
weights and the weighted scatter of its rows about the model's centre
(:class:`WindowSums`, p x p per window).  On the client,
:class:`WindowFold` folds them in row order and closes a window as soon
as the pass is past it; when every window is closed, :func:`calibrate`
sets one threshold from the windows themselves.

The statistic (:func:`residual_ratio`).  The window's weighted variance
outside the model's leading subspace (the ``k`` components of
:func:`drift_components`), each residual direction scaled by the model's
variance there, averaged over the ``p - k`` directions and divided by
what a window of the model's own Gaussian rows gives under the same
kernel weights (``c^2 / (1 + c^2)`` of the variance): about 1 when the
window's correlation structure is the model's.  A rotation of the
loadings of some channels, or a sensor's offset, puts variance outside
the subspace and raises it; a day of higher or lower load, a slow factor
far from its mean or a daily cycle move variance *inside* the subspace
and leave it alone.  The largest principal angle between the model's and
the window's subspaces, the former statistic, is still written
(``subspace_angle_deg``) but decides nothing: where two eigenvalues are
close, the window's top-k swaps a direction and the angle jumps to tens
of degrees on ordinary days.

The threshold (:func:`calibrate`), on ``log(residual_ratio)``: a level
plus ``DRIFT_Z`` robust spreads (1.4826 MAD, at least ``SPREAD_FLOOR``),
from the archive's own window-to-window variation, so that autocorrelated
factors and daily cycles widen it as much as they move the windows.  The
spread is measured on the windows inside the rows the model was fitted on
(``reference_rows``: the command line passes the model's
``archive_rows_``) when at least ``MIN_REFERENCE`` of them are monitored,
else on every monitored window, about their median.  The level is the
lower of that median and the model's own level (0: a ratio of 1), and the
step above it at most ``MAX_STEP`` (a ratio of 1.5): reported windows that
all follow a change (a report of the new rows only, or of rows a
``partial_fit`` has read but does not follow) can neither lift the level
to theirs nor hide behind their own spread.

A window is monitored when at least ``MIN_COMPLETE_SHARE`` of its rows,
and ``max(MIN_COMPLETE_ROWS, p + 1)`` rows, hold every channel (with
operating modes: and are of the largest mode, the one the windows watch);
otherwise (a channel offline most of the window, or another mode) ``monitored``
is 0 and ``drift`` is empty, never 0.  A monitored window whose rows all lie beyond the
model's kernel (effective rows ``<= k + 1``) has an infinite ratio: drift.
The figures behind these choices are in ``benchmarks/DRIFT.md``.
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
    "checked_window",
    "drift_components",
    "residual_weights",
    "residual_ratio",
    "calibrate",
    "largest_angle_deg",
    "window_columns",
    "write_windows",
    "add_windows",
    "window_sums",
    "DRIFT_Z",
    "unmonitored_reason",
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
        back = np.flatnonzero(np.diff(ids) < 0)
        if len(back):
            raise self.out_of_order(labels[back[0] + 1])
        heads = np.flatnonzero(np.diff(ids, prepend=ids[0] - 1))
        return heads, ids[heads]

    def out_of_order(self, at) -> ValueError:
        """The error for a row (at ``at``: its time, or its row) in an earlier window than a row before it."""
        return ValueError(
            f"--window {self.text!r}: the row coordinate is not increasing (a row at {at} falls in an earlier "
            "window than a row before it); drift windows need rows in time order"
        )

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


def checked_window(window: str | Window | None, coordinate) -> Window | None:
    """The drift windows as a :class:`Window` (None: none); a duration needs a time coordinate."""
    if isinstance(window, str):
        window = parse_window(window)
    if window is not None and window.nanoseconds is not None:
        dtype = getattr(coordinate, "dtype", None)
        if dtype is None or dtype.kind != "M":
            raise ValueError(
                f"--window {window.text!r} is a duration, but the archive has no time coordinate; "
                "give a row count (e.g. --window 100000)"
            )
    return window


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
    complete: np.ndarray  # (m,) rows without a missing cell
    flagged: np.ndarray  # (m,) flagged rows
    sw: np.ndarray  # (m,) sum of w
    sw2: np.ndarray  # (m,) sum of w^2
    swy: np.ndarray  # (m, p) sum of w y
    swyy: np.ndarray  # (m, p, p) sum of w y y^T
    watched: np.ndarray | None = None  # (m,) rows in the weighted sums: the complete rows (with modes, the
    # largest mode's); None: the complete rows


def add_windows(win: dict, window: Window, first_row: int, labels, Y, d2, ok, complete, flags,
                two_c2: float, watched=None) -> None:
    """Add one slice's rows (from row ``first_row`` of the archive) to the per-window sums ``win``
    (see :class:`WindowSums`): only the rows ``watched`` (default: the ``complete`` rows) enter the
    weighted sums."""
    watched = complete if watched is None else watched
    if watched.all():
        w = np.exp(d2 * (-1.0 / two_c2))
    else:
        w = np.where(watched, np.exp(-np.where(watched, d2, np.inf) / two_c2), 0.0)
    heads, ids = window.segments(first_row, len(Y), labels)  # refuses times out of order within the slice
    if win and ids[0] < max(win):  # ... and a slice that starts in an earlier window than the block's rows before
        raise window.out_of_order(first_row if labels is None else labels[0])
    for h, t, wid in zip(heads, np.append(heads[1:], len(Y)), ids.tolist(), strict=True):
        Yw, ww = Y[h:t], w[h:t]
        sums = win.get(wid)
        if sums is None:
            label = None if labels is None else labels[h]
            p = Y.shape[1]
            sums = win[wid] = [first_row + int(h), label, 0, 0, 0, 0, 0.0, 0.0, np.zeros(p), np.zeros((p, p)), 0]
        sums[2] += t - h
        sums[3] += int(ok[h:t].sum())
        sums[4] += int(complete[h:t].sum())
        sums[5] += int(flags[h:t].sum())
        sw, swy, swyy = _weighted_sums(Yw, ww)
        sums[6] += sw
        sums[7] += float(ww @ ww)
        sums[8] += swy
        sums[9] += swyy
        sums[10] += int(watched[h:t].sum())


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
        complete=np.array([c[4] for c in col], dtype=np.int64),
        flagged=np.array([c[5] for c in col], dtype=np.int64),
        sw=np.array([c[6] for c in col]),
        sw2=np.array([c[7] for c in col]),
        swy=np.array([c[8] for c in col]).reshape(len(col), p),
        swyy=np.array([c[9] for c in col]).reshape(len(col), p, p),
        watched=np.array([c[10] for c in col], dtype=np.int64),
    )


#: Robust spreads (1.4826 MAD of log residual_ratio over the calibration windows) above the level
#: at which a window is called drift.
DRIFT_Z = 5.0
#: Least spread of log residual_ratio assumed (a 5 % change is never drift by itself).
SPREAD_FLOOR = 0.05
#: Without reference windows, the threshold lies at most this far (log) above the level: a ratio of 1.5.
MAX_STEP = float(np.log(1.5))
#: Monitored windows inside the model's fitted rows needed to calibrate on them alone.
MIN_REFERENCE = 5
#: A window is monitored when this share of its rows, and at least MIN_COMPLETE_ROWS (and p + 1), are complete.
MIN_COMPLETE_SHARE = 0.25
MIN_COMPLETE_ROWS = 30
#: Robust variances per component written to windows.csv (var_1, var_2, ...).
WINDOW_VARIANCES = 10


def drift_components(model) -> int:
    """How many leading components span the subspace outside which drift is measured.

    The model's ``n_components_`` when it discarded some; otherwise (every
    direction kept) the fewest leading components explaining 90 % of the
    robust variance, at most ``n_features - 1``.
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


def residual_weights(model, k: int) -> np.ndarray:
    """``G = R P R`` (p x p), with ``R`` the projector off the model's ``k`` leading components and ``P``
    its precision, divided by ``p - k`` and by the model's own level ``c^2 / (1 + c^2)``: the
    :func:`residual_ratio` of a weighted scatter ``S`` is ``sum(G * S)``."""
    p = model.n_features_in_
    V = model.components_[:k]
    R = np.eye(p) - V.T @ V
    c2 = float(model.kernel_scale_) ** 2
    own = c2 / (1.0 + c2) if np.isfinite(c2) else 1.0
    return R @ model.get_precision() @ R / (max(p - k, 1) * own)


def residual_ratio(G: np.ndarray, scatter: np.ndarray) -> float:
    """The window's weighted variance about the model's centre outside its leading subspace, in the
    model's variances there, relative to the model's own rows (about 1 without drift): ``sum(G * S)``
    with ``G`` from :func:`residual_weights` and ``S`` the window's weighted scatter ``sum w y y^T / sum w``."""
    return float(np.sum(G * scatter))


def calibrate(ratio: np.ndarray, monitored: np.ndarray, reference: np.ndarray) -> tuple[float, str]:
    """The drift threshold on ``residual_ratio`` for the windows, and how it was set (see the module docstring).

    Parameters
    ----------
    ratio : ndarray
        Each window's :func:`residual_ratio` (NaN where not monitored, inf where every row is beyond the kernel).
    monitored : ndarray of bool
    reference : ndarray of bool
        The windows inside the rows the model was fitted on.

    Returns
    -------
    threshold : float
        NaN when no window is monitored.
    how : str
        One line for the report's legend.
    """
    logs = np.log(np.where(monitored, ratio, np.nan))
    ref = monitored & reference & np.isfinite(logs)
    if ref.sum() >= MIN_REFERENCE:
        values, how = logs[ref], f"the {int(ref.sum())} windows of the model's fitted rows"
    else:
        values = logs[monitored & ~np.isnan(logs)]
        how = f"the {len(values)} monitored windows"
    if not len(values):
        return np.nan, "no monitored window"
    finite = values[np.isfinite(values)]
    centre = float(np.median(values))
    spread = 1.4826 * float(np.median(np.abs(finite - centre))) if len(finite) and np.isfinite(centre) else 0.0
    step = min(DRIFT_Z * max(spread, SPREAD_FLOOR), MAX_STEP)
    return float(np.exp(min(centre, 0.0) + step)), how


def window_columns(n_variances: int) -> list[str]:
    """The header of windows.csv.

    window_start (the window's first time, or first row without a row
    coordinate), first_row, rows, scored_rows, complete_rows (rows without
    a missing cell), watched_rows (the rows in the weighted sums: the
    complete rows; with operating modes, those of the largest mode), flagged_rows,
    share_flagged, effective_rows (Kish's ``(sum w)^2 / sum w^2`` of the
    kernel weights), monitored (1: enough complete rows to judge the
    window: :func:`unmonitored_reason`), residual_ratio (:func:`residual_ratio`), drift_threshold (the
    same for every window: :func:`calibrate`), drift (1 above the threshold,
    0 below, empty where not monitored), reference (1: a window of the rows
    the threshold was calibrated on), subspace_angle_deg (largest principal
    angle between the model's leading subspace and the window's: a
    diagnostic, unstable where eigenvalues are close), then var_1, ... (the
    robust variance of each component in the window: ``c_j^T S c_j`` with S
    the weighted covariance).
    """
    return ["window_start", "first_row", "rows", "scored_rows", "complete_rows", "watched_rows", "flagged_rows",
            "share_flagged",
            "effective_rows", "monitored", "residual_ratio", "drift_threshold", "drift", "reference",
            "subspace_angle_deg"] + [f"var_{j + 1}" for j in range(n_variances)]


class WindowFold:
    """Window sums folded in row order; a window is closed (its statistics computed, the p x p sums
    dropped) as soon as a later block starts past it; :meth:`table` calibrates the threshold.

    ``reference_rows``: ``(start, stop)`` of the rows, in the report's numbering, the model was fitted
    on (see :func:`calibrate`); None when not known.
    """

    def __init__(self, model, window: Window, reference_rows: tuple[int, int] | None = None):
        self.window, self.k = window, drift_components(model)
        self.basis = model.components_
        self.G = residual_weights(model, self.k)
        self.p = model.n_features_in_
        self.reference_rows = reference_rows
        self.n_var = min(WINDOW_VARIANCES, model.n_components_)
        self.open: dict[int, list] = {}
        self.closed: list[tuple] = []
        self.last_closed = None
        self.largest = None  # the last window of the blocks folded in
        self.threshold, self.calibration = np.nan, ""

    def add(self, s: WindowSums) -> None:
        """Fold in a block's window sums; a block whose first window is before the last window of the blocks
        before it is refused (rows out of time order), as :meth:`Window.segments` refuses them within a slice."""
        if len(s.ids) and self.largest is not None and s.ids[0] < self.largest:
            raise self.window.out_of_order(s.first_label[0] if s.first_label is not None else s.first_row[0])
        if len(s.ids):
            self.largest = int(s.ids[-1])
        for i, wid in enumerate(s.ids.tolist()):
            if self.last_closed is not None and wid <= self.last_closed:
                raise self.window.out_of_order(s.first_label[i] if s.first_label is not None else s.first_row[i])
            o = self.open.get(wid)
            fields = [s.first_row[i], None if s.first_label is None else s.first_label[i], s.rows[i], s.scored[i],
                      s.complete[i], s.flagged[i], s.sw[i], s.sw2[i], s.swy[i].copy(), s.swyy[i].copy(),
                      s.complete[i] if s.watched is None else s.watched[i]]
            if o is None:
                self.open[wid] = fields
            else:
                for j in range(2, 11):
                    o[j] = o[j] + fields[j]
        if len(s.ids):
            for wid in sorted(w for w in self.open if w < s.ids[0]):
                self._close(wid)

    def finish(self) -> None:
        for wid in sorted(self.open):
            self._close(wid)

    def _close(self, wid: int) -> None:
        first_row, label, rows, scored, complete, flagged, sw, sw2, swy, swyy, watched = self.open.pop(wid)
        self.last_closed = wid
        start = self.window.start(wid) if self.window.nanoseconds is not None or label is None else label
        n_eff = sw**2 / sw2 if sw2 > 0 else 0.0
        monitored = watched >= max(MIN_COMPLETE_SHARE * rows, MIN_COMPLETE_ROWS, self.p + 1) and self.k < self.p
        angle, ratio, var = np.nan, np.nan, np.full(self.n_var, np.nan)
        if n_eff > self.k + 1:
            S0 = swyy / sw  # about the model's centre
            m = swy / sw
            S = S0 - np.outer(m, m)  # about the window's own mean
            angle = largest_angle_deg(self.basis, S, self.k)
            var = np.einsum("ij,jk,ik->i", self.basis[: self.n_var], S, self.basis[: self.n_var])
            ratio = residual_ratio(self.G, S0) if monitored else np.nan
        elif monitored:
            ratio = np.inf  # complete rows, but every one beyond the model's kernel
        reference = self.reference_rows is not None and (
            self.reference_rows[0] <= first_row and first_row + rows <= self.reference_rows[1])
        self.closed.append((start, int(first_row), int(rows), int(scored), int(complete), int(watched), int(flagged),
                            flagged / max(scored, 1), n_eff, int(monitored), ratio, np.nan, np.nan, int(reference),
                            angle, *var))

    def table(self) -> dict[str, np.ndarray]:
        """The closed windows as columns (:func:`window_columns`), with the threshold and ``drift`` set."""
        cols = window_columns(self.n_var)
        t = {c: np.array([r[j] for r in self.closed]) for j, c in enumerate(cols)}
        if not self.closed:
            return t
        monitored = t["monitored"] == 1
        self.threshold, self.calibration = calibrate(t["residual_ratio"], monitored, t["reference"] == 1)
        t["drift_threshold"] = np.full(len(self.closed), self.threshold)
        with np.errstate(invalid="ignore"):
            t["drift"] = np.where(monitored, (t["residual_ratio"] > self.threshold).astype(float), np.nan)
        return t


def unmonitored_reason(modes: bool) -> str:
    """Why a window is not monitored, for the summary line and the PNG's legend: too few of the rows the
    windows watch, the complete rows, or with operating modes (``modes``) those of the largest mode."""
    return "too few complete rows of the largest mode" if modes else "too few complete rows"


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
