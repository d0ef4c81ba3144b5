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
from typing import Any

import dask.array as da
import numpy as np

from . import _checkpoint
from ._fit import FitResult, finish_fit, first_read, robust_stage, solver_limits
from ._modes import ModeRunner, SharedPasses, find_modes, given_labels
from ._passes import PassRunner

__all__ = ["ModesResult", "check_modes", "fit_modes"]


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
    finder: Any  # the ModeFinder of modes="auto", None for given labels


def check_modes(est, modes) -> None:
    """Raise a ValueError naming what ``modes`` cannot be combined with."""
    if isinstance(modes, str) and modes != "auto":
        raise ValueError(f"MCPCA: modes={modes!r} is not understood; use None, 'auto' or one label per row")
    clashes = {
        "solver": (est.solver, "auto"), "center": (est.center, "robust"), "nan_policy": (est.nan_policy, None),
        "cellwise": (est.cellwise, False), "checkpoint": (est.checkpoint, None), "warm_start": (est.warm_start, False),
    }
    for name, (value, allowed) in clashes.items():
        if name == "nan_policy":
            if value == "partial":
                raise ValueError("MCPCA: modes cannot be combined with nan_policy='partial' yet; use 'omit' or 'raise'")
        elif value != allowed:
            raise ValueError(f"MCPCA: modes need {name}={allowed!r} (got {value!r})")


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
        codes, names = given_labels(labels, n)
        counts = np.bincount(codes, minlength=len(names))
        source = da.from_array(codes, chunks=(X.chunks[0],)) if isinstance(X, da.Array) else codes
        shared = SharedPasses(X, source, len(names))

        def job(m):
            def fit_one():
                runner = ModeRunner(shared, m, int(counts[m]), nan_policy=est.nan_policy)
                moments, partial, rate = first_read(est, runner, none, seed=seed, spread=False)
                return finish(runner, moments, partial, rate)
            return fit_one

        results = _in_threads([job(m) for m in range(len(names))], shared)
        return _result(results, names, shared, None, finder=None)

    runner = PassRunner(X, nan_policy=est.nan_policy, progress=est.progress)
    moments, partial, rate = first_read(est, runner, none, seed=seed)
    finder = find_modes(moments.sample, seed=seed)
    if finder is None:
        return finish(runner, moments, partial, rate)
    sample_codes = finder(moments.sample)
    shared = SharedPasses(X, finder, finder.n_modes)

    def job(m):
        def fit_one():
            share = float(np.mean(sample_codes == m))
            mode_moments = replace(moments, sample=moments.sample[sample_codes == m],
                                   n_rows=max(round(moments.n_rows * share), 2))
            runner_m = ModeRunner(shared, m, mode_moments.n_rows, nan_policy=est.nan_policy)
            return finish(runner_m, mode_moments, partial[:0], rate)
        return fit_one

    results = _in_threads([job(m) for m in range(finder.n_modes)], shared)
    return _result(results, np.arange(finder.n_modes), shared, runner, finder=finder)


def _result(results: list, names, shared: SharedPasses, first: PassRunner | None, *, finder) -> ModesResult:
    """The modes' results with the passes of the whole fit (``first``: the runner of a first read made
    before the modes were known)."""
    rows = np.array([r.n_samples_ for r in results], np.float64)
    before = (0, 0) if first is None else (first.n_passes, first.n_partial_reads)
    return ModesResult(results=tuple(results), labels=np.asarray(names), weights=rows / rows.sum(),
                       n_passes=before[0] + shared.n_passes, n_partial_reads=before[1] + shared.n_partial_reads,
                       finder=finder)
