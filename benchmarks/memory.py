"""Peak memory of ``MCPCA().fit(store)``, or of ``dask-mcpca report``, as the store grows.

One command each::

    python benchmarks/memory.py --rows 1000000 8000000 32000000
    python benchmarks/memory.py --command report --rows 1000000 10000000 100000000 \
        --cols 6 --dtype float32 --compare-malloc

For each size it generates (or reuses) a float64 Zarr store of ``--cols``
columns with :mod:`make_store`, then fits it in a fresh Python process, so
that no earlier fit, page of data or import is counted.  The child reports
its own peak resident set size (``VmHWM``, the kernel's high-water mark,
which no polling interval can miss) once after the imports and once after
the fit; the parent also polls the child's RSS with
psutil every 10 ms as a cross-check.  Flat peak RSS as the rows grow is the
point: the data never has to fit in memory.  Peaks are written in MiB, so that
a ratio near 1 reads as one; the 1-minute load average of the machine before
and after each child goes in the last column (a loaded machine slows the fit, it does
not change the peak).

Wide stores (issue 37's target, peak flat at p = 300)::

    python benchmarks/memory.py --rows 1000000 10000000 --cols 300 --dtype float32 --chunk-rows 50000

50,000 rows of 300 columns are about ``dask_mcpca._io.DEFAULT_BLOCK_VALUES``, so one
store chunk is one dask block (60 MB of float32).

``--command report`` fits a model on the smallest store (in this process),
then runs ``dask-mcpca report STORE --model ...`` in the fresh child, with
``matplotlib.pyplot`` and the command line imported before the baseline;
its PNG and CSV go to a temporary folder.  ``--compare-malloc`` runs each
size a second time with the command's glibc setting
(``_malloc.return_large_frees_to_os``) turned off, to show what it saves.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import fmt_bytes, machine_info, update_section
from make_store import make_store

__all__ = ["measure", "run_memory", "run_report_memory"]

#: Polling interval of the parent's psutil cross-check (seconds).
POLL_S = 0.01


def _peak_rss() -> int:
    """This process's peak RSS in bytes.

    ``VmHWM`` of ``/proc/self/status`` belongs to the process image started by
    ``exec``; ``ru_maxrss`` on Linux also carries over the parent's RSS at
    ``fork``, which would count the parent's own memory, so it is only the
    fallback where ``/proc`` is missing.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _mib(n: float) -> str:
    """``n`` bytes in MiB, one decimal (a peak: GiB would hide a 5 % change)."""
    return f"{n / 2**20:,.1f} MiB"


def _child(path: str) -> None:
    """Fit the store and print one JSON line (runs in the fresh process)."""
    import dask_mcpca  # noqa: F401  (imports count in the baseline, not the fit)
    from dask_mcpca import MCPCA
    from dask_mcpca._io import as_row_blocks

    n_blocks = as_row_blocks(path).numblocks[0]
    base = _peak_rss()
    t = time.perf_counter()
    model = MCPCA().fit(path)
    seconds = time.perf_counter() - t
    peak = _peak_rss()
    print(json.dumps({"baseline": base, "peak": peak, "seconds": seconds, "n_passes": model.n_passes_,
                      "n_blocks": n_blocks}))


def _child_report(path: str, model: str, out_dir: str, default_malloc: bool) -> None:
    """Run ``dask-mcpca report`` on the store and print one JSON line (runs in the fresh process)."""
    import matplotlib.pyplot  # noqa: F401  (the report draws with it: imported before the baseline)

    from dask_mcpca import _malloc, _report
    from dask_mcpca._io import as_row_blocks
    from dask_mcpca.cli import main

    if default_malloc:
        _malloc.return_large_frees_to_os = lambda *a, **k: False
    n_blocks = as_row_blocks(path, block_values=_report.BLOCK_VALUES).numblocks[0]
    base = _peak_rss()
    png, events = str(Path(out_dir) / "report.png"), str(Path(out_dir) / "report.csv")
    t = time.perf_counter()
    rc = main(["report", path, "--model", model, "--output", png, "--events", events, "--no-progress"])
    seconds = time.perf_counter() - t
    peak = _peak_rss()
    with open(events) as f:
        n_events = sum(1 for _ in f) - 1
    print(json.dumps({"baseline": base, "peak": peak, "seconds": seconds, "rc": rc, "n_blocks": n_blocks,
                      "n_events": n_events}))


#: Runs this file as a child after the console script's malloc setting, before any import
#: (``dask_mcpca._console``: ``dask-mcpca fit`` sets it so).
_CONSOLE_CHILD = (
    "import runpy, sys; from dask_mcpca._malloc import reuse_large_blocks; reuse_large_blocks(); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def measure(path: str | Path, *, child_args: list[str] | None = None, console_malloc: bool = False) -> dict:
    """Run the child on ``path`` in a fresh process (a fit, or ``child_args``); return its peak RSS and time.

    ``console_malloc``: with the malloc setting of ``dask-mcpca fit`` (:mod:`dask_mcpca._malloc`).
    """
    import psutil

    args = child_args if child_args is not None else ["--child", str(path)]
    launch = [sys.executable, "-c", _CONSOLE_CHILD] if console_malloc else [sys.executable]
    proc = subprocess.Popen([*launch, __file__, *args], stdout=subprocess.PIPE, text=True)
    load_before = os.getloadavg()[0]
    ps = psutil.Process(proc.pid)
    polled = 0
    while proc.poll() is None:
        try:
            polled = max(polled, ps.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(POLL_S)
    out, _ = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"child on {path} failed with exit code {proc.returncode}")
    res = json.loads(out.strip().splitlines()[-1])
    res["polled"] = polled
    res["load"] = (load_before, os.getloadavg()[0])
    return res


def run_memory(rows: list[int], *, cols: int, chunk_rows: int, dtype: str = "float64",
               compare_malloc: bool = False) -> list[dict]:
    """Fits of stores of ``rows`` rows, each in a fresh process (and with the console's malloc setting)."""
    results = []
    for n in rows:
        info = make_store(n, cols, dtype=dtype, chunk_rows=chunk_rows)
        res = measure(info.path)
        res.update(rows=n, nbytes=info.nbytes, store_bytes=info.store_bytes)
        if compare_malloc:
            res["console"] = measure(info.path, console_malloc=True)
        results.append(res)
        console = f"; with the console's malloc {fmt_bytes(res['console']['peak'])}, " \
            f"{res['console']['seconds']:.1f} s" if compare_malloc else ""
        print(
            f"{n:>12,} rows  store {fmt_bytes(info.store_bytes):>10}  peak RSS {_mib(res['peak']):>12} "
            f"(after imports {_mib(res['baseline'])})  {res['seconds']:.1f} s  {res['n_passes']} passes  "
            f"load {res['load'][0]:.1f}-{res['load'][1]:.1f}"
            f"{console}",
            file=sys.stderr,
        )
    return results


def report(results: list[dict], *, cols: int, chunk_rows: int, dtype: str = "float64") -> str:
    ref = results[0]
    compare = "console" in ref
    lines = [
        f"## Memory: peak RSS of `MCPCA().fit(store)`, {dtype} x {cols} columns",
        "",
        f"Each fit in a fresh process; {chunk_rows:,}-row Zarr chunks; local threaded scheduler, "
        f"{os.cpu_count()} cores; "
        "peak = `VmHWM` (kernel high-water mark) of the child "
        f"(psutil polling every {POLL_S * 1e3:.0f} ms in brackets); 'after imports' is the peak before the fit "
        "started (Python, numpy, dask, zarr, scikit-learn); load = the machine's 1-minute load average "
        "before and after the child (it slows the fit, not its peak).",
        "",
        "| rows | raw data | store on disk | dask blocks | peak RSS (polled) | after imports "
        "| fit only (peak - imports) "
        f"| peak / {ref['rows'] / 1e6:g}M peak | fit s | n_passes_ |"
        + (" with `dask-mcpca fit`'s malloc: peak RSS | / first | fit s |" if compare else "") + " load |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        + " ---: | ---: | ---: |" * compare,
    ]
    for r in results:
        lines.append(
            f"| {r['rows']:,} | {fmt_bytes(r['nbytes'])} | {fmt_bytes(r['store_bytes'])} | {r['n_blocks']} | "
            f"{_mib(r['peak'])} ({_mib(r['polled'])}) | {_mib(r['baseline'])} | "
            f"{_mib(r['peak'] - r['baseline'])} | {r['peak'] / ref['peak']:.2f} | {r['seconds']:.1f} | "
            f"{r['n_passes']} |"
            + (f" {_mib(r['console']['peak'])} | {r['console']['peak'] / ref['console']['peak']:.2f} | "
               f"{r['console']['seconds']:.1f} |" if compare else "")
            + f" {r['load'][0]:.1f}-{r['load'][1]:.1f} |"
        )
    if compare:
        lines += ["", "The three malloc columns before the load: the same fit in a child that first sets "
                  "glibc's malloc as "
                  "`dask-mcpca fit` does (`dask_mcpca._malloc.reuse_large_blocks`: one arena, no mmap, no trim)."]
    return "\n".join(lines)


def run_report_memory(rows: list[int], *, cols: int, dtype: str, chunk_rows: int,
                      compare_malloc: bool) -> list[dict]:
    """``dask-mcpca report`` on stores of ``rows`` rows, each in a fresh process; one model for all."""
    from dask_mcpca import MCPCA

    infos = [make_store(n, cols, dtype=dtype, chunk_rows=chunk_rows) for n in rows]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model = str(Path(tmp) / "model.json")
        MCPCA().fit(str(infos[0].path)).save(model)
        for info in infos:
            res = {"rows": info.n_rows, "nbytes": info.nbytes, "store_bytes": info.store_bytes}
            for default_malloc in (False, True) if compare_malloc else (False,):
                args = ["--child-report", str(info.path), model, tmp] + ["--default-malloc"] * default_malloc
                r = measure(info.path, child_args=args)
                if r["rc"] != 0:
                    raise RuntimeError(f"dask-mcpca report on {info.path} exited with {r['rc']}")
                key = "default_malloc" if default_malloc else "measured"
                res[key] = r
                print(
                    f"{info.n_rows:>12,} rows  {key:<15} peak RSS {fmt_bytes(r['peak']):>10} "
                    f"(after imports {fmt_bytes(r['baseline'])})  {r['seconds']:.1f} s  {r['n_events']:,} events",
                    file=sys.stderr,
                )
            results.append(res)
    return results


def report_report(results: list[dict], *, cols: int, dtype: str, chunk_rows: int) -> str:
    ref = results[0]["measured"]
    compare = "default_malloc" in results[0]
    lines = [
        f"## Memory: peak RSS of `dask-mcpca report`, {dtype} x {cols} columns",
        "",
        f"`dask-mcpca report STORE --model model.json` in a fresh process; {chunk_rows:,}-row Zarr chunks, "
        "5 % outliers (mostly single rows: every one an event), local threads; peak = `VmHWM` of the child "
        f"(psutil polling every {POLL_S * 1e3:.0f} ms in brackets); 'after imports' includes matplotlib. "
        "The model is fitted on the smallest store.",
        "",
        "| rows | raw data | report blocks | events | peak RSS (polled) | after imports "
        f"| peak / {results[0]['rows'] / 1e6:g}M peak | s |"
        + (" peak without the malloc setting (/ first) |" if compare else ""),
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if compare else ""),
    ]
    for res in results:
        r = res["measured"]
        line = (
            f"| {res['rows']:,} | {fmt_bytes(res['nbytes'])} | {r['n_blocks']} | {r['n_events']:,} | "
            f"{fmt_bytes(r['peak'])} ({fmt_bytes(r['polled'])}) | {fmt_bytes(r['baseline'])} | "
            f"{r['peak'] / ref['peak']:.2f} | {r['seconds']:.1f} |"
        )
        if compare:
            d = res["default_malloc"]
            line += f" {fmt_bytes(d['peak'])} ({d['peak'] / results[0]['default_malloc']['peak']:.2f}) |"
        lines.append(line)
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--command", choices=("fit", "report"), default="fit")
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 8_000_000])
    parser.add_argument("--cols", type=int, default=10)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--chunk-rows", type=int, default=1_000_000)
    parser.add_argument("--compare-malloc", action="store_true",
                        help="also measure with the other glibc setting: report without its own, "
                        "fit with dask-mcpca fit's")
    parser.add_argument("--no-write", action="store_true", help="print, do not update RESULTS.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-report", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--default-malloc", action="store_true", help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    if a.child:
        _child(a.child)
        return
    if a.child_report:
        _child_report(*a.child_report, a.default_malloc)
        return
    if a.command == "report":
        results = run_report_memory(a.rows, cols=a.cols, dtype=a.dtype, chunk_rows=a.chunk_rows,
                                    compare_malloc=a.compare_malloc)
        body = report_report(results, cols=a.cols, dtype=a.dtype, chunk_rows=a.chunk_rows)
        print(body)
        if not a.no_write:
            update_section(f"report-memory-x{a.cols}-{a.dtype}", body, machine=machine_info())
        return
    results = run_memory(a.rows, cols=a.cols, chunk_rows=a.chunk_rows, dtype=a.dtype, compare_malloc=a.compare_malloc)
    body = report(results, cols=a.cols, chunk_rows=a.chunk_rows, dtype=a.dtype)
    print(body)
    if not a.no_write:
        update_section(f"memory-x{a.cols}" + ("" if a.dtype == "float64" else f"-{a.dtype}"), body,
                       machine=machine_info())


if __name__ == "__main__":
    main()
