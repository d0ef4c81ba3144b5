"""The default ``n_components`` for wide data, decided by measurement (issue 37 point 1).

One command::

    python benchmarks/wide_components.py --cols 300 1000 --rounds 3

A wide sensor archive is generated as real ones are shaped: ``FACTORS`` common factors of
decreasing strength and each channel's own noise, of a spread that differs by channel (0.2-1.0 of
a unit), standardised channel by channel.  ``MCPCA(n_components=k)`` is fitted on ``--rows`` rows
(a dask array of 10 blocks) for k = None (every component: the default) and for smaller k, the
fits alternated round by round; each model then judges ``--test-rows`` new rows of the same
archive, one in 100 of them with one cell off by ``SPIKE`` of its channel's own noise (a cell
fault that no component explains).  Reported, per width and k: the fit's wall time (median of
rounds) and its time outside the passes (the client's work), the time to judge the new rows, the
share of clean new rows flagged and of the faulty rows found.

With k < p the model is probabilistic PCA's: the k components and one variance for every
discarded direction (``docs/algorithm.md``), so the distance of a row weighs its residual by
that average, not by each channel's own noise.  Writes the section ``wide-components`` of
``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import dask.array as da
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import PassClock, update_section  # noqa: E402

from dask_mcpca import MCPCA, BreakdownWarning  # noqa: E402

#: Common factors of the generated archive, and their spreads (strongest first).
FACTORS = 10
FACTOR_SD = np.geomspace(10.0, 1.0, FACTORS)

#: A faulty cell is off by this many of its channel's own noise SDs.
SPIKE = 10.0


def archive(n: int, p: int, seed: int, faults: bool = False):
    """Rows of the archive (standardised by the true channel spreads) and, with ``faults``, the mask of
    the rows given a faulty cell.  The loadings and noise spreads depend on ``p`` only."""
    rng = np.random.default_rng(p)
    L = rng.normal(size=(FACTORS, p)) * FACTOR_SD[:, None] / np.sqrt(p) * 3
    noise = rng.uniform(0.2, 1.0, p)
    sd = np.sqrt((L**2).sum(axis=0) + noise**2)
    rows = np.random.default_rng(seed)
    X = rows.normal(size=(n, FACTORS)) @ L + rows.normal(size=(n, p)) * noise
    bad = np.zeros(n, bool)
    if faults:
        bad = rows.random(n) < 0.01
        channel = rows.integers(0, p, bad.sum())
        X[np.flatnonzero(bad), channel] += SPIKE * noise[channel] * rows.choice([-1, 1], bad.sum())
    return X / sd, bad


def measure(p: int, rows: int, test_rows: int, ks: list, rounds: int, clock: PassClock) -> list[dict]:
    X, _ = archive(rows, p, seed=1)
    Xd = da.from_array(X, chunks=(rows // 10, p))
    T, bad = archive(test_rows, p, seed=2, faults=True)
    MCPCA(n_components=ks[-1]).fit(Xd)  # compile and warm up
    out = {k: {"fit": [], "client": [], "judge": []} for k in ks}
    for r in range(rounds):
        for k in ks[r % len(ks):] + ks[:r % len(ks)]:
            clock.seconds = 0.0
            t = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model = MCPCA(n_components=k).fit(Xd)
            fit = time.perf_counter() - t
            breakdown = any(issubclass(w.category, BreakdownWarning) for w in caught)
            t = time.perf_counter()
            flags = np.asarray(model.is_outlier(T))
            out[k]["judge"].append(time.perf_counter() - t)
            out[k]["fit"].append(fit)
            out[k]["client"].append(fit - clock.seconds)
            cells = np.asarray(model.cell_outliers(T)).any(axis=1)
            out[k].update(false_alarms=flags[~bad].mean(), recall=flags[bad].mean(), passes=model.n_passes_,
                          cells=cells[~bad].mean(), breakdown=breakdown)
        print(p, r, {str(k): round(v["fit"][-1], 2) for k, v in out.items()}, flush=True)
    medians = ("fit", "client", "judge")
    return [{"p": p, "k": k, "n_faulty": int(bad.sum()), **{m: float(np.median(v[m])) for m in medians},
             **{m: v[m] for m in ("false_alarms", "recall", "passes", "cells", "breakdown")}}
            for k, v in out.items()]


def report(results: list[dict], command: str, rows: int, test_rows: int) -> str:
    lines = [
        "## The default `n_components` for wide data (benchmarks/wide_components.py)",
        "",
        f"Command: `{command}`. A generated archive of {FACTORS} factors (spreads 10 to 1) and each channel's "
        f"own noise (0.2-1.0), standardised; fits on {rows:,} rows (a dask array of 10 blocks, local threads), "
        f"alternated, medians; judged on {test_rows:,} new rows, 1 % of them with one cell off by {SPIKE:g} of "
        "its channel's noise. Client s: the fit's time outside its passes. Clean rows with a flagged cell: "
        "`cell_outliers` on the clean new rows; BreakdownWarning: whether the fit (on clean rows) raised it.",
        "",
        "| p | `n_components` | fit s | client s | passes | judge new rows s | clean rows flagged "
        "| faulty rows found | clean rows with a flagged cell | BreakdownWarning |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        found = round(r["recall"] * r["n_faulty"])
        lines.append(f"| {r['p']} | {r['k']} | {r['fit']:.2f} | {r['client']:.2f} | {r['passes']} | "
                     f"{r['judge']:.2f} | {r['false_alarms']:.4f} | {r['recall']:.3f} ({found} of {r['n_faulty']}) | "
                     f"{r['cells']:.3f} | {'yes' if r['breakdown'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cols", type=int, nargs="*", default=[300, 1000])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--test-rows", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    clock = PassClock()
    results = []
    for p in a.cols:
        results += measure(p, a.rows, a.test_rows, [None, FACTORS, 5 * FACTORS], a.rounds, clock)
    text = report(results, "python benchmarks/wide_components.py " + " ".join(sys.argv[1:]), a.rows, a.test_rows)
    print(text)
    if not a.no_write:
        update_section("wide-components", text)


if __name__ == "__main__":
    main()
