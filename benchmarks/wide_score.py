"""``dask-mcpca score`` and ``report`` on a wide store against the copy floor (issue 37 point 4).

One command::

    python benchmarks/wide_score.py --rows 200000 --cols 300 --repeats 5

Generates (or reuses) a float32 Zarr store with :mod:`make_store`, chunked as
docs/performance.md recommends for a store under 1 GiB (16 chunks of whole
rows), fits ``MCPCA()`` once on its first ``--fit-rows`` rows and saves the
model, then runs four commands as fresh processes, alternated (the order
rotates each round), ``--repeats`` times, and reports the medians and the
ratios to the floor:

copy floor
    ``da.from_zarr`` of the store, and per row block one array of each of the
    default outputs of ``score`` (``monitoring``: float32 ``d2``, bool
    ``outlier``, int16 ``top_channel``, int16 ``n_observed``; 9 bytes a
    row) made from the block's first column (a cast, no arithmetic), written
    with ``da.store`` to a new Zarr group with the same row chunks: the same
    bytes read, the same bytes written, the same process start and imports.
arithmetic floor
    The copy floor with ``d2`` computed: per block, in float64 with
    single-threaded BLAS, ``|(x - mean) R|^2`` with ``R`` the symmetric root
    of the model's precision (one GEMM of the block by a p x p matrix, as
    much arithmetic as the distances need), written as float32.  What a
    score at BLAS speed would cost, without the outliers' rules.
score
    ``dask-mcpca score STORE --model M --output OUT --overwrite`` (the
    default outputs).
report
    ``dask-mcpca report STORE --model M --output report.png`` (a PNG and
    the events CSV).

``--before DIR`` also runs ``score`` and ``report`` from a folder holding the package before a
change (``DIR/dask_mcpca``) in the same rounds, and compares their outputs with the installed
package's: the score stores bit for bit, the report's CSV and PNG byte for byte.

The target of issue 37 point 4: both within 1.5x of the copy floor at
p = 300.  Writes ``benchmarks/WIDE_SCORE.md`` (unless ``--no-write``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: This folder (the docs build executes this file without ``__file__`` to render :func:`build_parser`,
#: so the benchmark helpers are imported where they are used).
HERE = Path(globals().get("__file__", "benchmarks/wide_score.py")).resolve().parent
sys.path.insert(0, str(HERE))

__all__ = ["build_parser", "time_commands", "RESULT"]

#: The results file this script writes.
RESULT = HERE / "WIDE_SCORE.md"

#: The copy floor's child: read the store, write arrays of the default outputs' dtypes and rows.
_COPY = (
    "import sys, dask.array as da, numpy as np, zarr\n"
    "X = da.from_zarr(sys.argv[1])\n"
    "first = X[:, 0]\n"
    "arrays = {'d2': first.astype(np.float32), 'outlier': first > 0,\n"
    "          'top_channel': first.astype(np.int16), 'n_observed': first.astype(np.int16)}\n"
    "g = zarr.open_group(sys.argv[2], mode='w')\n"
    "targets = [g.create_array(n, shape=a.shape, chunks=(X.chunks[0][0],), dtype=a.dtype)\n"
    "           for n, a in arrays.items()]\n"
    "da.store(list(arrays.values()), targets, lock=False)\n"
)

#: The arithmetic floor's child: the copy floor, with ``d2`` from one float64 BLAS product a block.
_GEMM = (
    "import json, sys, dask.array as da, numpy as np, zarr\n"
    "from threadpoolctl import threadpool_limits\n"
    "model = json.load(open(sys.argv[3]))\n"
    "X = da.from_zarr(sys.argv[1])\n"
    "def d2(b, mean, root):\n"
    "    with threadpool_limits(1):\n"
    "        Z = (np.asarray(b, np.float64) - mean) @ root\n"
    "        return np.einsum('ij,ij->i', Z, Z).astype(np.float32)\n"
    "mean, root = np.asarray(model['mean'], float), np.asarray(model['root'], float)\n"
    "first = X[:, 0]\n"
    "arrays = {'d2': X.map_blocks(d2, mean, root, drop_axis=1, dtype=np.float32), 'outlier': first > 0,\n"
    "          'top_channel': first.astype(np.int16), 'n_observed': first.astype(np.int16)}\n"
    "g = zarr.open_group(sys.argv[2], mode='w')\n"
    "targets = [g.create_array(n, shape=a.shape, chunks=(X.chunks[0][0],), dtype=a.dtype)\n"
    "           for n, a in arrays.items()]\n"
    "da.store(list(arrays.values()), targets, lock=False)\n"
)

#: The commands' child: ``python -m dask_mcpca``, what the installed ``dask-mcpca`` runs.
_CLI = None


def _run(code: str | None, args: list[str], *, cwd: Path, package: str | None = None) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one child process, run in ``cwd`` (outside the repository:
    ``python -m`` puts the working directory first on ``sys.path``); ``package``: a folder holding the
    ``dask_mcpca`` to run instead of the installed one (put first on ``PYTHONPATH``)."""
    env = dict(os.environ)
    if package is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package, env.get("PYTHONPATH")]))
    started, used = time.perf_counter(), _children_cpu()
    head = ["-m", "dask_mcpca"] if code is None else ["-c", code]
    done = subprocess.run([sys.executable, *head, *args], capture_output=True, text=True, cwd=cwd, env=env)
    if done.returncode:
        raise SystemExit(f"{args[0]} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return time.perf_counter() - started, _children_cpu() - used


def _children_cpu() -> float:
    """User + system CPU seconds of this process's finished children."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _dir_bytes(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def time_commands(store: str, model: str, repeats: int, tmp: Path, before: str | None = None):
    """Seconds of each command per round (fresh processes, the order rotating), and the bytes each wrote.

    ``before``: a folder holding the package before a change; ``score`` and ``report`` then also run from it
    (``score-before``, ``report-before``), in the same rounds, writing their own outputs."""
    def score(out):
        return ["score", store, "--model", model, "--output", str(tmp / out), "--overwrite", "--no-progress"]

    def report(out):
        return ["report", store, "--model", model, "--output", str(tmp / out), "--no-progress"]

    commands = {
        "copy": (_COPY, [store, str(tmp / "copy.zarr")], tmp / "copy.zarr", None),
        "gemm": (_GEMM, [store, str(tmp / "gemm.zarr"), str(tmp / "root.json")], tmp / "gemm.zarr", None),
        "score": (_CLI, score("scores.zarr"), tmp / "scores.zarr", None),
        "report": (_CLI, report("report.png"), None, None),
    }
    if before is not None:
        commands["score-before"] = (_CLI, score("scores_before.zarr"), tmp / "scores_before.zarr", before)
        commands["report-before"] = (_CLI, report("report_before.png"), None, before)
    names = list(commands)
    for code, args, _, package in commands.values():  # once untimed: the page cache and compiled loops
        _run(code, args, cwd=tmp, package=package)
    written = {name: _dir_bytes(out) if out else 0 for name, (_, _, out, _) in commands.items()}
    times, cpu = {name: [] for name in names}, {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            code, args, _, package = commands[name]
            wall, used = _run(code, args, cwd=tmp, package=package)
            times[name].append(wall)
            cpu[name].append(used)
        print(f"round {r + 1}/{repeats}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items()), flush=True)
    return times, cpu, written


def same_outputs(tmp: Path) -> str:
    """Whether the package before the change wrote the same outputs as after (``--before``): every array of
    the score stores compared bit for bit, and the report's events CSV and PNG byte for byte."""
    import numpy as np
    import zarr

    def arrays(path):
        return {name: np.asarray(a[...]) for name, a in zarr.open_group(str(path), mode="r").arrays()}

    a, b = arrays(tmp / "scores_before.zarr"), arrays(tmp / "scores.zarr")
    differ = [n for n in sorted(set(a) | set(b))
              if n not in a or n not in b or a[n].dtype != b[n].dtype or a[n].tobytes() != b[n].tobytes()]
    files = [f for f in ("report.csv", "report.png")
             if (tmp / f).read_bytes() != (tmp / f.replace("report", "report_before")).read_bytes()]
    if not differ and not files:
        return (f"Outputs before and after identical: the score stores' {', '.join(sorted(a))} bit for bit, the "
                "report's events CSV and PNG byte for byte.")
    return f"Outputs DIFFER before and after: {', '.join(differ + files)}."


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="wide_score.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--cols", type=int, default=300)
    ap.add_argument("--chunks", type=int, default=16, help="row chunks of the store (docs/performance.md: 16)")
    ap.add_argument("--fit-rows", type=int, default=100_000, help="rows the model is fitted on, once")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--label", default="", help="a note on the code measured, in the section's title")
    ap.add_argument("--before", default=None,
                    help="a folder holding the package before a change (its dask_mcpca): score and report also run "
                         "from it in the same rounds, and their outputs are compared with the installed package's")
    ap.add_argument("--no-write", action="store_true", help="print, do not update WIDE_SCORE.md")
    return ap


def main(argv=None) -> None:
    a = build_parser().parse_args(argv)
    import numpy as np
    from _results import cpu_line, fmt_bytes
    from make_store import make_store

    from dask_mcpca import MCPCA
    from dask_mcpca._io import as_row_blocks

    info = make_store(a.rows, a.cols, dtype="float32", chunk_rows=math.ceil(a.rows / a.chunks))
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=HERE / "data") as tmp:
        tmp = Path(tmp)
        model = tmp / "model.json"
        fitted = MCPCA().fit(np.asarray(as_row_blocks(str(info.path))[: a.fit_rows]))
        fitted.save(model)
        # d2 = |y P^(1/2)|^2: the precision's symmetric root, for the arithmetic floor
        w, V = np.linalg.eigh(fitted.get_precision())
        root = (V * np.sqrt(np.maximum(w, 0.0))) @ V.T
        (tmp / "root.json").write_text(json.dumps({"mean": fitted.mean_.tolist(), "root": root.tolist()}))
        before = None if a.before is None else str(Path(a.before).resolve())
        times, cpu, written = time_commands(str(info.path), str(model), a.repeats, tmp, before)
        same = same_outputs(tmp) if before is not None else ""
    med = {k: statistics.median(v) for k, v in times.items()}
    labels = {"copy": "copy floor (read + write the default outputs' bytes)",
              "gemm": "arithmetic floor (the copy, `d2` from one float64 GEMM a block)",
              "score": "`dask-mcpca score` (default outputs)", "report": "`dask-mcpca report` (PNG + events CSV)",
              "score-before": "`dask-mcpca score`, before", "report-before": "`dask-mcpca report`, before"}
    title = f"## {a.rows:,} x {a.cols} float32, {a.chunks} chunks" + (f": {a.label}" if a.label else "")
    text = "\n".join([
        title,
        "",
        f"Command: `python benchmarks/wide_score.py --rows {a.rows} --cols {a.cols} --chunks {a.chunks} "
        f"--repeats {a.repeats}{' --before DIR' if a.before else ''}`. Input {fmt_bytes(info.store_bytes)} on disk "
        f"({fmt_bytes(info.nbytes)} raw). Fresh processes, alternated, medians (CPU: the child's user + system "
        "seconds). 1-min load average before / "
        f"after: {load:.1f} / {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {cpu_line()}.",
        "",
        "| command | median s | runs s | median CPU s | written | / copy floor |",
        "| --- | ---: | --- | ---: | ---: | ---: |",
        *[f"| {labels[k]} | {med[k]:.2f} | {', '.join(f'{t:.2f}' for t in v)} | {statistics.median(cpu[k]):.2f} | "
          f"{fmt_bytes(written[k]) if written[k] else 'PNG + CSV'} | {med[k] / med['copy']:.2f} |"
          for k, v in times.items()],
        "",
        f"score / copy floor **{med['score'] / med['copy']:.2f}**, report / copy floor "
        f"**{med['report'] / med['copy']:.2f}** (target: at most 1.5 each); the arithmetic floor / copy floor "
        f"{med['gemm'] / med['copy']:.2f}."
        + (f" Before: score {med['score-before'] / med['copy']:.2f}, report {med['report-before'] / med['copy']:.2f}."
           if a.before else ""),
        *(["", same] if same else []),
    ])
    print(text)
    if not a.no_write:
        _write_section(f"wide-{a.rows}x{a.cols}" + (f"-{a.label}" if a.label else ""), text)


def _write_section(key: str, body: str) -> None:
    import re

    head = ("# Scoring and reporting wide archives against the copy floor\n\n"
            "Written by `benchmarks/wide_score.py` (issue 37 point 4): `dask-mcpca score` (the default outputs) and\n"
            "`dask-mcpca report` on a wide float32 store against the **copy floor**, a process that reads the same\n"
            "store and writes arrays of the same rows and dtypes as `score`'s default outputs (float32 `d2`, bool\n"
            "`outlier`, int16 `top_channel` and `n_observed`: 9 bytes a row), cast from each block's first column\n"
            "with no other arithmetic. Every command runs as a fresh process (interpreter start and imports\n"
            "included), the order rotating each round. Target: both within 1.5x of the floor at p = 300.\n")
    text = RESULT.read_text() if RESULT.exists() else head
    begin, end = f"<!-- begin {key} -->", f"<!-- end {key} -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    RESULT.write_text(text.rstrip() + "\n")


if __name__ == "__main__":
    main()
