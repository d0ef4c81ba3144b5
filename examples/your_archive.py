"""The README's "your own archive" walk-through, end to end, written under one output folder.

An xarray-written Zarr store with a time coordinate stands in for a plant's
logger: the demo's sensors (``dask_mcpca.demo``), one 1-D variable per
channel along ``time``, written by ``Dataset.to_zarr``.  Then the three
commands of the README: ``fit``, ``score`` and ``report``, called in this process through
``dask_mcpca.cli.main`` (what the ``dask-mcpca`` console script runs: the same arguments, the
same exit status).  Everything goes
to ``--out`` (default ``./out/your_archive``, which git ignores): the store,
``model.json``, ``scores.zarr``, ``archive_report.png`` and ``events.csv``;
a rerun replaces them.  Nothing is written elsewhere (the tracked
``examples/archive_report.png`` is a copy of a run, made by hand).

    python examples/your_archive.py [--rows 500000] [--out /tmp/plant]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

import pandas as pd
import xarray as xr
import zarr

from dask_mcpca.cli import main as dask_mcpca
from dask_mcpca.demo.archive import CHANNELS, make_archive

#: Where a run writes when no ``--out`` is given (relative to the working folder; ``out/`` is git-ignored).
DEFAULT_OUT = os.path.join("out", "your_archive")


def write_plant_archive(path: str, rows: int) -> None:
    """The demo's sensors as an xarray store: ``T1 ... V4`` along a 1 s ``time`` axis."""
    sensors, _, _ = make_archive(path + ".demo", n_rows=rows, seed=0)
    X = zarr.open_array(sensors, mode="r")[:]
    time = pd.date_range("2025-01-01", periods=rows, freq="1s")
    ds = xr.Dataset({c: ("time", X[:, j], {"units": "a.u."}) for j, c in enumerate(CHANNELS)}, coords={"time": time})
    ds.chunk({"time": 131_072}).to_zarr(path, mode="w")
    shutil.rmtree(path + ".demo")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    store = os.path.join(args.out, "plant.zarr")
    write_plant_archive(store, args.rows)
    model = os.path.join(args.out, "model.json")
    commands = [
        ["fit", store, "--nan-policy", "omit", "--output", model, "--overwrite"],
        ["score", store, "--model", model, "--output", os.path.join(args.out, "scores.zarr"), "--overwrite"],
        ["report", store, "--model", model, "--max-gap", "2", "--output", os.path.join(args.out, "archive_report.png"),
         "--events", os.path.join(args.out, "events.csv")],
    ]
    for command in commands:  # as `dask-mcpca fit ...` in a shell; stop at the first that fails
        if status := dask_mcpca(command):
            sys.exit(status)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
