"""Which channel, and the report's memory: measured on the demo archive.

One command::

    python benchmarks/archives.py --rows 1000000 10000000 --out /tmp/mcpca-archives

For each size it writes the demo archive (``dask_mcpca.demo``: stuck
sensors, swapped channels, spikes, gaps, with the truth), fits it with
``nan_policy="omit"``, and measures

- attribution: for the flagged rows of each stuck stretch, how often the
  stuck channel is the largest of :meth:`MCPCA.channel_contributions`; for
  the flagged swapped rows, how often the two largest are swapped channels
  (P1<->P3 and P2<->P4 are exchanged); for each ``method``;
- ``dask-mcpca report`` in a fresh process: its peak resident set size
  (``ru_maxrss`` of the child) and time, to show memory flat in n.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

import numpy as np
import zarr

from dask_mcpca import MCPCA
from dask_mcpca.demo.archive import SWAP, make_archive

METHODS = ("whitened", "product", "residual")


def attribution(model, sensors, truth, faults) -> dict:
    """Accuracy of each contribution method on the flagged stuck and swapped rows."""
    kind = zarr.open_array(truth, mode="r")[:]
    flagged = model.is_outlier(sensors).compute()
    stuck_channel = np.full(len(kind), -1)
    for start, length, channel, _ in faults.stuck:
        stuck_channel[int(start) : int(start + length)] = int(channel)
    swapped_channels = np.flatnonzero(SWAP != np.arange(len(SWAP)))
    stuck, swapped = flagged & (kind == 2), flagged & (kind == 3)
    out = {"stuck rows": int(stuck.sum()), "swapped rows": int(swapped.sum())}
    for method in METHODS:
        c = model.channel_contributions(sensors, method=method)
        top_stuck = c[stuck].argmax(axis=1).compute() if stuck.any() else np.empty(0, int)
        c_sw = c[swapped].compute()
        top2 = np.argsort(-c_sw, axis=1)[:, :2]
        out[method] = (
            float(np.mean(top_stuck == stuck_channel[stuck])),
            float(np.mean(np.isin(top2, swapped_channels).all(axis=1))),
        )
    return out


def report_memory(sensors: str, model_path: str, out: str) -> tuple[float, float]:
    """Peak RSS (bytes) and seconds of ``dask-mcpca report`` in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "dask_mcpca", "report", sensors, "--model", model_path, "--output",
         os.path.join(out, "report.png"), "--no-progress"],
        check=True, stdout=subprocess.DEVNULL,
    )
    elapsed = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if peak <= before:
        print("warning: an earlier child had a higher peak; run one size per call", file=sys.stderr)
    return peak * 1024.0, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--out", default="mcpca-archives")
    parser.add_argument("--no-attribution", action="store_true")
    args = parser.parse_args()
    for n in args.rows:
        folder = os.path.join(args.out, f"rows-{n}")
        model_path = os.path.join(folder, "model.json")
        if args.no_attribution and os.path.exists(model_path):  # reuse the archive and its fit
            sensors = os.path.join(folder, "sensors.zarr")
        else:
            sensors, truth, faults = make_archive(folder, n_rows=n, seed=0)
            model = MCPCA(nan_policy="omit").fit(sensors)
            model.save(model_path)
        print(f"{n:>12,} rows", flush=True)
        if not args.no_attribution:
            for key, value in attribution(model, sensors, truth, faults).items():
                if isinstance(value, tuple):
                    value = f"stuck top-1 {value[0]:.2%}, swapped top-2 {value[1]:.2%}"
                print(f"    {key:>13}: {value}", flush=True)
        peak, seconds = report_memory(sensors, model_path, folder)
        print(f"    report: peak RSS {peak / 2**20:.0f} MiB, {seconds:.1f} s", flush=True)


if __name__ == "__main__":
    main()
