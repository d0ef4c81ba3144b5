"""The declared scikit-learn floor is tested, not assumed (issue 24).

``dask_mcpca`` uses scikit-learn's parameter-validation helpers
(``sklearn.utils._param_validation``) and its feature-name check, which are
private: their behaviour is only promised by the versions that were run.  So
the floor in ``pyproject.toml`` is the oldest version this test installs
(into a folder put first on ``PYTHONPATH``, shadowing the installed one) and
runs scikit-learn's estimator checks under, with the tests of what the private helpers
serve: parameter validation, feature names, pandas in and out (``test_labels``,
``test_monitoring``, ``test_mcpca.py::test_sklearn_conventions``).
The newest release is what a fresh ``pip install`` brings, which the rest of
the suite runs under.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _floor(requirements: list[str]) -> str:
    found = [m.group(1) for r in requirements if (m := re.fullmatch(r"scikit-learn>=([0-9.]+)", r.replace(" ", "")))]
    assert len(found) == 1, f"one scikit-learn floor expected, found {found} in {requirements}"
    return found[0]


def declared_floor() -> str:
    """The ``scikit-learn>=X`` of the package's runtime dependencies."""
    return _floor(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def test_floor_is_the_tests_floor():
    """The runtime floor cannot be below what the tests themselves need."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = _floor(project["optional-dependencies"]["test"])
    assert tuple(map(int, declared_floor().split("."))) >= tuple(map(int, needed.split(".")))


def test_checks_pass_on_the_declared_floor(tmp_path):
    floor = declared_floor()
    version = floor if floor.count(".") >= 2 else f"{floor}.0"
    target = tmp_path / "sklearn-floor"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile", "--target", str(target),
         f"scikit-learn=={version}"],
        check=True, timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}
    seen = subprocess.run([sys.executable, "-c", "import sklearn; print(sklearn.__version__)"],
                          env=env, capture_output=True, text=True, check=True)
    assert seen.stdout.strip() == version
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-n", "0",
         "tests/test_sklearn_checks.py", "tests/test_labels.py", "tests/test_monitoring.py",
         "tests/test_mcpca.py::test_sklearn_conventions"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert re.search(r"\d+ passed", run.stdout)
