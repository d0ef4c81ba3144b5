"""The documentation site builds with warnings as errors (docs/, Sphinx).

The full tier (``.ci/run``) runs this, so a docstring, a page or a benchmark
file that breaks the build fails CI.  Build it by hand with
``python -m sphinx -W --keep-going -b html docs docs/_build/html``.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_docs_build_without_warnings(tmp_path):
    out = tmp_path / "html"
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, f"sphinx failed:\n{done.stdout}\n{done.stderr}"
    assert done.stderr.strip() == "", done.stderr
    # the API reference is generated from the docstrings, the CLI reference from the parser
    api = (out / "api.html").read_text()
    for name in ["MCPCA", "open_archive", "load", "check_params", "ModelFormatError"]:
        assert f'id="dask_mcpca.{name}"' in api, name
    assert 'id="dask_mcpca.MCPCA.fit"' in api
    cli = (out / "cli.html").read_text()
    assert "<kbd>--nan-policy</kbd>" in cli
    for command in ["fit", "score", "report", "demo"]:
        assert f'id="dask-mcpca-{command}"' in cli, command
    for page in ["index", "getting-started", "errors", "object-stores", "algorithm", "benchmarks/results"]:
        assert (out / f"{page}.html").exists(), page


def test_every_benchmark_file_has_a_page():
    pages = "\n".join(p.read_text() for p in (ROOT / "docs" / "benchmarks").glob("*.md"))
    results = sorted(p.name for p in (ROOT / "benchmarks").glob("*.md"))
    assert "RESULTS.md" in results
    missing = [name for name in results if f"../../benchmarks/{name}" not in pages]
    assert not missing, f"benchmarks without a page in docs/benchmarks/: {missing}"
