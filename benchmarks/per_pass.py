"""Tasks and bytes per pass of a default fit on a real local cluster: what each worker does, what moves.

One command::

    python benchmarks/per_pass.py --rows 4000000 --cols 10 --chunk-rows 250000 --workers 1 2 4

For each worker count, a real cluster on 127.0.0.1 (``dask scheduler`` and nanny-managed
``dask worker`` processes, one thread each: ``tests/_cluster.py``) and a default fit of the same
Zarr store through a ``distributed.Client``, with the task stream recorded.  Reported per fit:
the passes (full passes and blocks read for the row sample), the tasks by kind (dask's key
prefix) and the bytes of their results, the bytes moved between workers (each worker's own log of
incoming transfers: what a real network would carry), the bytes of results the client gathers,
and the wall time.  The point is the plan in ``docs/performance.md``: a block is read, reduced to
a few p x p sums and dropped where it was read, so what crosses the network per pass does not
grow with the rows of a block, only with their number.  Writes the ``per-pass`` section of
``RESULTS.md`` (``--no-write``: print only).  A 2-core machine cannot show speed-ups past 2
workers; the counts and bytes do not depend on the cores.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from _results import cpu_line, fmt_bytes, update_section  # noqa: E402
from make_store import make_store  # noqa: E402


def measure(store: str, n_workers: int) -> dict:
    """One default fit on a fresh cluster of ``n_workers`` single-threaded workers."""
    import distributed
    from _cluster import ProcessCluster
    from dask.utils import key_split

    from dask_mcpca import MCPCA

    with tempfile.TemporaryDirectory() as tmp, ProcessCluster(tmp, n_workers=n_workers, memory_limit="4GiB") as c:
        with distributed.Client(c.address) as client:
            MCPCA().fit(store)  # once: imports and compiled loops on every worker
            client.run(lambda dask_worker: dask_worker.transfer_incoming_log.clear())
            with distributed.get_task_stream(client) as stream:
                started = time.perf_counter()
                model = MCPCA().fit(store)
                seconds = time.perf_counter() - started
            logs = client.run(lambda dask_worker: [dict(t) for t in dask_worker.transfer_incoming_log])
    tasks, result_bytes = collections.Counter(), collections.Counter()
    for record in stream.data:
        kind = key_split(record["key"])
        tasks[kind] += 1
        result_bytes[kind] += int(record.get("nbytes", 0) or 0)
    moved = sum(int(t.get("total", 0)) for log in logs.values() for t in log)
    n_transfers = sum(len(log) for log in logs.values())
    return {"workers": n_workers, "seconds": seconds, "passes": int(model.n_passes_),
            "partial_reads": int(model.n_partial_reads_), "blocks_read": int(model.n_blocks_read_),
            "tasks": dict(tasks), "result_bytes": dict(result_bytes), "moved": moved, "transfers": n_transfers}


def report(info, chunk_rows: int, results: list[dict]) -> str:
    n_chunks = -(-info.n_rows // chunk_rows)
    first = results[0]
    per_pass = first["tasks"].get("from-zarr", 0) // max(first["passes"] + first["partial_reads"], 1)
    lines = [
        f"## Tasks and bytes per pass: {info.n_rows:,} x {info.n_cols} float64, {n_chunks} store chunks of "
        f"{chunk_rows:,} rows, read as {per_pass} blocks per full pass "
        f"({fmt_bytes(info.n_rows * info.n_cols * 8 / max(per_pass, 1))} each)",
        "",
        f"`python benchmarks/per_pass.py --rows {info.n_rows} --cols {info.n_cols} --chunk-rows {chunk_rows} "
        f"--workers {' '.join(str(r['workers']) for r in results)}`: a default fit through a real local cluster "
        "(single-threaded worker processes), its task stream, and each worker's log of incoming transfers.",
        "",
        "| workers | fit s | passes | blocks read | tasks | result of a block's task | result of a pass "
        "(to the client) | moved between workers | per pass |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        t, b = r["tasks"], r["result_bytes"]
        reads = t.get("from-zarr", 0)
        passes = r["passes"] + r["partial_reads"]
        block = b.get("block_task", 0) / max(t.get("block_task", 0), 1)
        whole = b.get("combine_many", 0) / max(t.get("combine_many", 0), 1)
        lines.append(
            f"| {r['workers']} | {r['seconds']:.2f} | {r['passes']} full + {r['partial_reads']} partial | {reads} | "
            f"{sum(t.values())} | {fmt_bytes(block)} | {fmt_bytes(whole)} | {fmt_bytes(r['moved'])} "
            f"({r['transfers']} transfers) | {fmt_bytes(r['moved'] / max(passes, 1))} |"
        )
    kinds = results[-1]
    lines += ["", f"Tasks by kind ({kinds['workers']} workers): "
              + ", ".join(f"`{k}` {v} ({fmt_bytes(kinds['result_bytes'].get(k, 0))} of results)"
                          for k, v in sorted(kinds["tasks"].items(), key=lambda kv: -kv[1])) + ".",
              "", f"Machine: {cpu_line()}; load average {os.getloadavg()[0]:.1f} at the end."]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--cols", type=int, default=10)
    ap.add_argument("--chunk-rows", type=int, default=250_000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    info = make_store(a.rows, a.cols, dtype="float64", chunk_rows=a.chunk_rows)
    results = []
    for k in a.workers:
        results.append(measure(str(info.path), k))
        print(results[-1], flush=True)
    text = report(info, a.chunk_rows, results)
    print(text)
    if not a.no_write:
        update_section("per-pass", text)


if __name__ == "__main__":
    main()
