"""The distributed code path, on a real cluster of separate processes.

A scheduler and two nanny-managed workers (one thread each) run as
subprocesses on 127.0.0.1 (``tests/_cluster.py``).  Every fit through the
cluster is compared with the fit of the same store by the local threaded
scheduler: the per-block statistics and the reduction tree do not depend on
where a task runs, so the two must agree to rounding, pass for pass, also
when a worker is killed in the middle of a fit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import dask
import dask.array as da
import h5py
import numpy as np
import psutil
import pytest
import zarr
from _cluster import REPO_ROOT, ProcessCluster, same_environment, subprocess_env
from conftest import assert_same_fit as assert_fits_agree
from distributed import Client, get_task_stream

from dask_mcpca import MCPCA
from dask_mcpca._io import H5Dataset
from dask_mcpca._malloc import WORKER_ENV

pytestmark = pytest.mark.slow  # the CI tier (tests/conftest.py): real processes, servers or timeouts

N_ROWS, SCALES = 20_000, np.array([4.0, 2.0, 1.0, 0.5, 0.3, 0.2])
N_FEATURES = len(SCALES)
STORE_CHUNK_ROWS = 1_000  # rows per chunk in the Zarr store and the HDF5 dataset
BLOCK_ROWS = 2_500  # rows per dask block of the "-blocks" inputs (8 blocks)
TOL = 1e-8

#: Input kinds: a store named by its path (one dask block: the store is far
#: below the block size of 16M values), and a dask array over the same store with
#: several blocks, so that both workers get tasks.
INPUTS = ["zarr", "zarr-blocks", "hdf5", "hdf5-blocks"]

#: Solvers, with parameters that keep the paper's solver cheap (about 50
#: passes) and its stopping point deterministic.
SOLVERS = {
    "auto": dict(solver="auto"),
    "paper": dict(solver="paper", n_components=2, n_decay=3, tol=1e-10),
}


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def data():
    """Axis-aligned Gaussian rows (variances SCALES**2) with 2 % gross outliers."""
    rng = np.random.default_rng(20240611)
    X = rng.normal(size=(N_ROWS, N_FEATURES)) * SCALES
    bad = rng.choice(N_ROWS, size=N_ROWS // 50, replace=False)
    X[bad] = rng.normal(scale=25.0, size=(len(bad), N_FEATURES))
    return X


@pytest.fixture(scope="module")
def stores(data, tmp_path_factory):
    root = tmp_path_factory.mktemp("stores")
    zpath = str(root / "data.zarr")
    z = zarr.open_array(zpath, mode="w", shape=data.shape, chunks=(STORE_CHUNK_ROWS, N_FEATURES), dtype="f8")
    z[:] = data
    hpath = str(root / "data.h5")
    with h5py.File(hpath, "w") as f:
        f.create_dataset("data", data=data, chunks=(STORE_CHUNK_ROWS, N_FEATURES))
    return {"zarr": zpath, "hdf5": hpath}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(tmp_path_factory.mktemp("cluster"), n_workers=2, nthreads=1, memory_limit="1GiB") as c:
        yield c


@pytest.fixture
def client(cluster):
    """A client of the cluster, with both workers up (a killed one restarted)."""
    cluster.wait_for_workers(2)
    with Client(cluster.address, timeout=30) as c:
        yield c


def make_input(kind: str, stores: dict):
    """The same on-disk data as each input kind (built afresh for every fit)."""
    if kind == "zarr":
        return stores["zarr"]
    if kind == "hdf5":
        return stores["hdf5"] + ":/data"
    if kind == "zarr-blocks":
        return da.from_zarr(stores["zarr"], chunks=(BLOCK_ROWS, N_FEATURES))
    if kind == "hdf5-blocks":
        h5 = H5Dataset(stores["hdf5"], "data")
        return da.from_array(h5, chunks=(BLOCK_ROWS, N_FEATURES), asarray=True, lock=False)
    raise ValueError(kind)


_LOCAL_FITS: dict = {}


def local_fit(kind: str, solver: str, stores: dict) -> MCPCA:
    """The fit by the local threaded scheduler (cached per input kind and solver)."""
    if (kind, solver) not in _LOCAL_FITS:
        with dask.config.set(scheduler="threads"):
            _LOCAL_FITS[kind, solver] = MCPCA(**SOLVERS[solver]).fit(make_input(kind, stores))
    return _LOCAL_FITS[kind, solver]


def assert_same_fit(got: MCPCA, expected: MCPCA) -> None:
    """Fitted components, variances and centre agree to ``TOL``; same number of passes."""
    assert_fits_agree(
        got, expected, rtol=TOL, atol=TOL, names=("components_", "explained_variance_", "mean_"), same_passes=True
    )


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def workers_used(stream) -> set:
    return {t["worker"] for t in stream.data}


# ------------------------------------------------------------------- tests
#: (input kind, solver) pairs fitted through the client: the default solver on
#: every input kind; the paper's (~50 passes) on one Zarr and one HDF5 input.
FIT_CASES = [(kind, "auto") for kind in INPUTS] + [("zarr-blocks", "paper"), ("hdf5", "paper")]


@pytest.mark.parametrize(("kind", "solver"), FIT_CASES)
def test_fit_through_client_matches_local(client, stores, kind, solver):
    expected = local_fit(kind, solver, stores)
    with get_task_stream(client) as stream:
        got = MCPCA(**SOLVERS[solver]).fit(make_input(kind, stores))

    # The passes ran on the cluster's workers, and on both when there are blocks to share.
    cluster_workers = set(client.scheduler_info(n_workers=-1)["workers"])
    used = workers_used(stream)
    assert used and used <= cluster_workers
    if kind.endswith("-blocks"):
        assert used == cluster_workers

    assert_same_fit(got, expected)
    # Not a vacuous agreement: the leading direction is the first axis, the
    # one of largest variance in the generating model, despite the outliers.
    assert abs(got.components_[0, 0]) > 0.99


def test_fit_survives_a_killed_worker(client, cluster, stores):
    """SIGKILL one worker process while the passes run: the fit completes, unchanged."""
    kind, solver = "zarr-blocks", "paper"  # ~50 passes of 8 tasks: several seconds
    expected = local_fit(kind, solver, stores)
    pids = client.run(os.getpid)  # worker address -> pid of the worker process (the nanny's child)
    victim = sorted(pids)[0]

    outcome: dict = {}

    def fit():
        try:
            outcome["model"] = MCPCA(**SOLVERS[solver]).fit(make_input(kind, stores))
        except BaseException as err:
            outcome["error"] = err

    thread = threading.Thread(target=fit, daemon=True)
    thread.start()
    # Wait until the victim is running one of the fit's tasks, then kill it.
    deadline = time.monotonic() + 60
    while not client.processing().get(victim):
        assert thread.is_alive(), f"the fit ended before any task ran on {victim}: {outcome}"
        assert time.monotonic() < deadline, "no task of the fit reached the victim worker"
        time.sleep(0.005)
    still_fitting = thread.is_alive()
    os.kill(pids[victim], signal.SIGKILL)
    thread.join(timeout=180)

    assert still_fitting, "the worker was killed after the fit had finished"
    assert not thread.is_alive(), "the fit did not finish after a worker was killed"
    assert "error" not in outcome, repr(outcome.get("error"))
    # The victim is gone from the scheduler (its nanny starts a new worker).
    assert victim not in client.scheduler_info(n_workers=-1)["workers"]
    assert_same_fit(outcome["model"], expected)


@pytest.mark.parametrize("kind", ["zarr", "zarr-blocks", "hdf5-blocks"])
def test_transform_and_score_stay_lazy_through_client(client, data, stores, kind):
    with dask.config.set(scheduler="threads"):
        model = MCPCA().fit(data)
        local_Z = model.transform(make_input(kind, stores)).compute()
        local_s = model.score_samples(make_input(kind, stores)).compute()

    with get_task_stream(client) as stream:
        Z = model.transform(make_input(kind, stores))
        s = model.score_samples(make_input(kind, stores))
        assert isinstance(Z, da.Array) and isinstance(s, da.Array)
        assert Z.shape == (N_ROWS, N_FEATURES) and s.shape == (N_ROWS,)
    assert not stream.data, "building the lazy results ran tasks"

    with get_task_stream(client) as stream:
        Z, s = dask.compute(Z, s)  # on the cluster: the client is the default scheduler
    assert workers_used(stream) <= set(client.scheduler_info(n_workers=-1)["workers"])
    assert stream.data

    np.testing.assert_allclose(Z, local_Z, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(s, local_s, rtol=1e-12, atol=1e-300)
    # And both equal the projection written out by hand.
    np.testing.assert_allclose(Z, (data - model.mean_) @ model.components_.T, rtol=1e-10, atol=1e-10)


def test_cli_score_on_the_cluster_draws_progress(client, cluster, data, stores, tmp_path):
    """``dask-mcpca score --scheduler``: the workers write the outputs; the bar goes to stderr."""
    model = MCPCA().fit(data)
    model.save(tmp_path / "model.json")
    out = tmp_path / "scores.zarr"
    with get_task_stream(client) as stream:
        done = subprocess.run(
            [sys.executable, "-m", "dask_mcpca", "score", stores["zarr"], "--model", str(tmp_path / "model.json"),
             "--output", str(out), "--scheduler", cluster.address, "--outputs", "all", "--dtype", "float64"],
            env=subprocess_env(), capture_output=True, text=True, timeout=120,
        )
    assert done.returncode == 0, done.stderr
    assert "100% Completed" in done.stderr and "Completed" not in done.stdout
    assert "outliers" in done.stdout
    assert workers_used(stream) and workers_used(stream) <= set(client.scheduler_info(n_workers=-1)["workers"])
    g = zarr.open_group(str(out), mode="r")
    np.testing.assert_array_equal(g["outlier"][:], model.is_outlier(data))
    np.testing.assert_allclose(g["scores"][:], (data - model.mean_) @ model.components_.T, rtol=1e-10, atol=1e-10)


def test_start_cluster_script(tmp_path, stores):
    """cluster/start-cluster.sh starts a cluster that fits, and its ``stop`` stops every process."""
    script = REPO_ROOT / "cluster" / "start-cluster.sh"
    state = tmp_path / "state"
    env = dict(subprocess_env(), PYTHON=sys.executable)

    def run(*args, timeout=120):
        return subprocess.run(
            ["bash", str(script), *args, "-d", str(state)],
            env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
        )

    started = run("start", "-n", "1", "-p", "0", "-m", "1GiB", "--dashboard", "none", "--timeout", "60")
    try:
        assert started.returncode == 0, started.stderr
        address = started.stdout.strip().splitlines()[-1]
        assert address.startswith("tcp://127.0.0.1:")
        with Client(address, timeout=30) as c:
            assert len(c.scheduler_info(n_workers=-1)["workers"]) == 1
            worker_pids = list(c.run(os.getpid).values())
            # the command's malloc, its trim threshold not reset by the nanny that spawned the worker
            for address in c.scheduler_info(n_workers=-1)["workers"]:
                got = {k: c.run(os.getenv, k, workers=[address])[address] for k in WORKER_ENV}
                assert same_environment(got, WORKER_ENV), got
            with get_task_stream(c) as stream:
                got = MCPCA().fit(stores["zarr"])
            assert workers_used(stream) <= set(c.scheduler_info(n_workers=-1)["workers"])
            assert stream.data
        assert_same_fit(got, local_fit("zarr", "auto", stores))

        pids = [int((state / f).read_text()) for f in ("scheduler.pid", "worker-localhost.pid")] + worker_pids
    finally:
        stopped = run("stop", timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    for pid in pids:  # the scheduler, the worker launcher (it runs the nannies) and the workers
        assert _gone(pid), f"process {pid} still runs after stop"
    assert not (state / "scheduler.pid").exists()


# ------------------------------------------ paths the workers cannot see
@pytest.fixture
def relative_store(data, tmp_path, monkeypatch):
    """``data.zarr`` in a folder that is this process's cwd but not the workers'."""
    folder = tmp_path / "here"
    folder.mkdir()
    z = zarr.open_array(str(folder / "data.zarr"), mode="w", shape=data.shape,
                        chunks=(STORE_CHUNK_ROWS, N_FEATURES), dtype="f8")
    z[:] = data
    with h5py.File(folder / "data.h5", "w") as f:
        f.create_dataset("data", data=data, chunks=(STORE_CHUNK_ROWS, N_FEATURES))
    monkeypatch.chdir(folder)
    return folder


@pytest.mark.parametrize("path, kind", [("data.zarr", "zarr"), ("data.h5:/data", "hdf5")])
def test_relative_path_fits_the_data_on_the_cluster(client, cluster, stores, relative_store, path, kind):
    """The workers run in another directory: the relative path is made absolute first."""
    assert os.path.realpath(cluster.directory) != os.path.realpath(os.getcwd())
    with get_task_stream(client) as stream:
        got = MCPCA().fit(path)
    assert stream.data  # the blocks were read on the workers
    assert_same_fit(got, local_fit(kind, "auto", stores))
    assert got.explained_variance_[0] > 1.0  # not the variance 0 of fill values


def test_relative_zarr_path_on_the_cli_with_scheduler(client, cluster, stores, relative_store):
    done = subprocess.run(
        [sys.executable, "-m", "dask_mcpca", "fit", "data.zarr", "--scheduler", cluster.address,
         "-o", "model.json", "--no-progress"],
        env=subprocess_env(), capture_output=True, text=True, timeout=120, cwd=relative_store,
    )
    assert done.returncode == 0, done.stderr
    from dask_mcpca import load

    assert_same_fit(load(relative_store / "model.json"), local_fit("zarr", "auto", stores))


def _chunk_file(store: str, row_chunk: int) -> str:
    return os.path.join(store, "c", str(row_chunk), "0")


@pytest.mark.parametrize("lose", ["chunk", "store"])
def test_data_gone_before_the_workers_read_it_raises_on_the_worker(client, data, tmp_path, lose):
    """A chunk or store that vanished after opening is an error, not the fill value 0."""
    from dask_mcpca._io import as_row_blocks

    path = str(tmp_path / "vanishing.zarr")
    z = zarr.open_array(path, mode="w", shape=data.shape, chunks=(STORE_CHUNK_ROWS, N_FEATURES), dtype="f8")
    z[:] = data
    X = as_row_blocks(path)  # opened while everything is there
    model = MCPCA().fit(data)
    if lose == "chunk":
        os.remove(_chunk_file(path, 7))
    else:
        os.rename(path, path + ".moved")
    with get_task_stream(client) as stream:
        with pytest.raises(FileNotFoundError) as err:
            model.transform(X).compute()
    assert stream.data  # the error was raised by a task on a worker
    assert path in str(err.value)
    assert ("rows 7000:8000" in str(err.value)) if lose == "chunk" else ("not visible" in str(err.value))


def test_partial_fit_through_client_matches_local(client, data, tmp_path):
    """nan_policy='partial' on the cluster: channels offline in stretches; the pattern sums travel
    through the tree reduction and the client's EM gives the local fit, and every row is scored."""
    gappy = data.copy()
    gappy[3_000:9_000, 2] = np.nan
    gappy[12_000:13_000, [0, 4]] = np.nan
    gappy[15_000:15_100] = np.nan
    path = str(tmp_path / "gappy.zarr")
    z = zarr.open_array(path, mode="w", shape=gappy.shape, chunks=(STORE_CHUNK_ROWS, N_FEATURES), dtype="f8")
    z[:] = gappy
    blocks = lambda: da.from_zarr(path, chunks=(BLOCK_ROWS, N_FEATURES))  # noqa: E731
    with dask.config.set(scheduler="threads"):
        expected = MCPCA(nan_policy="partial").fit(blocks())
    with get_task_stream(client) as stream:
        got = MCPCA(nan_policy="partial").fit(blocks())
    assert workers_used(stream) == set(client.scheduler_info(n_workers=-1)["workers"])
    assert_same_fit(got, expected)
    assert got.n_samples_ == N_ROWS - 100
    d2 = got.mahalanobis(blocks()).compute()
    assert np.isfinite(d2[:15_000]).all() and np.isnan(d2[15_000:15_100]).all()


def test_modes_through_client_match_local(client, tmp_path):
    """modes='auto' on the cluster: the modes' shared passes run on the workers and give the local fit,
    mode by mode, in the same number of passes."""
    rng = np.random.default_rng(5)
    states = np.repeat([0, 1, 0, 1], [6_000, 3_000, 6_000, 5_000])
    X = rng.normal(size=(len(states), N_FEATURES)) * SCALES + np.where(states[:, None] == 1, 9.0, 0.0)
    path = str(tmp_path / "states.zarr")
    zarr.open_array(path, mode="w", shape=X.shape, chunks=(STORE_CHUNK_ROWS, N_FEATURES), dtype="f8")[:] = X
    blocks = lambda: da.from_zarr(path, chunks=(BLOCK_ROWS, N_FEATURES))  # noqa: E731
    with dask.config.set(scheduler="threads"):
        expected = MCPCA(modes="auto").fit(blocks())
    with get_task_stream(client) as stream:
        got = MCPCA(modes="auto").fit(blocks())
    assert workers_used(stream) == set(client.scheduler_info(n_workers=-1)["workers"])
    assert got.n_modes_ == expected.n_modes_ == 2
    assert got.n_passes_ == expected.n_passes_
    for a, b in zip(got.mode_models_, expected.mode_models_, strict=True):
        assert_same_fit(a, b)
    np.testing.assert_array_equal(got.predict_mode(blocks()).compute(), states)


def test_a_wide_fit_keeps_the_bulk_sums_on_the_cluster(client, tmp_path, monkeypatch):
    """p = 40 (the wide route): the first robust step collects the bulk's plain sums on the workers,
    the next uses them (their sums pickled between worker processes and merged by the tree), and the
    model is the local threaded fit's, bit for bit, and within round-off of the fit that weighs every
    row in every pass."""
    from dask_mcpca import _bulk

    rng = np.random.default_rng(11)
    p = 40
    X = rng.normal(size=(N_ROWS, 4)) * [5.0, 4.0, 3.0, 2.0] @ np.linalg.qr(rng.normal(size=(p, 4)))[0].T
    X += 0.3 * rng.normal(size=X.shape)
    X[: N_ROWS // 50] += 6.0
    path = str(tmp_path / "wide.zarr")
    zarr.open_array(path, mode="w", shape=X.shape, chunks=(2_000, p), dtype="f8")[:] = X
    seen, completed = [], _bulk.completed
    monkeypatch.setattr(_bulk, "completed", lambda s, plan, kept: seen.append(plan.bulk.collect) or completed(
        s, plan, kept))
    with get_task_stream(client) as stream:
        got = MCPCA().fit(path)
    assert workers_used(stream) == set(client.scheduler_info(n_workers=-1)["workers"])
    assert seen[:2] == [True, False]  # collected, then used
    with dask.config.set(scheduler="threads"):
        local = MCPCA().fit(path)
        monkeypatch.setattr(_bulk, "KEEP_BULK", False)
        every_row = MCPCA().fit(path)
    for name in ("components_", "explained_variance_", "mean_", "offset_"):
        np.testing.assert_array_equal(getattr(got, name), getattr(local, name), err_msg=name)
    assert_fits_agree(got, every_row, rtol=1e-9, atol=1e-9, names=("explained_variance_", "mean_"), same_passes=True)
