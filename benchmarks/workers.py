"""Scaling with workers: the fit, an X^T X pass and dask-ml's PCA on local clusters of 1, 2, 4, ... workers.

One command (stores are made by :mod:`make_store` and cached)::

    python benchmarks/workers.py --shapes 20000000x10 2000000x100 --dtype float32 --repeats 5

For each store, one real local cluster per worker count (``tests/_cluster.py``:
a scheduler and ``k`` nanny-managed worker processes of one thread each, with
the malloc setting ``docs/performance.md`` gives for workers,
``dask_mcpca._malloc.WORKER_ENV``) is started, all of them side by side.
Every cluster first runs one untimed fit (page cache, the workers' imports
and compiled loops); then each round runs every (worker count, method) pair
once, each in a fresh client process, the order rotated from round to round
so that worker counts and methods alternate.  The methods:

xtx
    ``(X.T @ X).compute()`` on the blocks MCPCA reads: one plain pass, the floor.
fit
    ``MCPCA().fit(store)``, with its full passes and partial reads.
daskml
    ``dask_ml.decomposition.PCA(svd_solver=...).fit`` on the same dask array
    (``"auto"`` picks ``"full"``, a tall-and-skinny QR, for p <= 500).

Medians over the rounds, the range, the speed-up against 1 worker (the median
of the per-round ratios) and the efficiency (speed-up / workers) go to
``benchmarks/WORKERS.md`` with the machine; ``benchmarks/workers.png`` plots
time against workers with the ideal line ``t(1) / k``.

Chunks: ``--chunk-mib`` per store chunk (64 MiB, the lower end of the 64-128 MiB
blocks ``docs/performance.md`` recommends), fewer rows where the store would
otherwise have fewer than 2 chunks per worker thread of the largest cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

#: This folder (the docs build executes this file without ``__file__`` to render :func:`build_parser`,
#: so the benchmark helpers are imported where they are used).
HERE = Path(globals().get("__file__", "benchmarks/workers.py")).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

__all__ = ["METHODS", "build_parser", "chunk_rows", "measure", "worker_counts"]

#: What each round runs on each cluster, in this order before rotation.
METHODS = ("xtx", "fit", "daskml")

#: Labels in the table and the plot.
LABELS = {"xtx": "X^T X pass", "fit": "MCPCA().fit", "daskml": "dask-ml PCA"}

#: The results file and the plot.
RESULTS = HERE / "WORKERS.md"
PLOT = HERE / "workers.png"


def worker_counts(cores: int | None = None) -> list[int]:
    """1, 2, 4, ... up to the machine's cores, and the core count itself if it is not a power of 2."""
    cores = cores or os.cpu_count() or 1
    counts = [1 << i for i in range(cores.bit_length()) if 1 << i <= cores]
    return counts if counts[-1] == cores else counts + [cores]


def chunk_rows(n_rows: int, n_cols: int, itemsize: int, *, chunk_mib: float, min_chunks: int) -> int:
    """Rows per store chunk: at most ``chunk_mib`` MiB, and at least ``min_chunks`` chunks."""
    by_bytes = max(1, int(chunk_mib * 2**20) // (n_cols * itemsize))
    return max(1, min(by_bytes, -(-n_rows // min_chunks)))


def _child(what: str, path: str, address: str, solver: str) -> None:
    """One method on the cluster at ``address``; print one JSON line."""
    from distributed import Client
    from threadpoolctl import threadpool_limits

    from dask_mcpca import MCPCA
    from dask_mcpca._io import as_row_blocks

    client = Client(address)
    X = as_row_blocks(path)
    out = {"n_blocks": X.numblocks[0]}
    t = time.perf_counter()
    if what == "xtx":
        with threadpool_limits(1, "blas"):
            (X.T @ X).compute()
    elif what == "fit":
        m = MCPCA().fit(path)
        out.update(n_passes=m.n_passes_, n_partial_reads=m.n_partial_reads_, n_blocks_read=m.n_blocks_read_)
    else:
        from dask_ml.decomposition import PCA

        pca = PCA(svd_solver=solver)
        out["solver"] = pca._get_solver(X, min(X.shape))
        pca.fit(X)
    out["seconds"] = time.perf_counter() - t
    client.close()
    print(json.dumps(out))


def measure(what: str, path, address: str, *, solver: str = "auto", timeout: float = 600) -> dict:
    """One fresh client process; on failure or timeout ``{"error": ...}``."""
    cmd = [sys.executable, __file__, "--child", what, str(path), address, solver]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if proc.returncode != 0:
        last = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        return {"error": (last[-1] if last else f"exit {proc.returncode}")[:160]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_store(shape: tuple[int, int], a) -> dict:
    """All clusters of one store side by side, the (workers, method) pairs rotated over the rounds."""
    from _cluster import ProcessCluster
    from make_store import make_store

    from dask_mcpca._malloc import WORKER_ENV

    n, p = shape
    itemsize = 4 if a.dtype == "float32" else 8
    rows = chunk_rows(n, p, itemsize, chunk_mib=a.chunk_mib, min_chunks=2 * max(a.workers))
    t = time.perf_counter()
    info = make_store(n, p, dtype=a.dtype, chunk_rows=rows)
    print(f"store {info.path.name}: {info.store_bytes / 2**20:.0f} MiB ({time.perf_counter() - t:.0f} s)", flush=True)
    methods = [m for m in a.methods if m != "daskml" or _has_dask_ml()]
    res = {"n": n, "p": p, "dtype": a.dtype, "chunk_rows": rows, "store_bytes": info.store_bytes,
           "nbytes": info.nbytes, "runs": {}, "errors": {}, "load": [os.getloadavg()[0]]}
    with ExitStack() as stack:
        clusters = {
            k: stack.enter_context(ProcessCluster(stack.enter_context(tempfile.TemporaryDirectory()), n_workers=k,
                                                  memory_limit=a.memory_limit, worker_env=WORKER_ENV))
            for k in a.workers
        }
        for c in clusters.values():  # untimed: page cache, imports and compiled loops in the workers
            measure("fit", info.path, c.address, timeout=a.timeout)
        jobs = [(k, m) for k in a.workers for m in methods]
        for r in range(a.repeats):
            for k, m in jobs[r % len(jobs):] + jobs[: r % len(jobs)]:
                key = f"{k}/{m}"
                if key in res["errors"]:
                    continue
                out = measure(m, info.path, clusters[k].address, solver=a.daskml_solver, timeout=a.timeout)
                if "error" in out:
                    res["errors"][key] = out["error"]
                else:
                    res["runs"].setdefault(key, []).append(out)
                print(f"round {r} {shape} workers={k} {m}: {out}", flush=True)
    res["load"].append(os.getloadavg()[0])
    return res


def _has_dask_ml() -> bool:
    try:
        import dask_ml  # noqa: F401
    except ImportError:
        return False
    return True


def _span(xs) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def _rows(res: dict, workers: list[int], methods) -> list[str]:
    lines = []
    for m in methods:
        base = res["runs"].get(f"1/{m}")
        for k in workers:
            key = f"{k}/{m}"
            if key in res["errors"] or key not in res["runs"]:
                why = res["errors"].get(key, "not run")
                if m == "daskml" and not _has_dask_ml():
                    why = "dask-ml not installed"
                lines.append(f"| {LABELS[m]} | {k} | failed: {why} | | | | |")
                continue
            runs = res["runs"][key]
            secs = [x["seconds"] for x in runs]
            speed = eff = "-"
            if base is not None and k != 1:
                ratios = [b["seconds"] / x["seconds"] for b, x in zip(base, runs, strict=False)]
                speed = f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
                eff = f"{statistics.median(ratios) / k:.2f}"
            elif k == 1:
                speed, eff = "1", "1"
            xtx = res["runs"].get(f"{k}/xtx")
            per_pass = f"{statistics.median(secs) / statistics.median(x['seconds'] for x in xtx):.2f}" if xtx else "-"
            note = ""
            if m == "fit":
                note = (f"{runs[0]['n_passes']} full passes + {runs[0]['n_partial_reads']} partial read "
                        f"({runs[0]['n_blocks_read']} blocks)")
            elif m == "daskml":
                note = f"solver {runs[0]['solver']!r}"
            lines.append(f"| {LABELS[m]} | {k} | {_span(secs)} | {speed} | {eff} | {per_pass} | {note} |")
    return lines


def report(results: list[dict], a, command: str) -> str:
    from _results import machine_info

    lines = [
        "# Scaling with workers",
        "",
        "Written by `benchmarks/workers.py`; see `docs/performance.md` (sizing chunks and workers).",
        "",
        "## Machine",
        "",
        machine_info(),
        "",
        "## Runs",
        "",
        f"Command: `{command}`. Real local clusters of single-threaded nanny workers (`tests/_cluster.py`,",
        f"memory limit {a.memory_limit} each, the workers' malloc of `dask_mcpca._malloc.WORKER_ENV`), all worker",
        "counts of a store side by side; every (workers, method) pair once per round, each in a fresh client",
        f"process, the order rotated between rounds; {a.repeats} rounds after one untimed fit per cluster. Seconds:",
        "median (range). Speed-up: the median of the per-round ratios t(1 worker) / t(k workers); efficiency:",
        "speed-up / k. / pass: the method's median over the X^T X pass's median on the same cluster.",
        "Plot: `benchmarks/workers.png`.",
    ]
    for res in results:
        item = 4 if res["dtype"] == "float32" else 8
        lines += [
            "",
            f"### {res['n']:,} x {res['p']} {res['dtype']}",
            "",
            f"{res['nbytes'] / 2**20:,.0f} MiB raw, {res['store_bytes'] / 2**20:,.0f} MiB of zstd Zarr, "
            f"chunks of {res['chunk_rows']:,} rows ({res['chunk_rows'] * res['p'] * item / 2**20:.0f} MiB), "
            f"{-(-res['n'] // res['chunk_rows'])} chunks. 1-min load average before / after: "
            f"{res['load'][0]:.1f} / {res['load'][1]:.1f}.",
            "",
            "| method | workers | seconds | speed-up | efficiency | / pass | |",
            "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
            *_rows(res, a.workers, a.methods),
        ]
    return "\n".join(lines) + "\n"


def plot(results: list[dict], workers: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4.2), squeeze=False)
    for ax, res in zip(axes[0], results, strict=True):
        for i, m in enumerate(METHODS):
            ks = [k for k in workers if f"{k}/{m}" in res["runs"]]
            if not ks:
                continue
            med = [statistics.median(x["seconds"] for x in res["runs"][f"{k}/{m}"]) for k in ks]
            line = ax.loglog(ks, med, "os^"[i] + "-", label=LABELS[m])[0]
            if ks[0] == 1:
                ax.loglog(workers, [med[0] / k for k in workers], ":", color=line.get_color(), alpha=0.7,
                          label=f"{LABELS[m]}, ideal t(1)/k")
        ax.set_xticks(workers, [str(k) for k in workers])
        ax.minorticks_off()
        ax.set(xlabel="workers (1 thread each)", ylabel="seconds (median)",
               title=f"{res['n']:,} x {res['p']} {res['dtype']}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _shape(text: str) -> tuple[int, int]:
    n, _, p = text.lower().partition("x")
    return int(n), int(p)


def build_parser() -> argparse.ArgumentParser:
    """The command line (also rendered in the documentation)."""
    ap = argparse.ArgumentParser(prog="python benchmarks/workers.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", type=_shape, nargs="+", default=[(20_000_000, 10), (2_000_000, 100)],
                    metavar="ROWSxCOLS", help="the stores (default: 20000000x10 2000000x100)")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    ap.add_argument("--workers", type=int, nargs="+", default=None,
                    help="worker counts (default: 1, 2, 4, ... up to the machine's cores, and the core count)")
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    ap.add_argument("--repeats", type=int, default=3, help="rounds (default: 3)")
    ap.add_argument("--chunk-mib", type=float, default=64.0,
                    help="MiB per store chunk at most; fewer rows where a store would have fewer than 2 chunks "
                         "per worker of the largest cluster (default: 64)")
    ap.add_argument("--memory-limit", default=None,
                    help="per worker (default: the machine's memory / the largest worker count)")
    ap.add_argument("--daskml-solver", default="auto", choices=("auto", "full", "tsqr", "randomized"),
                    help="dask-ml PCA's svd_solver (default: auto)")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds per measurement before it counts as failed (default: 600)")
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    return ap


def main(argv=None) -> None:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.child:
        _child(*a.child)
        return
    a.workers = sorted(set(a.workers or worker_counts()))
    if a.memory_limit is None:
        import psutil

        a.memory_limit = f"{psutil.virtual_memory().total // max(a.workers) // 2**20}MiB"
    results = [run_store(s, a) for s in a.shapes]
    (HERE / "data").mkdir(exist_ok=True)
    (HERE / "data" / "workers.json").write_text(json.dumps(results, indent=1))
    text = report(results, a, "python benchmarks/workers.py " + " ".join(sys.argv[1:]))
    print(text)
    if not a.no_write:
        RESULTS.write_text(text)
        plot(results, a.workers, PLOT)


if __name__ == "__main__":
    main()
