"""Scaling of the default fit: time and peak memory against rows, columns and workers.

One command (stores are made by :mod:`make_store` and cached)::

    python benchmarks/scaling.py --rows 1000000 5000000 20000000 --cols 10 100 300 500 1000

Every measurement runs in a fresh process, which reports its own peak RSS
(``VmHWM``) and how long the fit spent inside its reads of the data
(``PassRunner.run``), so the rest, the "non-pass work" (start, sample
stage, eigendecompositions), is measured too.  Each point alternates
``MCPCA().fit(store)`` with a plain ``(X.T @ X).compute()`` pass on the same
store, ``--repeats`` times, and keeps the medians.

- **rows**: float64 x 10 stores of 1M-row chunks (``--rows``), and float32
  stores of ``--rows32``;
- **columns**: ``--p-rows``-row float64 stores of ``--cols`` columns, chunks
  of about 80 MB; the non-pass work is compared with one X^T X pass of a
  1M-row store of the same width (the pass on this store, scaled to 1M rows);
- **workers**: the ``--worker-rows`` float64 store on a real local cluster
  (``tests/_cluster.py``: a scheduler and 1 or 2 single-threaded worker
  processes), against the default threaded scheduler.

Writes the ``scaling`` section of ``RESULTS.md`` and ``scaling.png``.

``--before`` also fits each column store under the rules before issue 37 point 1's last change
(:data:`BEFORE`: the module constants set back in the fitting process), alternated with the
fit and the X^T X pass in the same run, so that the table shows both::

    python benchmarks/scaling.py --rows --rows32 --workers --cols 10 100 300 1000 --before --section scaling-wide

``--worker-malloc`` measures only what ``docs/performance.md`` tells cluster
users to set: for each ``--workers`` count it starts two clusters side by
side, one with glibc's defaults (and the nanny's ``MALLOC_TRIM_THRESHOLD_``)
and one whose workers get ``dask_mcpca._malloc.WORKER_ENV`` (set here for the
workers whatever the recipes do), and alternates the fit
and the X^T X pass between them; it writes the ``worker-malloc`` section::

    python benchmarks/scaling.py --worker-malloc --workers 1 2 --worker-rows 20000000 --repeats 5
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from _results import PassClock, blas_info, machine_info, update_section  # noqa: E402
from make_store import make_store  # noqa: E402

from dask_mcpca._malloc import WORKER_ENV  # noqa: E402

__all__ = ["measure"]

#: Bytes per Zarr chunk of the column stores.
CHUNK_BYTES = 80_000_000

#: ``--before``: (module, constant, value) set in the fitting process for the rules before the last
#: change of issue 37 point 1: every wide pass computed every row's quadratic form in float64; now
#: from ``_screen.SCREEN_FEATURES`` columns it takes float32's where a worst-case error bound places
#: the row inside the first flat top (:mod:`dask_mcpca._screen`).  (The change before, the bulk's
#: kept plain sums, ``_bulk.KEEP_BULK``, is in commit b43a0df's BEFORE.)
BEFORE = (
    ("dask_mcpca._screen", "SCREEN_FEATURES", 10**9),
)

#: What each worker reports of its environment (``--worker-malloc`` checks that the setting arrived).
_MALLOC_VARS = tuple(k for k in WORKER_ENV if k.startswith("MALLOC_"))


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _child(what: str, path: str, address: str | None) -> None:
    """Fit (or make one X^T X pass over) ``path``; print one JSON line.  ``what``: "fit", "xtx", or
    "before" (a fit under :data:`BEFORE`)."""
    import importlib

    from threadpoolctl import threadpool_limits

    from dask_mcpca import MCPCA
    from dask_mcpca._io import as_row_blocks

    client = None
    if address:
        from distributed import Client

        client = Client(address)
    clock = PassClock()
    for module, name, value in BEFORE if what == "before" else ():
        setattr(importlib.import_module(module), name, value)
    X = as_row_blocks(path)
    base = _peak_rss()
    t, cpu = time.perf_counter(), time.process_time()
    out = {}
    if what == "xtx":
        with threadpool_limits(1, "blas"):
            (X.T @ X).compute()
    else:
        m = MCPCA().fit(path)
        out = {"n_passes": m.n_passes_, "n_partial_reads": m.n_partial_reads_, "n_blocks_read": m.n_blocks_read_}
    out.update(seconds=time.perf_counter() - t, cpu=time.process_time() - cpu, in_passes=clock.seconds,
               peak=_peak_rss(), baseline=base, n_blocks=X.numblocks[0])
    if client is not None:
        out["worker_peak"] = max(client.run(_peak_rss).values())
        out["worker_env"] = sorted({json.dumps(e) for e in client.run(_malloc_env).values()})
        client.close()
    print(json.dumps(out))


def _malloc_env() -> dict:
    return {k: os.environ.get(k) for k in _MALLOC_VARS}


def measure(what: str, path, address: str | None = None) -> dict:
    """One fresh process: ``what`` is "fit", "xtx" or "before"."""
    cmd = [sys.executable, __file__, "--child", what, str(path)] + (["--address", address] if address else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _alternate(paths, repeats: int, address=None, before: bool = False) -> list[dict]:
    """Fit and X^T X pass of each store in ``paths``, all of them rotated round-robin ``repeats`` times
    (with ``before``, a fit under :data:`BEFORE` too).

    ``address`` is one scheduler for all, or a list of one per store (several clusters alternated)."""
    addresses = address if isinstance(address, list) else [address] * len(paths)
    kinds = ("fit", "xtx", "before") if before else ("fit", "xtx")
    jobs = [(i, what) for i in range(len(paths)) for what in kinds]
    runs = {job: [] for job in jobs}
    for r in range(repeats):
        for job in jobs[r % len(jobs) :] + jobs[: r % len(jobs)]:
            runs[job].append(measure(job[1], paths[job[0]], addresses[job[0]]))
    med = statistics.median
    out = []
    for i in range(len(paths)):
        fit, xtx = runs[(i, "fit")], runs[(i, "xtx")]
        out.append({
            "xtx_runs": [x["seconds"] for x in xtx],
            "ratio_runs": [f["seconds"] / x["seconds"] for f, x in zip(fit, xtx, strict=True)],
            "cpu_ratio_runs": [f["cpu"] / x["cpu"] for f, x in zip(fit, xtx, strict=True)],
            "worker_peak": max(f.get("worker_peak", 0) for f in fit + xtx),
            "worker_env": sorted({e for f in fit + xtx for e in f.get("worker_env", [])}),
            "fit_s": med(f["seconds"] for f in fit),
            "xtx_s": med(x["seconds"] for x in xtx),
            "fit_runs": [f["seconds"] for f in fit],
            "non_pass_s": med(f["seconds"] - f["in_passes"] for f in fit),
            "in_passes_s": med(f["in_passes"] for f in fit),
            "peak": max(f["peak"] for f in fit),
            "baseline": fit[0]["baseline"],
            **{k: fit[0][k] for k in ("n_passes", "n_partial_reads", "n_blocks_read", "n_blocks")},
        })
        if before:
            old = runs[(i, "before")]
            out[-1]["before"] = {
                "ratio_runs": [f["seconds"] / x["seconds"] for f, x in zip(old, xtx, strict=True)],
                "cpu_ratio_runs": [f["cpu"] / x["cpu"] for f, x in zip(old, xtx, strict=True)],
                "fit_s": med(f["seconds"] for f in old),
                "non_pass_s": med(f["seconds"] - f["in_passes"] for f in old),
                "in_passes_s": med(f["in_passes"] for f in old),
                **{k: old[0][k] for k in ("n_passes", "n_partial_reads", "n_blocks_read")},
            }
    return out


def run_scaling(a) -> dict:
    res = {"rows": [], "cols": [], "workers": [], "load": [os.getloadavg()[0]]}
    for n in sorted(set(a.rows) | set(a.rows32)):  # both dtypes of one size alternate with each other
        dtypes = [d for d, rows in (("float64", a.rows), ("float32", a.rows32)) if n in rows]
        paths = [make_store(n, 10, dtype=d).path for d in dtypes]
        for d, r in zip(dtypes, _alternate(paths, a.repeats if n <= 20_000_000 else 1), strict=True):
            res["rows"].append({"n": n, "dtype": d, **r})
            print("rows", n, d, r, flush=True)
    for p in a.cols:
        info = make_store(a.p_rows, p, chunk_rows=max(1000, CHUNK_BYTES // (8 * p)))
        (r,) = _alternate([info.path], a.repeats, before=a.before)
        res["cols"].append({"p": p, "n": a.p_rows, **r})
        print("cols", p, r, flush=True)
    if a.workers:
        from _cluster import ProcessCluster

        info = make_store(a.worker_rows, 10)
        res["workers"].append({"workers": "threads (2)", **_alternate([info.path], a.repeats)[0]})
        for k in a.workers:
            with tempfile.TemporaryDirectory() as tmp, ProcessCluster(tmp, n_workers=k, memory_limit="4GiB") as c:
                (r,) = _alternate([info.path], a.repeats, c.address)
            res["workers"].append({"workers": k, **r})
            print("workers", k, r, flush=True)
    res["load"].append(os.getloadavg()[0])
    return res


def run_worker_malloc(a) -> dict:
    """Two clusters of each size side by side, glibc's defaults and ``_malloc.WORKER_ENV``, alternated."""
    from contextlib import ExitStack

    from _cluster import ProcessCluster

    info = make_store(a.worker_rows, 10)
    res = {"rows": a.worker_rows, "repeats": a.repeats, "workers": [], "load": [os.getloadavg()[0]]}
    for k in a.workers:
        with ExitStack() as stack:
            clusters = [
                stack.enter_context(ProcessCluster(stack.enter_context(tempfile.TemporaryDirectory()), n_workers=k,
                                                   memory_limit="4GiB", worker_env=env))
                for env in (None, WORKER_ENV)
            ]
            default, malloc = _alternate([info.path] * 2, a.repeats, [c.address for c in clusters])
        res["workers"].append({"workers": k, "default": default, "malloc": malloc})
        print("workers", k, default, malloc, flush=True)
    res["load"].append(os.getloadavg()[0])
    return res


def report_worker_malloc(res: dict, command: str) -> str:
    def span(xs) -> str:
        return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"

    lines = [
        "## The command's malloc on dask workers",
        "",
        f"Command: `{command}`. {res['rows']:,} x 10 float64 rows, 1M-row chunks. For each worker count, two",
        "real local clusters of single-threaded nanny workers run side by side: glibc's defaults (with the",
        "nanny's `MALLOC_TRIM_THRESHOLD_=65536`), and workers started with `docs/performance.md`'s",
        "`MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647` (the nanny's",
        "`pre-spawn-environ` set to the same threshold). `MCPCA().fit(store)` and `(X.T @ X).compute()`,",
        f"each in a fresh client process, alternate between them, {res['repeats']} rounds; medians (range).",
        "Worker peak = the largest `VmHWM` of a worker process over all rounds. 1-min load average",
        f"before / after: {res['load'][0]:.1f} / {res['load'][1]:.1f} on 2 cores.",
        "",
        "| workers | malloc | X^T X pass s | fit s | fit / pass | worker peak RSS MiB | the workers' variables |",
        "| ---: | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in res["workers"]:
        for name, label in (("default", "glibc's defaults"), ("malloc", "the command's setting")):
            m = r[name]
            env = "; ".join(", ".join(f"{k}={v}" for k, v in json.loads(e).items()) for e in m["worker_env"])
            lines.append(
                f"| {r['workers']} | {label} | {span(m['xtx_runs'])} | {span(m['fit_runs'])} | "
                f"{span(m['ratio_runs'])} | {_mib(m['worker_peak'])} | {env} |"
            )
    return "\n".join(lines)


def _mib(b) -> str:
    return f"{b / 2**20:,.0f}"


def report(res: dict, command: str, section: str = "scaling") -> str:
    lines = [
        "## Scaling: fit time and peak memory against rows, columns and workers" if res["rows"] or res["workers"]
        else "## Scaling against the columns (wide p)",
        "",
        f"Command: `{command}`. Each figure is the median over alternated fresh-process runs of",
        "`MCPCA().fit(store)` and `(X.T @ X).compute()` on the same store; peak = `VmHWM` of the fitting",
        f"process (the client's, for a cluster). BLAS: {blas_info()}. 1-min load average before / after:",
        f"{res['load'][0]:.1f} / {res['load'][1]:.1f} on 2 cores. Plot: `benchmarks/{section}.png`.",
    ]
    if res["rows"]:
        lines += [
            "",
            "| rows | dtype | blocks | fit s | X^T X pass s | fit / pass | full passes | partial reads (blocks) "
            "| non-pass s | peak RSS MiB | after imports MiB |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
    for r in res["rows"]:
        lines.append(
            f"| {r['n']:,} | {r['dtype']} | {r['n_blocks']} | {r['fit_s']:.1f} | {r['xtx_s']:.1f} | "
            f"{r['fit_s'] / r['xtx_s']:.2f} | {r['n_passes']} | {r['n_partial_reads']} ({r['n_blocks_read']}) | "
            f"{r['non_pass_s']:.2f} | {_mib(r['peak'])} | {_mib(r['baseline'])} |"
        )
    for n in sorted({r["n"] for r in res["rows"]}):
        both = {r["dtype"]: r for r in res["rows"] if r["n"] == n}
        if len(both) == 2:
            ratio = both["float64"]["fit_s"] / both["float32"]["fit_s"]
            lines.append(f"\n{n:,} rows: float64 fit / float32 fit = **{ratio:.2f}** (alternated in one run).")
    if res["cols"]:
        lines += [
            "",
            "Against the number of columns (float64; non-pass work = fit time outside the reads of the data:",
            "start, sample stage, eigendecompositions; the last column compares it with one X^T X pass of a",
            "1M-row store of the same width, the pass measured here scaled to 1M rows):",
        ]
        if any("before" in r for r in res["cols"]):
            lines += [
                "Rows `p before`: the same store fitted under `scaling.BEFORE` (the rules before the last change of",
                "issue 37 point 1), alternated with the fit and the X^T X pass in the same run; the X^T X pass and",
                "peak columns are the fit's.",
            ]
        lines += [
            "CPU s: the fitting process's CPU time (all its threads; `time.process_time`) over the X^T X pass's, per",
            "round: on a machine loaded by other jobs it moves less than the wall time.",
        ]
        lines += [
            "",
            "| p | rows | blocks | fit s | X^T X pass s | fit / pass (range) | CPU s: fit / pass (range) | full passes "
            "| partial reads (blocks) | in passes / X^T X pass | non-pass s | non-pass / 1M-row X^T X pass "
            "| peak RSS MiB |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in res["cols"]:
            per_1m = r["xtx_s"] * 1_000_000 / r["n"]
            for label, m in (("", r), (" before", r.get("before"))):
                if m is None:
                    continue
                ratios = m.get("ratio_runs") or [m["fit_s"] / r["xtx_s"]]
                cpu = m.get("cpu_ratio_runs")
                cpu = f"{statistics.median(cpu):.2f} ({min(cpu):.2f}-{max(cpu):.2f})" if cpu else ""
                in_passes = m.get("in_passes_s", m["fit_s"] - m["non_pass_s"])
                lines.append(
                    f"| {r['p']}{label} | {r['n']:,} | {r['n_blocks']} | {m['fit_s']:.1f} | {r['xtx_s']:.2f} | "
                    f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | {cpu} | "
                    f"{m['n_passes']} | {m['n_partial_reads']} ({m['n_blocks_read']}) | {in_passes / r['xtx_s']:.2f} | "
                    f"{m['non_pass_s']:.1f} | {m['non_pass_s'] / per_1m:.2f} | {_mib(r['peak']) if not label else ''} |"
                )
    if res["workers"]:
        lines += [
            "",
            "Against the workers (a real local cluster of single-threaded worker processes, and the default",
            "threaded scheduler; the machine has 2 cores):",
            "",
            "| workers | fit s | X^T X pass s | fit / pass | client peak RSS MiB |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for r in res["workers"]:
            lines.append(
                f"| {r['workers']} | {r['fit_s']:.1f} | {r['xtx_s']:.1f} | {r['fit_s'] / r['xtx_s']:.2f} | "
                f"{_mib(r['peak'])} |"
            )
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 4, figsize=(17, 4))
    for dtype, mark in (("float64", "o"), ("float32", "s")):
        rows = [r for r in res["rows"] if r["dtype"] == dtype]
        if rows:
            n = [r["n"] for r in rows]
            ax[0].loglog(n, [r["fit_s"] for r in rows], mark + "-", label=f"MCPCA fit, {dtype}")
            ax[0].loglog(n, [r["xtx_s"] for r in rows], mark + ":", label=f"X^T X pass, {dtype}")
            ax[1].semilogx(n, [r["peak"] / 2**20 for r in rows], mark + "-", label=f"fit, {dtype}")
    ax[0].set(xlabel="rows (x 10 columns)", ylabel="seconds", title="time against rows")
    ax[1].set(xlabel="rows (x 10 columns)", ylabel="peak RSS, MiB", title="memory against rows", ylim=(0, None))
    if res["cols"]:
        p = [r["p"] for r in res["cols"]]
        ax[2].loglog(p, [r["fit_s"] for r in res["cols"]], "o-", label="MCPCA fit")
        ax[2].loglog(p, [r["xtx_s"] for r in res["cols"]], "o:", label="X^T X pass")
        ax[2].loglog(p, [r["non_pass_s"] for r in res["cols"]], "^--", label="fit: non-pass work")
        ax[2].set(xlabel=f"columns ({res['cols'][0]['n']:,} rows)", ylabel="seconds", title="time against columns")
    if res["workers"]:
        names = [str(r["workers"]) for r in res["workers"]]
        x = range(len(names))
        ax[3].bar([i - 0.2 for i in x], [r["fit_s"] for r in res["workers"]], 0.4, label="MCPCA fit")
        ax[3].bar([i + 0.2 for i in x], [r["xtx_s"] for r in res["workers"]], 0.4, label="X^T X pass")
        ax[3].set_xticks(list(x), names)
        ax[3].set(xlabel="workers", ylabel="seconds", title="time against workers")
    for a in ax:
        a.legend(fontsize=8)
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="*", default=[1_000_000, 5_000_000, 20_000_000])
    ap.add_argument("--rows32", type=int, nargs="*", default=[20_000_000])
    ap.add_argument("--cols", type=int, nargs="*", default=[10, 100, 300, 500, 1000])
    ap.add_argument("--p-rows", type=int, default=200_000)
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--worker-rows", type=int, default=20_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--worker-malloc", action="store_true",
                    help="only compare glibc's defaults with the command's malloc on cluster workers")
    ap.add_argument("--before", action="store_true",
                    help="also fit each column store under the rules before the last change (BEFORE), alternated")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--section", default="scaling",
                    help="the RESULTS.md section (and data/<section>.json, <section>.png) to write; "
                         "'scaling-wide' for a --cols-only run (--rows --rows32 --workers left empty)")
    a = ap.parse_args(argv)
    if a.child:
        _child(*a.child, a.address)
        return
    if a.worker_malloc:
        text = report_worker_malloc(run_worker_malloc(a), "python benchmarks/scaling.py " + " ".join(sys.argv[1:]))
        print(text)
        if not a.no_write:
            update_section("worker-malloc", text, machine=machine_info())
        return
    res = run_scaling(a)
    (HERE / "data").mkdir(exist_ok=True)
    (HERE / "data" / f"{a.section}.json").write_text(json.dumps(res, indent=1))
    text = report(res, "python benchmarks/scaling.py " + " ".join(sys.argv[1:]), a.section)
    print(text)
    if not a.no_write:  # the machine block describes the full run's sections: only that run rewrites it
        update_section(a.section, text, machine=machine_info() if a.section == "scaling" else None)
        plot(res, HERE / f"{a.section}.png")


if __name__ == "__main__":
    main()
