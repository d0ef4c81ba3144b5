"""Writing benchmark figures into ``benchmarks/RESULTS.md``.

Each benchmark run owns one section of the file, delimited by HTML comments
``<!-- begin KEY -->`` / ``<!-- end KEY -->``; running it again replaces that
section and leaves the others alone.  The machine description at the top is
rewritten by every run.
"""

from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path

__all__ = ["RESULTS", "PassClock", "machine_info", "blas_info", "update_section", "fmt_bytes"]

#: The results file.
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"

_TITLE = "# dask_mcpca benchmarks\n"


class PassClock:
    """Seconds spent inside the fit's passes (``PassRunner.run``, patched once) since ``seconds`` was
    last set to 0: a fit's time outside them is the client's work."""

    def __init__(self):
        import dask_mcpca._passes as passes

        self.seconds = 0.0
        run = passes.PassRunner.run

        def timed(runner, *a, **k):
            t = time.perf_counter()
            try:
                return run(runner, *a, **k)
            finally:
                self.seconds += time.perf_counter() - t

        passes.PassRunner.run = timed


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def blas_info() -> str:
    """The BLAS libraries threadpoolctl sees, with their kernel and thread count."""
    from threadpoolctl import threadpool_info

    return "; ".join(
        f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture', '-')} kernel, "
        f"{i.get('num_threads')} threads)"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    )


def cpu_line() -> str:
    """The CPU model and the logical core count, as the first line of :func:`machine_info` gives them."""
    return f"{_cpu_model()}, {os.cpu_count()} logical cores"


def machine_info() -> str:
    """A Markdown list describing the machine and the library versions."""
    import dask
    import numpy
    import psutil
    import sklearn
    import zarr

    try:
        import dask_ml

        dask_ml_version = dask_ml.__version__
    except ImportError:  # optional contender
        dask_ml_version = "not installed"
    import dask_mcpca

    env = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    lines = [
        f"- CPU: {cpu_line()}",
        f"- RAM: {psutil.virtual_memory().total / 2**30:.1f} GiB",
        f"- OS: {platform.platform()}",
        f"- Python {platform.python_version()}; numpy {numpy.__version__}; dask {dask.__version__}; "
        f"zarr {zarr.__version__}; scikit-learn {sklearn.__version__}; dask-ml {dask_ml_version}; "
        f"dask_mcpca {dask_mcpca.__version__}",
        f"- BLAS: {blas_info()}",
        f"- OPENBLAS_* environment: {env or 'unset'}",
    ]
    return "\n".join(lines)


def update_section(key: str, body: str, *, path: Path = RESULTS, machine: str | None = None) -> None:
    """Replace (or append) the section ``key`` of the results file."""
    text = path.read_text() if path.exists() else _TITLE
    begin, end = f"<!-- begin {key} -->", f"<!-- end {key} -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    if machine is not None:
        mbody = "## Machine\n\n" + machine
        mbegin, mend = "<!-- begin machine -->", "<!-- end machine -->"
        mblock = f"{mbegin}\n{mbody}\n{mend}"
        mpat = re.compile(re.escape(mbegin) + r".*?" + re.escape(mend), re.S)
        if mpat.search(text):
            text = mpat.sub(lambda _: mblock, text)
        else:
            head, _, rest = text.partition("\n")
            text = f"{head}\n\n{mblock}\n{rest}"
    path.write_text(text.rstrip() + "\n")


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
