"""A wide kernel pass's blocks with and without the bulk's kept plain sums (issue 37 point 1).

One command::

    python benchmarks/bulk_block.py --cols 100 300 1000 --rounds 5

Per width, four row blocks of 80 MB in memory (correlated rows, a robust step's two flat-top
kernels of their precision: the default solver's 97.5 % and 99 % chi-square radii) are handed to
``_block.block_stats`` by a pool of 2 threads, one BLAS thread each, as dask's threaded scheduler
hands a pass's blocks to its workers.  Three plans are alternated round by round: every row
weighed by its SYRK (the pass without :mod:`dask_mcpca._bulk`), the first pass that collects the
bulk's plain sums, and a later pass that uses them; and ``X.T @ X`` of the same blocks (numpy's
SYRK) in the same pool; and the three plans again with every quadratic form in float64 (without
:mod:`dask_mcpca._screen`'s single-precision screen).  Reported: medians of the rounds' wall
times, and each over ``X.T @ X``.
Writes the section ``bulk-block`` of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.stats import chi2
from threadpoolctl import threadpool_limits

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import blas_info, update_section  # noqa: E402

from dask_mcpca import _block, _bulk, _screen  # noqa: E402
from dask_mcpca._stats import PassPlan  # noqa: E402

BLOCK_BYTES = 80_000_000
N_BLOCKS = 4


def _blocks(p: int, seed: int = 0):
    """Four blocks of correlated rows and the robust step's plan of their precision."""
    rng = np.random.default_rng(seed)
    n = BLOCK_BYTES // (8 * p)
    B = rng.normal(size=(p, p)) / np.sqrt(p) + np.eye(p)
    blocks = [rng.normal(size=(n, p)) @ B + 3.0 for _ in range(N_BLOCKS)]
    A = np.linalg.inv(B.T @ B)
    plan = PassPlan(center=np.full(p, 3.0), kernels=np.stack([A, A]),
                    offsets=np.array([chi2.ppf(0.975, p), chi2.ppf(0.99, p)]) / 2)
    return blocks, plan


def measure(p: int, rounds: int) -> dict:
    blocks, plan = _blocks(p)
    collect = replace(plan, bulk=_bulk.box_for(plan, None))
    kept = _block.block_stats(blocks[0], collect).bulk.plain * N_BLOCKS  # any sums of the right shape
    use = replace(plan, bulk=_bulk.box_for(plan, _bulk.KeptBulk(collect.bulk, kept, 0, None)))

    def one(job):
        X, pl = job
        with threadpool_limits(1):
            return X.T @ X if pl is None else _block.block_stats(X, pl)

    times = {name: [] for name in ("every row", "collect", "use", "X.T @ X", *DOUBLE)}
    screened = _screen.SCREEN_FEATURES
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(one, [(X, use) for X in blocks]))  # compile and warm up
        for _ in range(rounds):
            for name, pl in (("every row", plan), ("collect", collect), ("use", use), ("X.T @ X", None),
                             *zip(DOUBLE, (plan, collect, use), strict=True)):
                _screen.SCREEN_FEATURES = 10**9 if name in DOUBLE else screened  # every form in float64
                t = time.perf_counter()
                list(pool.map(one, [(X, pl) for X in blocks]))
                times[name].append(time.perf_counter() - t)
    _screen.SCREEN_FEATURES = screened
    return {name: float(np.median(v)) for name, v in times.items()}


#: The same plans with every quadratic form in double precision (no single-precision screen, :mod:`_screen`).
DOUBLE = ("every row, double", "collect, double", "use, double")


def report(results: dict, command: str) -> str:
    lines = [
        "## A wide kernel pass's blocks with and without the bulk's kept sums (issue 37 point 1)",
        "",
        f"Command: `{command}`. {N_BLOCKS} blocks of {BLOCK_BYTES // 10**6} MB in memory, float64, "
        "handed to `_block.block_stats` by 2 threads (one BLAS thread each); a robust step's two flat-top "
        "kernels (chi-square 97.5 % and 99 %) of the rows' precision. Medians of alternated rounds, wall s "
        f"(each over `X.T @ X` of the same blocks in the same pool). BLAS: {blas_info()}.",
        "",
        "| p | rows per block | every row weighed s | collecting pass s | later pass (kept sums) s | `X.T @ X` s "
        "| every row / `X.T @ X` | collecting / `X.T @ X` | later / `X.T @ X` "
        "| the same three, every form in float64 |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    kinds = ("every row", "collect", "use")
    for p, r in results.items():
        x = r["X.T @ X"]
        lines.append(f"| {p} | {BLOCK_BYTES // (8 * p):,} | " + " | ".join(f"{r[k]:.3f}" for k in kinds)
                     + f" | {x:.3f} | " + " | ".join(f"{r[k] / x:.2f}" for k in kinds)
                     + " | " + ", ".join(f"{r[k] / x:.2f}" for k in DOUBLE) + " |")
    lines += ["", f"Forms screened in single precision from p = {_screen.SCREEN_FEATURES} (`_screen.SCREEN_FEATURES`): "
              "a row is taken as inside the first flat top where its single-precision form and a worst-case bound "
              "of its error place it there; the others get their float64 form. The last column: the same plans "
              "with every form in float64, alternated in the same rounds."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cols", type=int, nargs="+", default=[100, 300, 1000])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    results = {p: measure(p, a.rounds) for p in a.cols}
    text = report(results, "python benchmarks/bulk_block.py " + " ".join(sys.argv[1:]))
    print(text)
    if not a.no_write:
        update_section("bulk-block", text)


if __name__ == "__main__":
    main()
