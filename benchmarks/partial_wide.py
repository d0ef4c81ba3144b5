"""Rows with gaps at wide p: ``nan_policy="partial"`` against the complete fit (issue 37, point 2).

A factor archive (5 factors with loadings of scale 3 to 1 on p channels,
each channel with its own noise variance, uniform in 0.5-2), float32, in a
Zarr store of 20 row chunks, once complete and once with 1 % of its cells
NaN at random: at p = 300, 1 - 0.99**300 = 95 % of the rows have a gap,
each in its own place, so almost no two rows share a pattern of observed
cells.  Each round fits the complete store (``nan_policy="raise"``) and the
gappy one (``"partial"``) one after the other, in one process;
reported are the medians of the times and of the per-round ratios, of
wall time and of the process's CPU time (which other work on a shared
machine disturbs less).

The real recordings (aeon's BasicMotions, 8,000 x 6, and Daphnet
S06R02E0, 7,000 x 9, fetched as in ``robustness.py``) are fitted in memory,
complete against 1 % NaN cells, the same way.

``--profile`` prints, for the widest gappy store, the functions that take
the most time in one partial fit run on the synchronous scheduler.

Usage::

    python benchmarks/partial_wide.py [--rows 200000] [--cols 100 300] [--rounds 3]
        [--cache ~/.cache/dask_mcpca-bench] [--profile] [--out benchmarks/MISSING.md]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import zarr

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import update_section  # noqa: E402

from dask_mcpca import MCPCA  # noqa: E402

__all__ = ["factor_rows", "with_gaps", "alternate"]

#: Share of the cells set to NaN.
NAN_SHARE = 0.01

#: Row chunks per store.
CHUNKS = 20


def factor_rows(n: int, p: int, seed: int = 0, k: int = 5) -> np.ndarray:
    """``n`` rows of a ``k``-factor model on ``p`` channels, float32."""
    rng = np.random.default_rng(seed)
    L = rng.normal(size=(p, k)) * np.linspace(3.0, 1.0, k)
    noise = rng.uniform(0.5, 2.0, p)
    out = np.empty((n, p), np.float32)
    for a in range(0, n, 50_000):  # in pieces: float64 temporaries of 50k rows
        b = min(n, a + 50_000)
        out[a:b] = rng.normal(size=(b - a, k)) @ L.T + rng.normal(size=(b - a, p)) * np.sqrt(noise)
    return out


def with_gaps(X: np.ndarray, share: float = NAN_SHARE, seed: int = 1) -> np.ndarray:
    """A copy of ``X`` with ``share`` of its cells NaN, at random."""
    rng = np.random.default_rng(seed)
    out = X.copy()
    out[rng.random(X.shape) < share] = np.nan
    return out


def _store(path: str, X: np.ndarray) -> str:
    chunk = -(-len(X) // CHUNKS)
    z = zarr.open_array(path, mode="w", shape=X.shape, chunks=(chunk, X.shape[1]), dtype=X.dtype)
    z[:] = X
    return path


def _fit(data, policy: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MCPCA(nan_policy=policy).fit(data)


def alternate(complete, gappy, rounds: int) -> dict:
    """Complete and partial fits alternated ``rounds`` times: medians of the times and ratios."""
    _fit(complete, "raise")  # warm the compiled loops and caches
    t_c, t_g, c_c, c_g = [], [], [], []
    for _ in range(rounds):
        for data, policy, out, cpu in ((complete, "raise", t_c, c_c), (gappy, "partial", t_g, c_g)):
            t, c = time.perf_counter(), time.process_time()
            m = _fit(data, policy)
            out.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        passes = m.n_passes_
    return {"complete": float(np.median(t_c)), "partial": float(np.median(t_g)),
            "ratio": float(np.median(np.array(t_g) / np.array(t_c))),
            "cpu_ratio": float(np.median(np.array(c_g) / np.array(c_c))), "passes": passes}


def _row(name: str, gappy: np.ndarray, r: dict) -> str:
    obs = ~np.isnan(gappy)
    share = float((~obs.all(axis=1)).mean())
    return (f"| {name} | {share:.0%} | {r['complete']:.2f} | {r['partial']:.2f} | {r['ratio']:.2f} "
            f"| {r['cpu_ratio']:.2f} | {r['passes']} |")


def profile(path: str, top: int = 20) -> str:
    """The ``top`` functions by own time of one partial fit of ``path``, synchronous scheduler."""
    import dask

    pr = cProfile.Profile()
    with dask.config.set(scheduler="synchronous"):
        pr.enable()
        _fit(path, "partial")
        pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--cols", type=int, nargs="+", default=[100, 300])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "dask_mcpca-bench")
    ap.add_argument("--no-real", action="store_true", help="skip the real recordings")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", type=Path, default=HERE / "MISSING.md")
    ap.add_argument("--note", default="", help="a line printed under the table (what the run measured)")
    args = ap.parse_args(argv)
    lines = [
        "## Wide p: 1 % NaN cells (benchmarks/partial_wide.py)",
        "",
        f"Command: `python benchmarks/partial_wide.py --rows {args.rows} --cols {' '.join(map(str, args.cols))} "
        f"--rounds {args.rounds}`; {os.cpu_count()}-core machine shared with other work, so only the "
        "alternated ratios compare across runs.",
        "",
        "| data | rows with a gap | complete fit (s, median) | partial fit (s, median) "
        "| partial / complete (median of rounds) | same, CPU seconds of the process | passes |",
        "|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as d:
        for p in args.cols:
            X = factor_rows(args.rows, p)
            Xg = with_gaps(X)
            c = _store(os.path.join(d, f"c{p}.zarr"), X)
            g = _store(os.path.join(d, f"g{p}.zarr"), Xg)
            lines.append(_row(f"factor {args.rows // 1000}k x {p} float32, Zarr", Xg, alternate(c, g, args.rounds)))
            print(lines[-1], flush=True)
            del X
        if not args.no_real:
            from robustness import sensor_data

            for name, X in sensor_data(args.cache).items():
                Xg = with_gaps(X)
                lines.append(_row(f"{name} {len(X) // 1000}k x {X.shape[1]} (real), numpy", Xg,
                                  alternate(X, Xg, max(args.rounds, 5))))
                print(lines[-1], flush=True)
        if args.note:
            lines += ["", args.note]
        update_section("partial-wide", "\n".join(lines), path=args.out)
        if args.profile:
            print(profile(g))


if __name__ == "__main__":
    main()
