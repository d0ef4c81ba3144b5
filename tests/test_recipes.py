"""The recipes run as written (issue 23): the Kubernetes manifests call today's ``dask`` commands, the
jobqueue script takes the store options of ``dask-mcpca fit`` and its ``--prologue`` decides the
workers' interpreter, and ``examples/your_archive.py`` writes only under the folder it is given.

No SLURM here: the jobqueue script's cluster arguments are checked as built, and its store is opened
from a real xarray-written Zarr store, up to the point where jobs would be submitted.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml
from _cluster import same_environment, subprocess_env

from dask_mcpca._malloc import WORKER_ENV

ROOT = Path(__file__).resolve().parents[1]
JOBQUEUE = ROOT / "cluster" / "jobqueue_slurm.py"
#: The commands current ``distributed`` ships, and those it no longer does.
CURRENT = {("dask", "scheduler"), ("dask", "worker")}
REMOVED = {"dask-scheduler", "dask-worker"}


def _containers(node):
    """Every container spec (a mapping with ``image``) anywhere in a parsed manifest."""
    if isinstance(node, dict):
        if "image" in node:
            yield node
        for value in node.values():
            yield from _containers(value)
    elif isinstance(node, list):
        for value in node:
            yield from _containers(value)


def test_kubernetes_manifests_call_the_current_dask_commands():
    seen = set()
    for manifest in sorted((ROOT / "cluster" / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(manifest.read_text()):
            for container in _containers(doc):
                argv = [str(a) for a in container.get("command", []) + container.get("args", [])]
                assert not REMOVED & set(argv), (manifest.name, argv)
                if argv[:1] == ["dask"]:
                    seen.add(tuple(argv[:2]))
    assert seen == CURRENT


@pytest.fixture(scope="module")
def jobqueue():
    spec = importlib.util.spec_from_file_location("jobqueue_slurm", JOBQUEUE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def plant(tmp_path_factory):
    """An xarray-written store: four 1-D variables along ``time``, 600 rows."""
    path = tmp_path_factory.mktemp("plant") / "plant.zarr"
    X = np.random.default_rng(5).normal(size=(600, 4))
    ds = xr.Dataset({c: ("time", X[:, j]) for j, c in enumerate("abcd")},
                    coords={"time": pd.date_range("2025-01-01", periods=600, freq="1min")})
    ds.to_zarr(path, mode="w")
    return path, X


@pytest.mark.parametrize(
    "extra, python",
    [
        ([], sys.executable),  # the environment is where this interpreter is
        (["--prologue", "source /opt/env/bin/activate"], "python"),  # the prologue puts it on PATH
        (["--prologue", "module load x", "--python", "/opt/py/bin/python3"], "/opt/py/bin/python3"),
    ],
)
def test_the_prologue_decides_the_workers_python(jobqueue, extra, python):
    args = jobqueue._parse(["store.zarr", "--directive=--constraint=amd", *extra])
    kwargs = jobqueue.cluster_kwargs(args)
    assert kwargs["python"] == python
    prologue = kwargs["job_script_prologue"]
    given = [extra[i + 1] for i, a in enumerate(extra) if a == "--prologue"]
    assert prologue[: len(given)] == given  # the user's lines first, before the exports
    assert "export OMP_NUM_THREADS=1" in prologue[len(given):]
    assert kwargs["job_extra_directives"] == ["--constraint=amd"]


def test_the_batch_jobs_get_the_commands_malloc(jobqueue, tmp_path):
    """The job script's exports, run by a shell, give the worker the environment of ``_malloc.WORKER_ENV``
    (the nanny's pre-spawn setting a dict literal with quotes and spaces)."""
    prologue = jobqueue.cluster_kwargs(jobqueue._parse(["store.zarr"]))["job_script_prologue"]
    show = "import json, os, sys; print(json.dumps({k: os.environ.get(k) for k in sys.argv[1:]}))"
    script = "\n".join([*prologue, f"{sys.executable} -c '{show}' {' '.join(WORKER_ENV)}"])
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, env={"PATH": os.defpath})
    assert proc.returncode == 0, proc.stderr
    assert same_environment(json.loads(proc.stdout), WORKER_ENV)


def test_the_image_sets_the_commands_malloc():
    """cluster/Dockerfile's ENV (the compose file and the Kubernetes manifests run that image)."""
    text = (ROOT / "cluster" / "Dockerfile").read_text()
    env_block = re.search(r"^ENV (.*?)(?<!\\)\n", text, re.S | re.M).group(1)
    pairs = dict(re.findall(r'(\w+)=("[^"]*"|\S+)', env_block.replace("\\\n", " ")))
    got = {k: pairs.get(k, "").strip('"') for k in WORKER_ENV}
    assert same_environment(got, WORKER_ENV), got


def test_local_trial_jobs_inherit_this_interpreter(jobqueue):
    kwargs = jobqueue.cluster_kwargs(jobqueue._parse(["store.zarr", "--system", "local", "--cores", "2"]))
    assert "python" not in kwargs and kwargs["processes"] == 2


def test_the_store_options_of_fit_open_an_xarray_store(jobqueue, plant):
    path, X = plant
    args = jobqueue._parse([str(path), "--variables", "c,a", "--rows", "10:110", "--nan-policy", "omit"])
    assert args.nan_policy == "omit"
    data = jobqueue.open_store(args)
    assert list(map(str, data.coords["channel"].values)) == ["c", "a"]
    np.testing.assert_array_equal(np.asarray(data), X[10:110][:, [2, 0]])
    by_time = jobqueue.open_store(jobqueue._parse([str(path), "--time", "2025-01-01T00:30/2025-01-01T00:39"]))
    np.testing.assert_array_equal(np.asarray(by_time), X[30:40])


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, expected",
    [
        (["--variables", "a,zz"], "'zz'"),
        (["--variables", "a,b,a"], "--variables a,b,a name 'a' more than once"),
        (["--rows", "5:2"], "--rows 5:2"),
        (["--dataset", "nope"], "'nope'"),
    ],
)
def test_a_store_that_cannot_be_read_is_one_line(plant, tmp_path, args, expected):
    proc = subprocess.run([sys.executable, str(JOBQUEUE), str(plant[0]), "--output", str(tmp_path / "m.json"),
                           *args], capture_output=True, text=True, timeout=120, env=subprocess_env())
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "Warning" not in ln]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("jobqueue_slurm.py: error: ") and expected in lines[0], lines[0]
    assert not (tmp_path / "m.json").exists()


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_your_archive_writes_only_under_its_output_folder(tmp_path):
    examples = ROOT / "examples"
    before = _digests(examples)
    out = tmp_path / "run"
    for _ in range(2):  # a rerun replaces its own outputs
        proc = subprocess.run([sys.executable, str(examples / "your_archive.py"), "--rows", "6000", "--out", str(out)],
                              capture_output=True, text=True, timeout=300, env=subprocess_env(), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert _digests(examples) == before
    assert sorted(os.listdir(tmp_path)) == ["run"]
    assert {"model.json", "archive_report.png", "events.csv", "plant.zarr", "scores.zarr"} <= set(os.listdir(out))
