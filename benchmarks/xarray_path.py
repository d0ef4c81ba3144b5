"""The xarray archive path against the plain path: ``dask-mcpca fit`` and ``score`` on the same data (issue 34).

Target: a store written by xarray (one 1-D variable per channel along a
``time`` coordinate, as a plant's logger writes it) fits and scores within
1.2x the time of the same values as one 2-D Zarr array.

The script writes the data once in each layout: ``rows`` x ``channels``
float32 (a few correlated factors, noise and ~1 % outlying rows; chunks of
``--chunk`` rows), a plain 2-D Zarr array and an xarray ``Dataset`` (time at
1 s, its ``channels`` attribute giving the order).  Then, for ``--rounds``
rounds, it runs the command line as a user does, each command in a fresh
process, the two layouts alternately (their order swapped every round):
``fit`` and then ``score`` into a new store.  Each run gives

- wall: the process, start to exit (the interpreter's start and imports
  included, the same for both);
- compute: the time the command prints (``time 1.4 s``, ``scored ... in
  1.2 s``): opening the archive, the passes and, for ``score``, the writes;
- CPU: user + system seconds of the process (steadier than wall on a
  machine shared with other work).

Medians and the ratios (xarray / plain) are written to a section of
``benchmarks/XARRAY_PATH.md`` (``--section``, ``--title``), with the median
wall time of ``dask-mcpca --version`` (the command line's start) and the heavy
libraries it imports.  The two fits must agree (the same values in a
different layout): the script compares the models' components.  A baseline:
``--package DIR`` runs the commands of another checkout (``git archive``
of an older commit), in its own section.

Run: ``python benchmarks/xarray_path.py [--rows 2000000] [--rounds 5] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import cpu_line, update_section

OUT = Path(__file__).resolve().parent / "XARRAY_PATH.md"
LAYOUTS = ("plain", "xarray")
COMMANDS = ("fit", "score")
#: The time a command prints: ``passes 3   rows 2,000,000   time 1.4 s`` and ``scored 2,000,000 rows in 1.2 s``.
PRINTED = {"fit": re.compile(r"\btime ([\d.]+) (s|min)\b"), "score": re.compile(r"rows in ([\d.]+) (s|min)\b")}


def make_data(rows: int, channels: int, chunk: int, seed: int = 0) -> np.ndarray:
    """``rows`` x ``channels`` float32: 3 factors through fixed loadings, noise, 1 % rows shifted."""
    rng = np.random.default_rng(seed)
    loadings = rng.normal(size=(3, channels)).astype(np.float32)
    X = np.empty((rows, channels), np.float32)
    for start in range(0, rows, chunk):
        m = min(chunk, rows - start)
        block = rng.normal(size=(m, 3)).astype(np.float32) @ loadings
        block += 0.1 * rng.normal(size=(m, channels)).astype(np.float32)
        block[rng.random(m) < 0.01] += 5.0
        X[start : start + m] = block
    return X


def write_layouts(X: np.ndarray, chunk: int, folder: Path) -> dict[str, Path]:
    """The same values as a plain 2-D Zarr array and as a Dataset xarray wrote, one variable per channel."""
    import pandas as pd
    import xarray as xr
    import zarr

    plain, labelled = folder / "plain.zarr", folder / "xarray.zarr"
    z = zarr.create_array(plain, shape=X.shape, chunks=(chunk, X.shape[1]), dtype=X.dtype, overwrite=True)
    z[:] = X
    names = [f"ch{j:02d}" for j in range(X.shape[1])]
    time_ = pd.date_range("2024-01-01", periods=X.shape[0], freq="1s")
    ds = xr.Dataset({name: ("time", X[:, j]) for j, name in enumerate(names)}, coords={"time": time_},
                    attrs={"channels": names})
    with warnings.catch_warnings():  # Zarr: consolidated metadata is not part of the v3 specification
        warnings.simplefilter("ignore")
        ds.chunk({"time": chunk}).to_zarr(labelled, mode="w")
    return {"plain": plain, "xarray": labelled}


#: The checkout whose ``dask_mcpca`` the commands run (``--package``: another one, for a baseline).
PACKAGE = [str(Path(__file__).resolve().parent.parent)]


def _environment() -> dict:
    """The children's environment: the package measured first on the path, and quiet."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": PACKAGE[0] + (os.pathsep + path if path else ""), "PYTHONWARNINGS": "ignore"}


def run_command(args: list[str]) -> tuple[float, float, str]:
    """``dask-mcpca ARGS`` in a fresh process: (wall seconds, CPU seconds, stdout)."""
    cmd = [sys.executable, "-m", "dask_mcpca", *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_environment(), cwd=PACKAGE[0])
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def _printed(command: str, out: str) -> float:
    match = PRINTED[command].search(out)
    if match is None:
        raise RuntimeError(f"no time in the output of {command}: {out!r}")
    value = float(match.group(1))
    return value * 60 if match.group(2) == "min" else value


def measure(stores: dict[str, Path], folder: Path, rounds: int) -> dict:
    """Medians per (command, layout) of wall, printed compute and CPU seconds."""
    times: dict = {(c, layout): [] for c in COMMANDS for layout in LAYOUTS}
    for layout in LAYOUTS:  # warm: numba's cache, the file system's
        run_command(["fit", str(stores[layout]), "-o", str(folder / f"{layout}.json"), "--overwrite",
                     "--no-progress"])
    for r in range(rounds):
        order = LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]
        for command in COMMANDS:
            for layout in order:
                model = str(folder / f"{layout}.json")
                if command == "fit":
                    args = ["fit", str(stores[layout]), "-o", model, "--overwrite"]
                else:
                    args = ["score", str(stores[layout]), "-m", model, "-o", str(folder / f"{layout}_scores.zarr"),
                            "--overwrite"]
                wall, cpu, out = run_command([*args, "--no-progress"])
                times[command, layout].append((wall, _printed(command, out), cpu))
                print(f"round {r + 1} {command:5s} {layout:6s} wall {wall:6.2f} s  compute "
                      f"{times[command, layout][-1][1]:5.1f} s  cpu {cpu:6.2f} s", flush=True)
    return {key: tuple(statistics.median(v[i] for v in values) for i in range(3)) for key, values in times.items()}


def version_time(repeats: int = 5) -> float:
    """Median wall seconds of ``dask-mcpca --version`` in a fresh process."""
    return statistics.median(run_command(["--version"])[0] for _ in range(repeats))


def same_model(folder: Path) -> float:
    """The largest difference between the two fits' components (signs aligned), relative to 1."""
    import json

    saved = (json.loads((folder / f"{layout}.json").read_text())["attributes"]["components_"] for layout in LAYOUTS)
    a, b = (np.reshape(c["data"], c["shape"]) for c in saved)
    signs = np.sign(np.sum(a * b, axis=1))[:, None]
    return float(np.max(np.abs(a - signs * b)))


def _heavy_at_start() -> list[str]:
    """The heavy libraries ``dask-mcpca --version`` imports."""
    code = ("import sys; sys.argv = ['dask-mcpca', '--version']\nfrom dask_mcpca._console import run\n"
            "try:\n    run()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('dask', 'numpy', 'sklearn', 'zarr', 'xarray') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_environment(),
                          cwd=PACKAGE[0])
    return done.stdout.strip().splitlines()[-1]


HEADER = """# The xarray archive path

Written by `benchmarks/xarray_path.py`: the same float32 values, once as a plain 2-D Zarr
array and once as an xarray `Dataset` (one variable per channel, a `time` coordinate at 1 s,
as a plant's logger writes them); `dask-mcpca fit` and then `score` on each, every command
in a fresh process, the layouts alternately. Target (issue 34): the xarray archive within
1.2x of the plain one, and `dask-mcpca --version` without dask, scikit-learn, Zarr or xarray.

- wall: the process from start to exit (the interpreter's start and the imports included);
  compute: the time the command prints (opening the archive, the passes, the writes; to 0.1 s);
  CPU: user + system seconds of the process (steadier than wall on a shared machine).
- Each section names the code it measured; both ran on the machine below, shared with other
  work while measured: compare ratios within a section, not seconds across sections.
"""


def report(medians: dict, args, version: float, heavy: str, difference: float) -> str:
    rows = [
        "| command | measure | plain 2-D Zarr | xarray Dataset | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    for command in COMMANDS:
        for i, measure_ in enumerate(("wall", "compute", "CPU")):
            plain, labelled = medians[command, "plain"][i], medians[command, "xarray"][i]
            rows.append(f"| `{command}` | {measure_} | {plain:.2f} s | {labelled:.2f} s | {labelled / plain:.2f}x |")
    return "\n".join([
        f"## {args.title}",
        "",
        f"`--rows {args.rows} --channels {args.channels} --chunk {args.chunk} --rounds {args.rounds}`: "
        f"{args.rows:,} rows x {args.channels} channels in chunks of {args.chunk:,} rows; medians of "
        f"{args.rounds} rounds.",
        "",
        *rows,
        "",
        f"- The two fits agree: largest difference of their components {difference:.1e}.",
        f"- `dask-mcpca --version`: {version:.2f} s wall (median of 5); heavy libraries it imports: {heavy}.",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--channels", type=int, default=16)
    parser.add_argument("--chunk", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", help="folder for the stores (default: a temporary one, removed)")
    parser.add_argument("--package", help="checkout whose dask_mcpca to run (default: this one), for a baseline")
    parser.add_argument("--section", default="after", help=f"section of {OUT.name} to write (default after)")
    parser.add_argument("--title", default="This version", help="the section's heading (what code it measured)")
    parser.add_argument("--no-write", action="store_true", help=f"print only; leave {OUT.name} alone")
    args = parser.parse_args()
    if args.package:
        PACKAGE[0] = str(Path(args.package).resolve())
    folder = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="mcpca-xarray-path-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        stores = write_layouts(make_data(args.rows, args.channels, args.chunk), args.chunk, folder)
        medians = measure(stores, folder, args.rounds)
        text = report(medians, args, version_time(), _heavy_at_start(), same_model(folder))
    finally:
        if not args.out:
            shutil.rmtree(folder, ignore_errors=True)
    print(text)
    if not args.no_write:
        if not OUT.exists():
            OUT.write_text(HEADER)
        update_section(args.section, text, path=OUT, machine=f"- CPU: {cpu_line()}")


if __name__ == "__main__":
    main()
