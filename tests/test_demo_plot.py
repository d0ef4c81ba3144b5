"""The demo draws its PNG on its own Agg canvas: a caller's matplotlib backend is left alone (issue 23)."""

from __future__ import annotations

import matplotlib
import pytest

from dask_mcpca.cli import main

pytestmark = pytest.mark.slow  # a whole demo run (about 30 s on 2 cores)


def test_the_demo_leaves_the_matplotlib_backend_alone(tmp_path):
    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        assert main(["demo", "--rows", "20000", "--out", str(tmp_path / "demo"), "--no-progress"]) == 0
        assert matplotlib.get_backend() == "svg"  # matplotlib.use("Agg") in the demo switched it
    finally:
        matplotlib.use(before)
    assert (tmp_path / "demo" / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
