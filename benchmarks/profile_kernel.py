"""Where the per-block kernel spends its time, against X^T X.

One command (needs ``pip install line_profiler``)::

    python benchmarks/profile_kernel.py --rows 1000000 --cols 10

Times :func:`dask_mcpca._block.block_stats` on an in-memory block (no
reading, no dask) with the two kernels of a robust step (core and final, one
Mahalanobis matrix), in each of its spellings: the one compiled sweep the
default solver takes, the two compiled sweeps, and numpy.  Twice: with the
default's radii (the chi-square 97.5 % and 99 % quantiles, as
``benchmarks/speed.py`` runs them: a few percent of the rows outside the core's
flat top take an ``exp``) and at the coverage floor (the core radius at the
median d², so half the rows are outside it: the most ``exp`` a default pass
can take).  Then the moments pass that draws the row sample (what the spread
read runs), against ``X.T @ X`` on the same block, all with single-threaded
BLAS; and the line profile of that moments pass (the kernel pass is one
compiled call).  Writes a section of ``RESULTS.md``.

Wide blocks (issue 37 point 1)::

    python benchmarks/profile_kernel.py --wide --cols 100 300 1000 --dtype float64 float32

times a robust step's ``block_stats`` on one block of each width (as many rows as an 80 MB
float64 chunk of ``benchmarks/scaling.py``'s stores holds: 100,000 / 33,333 / 10,000 rows) by
the usual route (:func:`dask_mcpca._kernels.wide_block`) and by the numpy spelling asked for
(``route="numpy"``: the route every wide block took before, sub-blocks of 32,768 rows), against
``X.T @ X`` of the same block, the three alternated in each round, wall and CPU time
(``time.process_time``), one BLAS thread; then the line profile of the usual route's block.
Writes the ``profile-wide`` section.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

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


def _spellings(block, X, plan, repeats):
    """Median seconds of ``block_stats(X, plan)`` in one sweep, in two sweeps and in numpy
    (each route asked for by name, :func:`dask_mcpca._block.choose_route`)."""
    t_one = _best(lambda: block.block_stats(X, plan), repeats)
    t_two = _best(lambda: block.block_stats(X, plan, route="two_sweeps"), repeats)
    t_numpy = _best(lambda: block.block_stats(X, plan, route="numpy"), repeats)
    return t_one, t_two, t_numpy


def profile_kernel(rows: int, cols: int, repeats: int = 7, dtype: str = "float64") -> str:
    from line_profiler import LineProfiler
    from threadpoolctl import threadpool_limits

    import dask_mcpca._block as block
    import dask_mcpca._kernels as kernels

    X = np.random.default_rng(0).standard_normal((rows, cols)).astype(dtype)
    # A robust step: the core and the final kernel, one Mahalanobis matrix A = I / c^2 (c^2 = 0.25), so
    # q = (x - c)^T A (x - c) = 4 d^2 and a flat top at d^2 <= r has offset z = q / 2 = 2 r.
    A = np.eye(cols) / 0.25

    def step(core: float, final: float):
        return block.PassPlan(center=np.zeros(cols), kernels=np.stack([A, A]), offsets=2 * np.array([core, final]))

    default = step(stats.chi2.ppf(0.975, cols), stats.chi2.ppf(0.99, cols))
    floor = step(stats.chi2.ppf(0.5, cols), stats.chi2.ppf(0.99, cols))
    moments = block.PassPlan(center=np.zeros(cols), sample_rate=0.004)
    per_m = 1e3 * 1e6 / rows  # seconds -> ms per million rows
    with threadpool_limits(limits=1, user_api="blas"):
        block.block_stats(X, default)  # compiles the loops (or loads them from numba's cache)
        block.block_stats(X, moments)
        t_default = _spellings(block, X, default, repeats)
        t_floor = _spellings(block, X, floor, repeats)
        t_moments = _best(lambda: block.block_stats(X, moments), repeats)
        t_moments_numpy = _best(lambda: block.block_stats(X, moments, route="numpy"), repeats)
        t_xtx = _best(lambda: X.T @ X, repeats)
        profiler = LineProfiler(block.block_stats, kernels.compiled_moments)
        wrapped = profiler(block.block_stats)
        for _ in range(repeats):
            wrapped(X, moments)
    stats_ = profiler.get_stats()
    out = io.StringIO()
    profiler.print_stats(stream=out, output_unit=1e-3)
    print(out.getvalue())

    def ms(t):
        return f"{t * per_m:.1f}"

    lines = [
        f"## Per-block kernel profile: {rows:,} x {cols} {dtype} in memory, 1 BLAS thread",
        "",
        f"BLAS: {blas_info()}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}. "
        f"Median of {repeats}; ms per million rows. `X.T @ X` on the same rows: **{ms(t_xtx)} ms**.",
        "",
        "| `block_stats`, a robust step (core and final kernel) | one sweep (the default's) | two sweeps | numpy |",
        "| --- | ---: | ---: | ---: |",
        f"| default radii (chi-square 97.5 % and 99 %) | **{ms(t_default[0])}** | {ms(t_default[1])} "
        f"| {ms(t_default[2])} |",
        f"| coverage floor (core at the median d², half the rows outside it) | {ms(t_floor[0])} "
        f"| {ms(t_floor[1])} | {ms(t_floor[2])} |",
        "",
        f"- one sweep at the default radii / `X.T @ X` in memory: {t_default[0] / t_xtx:.1f}x",
        f"- `block_stats`, moments + row sample (the spread read): **{ms(t_moments)} ms** "
        f"(numpy spelling: {ms(t_moments_numpy)} ms)",
        "",
        f"Line profile of the moments pass ({repeats} calls; lines with at least 1 % of their function):",
        "",
        "| function | line | ms per 1M rows | % of function |",
        "| --- | --- | ---: | ---: |",
    ]
    for (filename, _, name), timings in stats_.timings.items():
        total = sum(t for _, _, t in timings) or 1
        source = Path(filename).read_text().splitlines()
        for lineno, _, t in sorted(timings, key=lambda x: -x[2]):
            share = t / total
            if share < 0.01:
                continue
            code = source[lineno - 1].strip().replace("|", "\\|")
            lines.append(f"| `{name}` | `{code}` | {t * stats_.unit / repeats * per_m:.1f} | {share:.0%} |")
    return "\n".join(lines)


#: Bytes of the stores' chunks in ``benchmarks/scaling.py`` (float64): a wide block's rows.
CHUNK_BYTES = 80_000_000


def _alternated(calls: dict, repeats: int, setup: dict | None = None) -> dict:
    """Median wall and CPU seconds of each call, the calls rotated in every round.

    ``setup[k]()``, where given, runs before call ``k`` outside the timed region and its result is
    passed to the call (a fresh operand for a call that overwrites its input).
    """
    times = {k: ([], []) for k in calls}
    keys, setup = list(calls), setup or {}
    for r in range(repeats):
        for k in keys[r % len(keys):] + keys[: r % len(keys)]:
            args = (setup[k](),) if k in setup else ()
            t, c = time.perf_counter(), time.process_time()
            calls[k](*args)
            times[k][0].append(time.perf_counter() - t)
            times[k][1].append(time.process_time() - c)
    return {k: (float(np.median(w)), float(np.median(c))) for k, (w, c) in times.items()}


def profile_wide(cols: list[int], dtypes: list[str], repeats: int = 7) -> str:
    """A robust step's block at each width and dtype: the usual route, the numpy spelling, X^T X."""
    from line_profiler import LineProfiler
    from scipy.linalg.blas import dtrmm
    from threadpoolctl import threadpool_limits

    import dask_mcpca._block as block
    import dask_mcpca._kernels as kernels

    rows_out, profiles = [], []
    load = os.getloadavg()[0]
    for p in cols:
        n = CHUNK_BYTES // (8 * p)
        rng = np.random.default_rng(0)
        B = rng.standard_normal((p, p)) / np.sqrt(p) + np.eye(p)
        X64 = rng.standard_normal((n, p)) @ B
        A = np.linalg.inv(B.T @ B) / 0.25  # a robust step: the precision over c^2 = 0.25
        plan = block.PassPlan(center=np.full(p, 0.01), kernels=np.stack([A, A]), unit_exp=1,
                              offsets=2 * np.array([stats.chi2.ppf(0.975, p), stats.chi2.ppf(0.99, p)]))
        for dtype in dtypes:
            X = np.ldexp(X64, 1).astype(dtype)
            with threadpool_limits(limits=1, user_api="blas"):
                block.block_stats(X, plan)
                block.block_stats(X, plan, route="numpy")
                L = np.asfortranarray(np.linalg.cholesky(A))
                # the TRMM overwrites its operand: a fresh copy of the rows each round, made untimed
                t = _alternated({"usual": lambda X=X, plan=plan: block.block_stats(X, plan),
                                 "numpy": lambda X=X, plan=plan: block.block_stats(X, plan, route="numpy"),
                                 "xtx": lambda X=X: X.T @ X,
                                 "syrk64": lambda X64=X64: X64.T @ X64,
                                 "trmm64": lambda Z, L=L: dtrmm(1.0, L, Z.T, side=0, lower=1, trans_a=1,
                                                                overwrite_b=1)},
                                repeats, setup={"trmm64": lambda X64=X64: np.array(X64)})
                profiler = LineProfiler(kernels.wide_block, kernels._wide_sums)
                wrapped = profiler(block.block_stats)
                for _ in range(3):
                    wrapped(X, plan)
            rows_out.append((p, n, dtype, t))
            out = io.StringIO()
            profiler.print_stats(stream=out, output_unit=1e-3)
            print(out.getvalue())
            st = profiler.get_stats()
            for (filename, _, name), timings in st.timings.items():
                if name != "_wide_sums":
                    continue
                total = sum(x for _, _, x in timings) or 1
                source = Path(filename).read_text().splitlines()
                top = sorted(timings, key=lambda x: -x[2])[:6]
                profiles.append((p, dtype, [(source[ln - 1].strip().replace("|", "\\|"), x * st.unit / 3 * 1e3,
                                             x / total) for ln, _, x in top]))
    lines = [
        "## Per-block kernel at wide p: a robust step's block in memory, 1 BLAS thread (issue 37 point 1)",
        "",
        f"`python benchmarks/profile_kernel.py --wide --cols {' '.join(map(str, cols))} --dtype {' '.join(dtypes)}"
        f" --repeats {repeats}`. BLAS: {blas_info()}. One block of each width (the rows of an 80 MB float64 chunk),"
        " a robust step's two kernels (core and final, chi-square 97.5 % and 99 %, one matrix); `usual`: "
        "`block_stats` as the fit runs it (`_kernels.wide_block`); `numpy`: the numpy spelling asked for "
        "(`route=\"numpy\"`, sub-blocks of 32,768 rows: every wide block's route before); `X.T @ X` of the same "
        f"block (numpy's SYRK, in the block's dtype). Medians of {repeats} rounds, the five timed calls "
        "(`usual`, `numpy`, `X.T @ X` and the floor's two products) rotated in each; "
        f"wall ms (CPU ms). 1-min load average {load:.1f} before, {os.getloadavg()[0]:.1f} after, on "
        f"{os.cpu_count()} cores.",
        "",
        "Floor: the kernel's two float64 products alone on the same rows, the TRMM of the quadratic forms "
        "and the SYRK `X.T @ X` in float64 (the weighted sums' product), over `X.T @ X` in the block's dtype "
        "(CPU time).",
        "",
        "| p | rows | dtype | usual ms | numpy (before) ms | `X.T @ X` ms | usual / X^T X | before / X^T X "
        "| CPU: usual / X^T X | CPU: before / X^T X | CPU: floor (TRMM + SYRK) / X^T X |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p, n, dtype, t in rows_out:
        u, b, x = t["usual"], t["numpy"], t["xtx"]
        floor = (t["trmm64"][1] + t["syrk64"][1]) / x[1]
        lines.append(f"| {p} | {n:,} | {dtype} | {u[0] * 1e3:.1f} ({u[1] * 1e3:.1f}) | {b[0] * 1e3:.1f} "
                     f"({b[1] * 1e3:.1f}) | {x[0] * 1e3:.1f} ({x[1] * 1e3:.1f}) | **{u[0] / x[0]:.2f}** | "
                     f"{b[0] / x[0]:.2f} | **{u[1] / x[1]:.2f}** | {b[1] / x[1]:.2f} | {floor:.2f} |")
    lines += ["", "Where the usual route's time goes (`_wide_sums`, per block, line profiler; its six largest lines):",
              "", "| p | dtype | line | ms | share |", "| ---: | --- | --- | ---: | ---: |"]
    for p, dtype, top in profiles:
        for code, ms, share in top:
            lines.append(f"| {p} | {dtype} | `{code}` | {ms:.1f} | {share:.0%} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--cols", type=int, nargs="+", default=[10])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dtype", choices=("float64", "float32"), nargs="+", default=["float64"])
    parser.add_argument("--wide", action="store_true", help="the wide blocks' table (section profile-wide)")
    parser.add_argument("--no-write", action="store_true")
    a = parser.parse_args(argv)
    if a.wide:
        body = profile_wide(a.cols, a.dtype, a.repeats)
        print(body)
        if not a.no_write:
            update_section("profile-wide", body)
        return
    a.cols, a.dtype = a.cols[0], a.dtype[0]
    body = profile_kernel(a.rows, a.cols, a.repeats, a.dtype)
    print(body)
    if not a.no_write:
        update_section(f"profile-{a.cols}-{a.dtype}", body, machine=machine_info())


if __name__ == "__main__":
    main()
