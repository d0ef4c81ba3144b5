"""The cluster scripts without what they need, and their dry runs (issue 35, point 6).

``cluster/start-cluster.sh`` run with a PATH of the shell tools it uses and a ``python3`` that has no
``distributed`` (a fresh virtual environment, no site packages), or no ``python3`` at all; and
``cluster/jobqueue_slurm.py`` run by an interpreter where ``dask_jobqueue`` (or ``distributed``)
cannot be imported (a ``None`` entry in ``sys.modules``, which makes Python's import fail as for
a package never installed).  Each says in one line what is missing and how to install it, exits
non-zero, shows no traceback and starts nothing.  ``--dry-run`` of each prints what would run and
starts nothing: run where ``distributed`` cannot be imported, so no scheduler could have started.

The scripts started on a real cluster: ``tests/test_distributed.py::test_start_cluster_script``,
and ``tests/test_recipes.py`` for the jobqueue script's store options.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import zarr

ROOT = Path(__file__).resolve().parents[1]
START = ROOT / "cluster" / "start-cluster.sh"
JOBQUEUE = ROOT / "cluster" / "jobqueue_slurm.py"
#: What start-cluster.sh runs besides bash's builtins and Python.
SHELL_TOOLS = ("bash", "cat", "ps", "sed", "hostname", "mkdir", "rm", "tail", "sleep", "seq", "env", "setsid",
               "nohup")


@pytest.fixture(scope="module")
def tools(tmp_path_factory) -> Path:
    """A folder of the shell tools start-cluster.sh uses, and nothing else (no python3)."""
    folder = tmp_path_factory.mktemp("tools")
    for tool in SHELL_TOOLS:
        found = shutil.which(tool)
        if found:  # setsid is optional to the script
            (folder / tool).symlink_to(found)
    return folder


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """The bin folder of a virtual environment without site packages: its python3 has no distributed."""
    env = tmp_path_factory.mktemp("bare") / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=True).create(env)
    assert subprocess.run([env / "bin" / "python3", "-c", "import distributed"], capture_output=True,
                          env={"PATH": str(env / "bin")}).returncode != 0
    return env / "bin"


def _start_cluster(*args, path: list[Path], cwd: Path):
    env = {"PATH": os.pathsep.join(map(str, path)), "HOME": str(cwd)}
    return subprocess.run([str(path[-1] / "bash"), str(START), *args], env=env, capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def _one_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_status_without_distributed_says_what_to_install(tools, bare_python, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "scheduler.pid").write_text(f"{os.getpid()}\n")  # a process that runs: "started from here"
    (state / "address").write_text("tcp://127.0.0.1:9\n")
    proc = _start_cluster("status", "-d", state, path=[bare_python, tools], cwd=tmp_path)
    line = _one_line(proc)
    assert proc.returncode != 0 and proc.stdout == ""
    assert line.startswith("start-cluster.sh: python3") and "cannot import distributed" in line
    assert "python3 -m pip install 'dask[distributed]'" in line and "PYTHON" in line


@pytest.mark.parametrize("python", ["bare", "none"])
def test_start_without_distributed_starts_nothing(tools, bare_python, tmp_path, python):
    path = [bare_python, tools] if python == "bare" else [tools]
    proc = _start_cluster("start", "-p", "0", "-d", tmp_path / "state", path=path, cwd=tmp_path)
    line = _one_line(proc)
    assert proc.returncode != 0 and proc.stdout == ""
    expected = "cannot import distributed" if python == "bare" else "no python3 on PATH: set PYTHON"
    assert expected in line, line
    assert not (tmp_path / "state").exists()  # not even its state directory


def test_start_dry_run_prints_the_commands_and_starts_nothing(tools, bare_python, tmp_path):
    """Run with a python3 that cannot import distributed: a scheduler it tried to start would fail."""
    proc = _start_cluster("start", "--dry-run", "-n", "2", "-H", "localhost,node2", "-d", tmp_path / "state",
                          path=[bare_python, tools], cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# dry run: nothing started")
    assert lines[1].startswith("python3 -m distributed.cli.dask_scheduler --host ")
    workers = [ln for ln in lines if "distributed.cli.dask_worker" in ln]
    assert len(workers) == 2 and workers[1].startswith("ssh node2 env MALLOC_ARENA_MAX=1")
    assert all("--nworkers 2" in ln for ln in workers)
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("args, expected", [
    (["start", "-H"], "-H needs a value"),
    (["status", "--dry-run"], "--dry-run goes with start only"),
])
def test_usage_errors_are_one_line(tools, tmp_path, args, expected):
    proc = _start_cluster(*args, path=[tools], cwd=tmp_path)
    assert proc.returncode != 0 and expected in _one_line(proc)


def _jobqueue(hidden: tuple[str, ...], *args, cwd: Path):
    """jobqueue_slurm.py run as a script by an interpreter that cannot import the modules ``hidden``."""
    code = ("import runpy, sys\n"
            f"for name in {hidden!r}:\n    sys.modules[name] = None\n"
            f"sys.argv = [{str(JOBQUEUE)!r}, *{list(map(str, args))!r}]\n"
            f"runpy.run_path({str(JOBQUEUE)!r}, run_name='__main__')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=env)


@pytest.mark.parametrize("hidden, package", [
    (("dask_jobqueue",), "dask-jobqueue"),
    (("dask_jobqueue", "distributed"), "dask-jobqueue"),
])
@pytest.mark.slow  # a fresh interpreter in a subprocess: the CI tier
def test_jobqueue_without_dask_jobqueue_says_what_to_install(tmp_path, hidden, package):
    """After the store is opened (a store that cannot be read is said first: tests/test_recipes.py)."""
    zarr.create_array(str(tmp_path / "store.zarr"), shape=(100, 3), chunks=(50, 3), dtype="f8")[:] = 1.0
    proc = _jobqueue(hidden, tmp_path / "store.zarr", "--output", tmp_path / "m.json", cwd=tmp_path)
    line = _one_line(proc)
    assert proc.returncode == 2 and proc.stdout == ""
    assert line.startswith("jobqueue_slurm.py: error: this script needs dask-jobqueue")
    assert f"{sys.executable} -m pip install {package}" in line
    assert os.listdir(tmp_path) == ["store.zarr"]  # no model, no log folder


@pytest.mark.parametrize("system", ["slurm", "pbs", "local"])
def test_jobqueue_dry_run_starts_nothing(tmp_path, system):
    """With distributed not importable, no scheduler can start: the dry run still says what would run."""
    proc = _jobqueue(("distributed", "dask_jobqueue"), "/scratch/survey.zarr", "--system", system, "--jobs", "3",
                     "--cores", "4", "--output", "m.json", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    first, second = proc.stdout.splitlines()[:2]
    assert first.startswith("# dry run: nothing started or submitted. jobqueue_slurm.py would open "
                            "/scratch/survey.zarr")
    assert f"submit 3 {system} job(s) of 4 worker process(es)" in first and "(12 workers)" in first
    assert "save the model to m.json" in first
    assert "pip install dask-jobqueue" in second  # the batch script is dask-jobqueue's to write
    assert os.listdir(tmp_path) == []
