"""Operating modes: one robust model per state of the machine, fitted in the same passes.

A machine that runs in several states (idle and loaded, two speeds, day
and night) has one normal for each; a single robust model takes the
largest state for "normal" and flags every row of the others.  With
``modes``, :class:`~dask_mcpca.MCPCA` fits one robust model per mode (its
own centre, components and calibrated cutoff) and judges each row against
its mode.

- ``modes=<labels>`` (``fit(X, modes=labels)``): the user's label of each
  row.  Each mode's first read and every robust step run in shared passes.
- ``modes="auto"``: the states are found on the first read's row sample
  (a full read: a spread of blocks can miss a state; :func:`._fit_modes.find_modes`)
  and each row is given the state whose Gaussian explains it best; a mode is
  accepted only on the evidence that separates a state from a fault
  (:func:`is_state`), and the states are settled so that the rule built from
  the fitted modes sends each mode the rows it was fitted on.  One state
  found: the fit goes on as ``modes=None`` from the same first read.

The passes are shared: each mode's fit is the single-mode fit
(:func:`._fit.robust_stage`, :func:`._fit.finish_fit`), run in a thread
of its own against a :class:`ModeRunner`.  A runner does not read: it
hands its pass to :class:`SharedPasses`, which waits until every mode
still fitting has asked for its next pass, then reads each row block once
and computes each mode's sums on that mode's rows (one task per block,
one tree of merges).  The passes of the fit are those of its slowest
mode; each mode's arithmetic is that of its own rows alone, so the
threads' timing cannot change a result.

Rows are judged by their mode (:func:`best_modes`, the rule of
:class:`ModeFinder` built from the fitted modes; :func:`judged_rows`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from functools import reduce

import dask
import dask.array as da
import numpy as np

from . import _labels, _model
from ._block import block_stats
from ._compiled import sampled_rows
from ._passes import PassRunner, kept_runs, limit_blas_in_task, tree_reduce
from ._scale import in_model_units
from ._stats import BlockStats, combine

__all__ = [
    "MAX_MODES",
    "NO_MODE",
    "VARIANCE_FLOOR",
    "ModeFinder",
    "ModeRunner",
    "SharedPasses",
    "best_modes",
    "calibrated_d2",
    "finder",
    "mode_finder",
    "telling_channels",
    "is_state",
    "given_labels",
    "labels_from_channel",
    "label_text",
    "has_modes",
    "judged_rows",
    "mode_rows",
    "mahalanobis_d2",
    "modes_of_rows",
    "refuse",
]

#: The mode of a row no mode can judge (holding NaN or inf): :meth:`MCPCA.predict_mode` and ``score_rows``.
NO_MODE = -1

#: ``modes="auto"`` finds at most this many states.
MAX_MODES = 4

#: A state holds at least this share of the sampled rows (rarer states are judged as departures:
#: spikes on one channel, 2-3 % of the rows, are not a state) ...
MIN_MODE_SHARE = 0.05
#: ... and at least this many sampled rows per feature (plus 2) to fit its robust model on.
MIN_ROWS_PER_FEATURE = 2

#: Two states differ in at least ``MIN_CHANNELS`` channels (all of them when there are fewer): each
#: channel's centre moves by ``SHIFT_SD`` within-state standard deviations, or its spread changes by
#: ``SPREAD_RATIO``.  A departure in one channel (a stuck, biased or drifting sensor) is a fault.
MIN_CHANNELS = 2
SHIFT_SD = 2.0
SPREAD_RATIO = 3.0

#: A channel active in the smaller group stays about its level at rest: within this many of its SDs there.
CENTRED_SD = 0.5

#: Spreads below this (in robust SDs of the channel) count as this in the ratio of two spreads: a
#: channel at rest, read at a resolution, spreads 0 in one group of rows and a step in another.
SD_FLOOR = 0.25

#: A channel is active in a group of rows when ``ACTIVE_SHARE`` of them lie beyond ``ACTIVE_SD``
#: SDs of the other group's centre: a spread shared by the group, not the few rows of spikes.
ACTIVE_SHARE = 0.6
ACTIVE_SD = 3.0

#: A channel whose spread in one state is below this share of its spread in the other is collapsed
#: there (a stuck value, a frozen logger); it is not evidence of a state.
COLLAPSED = 0.05

#: The rule that sends rows to modes floors each mode's variance of a channel at this share of the channel's
#: pooled within-mode variance (:func:`mode_finder`), so that one exact value of a collapsed channel does not
#: decide the mode.
VARIANCE_FLOOR = 0.01

#: ``modes="auto"`` looks for states in at most this many rows of the row sample.
FIND_ROWS = 20000



# ------------------------------------------------------------ finding states
@dataclass(frozen=True)
class ModeFinder:
    """Which state each row is in: the most likely state on the channels that tell the states apart.

    A row's state is decided on those channels alone (``channels``, :func:`telling_channels`), so
    that a fault on another channel (a bias, a stuck value) does not send the row to a state whose
    wider spread would explain it.  Built by :func:`mode_finder`; ``scales`` (K, p): the units of
    each state's model; ``means`` (K, q) and ``inv_chol`` (K, q, q): each state's mean and the
    inverse Cholesky factor of its covariance on the q telling channels, in those units;
    ``log_norm`` (K,): each state's log weight less its log normalising constant there.
    """

    scales: np.ndarray
    channels: np.ndarray
    means: np.ndarray
    inv_chol: np.ndarray
    log_norm: np.ndarray

    @property
    def n_modes(self) -> int:
        return len(self.means)

    def log_likelihoods(self, rows) -> np.ndarray:
        """(n, K): each row's log likelihood under each state on the telling channels (NaN cells: the mean)."""
        rows = np.asarray(rows, np.float64)[:, self.channels]
        out = np.empty((len(rows), self.n_modes))
        for k in range(self.n_modes):
            y = np.nan_to_num(rows / self.scales[k, self.channels] - self.means[k]) @ self.inv_chol[k].T
            out[:, k] = self.log_norm[k] - 0.5 * np.einsum("ij,ij->i", y, y)
        return out

    def __call__(self, rows) -> np.ndarray:
        """The state of each row (int64)."""
        return np.argmax(self.log_likelihoods(rows), axis=1).astype(np.int64)


def telling_channels(means: np.ndarray, sds: np.ndarray) -> np.ndarray:
    """The channels that tell states apart (bool, p): for some pair of states, the centre moves by
    ``SHIFT_SD`` pooled SDs or the spread by ``SPREAD_RATIO`` (``means``, ``sds``: (K, p), data units).
    All channels where none does."""
    k = len(means)
    found = np.zeros(means.shape[1], bool)
    for a in range(k):
        for b in range(a + 1, k):
            pooled = np.maximum(np.sqrt((sds[a] ** 2 + sds[b] ** 2) / 2), 1e-300)
            ratio = np.maximum(sds[a], sds[b]) / np.maximum(np.minimum(sds[a], sds[b]), 1e-300)
            found |= (np.abs(means[a] - means[b]) / pooled >= SHIFT_SD) | (ratio >= SPREAD_RATIO)
    return found if found.any() else np.ones_like(found)


def mode_finder(models, weights) -> ModeFinder:
    """The :class:`ModeFinder` of fitted single-mode models (their ``mean_``, ``get_covariance()`` and
    ``scale_``) with the states' shares ``weights``."""
    p = len(models[0].mean_)
    scales = np.stack([np.ones(p) if getattr(m, "scale_", None) is None else m.scale_ for m in models])
    covs = np.stack([m.get_covariance() for m in models])
    sds = np.sqrt(np.maximum(np.diagonal(covs, axis1=1, axis2=2), 0)) * scales
    channels = telling_channels(np.stack([m.mean_ for m in models]) * scales, sds)
    shares = np.asarray(weights, np.float64) / np.sum(weights)
    # each mode's variances floored at a share of the channel's pooled (within-mode) variance, in the data's
    # units: a channel collapsed in one mode (an idle counter reading exactly 0) would otherwise decide alone
    # that every row reading that value is the mode's
    pooled = np.einsum("k,kp->p", shares, sds**2)
    floor = np.maximum(VARIANCE_FLOOR * pooled[None, :] / scales**2 - np.diagonal(covs, axis1=1, axis2=2), 0)
    sub = (covs + floor[:, :, None] * np.eye(p))[:, channels][:, :, channels]
    chol = np.linalg.cholesky(sub + np.eye(sub.shape[1]) * 1e-12 * np.trace(sub, axis1=1, axis2=2)[:, None, None])
    inv = np.linalg.inv(chol)
    log_norm = (np.log(np.asarray(weights, np.float64)) - np.log(np.diagonal(chol, axis1=1, axis2=2)).sum(axis=1)
                - np.log(scales[:, channels]).sum(axis=1))
    return ModeFinder(scales=scales, channels=channels, means=np.stack([m.mean_[channels] for m in models]),
                      inv_chol=inv, log_norm=log_norm)


def is_state(a: np.ndarray, b: np.ndarray, scale: np.ndarray, center: np.ndarray) -> bool:
    """Whether two groups of rows (robustly standardised, ``scale`` and ``center`` the
    standardisation; ``a`` the larger) are two states rather than a state and a fault.

    A channel moves between the groups when its centre moves by ``SHIFT_SD`` within-group SDs, or
    its spread by ``SPREAD_RATIO`` with ``ACTIVE_SHARE`` of the wider group's rows beyond
    ``ACTIVE_SD`` SDs of the tighter group's centre (a channel that is active in most rows of a
    group, not a few spikes).  The evidence of a state is either

    - at least ``min(MIN_CHANNELS, p)`` channels move, not counting channels collapsed in one
      group only (a stuck value, a frozen logger), and they are not two channels exchanged (a
      swap: each of the two sits where the other sits in the other group, within ``SHIFT_SD / 2``
      SDs, in the data's units); or
    - a channel at rest in the larger group is active in the smaller one about the same level
      (within ``CENTRED_SD`` of its wider spread: a device that switches on at times, not a
      drift).  A sensor that turns noisy over a stretch looks the same and is taken for a state.

    A bias, a drift or a stuck value on one channel is a fault.
    """
    mean_a, mean_b = a.mean(axis=0), b.mean(axis=0)
    sd_a, sd_b = a.std(axis=0), b.std(axis=0)
    pooled = np.maximum(np.sqrt((sd_a**2 + sd_b**2) / 2), 1e-12)
    shift = np.abs(mean_a - mean_b) / pooled
    tight = np.maximum(np.minimum(sd_a, sd_b), SD_FLOOR)
    ratio = np.maximum(sd_a, sd_b) / tight
    a_wider = sd_a > sd_b
    centre_tight = np.where(a_wider, mean_b, mean_a)
    far_a = (np.abs(a - centre_tight) > ACTIVE_SD * tight).mean(axis=0)
    far_b = (np.abs(b - centre_tight) > ACTIVE_SD * tight).mean(axis=0)
    active = (ratio >= SPREAD_RATIO) & (np.where(a_wider, far_a, far_b) >= ACTIVE_SHARE)
    collapsed = np.minimum(sd_a, sd_b) < COLLAPSED * np.maximum(sd_a, sd_b)
    centred = np.abs(mean_a - mean_b) <= CENTRED_SD * np.maximum(sd_a, sd_b)
    if np.any(active & ~a_wider & centred):
        return True  # at rest in the larger group, active about the same level in the smaller: a device on
    moved = ((shift >= SHIFT_SD) | active) & ~collapsed
    if moved.sum() < min(MIN_CHANNELS, len(shift)):
        return False
    if moved.sum() == 2 and len(shift) > 2:
        i, j = np.flatnonzero(moved)
        raw_a, raw_b = mean_a * scale + center, mean_b * scale + center
        near = SHIFT_SD / 2 * np.maximum(sd_b, sd_a) * scale
        if abs(raw_a[i] - raw_b[j]) <= near[j] and abs(raw_a[j] - raw_b[i]) <= near[i]:
            return False
    return True


def labels_from_channel(X, modes):
    """``(X, modes)`` with ``modes`` a channel of a DataArray ``X`` replaced by that channel's values,
    and the channel left out of ``X``; anything else as given."""
    if not isinstance(modes, str) or modes == "auto":
        return X, modes
    if not _labels.is_dataarray(X):
        raise ValueError(f"modes={modes!r}: a channel name needs a DataArray X (rows x channels); "
                         "pass 'auto' or one label per row")
    dim = X.dims[1]
    names = [str(v) for v in X.coords[dim].values] if dim in X.coords else []
    if modes not in names:
        raise ValueError(f"modes={modes!r}: no such channel in X's {dim!r} (channels: {names[:10]}"
                         f"{' ...' if len(names) > 10 else ''})")
    labels = np.asarray(X.isel({dim: names.index(modes)}).values)
    return X.isel({dim: [i for i in range(len(names)) if i != names.index(modes)]}), labels


def label_text(label) -> str:
    """A mode's label as an error names it: ``'idle'``, ``3`` (a numpy scalar as its Python value)."""
    return repr(label.item() if isinstance(label, np.generic) else label)


def _missing_labels(labels: np.ndarray) -> np.ndarray:
    """Which labels are missing: ``pd.isna`` where pandas is installed (an optional dependency, the
    ``xarray`` extra's), else NaN and None, all a numpy array of labels can hold."""
    try:
        import pandas as pd
    except ImportError:
        if labels.dtype.kind == "f":
            return np.isnan(labels)
        return np.array([v is None or (isinstance(v, float) and v != v) for v in labels.ravel()], bool)
    return np.asarray(pd.isna(labels), bool)


def given_labels(labels, n_rows: int, n_features: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The user's labels as codes 0..K-1 (int64, in the order of ``np.unique``) and the labels themselves.

    Raises a ValueError naming the problem, before any pass: labels of the wrong length, missing labels
    (NaN, None, pandas' NA or NaT: ``pd.isna``), and, where ``n_features`` is given, a label with fewer
    rows than a robust fit of that many features needs (``n_features + 2``), naming the label.
    """
    labels = np.asarray(labels.compute() if isinstance(labels, da.Array) else labels)
    if labels.ndim != 1 or len(labels) != n_rows:
        raise ValueError(f"modes: expected one label per row ({n_rows}), got an array of shape {labels.shape}")
    missing = _missing_labels(labels)
    if missing.any():
        raise ValueError(f"modes: {int(missing.sum()):,} labels are missing (NaN, None or NA), the first at row "
                         f"{int(np.argmax(missing))}; give every row a mode")
    try:
        names, codes = np.unique(labels, return_inverse=True)
    except TypeError as err:  # labels of kinds that do not sort together (numbers and strings)
        raise ValueError(f"modes: the labels cannot be ordered ({err}); give labels of one kind, numbers or "
                         "strings") from None
    if n_features is not None:
        counts = np.bincount(codes, minlength=len(names))
        if (few := np.flatnonzero(counts < n_features + 2)).size:
            listed = ", ".join(f"{label_text(names[m])} ({counts[m]} rows)" for m in few[:5])
            raise ValueError(f"modes: the robust fit of a mode needs at least {n_features + 2} rows for "
                             f"{n_features} features; too few for mode {listed}{' ...' if few.size > 5 else ''}: "
                             "merge it with another mode, or label more rows")
    return codes.astype(np.int64), names


# ------------------------------------------------------------ shared passes
def _mode_stats(block: np.ndarray, mine: np.ndarray, plan, scale, offset: int, keep=()) -> BlockStats:
    """:func:`._block.block_stats` of the rows ``mine`` of ``block`` (rows ``offset ..`` of the data),
    in the model's units; a row sample is drawn by the rows' global indices, as a single fit draws
    it, so that the rows drawn do not depend on the blocks' sizes.  ``keep``: runs ``(start, stop)`` of the
    block's rows kept as stored for the shift rule (:func:`._passes.kept_runs`), the other modes' rows NaN
    (left out of its means, as ``"auto"``'s modes leave them)."""
    if plan.sample_rate <= 0:
        stats = block_stats(in_model_units(block[mine], scale), plan, offset)
    else:
        stats = block_stats(in_model_units(block[mine], scale), replace(plan, sample_rate=0.0), offset)
        drawn = sampled_rows(offset, len(block), plan.seed, plan.sample_rate)
        rows = np.asarray(in_model_units(block[drawn[mine[drawn]]], scale), np.float64)
        stats.sample = rows[np.isfinite(rows).all(axis=1)]
    if keep:
        stats.segments = tuple(np.where(mine[a:b, None], run, np.nan)
                               for (a, b), run in zip(keep, kept_runs(block, keep), strict=True))
    return stats


def _mode_block_task(block, codes, requests: tuple, offset: int, index: int) -> tuple:
    """Each requesting mode's :class:`BlockStats` of its rows of ``block`` (row block ``index``):
    ``requests`` holds ``(mode, plan, scale, keep)``, ``keep`` the runs of rows each block keeps
    (:func:`._shift.run_plan`); ``codes`` is the block's mode per row, or a :class:`ModeFinder`."""
    limit_blas_in_task()
    block = np.asarray(block)
    codes = codes(block) if callable(codes) else np.asarray(codes)
    return tuple(_mode_stats(block, codes == mode, plan, scale, offset, keep.get(index, ()))
                 for mode, plan, scale, keep in requests)


def _combine_tuples(*parts: tuple) -> tuple:
    return tuple(reduce(combine, same) for same in zip(*parts, strict=True))


class SharedPasses:
    """Reads each row block once per pass for every mode still fitting (see the module's docstring).

    Parameters
    ----------
    X : ndarray or dask array
        Full-row blocks.
    codes : ndarray, dask array or ModeFinder
        The mode of each row (int64, chunked as ``X``'s rows), or the rule that gives it.
    n_modes : int
    """

    def __init__(self, X, codes, n_modes: int):
        self.X, self.codes = X, codes
        self.alive = n_modes
        self.pending: dict[int, tuple] = {}
        self.results: dict[int, object] = {}
        self.n_passes = 0  # full passes made for the modes
        self.n_partial_reads = 0
        self._cond = threading.Condition()
        self._runner = PassRunner(X)  # the blocks and their offsets

    def request(self, mode: int, plan, scale, chosen: list[int], keep: dict | None = None) -> BlockStats:
        """Mode ``mode``'s sums under ``plan``, from the next shared read of the blocks ``chosen`` (with the
        runs of rows ``keep``, block -> ``((start, stop), ...)``, in their ``segments``)."""
        with self._cond:
            self.pending[mode] = (plan, scale, tuple(chosen), keep or {})
            self._maybe_read()
            while mode not in self.results:
                self._cond.wait()
            out = self.results.pop(mode)
        if isinstance(out, BaseException):
            raise out
        return out

    def leave(self) -> None:
        """A mode has finished (or failed): the next read no longer waits for it."""
        with self._cond:
            self.alive -= 1
            self._maybe_read()

    def _maybe_read(self) -> None:
        if not self.pending or len(self.pending) < self.alive:
            return
        pending, self.pending = sorted(self.pending.items()), {}
        groups: dict[tuple, list] = {}  # the modes that read the same blocks share one read
        for mode, (plan, scale, chosen, keep) in pending:
            groups.setdefault(chosen, []).append((mode, plan, scale, keep))
        for chosen, requests in groups.items():
            try:
                sums = self._read(chosen, tuple(requests))
            except BaseException as err:  # every mode waiting on this read gets the error
                sums = [err] * len(requests)
            for (mode, *_), out in zip(requests, sums, strict=True):
                self.results[mode] = out
        self._cond.notify_all()

    def _read(self, chosen: tuple, requests: tuple) -> tuple:
        """One read of the blocks ``chosen``: each request's merged sums, in order."""
        runner = self._runner
        if len(chosen) == runner.n_blocks:
            self.n_passes += 1
        else:
            self.n_partial_reads += 1
        offsets = np.concatenate([[0], np.cumsum(runner.block_rows())[:-1]])
        if not runner.is_dask:
            parts = []
            for b in chosen:
                start, stop = int(offsets[b]), int(offsets[b]) + int(runner.block_rows()[b])
                codes = self.codes if callable(self.codes) else self.codes[start:stop]
                parts.append(_mode_block_task(self.X[start:stop], codes, requests, start, b))
            return _combine_tuples(*parts)
        data = runner._dask_blocks()
        codes = (self.codes.to_delayed(optimize_graph=True) if isinstance(self.codes, da.Array)
                 else [self.codes] * runner.n_blocks)
        requests_d = dask.delayed(requests, pure=True)
        parts = [dask.delayed(_mode_block_task, pure=True)(data[b], codes[b], requests_d, int(offsets[b]), b)
                 for b in chosen]
        return dask.compute(tree_reduce(parts, merge=_combine_tuples))[0]


class ModeRunner(PassRunner):
    """A :class:`._passes.PassRunner` for one mode: its passes go through :class:`SharedPasses`.

    ``n_rows`` is the mode's number of rows (estimated from the row sample until a full pass counts it).
    """

    def __init__(self, shared: SharedPasses, mode: int, n_rows: int, *, nan_policy: str):
        super().__init__(shared.X, nan_policy=nan_policy, keep_bulk=False)
        self.shared, self.mode = shared, mode
        self.n_rows = n_rows

    def _sums(self, plan, chosen, bar, keep=None) -> BlockStats:  # given labels' modes keep the runs of their
        # first read (the other modes' rows NaN); "auto"'s learn from the runs of the read before the modes
        return self.shared.request(self.mode, plan, self.scale, list(chosen), keep)


# ------------------------------------------------------------ judging rows
def has_modes(model) -> bool:
    """Whether ``model`` was fitted with several modes."""
    return getattr(model, "mode_models_", None) is not None


def refuse(model, what: str) -> None:
    """Raise NotImplementedError where ``what`` does not judge rows by their mode yet."""
    if has_modes(model):
        raise NotImplementedError(
            f"{what} is not built for a model with operating modes yet; use it on one mode's model, "
            "model.mode_models_[m], with the rows model.predict_mode(X) gives mode m"
        )


def finder(model) -> ModeFinder:
    """The :class:`ModeFinder` of a model with modes, from its fitted modes (built once, then kept)."""
    found = vars(model).get("_mode_finder")
    if found is None:
        found = model._mode_finder = mode_finder(model.mode_models_, model.mode_weights_)
    return found


def best_modes(model, rows) -> np.ndarray:
    """The mode of each row (int64 codes into ``modes_``): the most likely on the channels that tell
    the modes apart (:class:`ModeFinder`); 0 for every row of a model without modes."""
    if not has_modes(model):
        return np.zeros(len(rows), np.int64)
    return finder(model)(rows)


def modes_of_rows(model, block, nan_policy: str) -> np.ndarray:
    """:meth:`MCPCA.predict_mode` of a row block as stored: :func:`best_modes`, and ``NO_MODE`` (-1) for the
    rows no mode can judge (:func:`._model.unusable_rows`: holding NaN or inf; under ``"raise"`` they raise)."""
    block = np.asarray(block)
    bad = _model.unusable_rows(block, nan_policy, modes=True)
    out = best_modes(model, np.where(bad[:, None], 0.0, block) if bad.any() else block)
    out[bad] = NO_MODE
    return out


def mode_rows(model, m: int):
    """``own(rows)``: the mask of the rows (as stored) whose mode is ``m`` (:func:`best_modes`), the rows a mode's
    shift rule averages (:func:`._shift.shifted_cells`): a mode's residuals are its own rows'."""
    return lambda rows: best_modes(model, rows) == m


def judged_rows(model, block, before=None, original=None):
    """:func:`._model.judged_rows` for a model with or without modes.  With modes, each row by its mode
    (:func:`best_modes`): the flags are the mode's, and the distance that mode's ``d2`` rescaled so that
    the model's ``outlier_cutoff_`` is the mode's (``d2 * outlier_cutoff_ / mode cutoff``)."""
    if not has_modes(model):
        return _model.judged_rows(model, block, before, original)
    best = best_modes(model, block)
    d2, flags, held = np.full(len(best), np.nan), np.zeros(len(best), bool), np.zeros(len(best), bool)
    block = np.asarray(block)
    for m, sub in enumerate(model.mode_models_):
        mine = best == m
        if mine.any():
            # the rows before a mode's rows are the block's: a run that crosses modes is judged whole
            judged = _model.judged_rows(sub, block, before, original, mode_rows(model, m))
            d2_m, flags[mine], held[mine] = (v[mine] for v in judged)
            d2[mine] = d2_m * (model.outlier_cutoff_ / sub.outlier_cutoff_)
    return d2, flags, held


def calibrated_d2(model, rows) -> np.ndarray:
    """:func:`._model.calibrated_d2` of rows in the model's units, by mode as :func:`judged_rows` gives it."""
    if not has_modes(model):
        return _model.calibrated_d2(model, rows)
    return judged_rows(model, rows)[0]


def mahalanobis_d2(model, rows) -> np.ndarray:
    """:func:`._model.mahalanobis_d2` of rows in the model's units; with modes, under each row's mode."""
    if not has_modes(model):
        return _model.mahalanobis_d2(model, rows)
    best = best_modes(model, rows)
    out = np.full(len(rows), np.nan)
    for m, sub in enumerate(model.mode_models_):
        mine = best == m
        if mine.any():
            out[mine] = _model.mahalanobis_d2(sub, _model.model_rows(sub, np.asarray(rows, np.float64)[mine]))
    return out
