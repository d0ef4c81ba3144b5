"""``dask-mcpca score --append`` of the newest rows against a full ``score`` of the archive (issue 22).

Target: appending 10 % new rows costs <= 0.15 of a full ``score``.  The two
are timed alternately in one run, as the command line runs them, in this
process (``dask_mcpca.cli.run_args``: the interpreter's start and imports, paid
by both alike, are left out).  Each round:

1. a full ``score`` of the archive (``benchmarks/make_store.py``: Gaussian
   rows with ~5 % outliers, p columns, float64) into a new store;
2. ``score --append`` into a copy (made untimed) of a store that holds the
   scores of the first ``1 - new`` share of the rows: only the newest rows
   are read, scored and written; the old rows' chunks are hard links.

The medians and their ratio are written between the markers of this
benchmark in ``benchmarks/MONITORING.md`` (the rest of the file is
``monitoring.py``'s).

Run: ``python benchmarks/score_append.py [--rows 2000000] [--rounds 5] [--new 0.1]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_store import make_store

from dask_mcpca import MCPCA
from dask_mcpca.cli import build_parser, run_args

OUT = Path(__file__).resolve().parent / "MONITORING.md"
#: The section of ``MONITORING.md`` this benchmark writes (``monitoring.py`` keeps it).
BEGIN, END = "<!-- score-append: begin -->", "<!-- score-append: end -->"


def _timed(argv: list[str]) -> float:
    args = build_parser().parse_args(argv + ["--no-progress"])
    started = time.perf_counter()
    rc = run_args(args)  # the command's work; main() adds a gc.collect() for callers in Python, not paid by a process
    elapsed = time.perf_counter() - started
    if rc != 0:
        raise SystemExit(f"{argv} failed with status {rc}")
    return elapsed


def run(rows: int, cols: int, chunk_rows: int, rounds: int, new: float) -> dict:
    info = make_store(rows, cols, chunk_rows=chunk_rows)
    store = str(info.path)
    old = int(round(rows * (1 - new)))
    with tempfile.TemporaryDirectory(prefix="score-append-", dir=Path(__file__).resolve().parent / "data") as work:
        model = os.path.join(work, "model.json")
        import zarr

        MCPCA().fit(zarr.open_array(store, mode="r")[: min(rows, 200_000)]).save(model)
        base = os.path.join(work, "base.zarr")
        _timed(["score", store, "-m", model, "-o", base, "--rows", f":{old}"])
        full_s, append_s = [], []
        for r in range(rounds):
            full_s.append(_timed(["score", store, "-m", model, "-o", os.path.join(work, "full.zarr"), "--overwrite"]))
            target = os.path.join(work, f"append{r}.zarr")
            shutil.copytree(base, target)
            append_s.append(_timed(["score", store, "-m", model, "-o", target, "--append"]))
            shutil.rmtree(target)
            print(f"round {r}: full {full_s[-1]:.2f} s, append {append_s[-1]:.2f} s", flush=True)
    full, append = statistics.median(full_s), statistics.median(append_s)
    return {"load": os.getloadavg()[0], "rows": rows, "cols": cols, "chunk_rows": chunk_rows, "rounds": rounds,
            "new": new,
            "new_rows": rows - old, "full": full, "append": append, "ratio": append / full,
            "full_all": full_s, "append_all": append_s}


def section(res: dict, argv: str) -> str:
    ok = res["ratio"] <= 0.15
    return "\n".join([
        BEGIN,
        "## `score --append`: the newest rows only",
        "",
        f"Written by `python benchmarks/score_append.py {argv}` on {os.cpu_count()} cores: a "
        f"{res['rows']:,} x {res['cols']} float64 Zarr store ({res['chunk_rows']:,}-row chunks), a full "
        f"`score` of it and `score --append` of its newest {res['new_rows']:,} rows ({res['new']:.0%}) to a "
        f"store holding the others' scores, alternated {res['rounds']} times in one run (in process: the "
        "interpreter's start and imports, about the same for both, are left out).",
        "",
        "| | median (s) | all rounds (s) |",
        "|---|---|---|",
        f"| full `score` | {res['full']:.2f} | {', '.join(f'{t:.2f}' for t in res['full_all'])} |",
        f"| `score --append` | {res['append']:.2f} | {', '.join(f'{t:.2f}' for t in res['append_all'])} |",
        "",
        f"Append / full: **{res['ratio']:.3f}** (target <= 0.15: {'met' if ok else 'NOT met'}).  The append "
        "reads only the input chunks that hold new rows (counted in `tests/test_score_append.py`), and "
        "links, rather than copies, the old rows' output chunks.",
        "",
        f"Load average {res['load']:.1f} at the end of the run (above {os.cpu_count()}, other work shared the cores).",
        END,
    ])


def write(text: str) -> None:
    """Put ``text`` between this benchmark's markers in MONITORING.md (appended the first time)."""
    current = OUT.read_text() if OUT.exists() else ""
    if BEGIN in current and END in current:
        head, _, rest = current.partition(BEGIN)
        _, _, tail = rest.partition(END)
        OUT.write_text(head + text + tail)
    else:
        OUT.write_text(current.rstrip("\n") + "\n\n" + text + "\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--cols", type=int, default=10)
    parser.add_argument("--chunk-rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new", type=float, default=0.1, help="share of the rows appended (default 0.1)")
    parser.add_argument("--no-write", action="store_true", help="print, do not update MONITORING.md")
    args = parser.parse_args(argv)
    res = run(args.rows, args.cols, args.chunk_rows, args.rounds, args.new)
    text = section(res, " ".join(sys.argv[1:] if argv is None else argv))
    print(text)
    if not args.no_write:
        write(text)
        print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
