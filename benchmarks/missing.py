"""Channels that go offline: ``nan_policy="partial"`` against the complete data and against ``"omit"``.

Two archives, each fitted complete and with channels offline in stretches:

1. **Generated** (known truth): 200,000 rows x 10 correlated channels
   (eigenvalues ``10 * 0.6**i``, random basis) in a Zarr store of 20 chunks;
   channel 3 offline in stretches of 2,000 rows over 30 % of the rows,
   channels 5 and 7 over 5 % each, 1,000 rows with every channel offline.
2. **Real**: aeon's BasicMotions (8,000 rows x 6 channels, smart-watch
   accelerometer and gyroscope; the wheel is fetched as in
   ``robustness.py``), gyroscope x offline in stretches of 100 rows over
   30 % of the rows.

Reported: the largest angle between the top-3 subspaces of the gappy and the
complete fit; the share of rows with a missing cell that get a finite
distance and score; recall of spike (8-15 sd), stuck (one channel held at
its 99th percentile plus 4 sd) and bias (+8 sd) faults injected into 2 % of the rows
with a missing cell, on an observed channel; false alarms in the clean rows
with and without a missing cell; full passes; and (generated stores of 200k
and 2M rows, 20 chunks each) the fit's time on the gappy store over the
complete one, alternated in one run, medians.

**Most rows with a gap** (issue 35, point 5): a factor archive (3 factors
with loadings of scale 2, 1.5 and 1 on p channels, each channel with its own
noise variance, uniform in 0.5-2), the noisiest channel offline in 90 % of
the rows, at random or all but one block of time; p = 10 (50,000 rows) and
p = 30 (100,000 rows), several seeds; and the two real recordings
(BasicMotions, Daphnet S06R02E0) with one channel offline in 90 % of the
rows.  Reported: the top-3 angle of ``omit`` (the 10 % complete rows) and
``partial`` to the fit of the same rows without gaps and to the truth, and
the largest relative error of the top-3 variances against that fit
(median and largest over the seeds).

Usage::

    python benchmarks/missing.py [--rounds 3] [--seeds 6] [--cache ~/.cache/dask_mcpca-bench]
        [--sections table,most,timing]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import zarr
from scipy.linalg import subspace_angles

sys.path.insert(0, os.path.dirname(__file__))

from dask_mcpca import MCPCA


def _stretches(n: int, share: float, length: int, rng) -> np.ndarray:
    gone = np.zeros(n, bool)
    while gone.mean() < share:
        s = rng.integers(0, n - length)
        gone[s : s + length] = True
    return gone


def generated(seed: int = 0, n: int = 200_000):
    rng = np.random.default_rng(seed)
    p = 10
    Q, _ = np.linalg.qr(rng.normal(size=(p, p)))
    X = (rng.normal(size=(n, p)) * np.sqrt(10 * 0.6 ** np.arange(p))) @ Q.T
    Xg = X.copy()
    for col, share in ((3, 0.30), (5, 0.05), (7, 0.05)):
        Xg[_stretches(n, share, 2000, rng), col] = np.nan
    Xg[n // 4 : n // 4 + 1000] = np.nan
    return X, Xg


def basic_motions(cache: Path, seed: int = 0):
    from robustness import sensor_data

    X = sensor_data(cache)["BasicMotions"]
    rng = np.random.default_rng(seed)
    Xg = X.copy()
    Xg[_stretches(len(X), 0.30, 100, rng), 3] = np.nan
    return X, Xg


def inject(Xg: np.ndarray, kind: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Faults on an observed channel of 2 % of the rows with a missing cell (rows, not the empty ones)."""
    rng = np.random.default_rng(seed)
    obs = ~np.isnan(Xg)
    gappy = np.flatnonzero(~obs.all(axis=1) & obs.any(axis=1))
    rows = rng.choice(gappy, max(1, len(gappy) // 50), replace=False)
    bad = Xg.copy()
    sd = np.nanstd(Xg, axis=0)
    for r in rows:
        col = rng.choice(np.flatnonzero(obs[r]))
        if kind == "spike":
            bad[r, col] += rng.choice([-1, 1]) * rng.uniform(8, 15) * sd[col]
        elif kind == "stuck":
            bad[r, col] = np.nanpercentile(Xg[:, col], 99) + 4 * sd[col]
        else:
            bad[r, col] += 8 * sd[col]
    truth = np.zeros(len(Xg), bool)
    truth[rows] = True
    return bad, truth


def _angle(a, b) -> float:
    return float(np.degrees(subspace_angles(a.components_[:3].T, b.components_[:3].T)).max())


def evaluate(name: str, X: np.ndarray, Xg: np.ndarray, fit_input=None, fit_complete=None) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = MCPCA().fit(X if fit_complete is None else fit_complete)
        part = MCPCA(nan_policy="partial").fit(Xg if fit_input is None else fit_input)
        omit = MCPCA(nan_policy="omit").fit(Xg if fit_input is None else fit_input)
    obs = ~np.isnan(Xg)
    gap = ~obs.all(axis=1) & obs.any(axis=1)
    d2, w = part.mahalanobis(Xg), part.score_samples(Xg)
    if hasattr(d2, "compute"):
        d2, w = d2.compute(), w.compute()
    finite = float((np.isfinite(d2[gap]) & np.isfinite(w[gap])).mean())
    flags = np.asarray(part.is_outlier(Xg))
    recalls = []
    for kind in ("spike", "stuck", "bias"):
        bad, truth = inject(Xg, kind, 1)
        recalls.append(float(np.asarray(part.is_outlier(bad))[truth].mean()))
    omit_scored = float(np.isfinite(np.asarray(omit.mahalanobis(Xg))[gap]).mean())
    return [
        f"| {name} | partial | {_angle(part, full):.2f} | {finite:.4f} | "
        + " | ".join(f"{r:.3f}" for r in recalls)
        + f" | {flags[gap].mean():.4f} | {flags[obs.all(axis=1)].mean():.4f} | {part.n_passes_} |",
        f"| {name} | omit | {_angle(omit, full):.2f} | {omit_scored:.4f} | 0 | 0 | 0 | — | "
        f"{np.asarray(omit.is_outlier(Xg))[obs.all(axis=1)].mean():.4f} | {omit.n_passes_} |",
    ]


def factor_archive(seed: int, n: int, p: int, how: str, share: float = 0.9):
    """A 3-factor archive with per-channel noise, its covariance, and a copy with the noisiest channel
    offline in ``share`` of the rows: at random (``how="random"``) or all but one block of time."""
    rng = np.random.default_rng(seed)
    L = rng.normal(size=(p, 3)) * np.array([2.0, 1.5, 1.0])
    noise = rng.uniform(0.5, 2.0, p)
    X = rng.normal(size=(n, 3)) @ L.T + rng.normal(size=(n, p)) * np.sqrt(noise)
    return X, _offline(X, int(np.argmax(noise)), share, how, rng), L @ L.T + np.diag(noise)


def _offline(X: np.ndarray, col: int, share: float, how: str, rng) -> np.ndarray:
    n = len(X)
    if how == "random":
        gone = rng.random(n) < share
    else:
        keep = int(round(n * (1 - share)))
        start = int(rng.integers(0, n - keep + 1))
        gone = np.ones(n, bool)
        gone[start : start + keep] = False
    Xg = X.copy()
    Xg[gone, col] = np.nan
    return Xg


def _fits(X: np.ndarray, Xg: np.ndarray, k: int = 3):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return (MCPCA(n_components=k).fit(X), MCPCA(n_components=k, nan_policy="omit").fit(Xg),
                MCPCA(n_components=k, nan_policy="partial").fit(Xg))


def _to(m, basis: np.ndarray) -> float:
    return float(np.degrees(subspace_angles(m.components_[:3].T, basis)).max())


def _var_error(m, full) -> float:
    return float(np.abs(m.explained_variance_[:3] / full.explained_variance_[:3] - 1).max())


def most_rows_with_a_gap(seeds: int, cache: Path) -> list[str]:
    """``omit`` against ``partial`` with 90 % of the rows missing one channel."""
    lines = [
        "| data | gaps | seeds | omit: angle to the complete fit, median (max) | partial: same "
        "| omit: angle to the truth, median (max) | partial: same | omit: top-3 variance error, median "
        "| partial: same |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p, n in ((10, 50_000), (30, 100_000)):
        for how in ("random", "block"):
            got = []
            for seed in range(seeds):
                X, Xg, S = factor_archive(seed, n, p, how)
                truth = np.linalg.eigh(S)[1][:, ::-1][:, :3]
                full, omit, part = _fits(X, Xg)
                got.append([_to(omit, full.components_.T), _to(part, full.components_.T), _to(omit, truth),
                            _to(part, truth), _var_error(omit, full), _var_error(part, full)])
            g = np.array(got)
            cells = [f"{np.median(g[:, i]):.2f} ({g[:, i].max():.2f})" for i in range(4)]
            cells += [f"{np.median(g[:, i]):.3f}" for i in (4, 5)]
            lines.append(f"| factor {n // 1000}k x {p} | 90 % of rows, {how} | {seeds} | " + " | ".join(cells) + " |")
    from robustness import sensor_data

    real = sensor_data(cache)
    for name, col in (("BasicMotions", 3), ("Daphnet S06R02E0", 0)):
        X = real[name]
        for how in ("random", "block"):
            Xg = _offline(X, col, 0.9, how, np.random.default_rng(0))
            full, omit, part = _fits(X, Xg)
            B = full.components_.T
            lines.append(f"| {name} {len(X) // 1000}k x {X.shape[1]} (real), channel {col} | 90 % of rows, {how} "
                         f"| 1 | {_to(omit, B):.2f} | {_to(part, B):.2f} | — | — | {_var_error(omit, full):.3f} "
                         f"| {_var_error(part, full):.3f} |")
    return lines


def timing(X: np.ndarray, Xg: np.ndarray, rounds: int) -> list[str]:
    """Fit time of the gappy store over the complete one, alternated, in one run; passes of each."""
    with tempfile.TemporaryDirectory() as d:
        paths = {}
        for key, data in (("complete", X), ("gappy", Xg)):
            paths[key] = os.path.join(d, f"{key}.zarr")
            chunk = max(10_000, len(data) // 20)
            z = zarr.open_array(paths[key], mode="w", shape=data.shape, chunks=(chunk, data.shape[1]), dtype="f8")
            z[:] = data
        MCPCA().fit(paths["complete"])  # warm the compiled loops
        times = {"complete": [], "gappy": []}
        passes = {}
        for _ in range(rounds):
            for key, policy in (("complete", "raise"), ("gappy", "partial")):
                t = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    m = MCPCA(nan_policy=policy).fit(paths[key])
                times[key].append(time.perf_counter() - t)
                passes[key] = (m.n_passes_, m.n_partial_reads_, m.converged_)
        ratio = np.median(np.array(times["gappy"]) / np.array(times["complete"]))
        return [
            f"- complete store: median {np.median(times['complete']):.2f} s, full passes {passes['complete'][0]} "
            f"(+{passes['complete'][1]} read of a spread of blocks), converged {passes['complete'][2]}",
            f"- gappy store, `nan_policy='partial'`: median {np.median(times['gappy']):.2f} s, full passes "
            f"{passes['gappy'][0]} (+{passes['gappy'][1]}), converged {passes['gappy'][2]}",
            f"- ratio gappy / complete (alternated, {rounds} rounds, median of the per-round ratios): {ratio:.2f}",
        ]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "dask_mcpca-bench")
    ap.add_argument("--seeds", type=int, default=6, help="seeds of the factor archives (most rows with a gap)")
    ap.add_argument("--sections", default="table,most,timing", help="comma-separated: table, most, timing")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("MISSING.md"))
    args = ap.parse_args(argv)
    sections = set(args.sections.split(","))
    X, Xg = generated()
    lines = [
        "# Channels offline (benchmarks/missing.py)",
        "",
        f"Command: `python benchmarks/missing.py --rounds {args.rounds} --seeds {args.seeds}"
        + ("" if sections == {"table", "most", "timing"} else f" --sections {args.sections}") + "`; 2-core machine.",
    ]
    if "table" in sections:
        lines += [
            "",
            "| data | nan_policy | top-3 angle to the complete fit (deg) | rows with a gap scored | recall spike "
            "| recall stuck | recall bias | false alarms, rows with a gap | false alarms, complete rows | passes |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += evaluate("generated 200k x 10", X, Xg)
        B, Bg = basic_motions(args.cache)
        lines += evaluate("BasicMotions 8k x 6 (real)", B, Bg)
    if "most" in sections:
        lines += ["", "## Most rows with a gap: one channel offline in 90 % of the rows (angles in degrees)", ""]
        lines += most_rows_with_a_gap(args.seeds, args.cache)
    for n in (200_000, 2_000_000) if "timing" in sections else ():
        lines += ["", f"## Fit time on a Zarr store of 20 chunks ({n:,} x 10)", ""]
        lines += timing(*((X, Xg) if n == len(X) else generated(n=n)), args.rounds)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
