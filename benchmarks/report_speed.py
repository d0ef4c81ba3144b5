"""Time of ``dask-mcpca report`` against one ``dask-mcpca score`` of the same store.

One command::

    python benchmarks/report_speed.py --rows 100000000 --cols 6 --dtype float32 --repeats 3

Generates (or reuses) a Zarr store with :mod:`make_store`, fits a model on
its first million rows, then runs the two commands as fresh processes,
alternated (the order rotates each round), ``--repeats`` times, and reports
the medians and their ratio.  Both read the whole store once with the same
model: ``score`` writes the per-row outputs to a new Zarr store, ``report``
writes a PNG and an events CSV.  The target of the "Working with real
archives" issue is ``report`` within 1.5x of ``score``.  Writes the
``report-speed`` section of ``RESULTS.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import machine_info, update_section
from make_store import make_store

__all__ = ["time_commands"]


def _run(args: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dask_mcpca", *args], check=True, capture_output=True)
    return time.perf_counter() - t


def time_commands(store: str, model: str, repeats: int, tmp: Path) -> dict[str, list[float]]:
    """Seconds of each command per round, alternated."""
    commands = {
        "score": ["score", store, "--model", model, "--output", str(tmp / "scores.zarr"), "--overwrite",
                  "--no-progress"],
        "report": ["report", store, "--model", model, "--output", str(tmp / "report.png"), "--no-progress"],
    }
    times = {name: [] for name in commands}
    names = list(commands)
    for r in range(repeats):
        for name in names[r % 2 :] + names[: r % 2]:
            times[name].append(_run(commands[name]))
            print(f"round {r + 1}/{repeats}  {name:7s} {times[name][-1]:7.2f} s", flush=True)
    return times


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000_000)
    ap.add_argument("--cols", type=int, default=6)
    ap.add_argument("--dtype", choices=("float64", "float32"), default="float32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    import numpy as np

    from dask_mcpca import MCPCA
    from dask_mcpca._io import as_row_blocks

    info = make_store(a.rows, a.cols, dtype=a.dtype)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = tmp / "model.json"
        MCPCA().fit(np.asarray(as_row_blocks(str(info.path))[:1_000_000])).save(model)
        times = time_commands(str(info.path), str(model), a.repeats, tmp)
    med = {k: statistics.median(v) for k, v in times.items()}
    text = "\n".join([
        f"## Report against score: {a.rows:,} x {a.cols} {a.dtype} Zarr store",
        "",
        f"Command: `python benchmarks/report_speed.py --rows {a.rows} --cols {a.cols} --dtype {a.dtype} "
        f"--repeats {a.repeats}`. Fresh processes, alternated, medians; "
        f"1-min load average before / after: {load:.1f} / {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores.",
        "",
        "| command | median s | runs s |",
        "| --- | ---: | --- |",
        *[f"| `dask-mcpca {k}` | {med[k]:.1f} | {', '.join(f'{t:.1f}' for t in v)} |" for k, v in times.items()],
        "",
        f"report / score: **{med['report'] / med['score']:.2f}** (target: at most 1.5).",
    ])
    print(text)
    if not a.no_write:
        update_section("report-speed", text, machine=machine_info())


if __name__ == "__main__":
    main()
