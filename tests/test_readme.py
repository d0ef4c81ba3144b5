"""Every code block of README.md runs as written (issue 23).

The README's fenced blocks are read from the file itself.  A ``python`` block
runs in a fresh interpreter and a ``bash`` block in ``bash -euo pipefail``,
in order, in a folder whose ``archive.zarr`` is first the demo's archive (a
plain Zarr array with NaN rows) and then a store written by xarray
(``Dataset.to_zarr``, one variable per channel along ``time``, with gaps).
A block that is not meant to run says so in its info string (```` ```bash
norun ````); only the two set-up commands may, and the second must be the
command ``.ci/run`` runs.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

#: how each language of a runnable block is run (the block is fed on stdin)
RUNNERS = {
    "python": [sys.executable, "-"],
    "bash": ["bash", "-euo", "pipefail", "-s"],
}
NORUN = "norun"
#: the blocks that may be marked norun: the set-up commands (they install the package)
SETUP_COMMANDS = [
    'pip install ".[plot]" && dask-mcpca demo',
    'pip install -e ".[test]" && ruff check . && python -m pytest --full -n 2 --dist loadfile',
]
FENCE = re.compile(r"^```(?P<info>[^`\n]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")

DEMO_ROWS = 20_000
XARRAY_ROWS = 5_000


def readme_blocks():
    """``(words of the info string, body)`` of every fenced block, in order."""
    return [(m.group("info").split(), m.group("body")) for m in FENCE.finditer(README.read_text())]


def runnable_blocks():
    return [(info[0], body) for info, body in readme_blocks() if NORUN not in info]


def test_every_block_is_runnable_or_marked():
    blocks = readme_blocks()
    assert blocks, "no fenced code block found in README.md"
    for info, body in blocks:
        assert info and info[0] in RUNNERS, f"block without a runnable language ({info}):\n{body}"
        assert set(info[1:]) <= {NORUN}, f"unknown words in the info string {info}"
    norun = [body.strip() for info, body in blocks if NORUN in info]
    assert norun == SETUP_COMMANDS
    languages = [language for language, _ in runnable_blocks()]
    assert "python" in languages and "bash" in languages


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert SETUP_COMMANDS[1] in ci


def test_readme_links_point_to_files():
    text = README.read_text()
    targets = [m.group("target") for m in LINK.finditer(text)]
    local = [t.split("#")[0] for t in targets if "://" not in t and not t.startswith("#")]
    assert "examples/demo_report.png" in local
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_readme_is_a_front_door():
    assert len(README.read_text().splitlines()) <= 200


def _demo_archive(path):
    from dask_mcpca.demo.archive import make_archive

    sensors, _, _ = make_archive(path.parent / "demo", n_rows=DEMO_ROWS)
    shutil.copytree(sensors, path)
    return DEMO_ROWS


def _xarray_archive(path):
    import pandas as pd
    import xarray as xr

    rng = np.random.default_rng(0)
    factors = rng.normal(size=(XARRAY_ROWS, 2))
    channels = {}
    for j in range(5):
        values = factors @ rng.normal(size=2) + 0.1 * rng.normal(size=XARRAY_ROWS)
        channels[f"ch{j}"] = ("time", values)
    channels["ch2"][1][100:160] = np.nan  # a sensor offline for a minute
    channels["ch4"][1][::997] += 40.0  # spikes
    time = pd.date_range("2025-01-01", periods=XARRAY_ROWS, freq="s")
    xr.Dataset(channels, coords={"time": time}).to_zarr(path)
    return XARRAY_ROWS


def _run(language, body, cwd):
    env = {**os.environ, "MPLBACKEND": "Agg"}
    return subprocess.run(RUNNERS[language], input=body, cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("make_store", [_demo_archive, _xarray_archive], ids=["demo", "xarray"])
def test_readme_blocks_run(tmp_path, make_store):
    work = tmp_path / "work"
    work.mkdir()
    n_rows = make_store(work / "archive.zarr")
    outputs = []
    for language, body in runnable_blocks():
        done = _run(language, body, work)
        assert done.returncode == 0, f"README block failed:\n{body}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        outputs.append(done.stdout)
    # the quick start's summary line counts the store's rows
    found = re.search(r"(\d+) of (\d+) rows flagged in (\d+) passes", "".join(outputs))
    assert found, outputs
    flagged, rows, passes = map(int, found.groups())
    assert rows == n_rows and 0 < flagged < rows / 5 and 1 <= passes <= 4
    # the command-line block wrote what it names
    for name in ["model.json", "scores.zarr", "report.png", "report.csv"]:
        assert (work / name).exists(), name
