"""Time of ``dask-mcpca report`` against one ``dask-mcpca score`` of the same store.

One command::

    python benchmarks/report_speed.py --rows 100000000 --cols 6 --dtype float32 --repeats 3

With drift windows (``report --window``), and the peak memory at several sizes::

    python benchmarks/report_speed.py --rows 1000000 20000000 --cols 6 --dtype float32 --window 100000

Generates (or reuses) a Zarr store with :mod:`make_store`, fits a model on
its first million rows, then runs the two commands as fresh processes,
alternated (the order rotates each round), ``--repeats`` times, and reports
the medians and their ratio.  Both read the whole store once with the same
model: ``score`` writes the per-row outputs to a new Zarr store, ``report``
writes a PNG and an events CSV (and windows.csv with ``--window``).  The
target of the "Working with real archives" issue is ``report`` within 1.5x
of ``score``; issue 22's: ``report --window`` within 1.5x of ``score`` and
its peak memory at 100M rows at most 1.3x that at 1M.  Each child reports
its own peak resident set size (``VmHWM``).  Writes the ``report-speed``
section of ``RESULTS.md`` (``report-window-speed`` with ``--window``).
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


#: The child: the command line, then its own peak resident set size on stderr's last line.
_CHILD = (
    "import sys\n"
    "from dask_mcpca.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "hwm = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM')]\n"
    "print('VmHWM', hwm[0] if hwm else 0, file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


def _run(args: list[str]) -> tuple[float, int]:
    """Seconds and peak RSS (bytes; 0 off Linux) of one command in a fresh process."""
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CHILD, *args], check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    last = done.stderr.strip().splitlines()[-1].split()
    return seconds, int(last[1]) * 1024 if last and last[0] == "VmHWM" else 0


def time_commands(store: str, model: str, repeats: int, tmp: Path, window: str | None = None):
    """Seconds and peak RSS of each command per round, alternated."""
    report = ["report", store, "--model", model, "--output", str(tmp / "report.png"), "--no-progress"]
    if window:
        report += ["--window", window]
    commands = {
        "score": ["score", store, "--model", model, "--output", str(tmp / "scores.zarr"), "--overwrite",
                  "--no-progress"],
        "report": report,
    }
    times = {name: [] for name in commands}
    peaks = {name: [] for name in commands}
    names = list(commands)
    for r in range(repeats):
        for name in names[r % 2 :] + names[: r % 2]:
            seconds, peak = _run(commands[name])
            times[name].append(seconds)
            peaks[name].append(peak)
            print(f"round {r + 1}/{repeats}  {name:7s} {seconds:7.2f} s  peak RSS {peak / 2**20:7.0f} MiB", flush=True)
    return times, peaks


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[100_000_000], help="one store per size")
    ap.add_argument("--cols", type=int, default=6)
    ap.add_argument("--dtype", choices=("float64", "float32"), default="float32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--window", help="report --window (a row count: the stores have no time coordinate)")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    import numpy as np

    from dask_mcpca import MCPCA
    from dask_mcpca._io import as_row_blocks

    load = os.getloadavg()[0]
    lines, medians = [], {}
    for rows in a.rows:
        info = make_store(rows, a.cols, dtype=a.dtype)
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            model = tmp / "model.json"
            MCPCA().fit(np.asarray(as_row_blocks(str(info.path))[:1_000_000])).save(model)
            times, peaks = time_commands(str(info.path), str(model), a.repeats, tmp, a.window)
        med = {k: statistics.median(v) for k, v in times.items()}
        peak = {k: max(v) for k, v in peaks.items()}
        medians[rows] = (med, peak)
        for k, v in times.items():
            lines.append(f"| {rows:,} | `dask-mcpca {k}` | {med[k]:.1f} | {', '.join(f'{t:.1f}' for t in v)} | "
                         f"{peak[k] / 2**20:.0f} |")
    window = f" --window {a.window}" if a.window else ""
    small, large = min(medians), max(medians)
    text = "\n".join([
        f"## Report{window} against score: {a.cols}-column {a.dtype} Zarr stores",
        "",
        f"Command: `python benchmarks/report_speed.py --rows {' '.join(map(str, a.rows))} --cols {a.cols} "
        f"--dtype {a.dtype} --repeats {a.repeats}{window}`. Fresh processes, alternated, medians; peak RSS is "
        f"each child's VmHWM (the largest of its runs); 1-min load average before / after: {load:.1f} / "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores.",
        "",
        "| rows | command | median s | runs s | peak RSS MiB |",
        "| ---: | --- | ---: | --- | ---: |",
        *lines,
        "",
        *[f"{rows:,} rows: report{window} / score time **{m['report'] / m['score']:.2f}** (target: at most 1.5)."
          for rows, (m, _) in medians.items()],
        "",
        f"Peak memory of report{window}, {large:,} rows against {small:,}: "
        f"**{medians[large][1]['report'] / max(medians[small][1]['report'], 1):.2f}x** (target: at most 1.3)."
        if large != small else "",
    ])
    print(text)
    if not a.no_write:
        update_section("report-window-speed" if a.window else "report-speed", text, machine=machine_info())


if __name__ == "__main__":
    main()
