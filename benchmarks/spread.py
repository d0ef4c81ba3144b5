"""How many spread blocks the row sample needs: time-clustered faults and regimes.

On a store of at least ``_passes.PARTIAL_MIN_BLOCKS`` row blocks the default
fit draws its robust start's row sample from an evenly spaced spread of
blocks instead of a full pass (``_passes.spread_blocks``).  Fewer blocks make
the sample cheaper (on 20 blocks, 8 of them cost 0.4 of a pass) and see the
archive at fewer times.  This compares, on archives of 20 row blocks whose
trouble is clustered in time (where a spread could miss it):

- ``full``: the sample drawn in a full first pass (3 full passes);
- ``spread 8``: at least 8 blocks (the rule up to 0.4);
- ``spread 4``: at least 4 blocks.

Data (known truth): 1,000,000 rows x 10 channels in 20 blocks of 50,000 rows,
time-ordered; ``x = W z + 0.3 e`` with three AR(1) factors (phi = 0.99),
W normal.  Per seed a stretch of the given share of rows starts at a random
row, and holds:

- **bias run**: one channel off by 6 of its sd (faults, to flag);
- **stuck run**: one channel holding the value it had when the run began;
- **regime**: the factors shifted by 2.5 sd along a random direction, with
  the channels' relations unchanged (legitimate: it lies in the subspace; the
  figure is the share of its rows flagged, which a single Gaussian model
  cannot bring to 0, compared between the samplers);
- **weekly regime**: the same shift in 2 of every 7 periods of 70,000 rows
  (not aligned with the blocks).

Figures, medians over seeds: top-3 subspace angle to the clean rows'
axes (degrees), the share of the stretch's rows flagged, the share of the
other rows flagged, full passes and blocks read.  One command::

    python benchmarks/spread.py [--seeds 5]

Writes the ``spread`` section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import dask.array as da
import numpy as np
from scipy import linalg, signal

sys.path.insert(0, os.path.dirname(__file__))

from _results import update_section

from dask_mcpca import MCPCA, _passes

N, P, BLOCK = 1_000_000, 10, 50_000
SAMPLERS = {"full": None, "spread 8": 8, "spread 4": 4}
CASES = (("bias run", 0.05), ("bias run", 0.2), ("stuck run", 0.1), ("regime", 0.1), ("regime", 0.3),
         ("weekly regime", 2 / 7))


def make(case: str, share: float, seed: int):
    """(X, truth axes (P x 3), stretch mask) for one case and seed."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(P, 3))
    phi = 0.99
    z = signal.lfilter([np.sqrt(1 - phi**2)], [1, -phi], rng.normal(size=(N, 3)), axis=0)
    X = z @ W.T + 0.3 * rng.normal(size=(N, P))
    axes = linalg.eigh(W @ W.T + 0.09 * np.eye(P))[1][:, ::-1][:, :3]
    mask = np.zeros(N, bool)
    if case == "weekly regime":
        period = 70_000
        mask[(np.arange(N) % (7 * period)) >= 5 * period] = True
    else:
        start = int(rng.integers(0, N - int(share * N)))
        mask[start : start + int(share * N)] = True
    j = int(rng.integers(P))
    sd = X.std(axis=0)
    if case == "bias run":
        X[mask, j] += 6 * sd[j]
    elif case == "stuck run":
        X[mask, j] = X[np.flatnonzero(mask)[0], j]
    else:
        d = rng.normal(size=3)
        X[mask] += 2.5 * (d / np.linalg.norm(d)) @ W.T
    return X, axes, mask


def subspace_angle(A: np.ndarray, B: np.ndarray) -> float:
    return float(np.degrees(linalg.subspace_angles(A, B).max()))


def fit(X: np.ndarray, min_blocks: int | None):
    old = (_passes.PARTIAL_MIN_BLOCKS, _passes.SPREAD_MIN_BLOCKS)
    try:
        if min_blocks is None:
            _passes.PARTIAL_MIN_BLOCKS = 10**9
        else:
            _passes.SPREAD_MIN_BLOCKS = min_blocks
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = MCPCA().fit(da.from_array(X, chunks=(BLOCK, -1)))
    finally:
        _passes.PARTIAL_MIN_BLOCKS, _passes.SPREAD_MIN_BLOCKS = old
    return m


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    lines = [
        "| case | sampler | top-3 angle (deg) | stretch flagged | other rows flagged | passes + blocks read |",
        "|---|---|---|---|---|---|",
    ]
    for case, share in CASES:
        rows = {name: [] for name in SAMPLERS}
        for seed in range(args.seeds):
            X, axes, mask = make(case, share, seed)
            for name, min_blocks in SAMPLERS.items():
                m = fit(X, min_blocks)
                flags = np.asarray(m.is_outlier(X))
                rows[name].append((subspace_angle(m.components_[:3].T, axes), flags[mask].mean(),
                                   flags[~mask].mean(), f"{m.n_passes_} + {m.n_blocks_read_}"))
        for name, r in rows.items():
            a, s, o, passes = zip(*r, strict=True)
            lines.append(f"| {case}, {share:.0%} of rows | {name} | {statistics.median(a):.2f} (worst {max(a):.2f}) | "
                         f"{statistics.median(s):.3f} | {statistics.median(o):.4f} | {passes[0]} |")
            print(lines[-1], flush=True)
    body = "\n".join([
        "## Row sample: a spread of 4 or 8 blocks, or a full first pass (time-clustered faults and regimes)", "",
        f"`python benchmarks/spread.py --seeds {args.seeds}` ({time.perf_counter() - t0:.0f} s). "
        f"{N:,} x {P} rows in {N // BLOCK} blocks, time-ordered; medians over seeds.", "", *lines])
    if not args.no_write:
        update_section("spread", body)


if __name__ == "__main__":
    main()
