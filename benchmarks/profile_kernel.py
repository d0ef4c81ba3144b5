"""Where the per-block kernel spends its time, line by line, against X^T X.

One command (needs ``pip install line_profiler``)::

    python benchmarks/profile_kernel.py --rows 1000000 --cols 10

Times :func:`dask_mcpca._block.block_stats` on an in-memory block
(no reading, no dask) with one Mahalanobis kernel, as a robust step runs it,
and with the moments plan of the first pass, against ``X.T @ X`` on the same
block, all with single-threaded BLAS; then prints the line profile of
``block_stats`` and ``_sub_block_stats`` in ms per million rows and writes the
lines that cost at least 1 % into a section of ``RESULTS.md``.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import blas_info, machine_info, update_section

__all__ = ["profile_kernel"]


def _best(f, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def profile_kernel(rows: int, cols: int, repeats: int = 7, dtype: str = "float64") -> str:
    from line_profiler import LineProfiler
    from threadpoolctl import threadpool_limits

    import dask_mcpca._block as block

    X = np.random.default_rng(0).standard_normal((rows, cols)).astype(dtype)
    # a robust step: the core kernel and the final kernel, one Mahalanobis matrix (A = I / c^2, c^2 = 0.25),
    # flat tops at d^2 = 9.3 and 18 (about half the rows and nearly all of them for p = 10)
    A = np.eye(cols) / 0.25
    kernel = block.PassPlan(center=np.zeros(cols), kernels=np.stack([A, A]), offsets=np.array([9.3, 18.0]) / 0.5)
    moments = block.PassPlan(center=np.zeros(cols), sample_rate=0.004)
    per_m = 1e3 * 1e6 / rows  # seconds -> ms per million rows
    functions = [block.block_stats, block._compiled_stats, block._compiled_moments, block._sub_block_stats]
    with threadpool_limits(limits=1, user_api="blas"):
        block.block_stats(X, kernel)  # compiles the loops (or loads them from numba's cache)
        t_kernel = _best(lambda: block.block_stats(X, kernel), repeats)
        t_moments = _best(lambda: block.block_stats(X, moments), repeats)
        t_xtx = _best(lambda: X.T @ X, repeats)
        compiled, block.COMPILED = block.COMPILED, False
        t_kernel_numpy = _best(lambda: block.block_stats(X, kernel), repeats)
        t_moments_numpy = _best(lambda: block.block_stats(X, moments), repeats)
        block.COMPILED = compiled
        profiler = LineProfiler(*functions)
        wrapped = profiler(block.block_stats)
        for _ in range(repeats):
            wrapped(X, kernel)
    stats = profiler.get_stats()
    out = io.StringIO()
    profiler.print_stats(stream=out, output_unit=1e-3)
    print(out.getvalue())

    lines = [
        f"## Per-block kernel profile: {rows:,} x {cols} {dtype} in memory, 1 BLAS thread",
        "",
        f"BLAS: {blas_info()}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}. "
        f"Median of {repeats}; ms per million rows.",
        "",
        f"- `block_stats`, a robust step (core and final kernel): **{t_kernel * per_m:.1f} ms** "
        f"(numpy spelling: {t_kernel_numpy * per_m:.1f} ms)",
        f"- `block_stats`, moments + row sample (the first pass): **{t_moments * per_m:.1f} ms** "
        f"(numpy spelling: {t_moments_numpy * per_m:.1f} ms)",
        f"- `X.T @ X` on the same rows: **{t_xtx * per_m:.1f} ms** "
        f"(kernel / XtX in memory: {t_kernel / t_xtx:.1f}x)",
        "",
        f"Line profile of the kernel pass ({repeats} calls; lines with at least 1 % of their function):",
        "",
        "| function | line | ms per 1M rows | % of function |",
        "| --- | --- | ---: | ---: |",
    ]
    for (filename, _, name), timings in stats.timings.items():
        total = sum(t for _, _, t in timings) or 1
        source = Path(filename).read_text().splitlines()
        for lineno, _, t in sorted(timings, key=lambda x: -x[2]):
            share = t / total
            if share < 0.01:
                continue
            code = source[lineno - 1].strip().replace("|", "\\|")
            ms = t * stats.unit / repeats * per_m
            lines.append(f"| `{name}` | `{code}` | {ms:.1f} | {share:.0%} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--cols", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--no-write", action="store_true")
    a = parser.parse_args(argv)
    body = profile_kernel(a.rows, a.cols, a.repeats, a.dtype)
    print(body)
    if not a.no_write:
        update_section(f"profile-{a.cols}-{a.dtype}", body, machine=machine_info())


if __name__ == "__main__":
    main()
