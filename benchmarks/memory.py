"""Peak memory of ``MCPCA().fit(store)`` as the store grows.

One command::

    python benchmarks/memory.py --rows 1000000 8000000 32000000

For each size it generates (or reuses) a float64 Zarr store of ``--cols``
columns with :mod:`make_store`, then fits it in a fresh Python process, so
that no earlier fit, page of data or import is counted.  The child reports
its own peak resident set size (``VmHWM``, the kernel's high-water mark,
which no polling interval can miss) once after the imports and once after
the fit; the parent also polls the child's RSS with
psutil every 10 ms as a cross-check.  Flat peak RSS as the rows grow is the
point: the data never has to fit in memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import fmt_bytes, machine_info, update_section
from make_store import make_store

__all__ = ["measure", "run_memory"]

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


def measure(path: str | Path) -> dict:
    """Fit ``path`` in a fresh process; return its peak RSS, time and pass count."""
    import psutil

    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", str(path)], stdout=subprocess.PIPE, text=True
    )
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
        raise RuntimeError(f"fit of {path} failed with exit code {proc.returncode}")
    res = json.loads(out.strip().splitlines()[-1])
    res["polled"] = polled
    return res


def run_memory(rows: list[int], *, cols: int, chunk_rows: int) -> list[dict]:
    results = []
    for n in rows:
        info = make_store(n, cols, dtype="float64", chunk_rows=chunk_rows)
        res = measure(info.path)
        res.update(rows=n, nbytes=info.nbytes, store_bytes=info.store_bytes)
        results.append(res)
        print(
            f"{n:>12,} rows  store {fmt_bytes(info.store_bytes):>10}  peak RSS {fmt_bytes(res['peak']):>10} "
            f"(after imports {fmt_bytes(res['baseline'])})  {res['seconds']:.1f} s  {res['n_passes']} passes",
            file=sys.stderr,
        )
    return results


def report(results: list[dict], *, cols: int, chunk_rows: int) -> str:
    ref = results[0]
    lines = [
        f"## Memory: peak RSS of `MCPCA().fit(store)`, float64 x {cols} columns",
        "",
        f"Each fit in a fresh process; {chunk_rows:,}-row Zarr chunks; "
        "peak = `VmHWM` (kernel high-water mark) of the child "
        f"(psutil polling every {POLL_S * 1e3:.0f} ms in brackets); 'after imports' is the peak before the fit "
        "started (Python, numpy, dask, zarr, scikit-learn).",
        "",
        "| rows | raw data | store on disk | dask blocks | peak RSS (polled) | after imports "
        "| fit only (peak - imports) "
        f"| peak / {ref['rows'] / 1e6:g}M peak | fit s | n_passes_ |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r['rows']:,} | {fmt_bytes(r['nbytes'])} | {fmt_bytes(r['store_bytes'])} | {r['n_blocks']} | "
            f"{fmt_bytes(r['peak'])} ({fmt_bytes(r['polled'])}) | {fmt_bytes(r['baseline'])} | "
            f"{fmt_bytes(r['peak'] - r['baseline'])} | {r['peak'] / ref['peak']:.2f} | {r['seconds']:.1f} | "
            f"{r['n_passes']} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 8_000_000])
    parser.add_argument("--cols", type=int, default=10)
    parser.add_argument("--chunk-rows", type=int, default=1_000_000)
    parser.add_argument("--no-write", action="store_true", help="print, do not update RESULTS.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    if a.child:
        _child(a.child)
        return
    results = run_memory(a.rows, cols=a.cols, chunk_rows=a.chunk_rows)
    body = report(results, cols=a.cols, chunk_rows=a.chunk_rows)
    print(body)
    if not a.no_write:
        update_section(f"memory-x{a.cols}", body, machine=machine_info())


if __name__ == "__main__":
    main()
