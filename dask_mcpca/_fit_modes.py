"""How :class:`~dask_mcpca.MCPCA` is fitted with ``modes``: one single-mode fit per mode, in shared passes.

See :mod:`._modes` for what a mode is and how the passes are shared.  Each
mode's fit is :func:`._fit.robust_stage` and :func:`._fit.finish_fit`, the
steps of a single fit, run in a thread against a
:class:`._modes.ModeRunner`; its result is an ordinary
:class:`._fit.FitResult`, which the estimator sets on a model of its own
(``mode_models_``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import dask.array as da
import numpy as np
from sklearn.base import clone

from . import _checkpoint, _model
from ._exceptions import NonFiniteRowsError
from ._fit import FitResult, finish_fit, first_read, robust_stage, solver_limits
from ._modes import (
    CENTRED_SD,
    FIND_ROWS,
    MAX_MODES,
    MIN_MODE_SHARE,
    MIN_ROWS_PER_FEATURE,
    SHIFT_SD,
    ModeFinder,
    ModeRunner,
    SharedPasses,
    given_labels,
    is_state,
    label_text,
    mode_finder,
)
from ._passes import PARTIAL_HINT, PassRunner
from ._repeated import TIGHT_MIN_ROWS
from ._scale import robust_scales

__all__ = ["ModesResult", "check_modes", "find_modes", "fit_modes"]

#: Rounds of refitting the states on the rows their rule sends them (:func:`_settle`) ...
SETTLE_ROUNDS = 6
#: ... until the rule sends at most this share of the sample's rows to another state.
SETTLE_CHANGED = 1e-3


@dataclass(frozen=True)
class ModesResult:
    """A fit with several modes: each mode's :class:`FitResult` (largest first for ``"auto"``,
    in the order of the labels for given labels), the labels, each mode's share of the rows,
    and the passes of the whole fit."""

    results: tuple[FitResult, ...]
    labels: np.ndarray
    weights: np.ndarray
    n_passes: int
    n_partial_reads: int


def check_modes(est, modes) -> None:
    """Raise a ValueError naming what ``modes`` cannot be combined with."""
    if isinstance(modes, str) and modes != "auto":
        raise ValueError(f"MCPCA: modes={modes!r} is not understood; use None, 'auto' or one label per row")
    needed = {"solver": "auto", "center": "robust", "cellwise": False, "checkpoint": None, "warm_start": False}
    for name, allowed in needed.items():
        if getattr(est, name) != allowed:
            raise ValueError(f"MCPCA: modes need {name}={allowed!r} (got {getattr(est, name)!r})")
    if est.nan_policy == "partial":
        raise ValueError("MCPCA: modes cannot be combined with nan_policy='partial' yet; use 'omit' or 'raise'")


def _naming(label):
    """Decorate a mode's fit so that its errors name the mode (``label``): a ValueError of the single fit
    (too few usable rows, rows holding NaN under ``nan_policy="raise"``) speaks of that mode's rows."""

    def wrap(fit_one):
        def named():
            try:
                return fit_one()
            except ValueError as err:
                text = str(err)
                if isinstance(err, NonFiniteRowsError):  # the count is the mode's rows; 'partial' is refused
                    text = text.replace(" rows hold", " rows of the mode hold", 1).replace(
                        PARTIAL_HINT, " (a fit with modes cannot take nan_policy='partial')")
                try:
                    named_err = type(err)(f"mode {label_text(label)}: {text}")
                except TypeError:  # an error class with other arguments: as it was
                    raise err from None
                raise named_err from None
        return named

    return wrap


def _in_threads(jobs: list, shared: SharedPasses) -> list:
    """Run each mode's fit ``jobs[m]()`` in a thread of its own; each leaves the shared passes when done."""

    def run(job):
        try:
            return job()
        finally:
            shared.leave()

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [pool.submit(run, job) for job in jobs]
        return [f.result() for f in futures]


def fit_modes(X, est, labels=None) -> FitResult | ModesResult:
    """Fit ``X`` with one model per mode: the user's ``labels`` (one per row), or found (``labels`` None,
    ``modes="auto"``).  Where ``"auto"`` finds one state, the single fit from the same first read."""
    check_modes(est, "auto" if labels is None else labels)
    n, p = X.shape
    k = p if est.n_components is None else est.n_components
    seed = 0 if est.random_state is None else est.random_state
    tol, max_iter = solver_limits(est)
    none = _checkpoint.Checkpoint.open(None, params={}, shape=(n, p))

    def finish(runner, moments, partial, rate):
        start = robust_stage(est, runner, moments, partial, ckpt=none, seed=seed, max_iter=max_iter,
                             archive_sample_rate=rate)
        return finish_fit(est, runner, start, k=k, tol=tol, max_iter=max_iter)

    if labels is not None:
        codes, names = given_labels(labels, n, p)
        counts = np.bincount(codes, minlength=len(names))
        source = da.from_array(codes, chunks=(X.chunks[0],)) if isinstance(X, da.Array) else codes
        shared = SharedPasses(X, source, len(names))

        def job(m):
            @_naming(names[m])
            def fit_one():
                runner = ModeRunner(shared, m, int(counts[m]), nan_policy=est.nan_policy)
                moments, partial, rate = first_read(est, runner, none, seed=seed, spread=False)
                return finish(runner, moments, partial, rate)
            return fit_one

        results = _in_threads([job(m) for m in range(len(names))], shared)
        return _result(results, names, shared, None)

    runner = PassRunner(X, nan_policy=est.nan_policy, progress=est.progress,
                        names=getattr(est, "feature_names_in_", None))
    moments, partial, rate = first_read(est, runner, none, seed=seed, spread=False)
    finder = find_modes(moments.sample, est, seed=seed)
    if finder is None:
        return finish(runner, moments, partial, rate)
    sample_codes = finder(moments.sample)
    run_codes = [finder(np.nan_to_num(s)) for s in moments.segments]  # each row of the shift rule's runs: its mode
    shared = SharedPasses(X, finder, finder.n_modes)

    def job(m):
        @_naming(int(m))
        def fit_one():
            share = float(np.mean(sample_codes == m))
            # the runs of rows the mode's shift rule learns from hold its rows only (the others NaN: left out)
            runs = tuple(np.where((codes == m)[:, None], run, np.nan)
                         for run, codes in zip(moments.segments, run_codes, strict=True))
            mode_moments = replace(moments, sample=moments.sample[sample_codes == m], segments=runs,
                                   n_rows=max(round(moments.n_rows * share), 2))
            runner_m = ModeRunner(shared, m, mode_moments.n_rows, nan_policy=est.nan_policy)
            return finish(runner_m, mode_moments, partial[:0], rate)
        return fit_one

    results = _in_threads([job(m) for m in range(finder.n_modes)], shared)
    return _result(results, np.arange(finder.n_modes), shared, runner)


def _result(results: list, names, shared: SharedPasses, first: PassRunner | None) -> ModesResult:
    """The modes' results with the passes of the whole fit (``first``: the runner of a first read made
    before the modes were known)."""
    rows = np.array([r.n_samples_ for r in results], np.float64)
    before = (0, 0) if first is None else (first.n_passes, first.n_partial_reads)
    return ModesResult(results=tuple(results), labels=np.asarray(names), weights=rows / rows.sum(),
                       n_passes=before[0] + shared.n_passes, n_partial_reads=before[1] + shared.n_partial_reads)


def _inside(model, rows: np.ndarray, in_units: np.ndarray | None = None) -> np.ndarray:
    """The rows (as stored) within ``model``'s cutoff (``in_units``: the same rows in the model's
    units, where the caller has them)."""
    in_units = _model.model_rows(model, rows) if in_units is None else in_units
    return _model.calibrated_d2(model, in_units) <= model.outlier_cutoff_


def _explained(model, rows: np.ndarray) -> np.ndarray:
    """The rows (as stored) that ``model`` explains: within its cutoff, or holding a stuck value or a
    frozen record it learned (a fault it names, whose rows are no state's)."""
    in_units = _model.model_rows(model, rows)
    return _inside(model, rows, in_units) | _model.repeated(model, np.asarray(in_units, np.float64))


def _fault_rows(z: np.ndarray, group: np.ndarray, states: list) -> np.ndarray:
    """The rows of ``group`` (indices into the standardised rows ``z``), found to be no state, that are a
    fault's: on some channel, beyond ``SHIFT_SD`` SDs of the nearest state (``states``: each one's rows)
    on one side of it (a bias, a drift, a value stuck), not spread about its level (a device switching
    on: ``CENTRED_SD``).  The group's other rows may be another state that the fault's rows were fitted
    with, and are fitted again.  Where no row departs so, the whole group.  ``states`` is not empty
    (the first fit of :func:`find_modes` is always a state)."""
    g = z[group]
    nearest = min(states, key=lambda rows: np.sum((np.median(z[rows], axis=0) - np.median(g, axis=0)) ** 2))
    ref = z[nearest]
    dev = (g - ref.mean(axis=0)) / np.maximum(ref.std(axis=0), 1e-12)
    far = np.abs(dev) > SHIFT_SD
    fault = np.zeros(len(group), bool)
    for c in np.flatnonzero(far.sum(axis=0) >= TIGHT_MIN_ROWS):
        away = dev[far[:, c], c]
        if abs(away.mean()) > CENTRED_SD * away.std():  # to one side of the state: shifted, not active about it
            fault |= far[:, c]
    return group[fault] if fault.any() else group


def find_modes(sample: np.ndarray, est, *, seed: int = 0) -> ModeFinder | None:
    """The operating states of the data, from its row sample; None where there is one.

    States are peeled off by robust fits of the sample (``est``'s parameters, one state, every
    component).  The first fit, on every row, takes the largest state.  Then the rows that no
    state explains (beyond every state's cutoff) are fitted: the fit's inliers, where they hold
    ``MIN_MODE_SHARE`` of the rows (and enough to fit on), become a state if they differ from
    every state's inliers as a state does (:func:`._modes.is_state`, on the robustly standardised
    rows); otherwise they are a fault's rows (a bias, a drift, a stuck value), set aside
    (:func:`_fault_rows`: those departing to one side of the nearest state; the rest of the group
    may be a state fitted together with them; the whole group where those are fewer than a state
    needs), and the rest are fitted again.  The rows holding a
    stuck value or a frozen record a state's fit learned are that fault's, not another state's, and
    are not fitted again.  This repeats until fewer rows are left or ``MAX_MODES`` states are found.
    A state is thus found only where one model cannot explain it, and comparing the inliers of
    robust fits, not raw clusters, keeps each group's own departures out of the evidence.

    The states found are then settled (:func:`_settle`): each fitted as the fit fits a mode on the rows
    the rule of :meth:`MCPCA.predict_mode` sends it, until that rule, built from those fits, no longer
    moves rows; the rows a settled state does not explain (and no fault's) are peeled again, where
    another state was fitted within it.  The rule returned is the settled states', so that the modes
    the fit fits give it back and each mode judges the rows it was fitted on.
    """
    sample = np.asarray(sample, np.float64)
    sample = sample[np.isfinite(sample).all(axis=1)]
    sample = sample[:: max(1, -(-len(sample) // FIND_ROWS))]
    n, p = sample.shape
    least = max(MIN_ROWS_PER_FEATURE * (p + 2), MIN_MODE_SHARE * n)
    if n < 2 * least:
        return None
    center, scale = np.median(sample, axis=0), robust_scales(sample)
    z = (sample - center) / scale  # the evidence's units
    probe = clone(est).set_params(modes=None, n_components=None, contamination="auto", progress=False,
                                  random_state=seed, cellwise=False)
    fitter = clone(est).set_params(modes=None, progress=False, random_state=seed)  # as the fit fits a mode
    states: list = []  # (model, indices of its inliers)
    left = np.arange(n)  # the rows no state explains, less those of the faults found
    faults = np.zeros(n, bool)  # the rows set aside as a fault's
    settled = None
    for _ in range(MAX_MODES):  # each round peels states off, then settles them; a round adds a state or ends
        found = len(states)
        while len(states) < MAX_MODES and len(left) >= least:
            model = clone(probe).fit(sample[left])
            inliers = left[_inside(model, sample[left])]
            if len(inliers) < least:
                break
            if all(is_state(*sorted((z[mine], z[inliers]), key=len, reverse=True), scale, center)
                   for _, mine in states):
                states.append((model, inliers))
                left = np.flatnonzero(~np.any([_explained(m, sample) for m, _ in states], axis=0) & ~faults)
            else:  # a fault's rows: the departures of a state, not a state
                fault = _fault_rows(z, inliers, [mine for _, mine in states])
                # fewer than a state's rows: the whole group, else each fit would set aside as few as
                # TIGHT_MIN_ROWS rows and the loop would run a robust fit per handful of rows
                gone = inliers if len(fault) < least else fault
                faults[gone] = True
                left = np.setdiff1d(left, gone)
        if len(states) < 2 or (settled is not None and len(states) == found):
            break
        settled = _settle([m for m, _ in states], sample, fitter, least)
        if settled is None:
            break
        models, codes = settled
        # each state as the fit will hold it: its model of the rows sent to it, its inliers those it explains
        own = np.zeros(n, bool)
        for m, model in enumerate(models):
            mine = codes == m
            own[mine] = _explained(model, sample[mine])
        states = [(model, np.flatnonzero((codes == m) & own)) for m, model in enumerate(models)]
        left = np.flatnonzero(~own & ~faults)  # rows their mode does not explain: another state's?
        if len(states) >= MAX_MODES or len(left) < least:
            break
    if settled is None:
        return None
    models, codes = settled
    rows = np.bincount(codes, minlength=len(models))
    order = np.argsort(-rows, kind="stable")  # mode 0 the largest
    return mode_finder([models[i] for i in order], rows[order] / rows.sum())


def _settle(models: list, sample: np.ndarray, fitter, least: float) -> tuple[list, np.ndarray] | None:
    """The states ``models`` (robust fits of groups of ``sample``) made consistent with the rule that
    sends rows to them: each state fitted (``fitter``, as the fit fits a mode) on the rows the rule of
    the states' models sends it, and the rule built again from those fits and their shares of the rows,
    until it sends no more than ``SETTLE_CHANGED`` of the rows elsewhere (at most ``SETTLE_ROUNDS``
    times).  The fit then fits each mode on the rows this rule sends it, and its models give back the
    same rule (:meth:`MCPCA.predict_mode`), so that a mode judges the rows it was fitted on.  A state
    that gets fewer than ``least`` rows is dropped.  Returns the models and each sample row's state;
    None where fewer than two states are left."""
    shares = np.full(len(models), 1.0 / len(models))
    codes = mode_finder(models, shares)(sample) if len(models) > 1 else None
    for _ in range(SETTLE_ROUNDS):
        if len(models) < 2:
            return None
        rows = np.bincount(codes, minlength=len(models))
        if rows.min() < least:  # a state its rows are not sent to could not be fitted: drop it
            keep = np.flatnonzero(rows >= least)
            models = [models[i] for i in keep]
            if len(models) < 2:
                return None
            codes = mode_finder(models, rows[keep] / rows[keep].sum())(sample)
            continue
        models = [clone(fitter).fit(sample[codes == m]) for m in range(len(models))]
        new = mode_finder(models, rows / rows.sum())(sample)
        changed, codes = np.mean(new != codes), new
        if changed <= SETTLE_CHANGED:
            break
    rows = np.bincount(codes, minlength=len(models))
    return (models, codes) if len(models) >= 2 and rows.min() >= least else None
