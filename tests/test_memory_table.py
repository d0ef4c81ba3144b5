"""``benchmarks/memory.py``'s fit table: the columns the generated figures read, and its section keys.

``benchmarks/_front.py`` and ``_front_docs.py`` read the ``memory-x10`` section by column
(4: peak RSS, 8: fit s, 10 and 12: the console malloc's peak and seconds); the wide run of
issue 37 (``--cols 300 --dtype float32``) writes its own section and must not replace it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20


def _load(name):
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports its siblings
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


MEMORY = _load("memory")


def _result(rows, peak_mib, *, console=None):
    res = {"rows": rows, "nbytes": rows * 40, "store_bytes": rows * 38, "n_blocks": rows // 1_000_000,
           "peak": peak_mib * MIB, "polled": (peak_mib - 1) * MIB, "baseline": 256 * MIB, "seconds": 3.25,
           "n_passes": 2, "load": (1.5, 2.25)}
    if console is not None:
        res["console"] = {"peak": console * MIB, "seconds": 1.5}
    return res


def _rows(body):
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in body.splitlines() if line.startswith("| ") and line[2].isdigit()]


def test_columns_read_by_the_figures_stay_put_with_the_load_column():
    body = MEMORY.report([_result(1_000_000, 600, console=640), _result(8_000_000, 720, console=960)],
                         cols=10, chunk_rows=1_000_000)
    first, second = _rows(body)
    assert second[0] == "8,000,000"
    assert second[4] == "720.0 MiB (719.0 MiB)"  # peak (polled)
    assert second[7] == "1.20"  # 720 / 600
    assert second[8] == "3.2"  # fit s (3.25 rounds to even)
    assert second[10] == "960.0 MiB"  # the console malloc's peak
    assert second[11] == "1.50"  # 960 / 640
    assert second[12] == "1.5"
    assert second[13] == "1.5-2.2"  # the load, last
    assert len(second) == 14


def test_peaks_over_a_gib_stay_in_mib():
    body = MEMORY.report([_result(1_000_000, 1335), _result(10_000_000, 1349)], cols=300, chunk_rows=50_000,
                         dtype="float32")
    _, second = _rows(body)
    assert second[4].startswith("1,349.0 MiB")
    assert second[7] == "1.01"


def test_wide_float32_section_is_not_the_readme_s(monkeypatch):
    seen = {}

    def record(key, body, **_):
        seen[key] = body

    monkeypatch.setattr(MEMORY, "update_section", record)
    monkeypatch.setattr(MEMORY, "run_memory", lambda rows, **_: [_result(n, 1300) for n in rows])
    MEMORY.main(["--rows", "1000000", "10000000", "--cols", "300", "--dtype", "float32"])
    assert list(seen) == ["memory-x300-float32"]
