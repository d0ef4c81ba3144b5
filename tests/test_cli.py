"""The ``dask-mcpca`` console script, run as a real subprocess: fit, score, demo, errors.

The independent commands (every error case, the HDF5 fit and the demo) are
started together by one fixture, so their interpreter start-ups overlap.
"""

import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time

import dask.array as da
import h5py
import numpy as np
import pytest
import zarr
from conftest import cli_status

from dask_mcpca import MCPCA, load
from dask_mcpca.demo import CHANNELS, KINDS, TRUE_LOADINGS, angles_deg, make_archive, make_faults

pytestmark = pytest.mark.slow  # the CI tier (tests/conftest.py): real processes, servers or timeouts

N_ROWS, N_FEATURES = 3000, 5
TIMEOUT = 300
PROGRESS_LINE = re.compile(r"^pass +\d+  .+\[#+\] +(\d+)/(\d+) blocks", re.M)


def _script() -> str:
    found = shutil.which("dask-mcpca") or os.path.join(sysconfig.get_path("scripts"), "dask-mcpca")
    assert os.path.exists(found), "the dask-mcpca console script is not installed (pip install -e .)"
    return found


def _default_sigint() -> None:
    """In the child: Ctrl-C as in a terminal.  A shell starts background jobs with SIGINT ignored,
    Python keeps an ignored SIGINT ignored, and the suite run that way saw a fit finish with exit 0
    after its SIGINT: the child must not depend on how pytest was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(*args, module=False, cwd=None):
    cmd = [sys.executable, "-m", "dask_mcpca", *args] if module else [_script(), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            preexec_fn=_default_sigint if os.name == "posix" else None)


def _finish(proc):
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, out, err


def _run(*args, **kw):
    return _finish(_start(*args, **kw))


def _snapshot(path) -> dict:
    """Every file under ``path``: size, modification time and SHA-256."""
    files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    out = {}
    for f in sorted(files):
        st = os.stat(f)
        out[os.path.relpath(f, path)] = (st.st_size, st.st_mtime_ns, hashlib.sha256(open(f, "rb").read()).hexdigest())
    return out


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(N_ROWS, N_FEATURES)) * [4.0, 2.0, 1.0, 0.5, 0.25] + 10.0
    X[:150] += rng.normal(scale=30.0, size=(150, N_FEATURES))
    return X.astype(np.float32)


@pytest.fixture(scope="module")
def stores(tmp_path_factory, data):
    d = tmp_path_factory.mktemp("stores")
    single = str(d / "single.zarr")
    z = zarr.create_array(single, shape=data.shape, chunks=(500, N_FEATURES), dtype="float32")
    z[:] = data
    group = str(d / "group.zarr")
    g = zarr.open_group(group, mode="w")
    g.create_array("a", shape=data.shape, chunks=(500, N_FEATURES), dtype="float32")[:] = data
    g.create_array("b", shape=(10,), dtype="float64")[:] = np.arange(10.0)
    h5 = str(d / "data.h5")
    with h5py.File(h5, "w") as f:
        f.create_dataset("sensors/x", data=data, chunks=(500, N_FEATURES))
    existing = d / "existing.zarr"
    existing.mkdir()
    (existing / "keep.txt").write_text("not to be replaced")
    return {"dir": d, "single": single, "group": group, "h5": h5, "existing": str(existing)}


@pytest.fixture(scope="module")
def model_file(tmp_path_factory, stores):
    """A model written by an in-process fit (for the score error cases)."""
    path = str(tmp_path_factory.mktemp("model") / "model.json")
    MCPCA().fit(stores["single"]).save(path)
    return path


def _error_cases(stores, model_file):
    """name -> (arguments, what the one line on stderr must mention)."""
    s = stores
    return {
        "missing store": (["fit", str(s["dir"] / "nowhere.zarr")], "nowhere.zarr"),
        "wrong dataset": (["fit", s["group"], "--dataset", "nope"], "no dataset 'nope'"),
        "group without dataset": (["fit", s["group"]], "2 arrays"),
        "hdf5 wrong dataset": (["fit", s["h5"] + ":/sensors/nope"], "nope"),
        "scheduler unreachable": (
            ["fit", s["single"], "--scheduler", f"tcp://127.0.0.1:{_closed_port()}", "--connect-timeout", "1"],
            "cannot reach the dask scheduler",
        ),
        "n-components zero": (["fit", s["single"], "--n-components", "0"], "--n-components"),
        "n-components too many": (
            ["fit", s["single"], "--n-components", str(N_FEATURES + 1), "--no-progress"], "--n-components 6"
        ),
        "unknown solver": (["fit", s["single"], "--solver", "bogus"], "--solver"),
        "fit output inside the store": (
            ["fit", s["single"], "--output", os.path.join(s["single"], "m.json")], "overlap the input store"
        ),
        "missing model": (
            ["score", s["single"], "--model", str(s["dir"] / "none.json"), "--output", str(s["dir"] / "o1.zarr")],
            "none.json",
        ),
        "model is not a model": (
            ["score", s["single"], "--model", s["h5"], "--output", str(s["dir"] / "o2.zarr")], "data.h5"
        ),
        "score output exists": (
            ["score", s["single"], "--model", model_file, "--output", s["existing"]], "--overwrite"
        ),
        "score output is the input": (
            ["score", s["single"], "--model", model_file, "--output", s["single"], "--overwrite"],
            "overlap the input store",
        ),
        "demo rows not a number": (["demo", "--rows", "many"], "--rows"),
        "demo into a folder holding a model of its own": (
            ["demo", "--rows", "2000", "--out", os.path.dirname(model_file)], "which the demo did not write"
        ),
        "score output is the model": (
            ["score", s["single"], "--model", model_file, "--output", model_file, "--overwrite"],
            "would overwrite the model",
        ),
        # Refused before any request: no object store is needed to see it (replacing an output
        # prefix that holds the input store would delete the store).
        "score output holds the input URL": (
            ["score", "s3://bucket/archive/x.zarr", "--model", model_file, "--output", "s3://bucket/archive"],
            "overlap the input store",
        ),
        "score output inside the input URL": (
            ["score", "s3://bucket/x.zarr", "--model", model_file, "--output", "s3://bucket/x.zarr/scores"],
            "overlap the input store",
        ),
        "score overwrite of a folder that is no store": (
            ["score", s["single"], "--model", model_file, "--output", s["existing"], "--overwrite"],
            "is not a Zarr store",
        ),
        "score overwrite of a file": (
            ["score", s["single"], "--model", model_file, "--output", s["h5"], "--overwrite"],
            "is not a Zarr store",
        ),
        "report output is the model": (
            ["report", s["single"], "--model", model_file, "--output", model_file], "would overwrite the model"
        ),
        "report events are the model": (
            ["report", s["single"], "-m", model_file, "--output", str(s["dir"] / "r1.png"), "--events", model_file],
            "would overwrite the model",
        ),
        "report output is its events file": (
            ["report", s["single"], "--model", model_file, "--output", str(s["dir"] / "r2.csv")], "are one file"
        ),
        "fit output is a directory": (["fit", s["single"], "--output", s["existing"]], "is a directory"),
        "fit output under a file": (
            ["fit", s["single"], "--output", os.path.join(s["h5"], "m.json")], "is not a directory"
        ),
    }


#: Error cases run through the installed console script (one interpreter each);
#: the others call ``main`` in this process: the same code without the start-up.
SUBPROCESS_CASES = (
    "missing store",
    "wrong dataset",
    "scheduler unreachable",
    "n-components zero",
)
IN_PROCESS_CASES = (
    "n-components too many",
    "score output exists",
    "group without dataset",
    "hdf5 wrong dataset",
    "unknown solver",
    "fit output inside the store",
    "missing model",
    "model is not a model",
    "score output is the input",
    "demo rows not a number",
    "demo into a folder holding a model of its own",
    "score output is the model",
    "report output is the model",
    "report events are the model",
    "report output is its events file",
    "score overwrite of a folder that is no store",
    "score overwrite of a file",
    "score output holds the input URL",
    "score output inside the input URL",
    "fit output is a directory",
    "fit output under a file",
)


def _main_status(args) -> int:
    return cli_status(*args)


@pytest.fixture(scope="module")
def concurrent(stores, model_file, tmp_path_factory):
    """Start every independent command at once; return name -> (rc, stdout, stderr)."""
    before = {k: _snapshot(stores[k]) for k in ("single", "group", "h5", "existing")}
    demo_dir = tmp_path_factory.mktemp("demo") / "out"
    cases = _error_cases(stores, model_file)
    procs = {name: _start(*cases[name][0]) for name in SUBPROCESS_CASES}
    procs["module missing store"] = _start("fit", str(stores["dir"] / "nowhere.zarr"), module=True)
    procs["fit hdf5"] = _start(
        "fit", stores["h5"], "--dataset", "sensors/x", "--output", str(stores["dir"] / "h5.json"), "--no-progress"
    )
    procs["demo"] = _start("demo", "--rows", "20000", "--out", str(demo_dir), "--seed", "1")
    results = {name: _finish(p) for name, p in procs.items()}
    results["_before"] = before
    results["_demo_dir"] = str(demo_dir)
    return results


def _assert_one_line_error(rc, out, err, mention):
    assert rc == 2, (out, err)
    assert "Traceback" not in err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    assert lines[0].startswith("dask-mcpca ") and ": error: " in lines[0], err
    assert mention in lines[0], err


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_errors_are_one_line_with_exit_status_2(concurrent, stores, model_file, case):
    _assert_one_line_error(*concurrent[case], _error_cases(stores, model_file)[case][1])


def test_python_dash_m_runs_the_same_command_line(concurrent):
    _assert_one_line_error(*concurrent["module missing store"], "nowhere.zarr")


@pytest.mark.parametrize("case", IN_PROCESS_CASES)
def test_errors_in_process(stores, model_file, case, capsys):
    args, mention = _error_cases(stores, model_file)[case]
    rc = _main_status(args)
    captured = capsys.readouterr()
    _assert_one_line_error(rc, captured.out, captured.err, mention)


def test_failed_commands_touch_no_store(concurrent, stores, model_file, capsys):
    for case in IN_PROCESS_CASES:
        _main_status(_error_cases(stores, model_file)[case][0])
    capsys.readouterr()
    for name in ("single", "group", "h5", "existing"):
        assert _snapshot(stores[name]) == concurrent["_before"][name], name
    leftovers = [f for f in os.listdir(stores["dir"]) if f.startswith(".") or f.startswith("o")]
    assert leftovers == []  # no temporary or partial output


def test_fit_writes_the_model_prints_the_table_and_leaves_the_store_alone(stores, data, tmp_path):
    before = _snapshot(stores["single"])
    model_path = tmp_path / "m.json"
    rc, out, err = _run("fit", stores["single"], "--output", str(model_path))
    assert rc == 0, err
    assert _snapshot(stores["single"]) == before

    model = load(model_path)
    # The store is float32, which the kernel multiplies in float32 (performance
    # branch): the CLI's fit is the in-memory fit of the same float32 blocks, and
    # the float64 fit of the same values to float32 round-off (was: to 1e-9).
    expected = MCPCA().fit(da.from_array(data, chunks=(500, N_FEATURES)))
    np.testing.assert_allclose(model.components_, expected.components_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(model.explained_variance_, expected.explained_variance_, rtol=1e-9)
    in64 = MCPCA().fit(da.from_array(data.astype(np.float64), chunks=(N_ROWS, N_FEATURES)))
    np.testing.assert_allclose(model.components_, in64.components_, rtol=0, atol=1e-6)
    np.testing.assert_allclose(model.explained_variance_, in64.explained_variance_, rtol=1e-4)

    assert f"{N_ROWS:,} rows x {N_FEATURES} features" in out
    rows = re.findall(r"^ +(\d+) +(\S+) +([\d.]+)% +([\d.]+)% +(\S+)$", out, re.M)
    assert [int(r[0]) for r in rows] == list(range(1, N_FEATURES + 1))
    for i, (_, var, ratio, _, sigma) in enumerate(rows):
        assert float(var) == pytest.approx(model.explained_variance_[i], rel=1e-5)
        assert float(ratio) == pytest.approx(100 * model.explained_variance_ratio_[i], abs=0.006)
        assert float(sigma) == pytest.approx(model.sigmas_[i], rel=1e-3)
    assert re.search(rf"passes {model.n_passes_} +rows {N_ROWS:,} +time [\d.]+ s", out)
    assert f"model written to {model_path}" in out
    # Progress on stderr (not a terminal): one finished line per pass.
    bars = PROGRESS_LINE.findall(err)
    assert len(bars) == model.n_passes_ and all(a == b for a, b in bars)


def test_fit_options_reach_the_estimator(stores, tmp_path):
    rc, out, err = _run(
        "fit", stores["group"], "--dataset", "a", "--n-components", "2", "--center", "none",
        "--solver", "auto", "--nan-policy", "omit", "--no-progress", "-o", str(tmp_path / "m.json"),
    )
    assert rc == 0, err
    assert err == ""  # --no-progress
    model = load(tmp_path / "m.json")
    assert model.center is False and np.array_equal(model.mean_, np.zeros(N_FEATURES))
    assert model.n_components_ == 2 and model.nan_policy == "omit"


def test_hdf5_fit_matches_the_zarr_fit(concurrent, stores):
    rc, out, err = concurrent["fit hdf5"]
    assert rc == 0, err
    from_h5 = load(stores["dir"] / "h5.json")
    from_zarr = MCPCA().fit(stores["single"])
    np.testing.assert_allclose(from_h5.components_, from_zarr.components_, rtol=1e-9, atol=1e-12)


def test_score_writes_a_new_store_lazily_and_atomically(stores, model_file, tmp_path):
    before = _snapshot(stores["single"])
    out_path = tmp_path / "scores.zarr"
    rc, out, err = _run("score", stores["single"], "--model", model_file, "--output", str(out_path))
    assert rc == 0, err
    assert _snapshot(stores["single"]) == before
    assert sorted(os.listdir(tmp_path)) == ["scores.zarr"]  # the temporary was renamed

    model = load(model_file)
    X = zarr.open_array(stores["single"], mode="r")[:]
    g = zarr.open_group(str(out_path), mode="r")
    # the default outputs: what monitoring needs, floats in float32
    assert sorted(g.array_keys()) == ["d2", "n_observed", "outlier", "top_channel"]
    assert g["d2"].dtype == np.float32 and g["outlier"].dtype == bool and g["top_channel"].dtype == np.int16
    assert np.all(g["n_observed"][:] == X.shape[1])
    np.testing.assert_allclose(g["d2"][:], model.mahalanobis(X), rtol=1e-6)
    assert np.array_equal(g["outlier"][:], model.is_outlier(X))
    assert np.array_equal(g["top_channel"][:], np.argmax(model.channel_contributions(X), axis=1))
    assert g.attrs["source"] == os.path.abspath(stores["single"])
    n_out = int(model.is_outlier(X).sum())
    assert 100 <= n_out <= 400  # 150 rows were made outlying
    assert f"{n_out:,} outliers" in out
    assert "100% Completed" in err and "Completed" not in out  # dask's bar, on stderr

    # Refused without --overwrite (test_errors_are_one_line...), replaced with it; every output in
    # float64 gives the API's values
    (out_path / "stale.txt").write_text("from an earlier run")
    rc, _, err = _run("score", stores["single"], "--model", model_file, "--output", str(out_path), "--overwrite",
                      "--no-progress", "--outputs", "all", "--dtype", "float64")
    assert rc == 0, err
    assert "Completed" not in err
    g = zarr.open_group(str(out_path), mode="r")
    assert sorted(g.array_keys()) == ["channel", "component", "contributions", "d2", "n_observed", "outlier", "scores",
                                      "top_channel", "weight"]  # the outputs, and their channels' and components'
    # coordinates
    np.testing.assert_allclose(g["d2"][:], model.mahalanobis(X), rtol=1e-12)
    np.testing.assert_allclose(g["contributions"][:], model.channel_contributions(X), rtol=1e-12)
    assert g["scores"].shape == (N_ROWS, model.n_components_)
    assert np.array_equal(g["scores"][:], model.transform(X))
    assert np.array_equal(g["weight"][:], model.score_samples(X))
    assert np.array_equal(g["outlier"][:], model.is_outlier(X))
    assert not (out_path / "stale.txt").exists()  # replaced, not merged
    assert sorted(os.listdir(tmp_path)) == ["scores.zarr"]
    assert _snapshot(stores["single"]) == before


def test_fit_on_a_distributed_scheduler(stores, tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, protocol="tcp", dashboard_address=":0"
    ) as cluster:
        address = cluster.scheduler_address
        rc, out, err = _run("fit", stores["single"], "--scheduler", address, "-o", str(tmp_path / "m.json"))
    assert rc == 0, err
    model = load(tmp_path / "m.json")
    local = MCPCA().fit(stores["single"])
    np.testing.assert_allclose(model.components_, local.components_, rtol=1e-9, atol=1e-12)
    bars = PROGRESS_LINE.findall(err)  # counted from futures on the client
    assert len(bars) == model.n_passes_ and all(a == b for a, b in bars)


# ------------------------------------------------------------------ demo
def test_demo_runs_and_robust_pca_beats_pca(concurrent):
    rc, out, err = concurrent["demo"]
    assert rc == 0, err
    d = concurrent["_demo_dir"]
    with open(os.path.join(d, "report.png"), "rb") as f:
        png = f.read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000
    assert zarr.open_array(os.path.join(d, "sensors.zarr"), mode="r").shape == (20000, len(CHANNELS))
    load(os.path.join(d, "model.json"))
    assert sorted(n for n in os.listdir(d) if n.startswith(".")) == [".dask-mcpca-demo"]  # no temporaries left
    from dask_mcpca.demo.run import _claim_folder

    _claim_folder(d)  # its own folder: a second demo run may replace what the first wrote

    pca, mcpca = map(float, re.search(r"subspace +([\d.]+)° +([\d.]+)°", out).groups())
    assert mcpca < 2.0 < pca
    prec, rec = map(float, re.search(r"MCPCA is_outlier +([\d.]+)% +([\d.]+)%", out).groups())
    assert prec > 90 and rec > 90
    for i in (1, 2, 3):
        row = re.search(rf"^ +{i} +[\d.]+ +[\d.]+ +[\d.]+ +([\d.]+)° +([\d.]+)°", out, re.M)
        assert float(row[2]) < 2.0 and float(row[2]) < float(row[1])


def test_demo_truth_is_what_the_archive_holds(tmp_path):
    """The generator's claims, checked on the data: faults where marked, clean rows on the true axes."""
    n = 60_000
    sensors, truth, faults = make_archive(tmp_path, n_rows=n, seed=4)
    X = zarr.open_array(sensors, mode="r")[:].astype(np.float64)
    kind = zarr.open_array(truth, mode="r")[:]
    for code in KINDS:
        assert (kind == code).sum() == faults.n_rows_of(code) > 0
    gaps = ~np.isfinite(X).all(axis=1)
    assert gaps.any() and np.all(kind[gaps] == 0) and np.all(np.isnan(X[gaps]).sum(axis=1) == 1)
    clean = X[(kind == 0) & ~gaps]
    lam, V = np.linalg.eigh(np.cov(clean.T))
    assert angles_deg(V[:, ::-1].T, TRUE_LOADINGS).max() < 3.0
    assert np.allclose(TRUE_LOADINGS.T @ TRUE_LOADINGS, np.eye(3))
    # A stuck channel is flat; a spike row differs from the clean model on one channel.
    s, length, c, value = faults.stuck[0]
    assert np.all(X[int(s) : int(s + length), int(c)] == np.float32(value))
    # The same seed gives the same archive; the fault placement depends only on (rows, seed).
    again = make_faults(n, 4)
    assert np.array_equal(again.spikes, faults.spikes) and np.array_equal(again.swapped, faults.swapped)


# ------------------------------------------- every failure is one line
class _FakeService:
    """A TCP listener on 127.0.0.1 that accepts and then sends ``banner`` (maybe nothing), never more."""

    def __init__(self, banner: bytes = b""):
        self.banner = banner
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.address = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted: list = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.accepted.append(conn)
            if self.banner:
                conn.sendall(self.banner)

    def close(self):
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.mark.parametrize(
    "banner",
    [b"", b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n", b"\xff" * 64],
    ids=["silent", "ssh-banner", "binary-garbage"],
)
def test_scheduler_address_that_is_no_scheduler_fails_within_the_timeout(stores, tmp_path, banner):
    """A listener that never answers (a dashboard port) or sends a banner: one line within the deadline."""
    service = _FakeService(banner)
    try:
        started = time.monotonic()
        proc = _start("fit", stores["single"], "--scheduler", service.address, "--connect-timeout", "2",
                      "-o", str(tmp_path / "m.json"))
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        elapsed = time.monotonic() - started
    finally:
        service.close()
    assert service.accepted, "the command never connected to the listener"
    _assert_one_line_error(proc.returncode, out, err, service.address)
    assert "dask scheduler" in err
    assert elapsed < 30  # interpreter start-up and imports included; 2 s of waiting
    assert not os.path.exists(tmp_path / "m.json")


def test_scheduler_lost_mid_fit_is_one_line(stores, tmp_path):
    from _cluster import ProcessCluster

    with ProcessCluster(tmp_path / "cluster", n_workers=1) as cluster:
        proc = _start("fit", stores["single"], "--solver", "paper", "--scheduler", cluster.address,
                      "--connect-timeout", "2", "-o", str(tmp_path / "m.json"))
        # wait for the first finished pass (its progress line on stderr), then kill the scheduler
        line = ""
        while not line.startswith("pass"):
            line = proc.stderr.readline()
            assert line or proc.poll() is None, proc.communicate()
        scheduler = next(p for name, p in cluster._procs if name == "scheduler")
        os.killpg(scheduler.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    err = "\n".join(line for line in err.splitlines() if not line.startswith("pass"))  # the bars of the passes made
    _assert_one_line_error(proc.returncode, out, err, "scheduler")
    assert not os.path.exists(tmp_path / "m.json")


def test_deeply_nested_model_file_is_one_line(stores, tmp_path, capsys):
    model = tmp_path / "deep.json"
    model.write_text('{"format": "dask-mcpca-model", "params": ' + "[" * 100_000 + "]" * 100_000 + "}")
    rc = _main_status(["score", stores["single"], "--model", str(model), "--output", str(tmp_path / "o.zarr")])
    captured = capsys.readouterr()
    _assert_one_line_error(rc, captured.out, captured.err, "deep.json")


def _with_stderr_closed(*args, cwd=None):
    cmd = ["bash", "-c", 'exec "$@" 2>&-', "_", sys.executable, "-m", "dask_mcpca", *args]
    return subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=TIMEOUT, cwd=cwd)


def test_stderr_closed(stores, tmp_path):
    """No stderr to write to: errors still exit 2, and a fit that draws progress still succeeds."""
    failed = _with_stderr_closed("fit", str(tmp_path / "nowhere.zarr"))
    assert failed.returncode == 2 and "Traceback" not in failed.stdout
    fitted = _with_stderr_closed("fit", stores["single"], "-o", str(tmp_path / "m.json"))
    assert fitted.returncode == 0, fitted.stdout
    assert "model written to" in fitted.stdout
    np.testing.assert_allclose(load(tmp_path / "m.json").components_, MCPCA().fit(stores["single"]).components_,
                               rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e9"])
def test_connect_timeout_must_be_a_finite_number_of_seconds(stores, value, capsys):
    rc = _main_status(["fit", stores["single"], "--scheduler", "tcp://127.0.0.1:1", "--connect-timeout", value])
    captured = capsys.readouterr()
    _assert_one_line_error(rc, captured.out, captured.err, "--connect-timeout")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="stalls the read on a named pipe")
def test_score_killed_mid_write_leaves_nothing_after_the_next_run(tmp_path, model_file):
    """SIGKILL while ``score`` writes (its read of the last chunk stalled): the hidden temporary
    is left, and removed by the next ``score``."""
    from _stall import kill_once_writing, stalled_last_chunk

    rng = np.random.default_rng(1)
    big = str(tmp_path / "big.zarr")
    z = zarr.create_array(big, shape=(60_000, N_FEATURES), chunks=(2_000, N_FEATURES), dtype="float32")
    z[:] = rng.normal(size=z.shape).astype(np.float32)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = str(out_dir / "scores.zarr")
    with stalled_last_chunk(big):
        kill_once_writing(_start("score", big, "--model", model_file, "--output", out, "--no-progress"), out_dir)
    left = os.listdir(out_dir)
    assert len(left) == 1 and left[0].startswith(".scores.zarr.") and left[0].endswith(".tmp"), left
    rc, out_text, err = _run("score", big, "--model", model_file, "--output", out, "--no-progress")
    assert rc == 0, err
    assert os.listdir(out_dir) == ["scores.zarr"]
    model = load(model_file)
    np.testing.assert_array_equal(zarr.open_group(out, mode="r")["outlier"][:], model.is_outlier(z[:]))


def test_a_score_that_fails_mid_way_leaves_no_temporary(data, model_file, tmp_path, capsys):
    """A NaN row in the last chunk fails its task while others still write: nothing is left behind."""
    gappy = data.copy()
    gappy[-5] = np.nan  # the model's nan_policy is "raise"
    store = str(tmp_path / "gappy.zarr")
    zarr.create_array(store, shape=gappy.shape, chunks=(500, N_FEATURES), dtype="float32")[:] = gappy
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    for _ in range(3):  # the running tasks finish at different moments each time
        assert _main_status(["score", store, "--model", model_file, "--output", str(out_dir / "s.zarr"),
                             "--no-progress"]) == 2
        assert "NaN" in capsys.readouterr().err
        assert os.listdir(out_dir) == []


def test_ctrl_c_mid_fit_exits_130_in_one_line(stores, tmp_path):
    proc = _start("fit", stores["single"], "--solver", "paper", "-o", str(tmp_path / "m.json"))
    try:
        line = ""
        while not line.startswith("pass"):
            line = proc.stderr.readline()
            assert line or proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    err = "\n".join(line for line in err.splitlines() if not line.startswith("pass"))
    assert err.strip() == "dask-mcpca fit: interrupted"
    assert not os.path.exists(tmp_path / "m.json")


def test_a_ctrl_c_raised_in_a_finalizer_still_stops_the_command():
    """The command line silences "Exception ignored in ..." (abandoned object-store requests); a
    KeyboardInterrupt raised while a finalizer ran went there too, and a fit ran on to exit 0."""
    from dask_mcpca.cli import _quiet_unraisable

    class Finalized:
        def __del__(self):
            raise KeyboardInterrupt

    hook = sys.unraisablehook
    sys.unraisablehook = _quiet_unraisable
    # Ctrl-C as Python handles it in a fresh process (the command's case), whatever handler an earlier
    # test in this worker left: twice in full runs the interrupt never came (a handler that swallows it)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            Finalized()  # collected at once: its KeyboardInterrupt is "unraisable"
            start = time.monotonic()
            while time.monotonic() - start < 10:  # the interrupt, delivered again 0.05 s later, lands here
                pass
            pytest.fail(f"no KeyboardInterrupt in 10 s (SIGINT handler before the test: {previous!r})")
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = hook


def test_fit_on_a_tls_scheduler_uses_the_configured_certificates(stores, tmp_path):
    """The handshake probe connects with the client's TLS settings from the Dask config, as Client does."""
    distributed = pytest.importorskip("distributed")
    pytest.importorskip("cryptography")
    from distributed.security import Security

    security = Security.temporary()
    env = dict(os.environ, DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION="True")
    names = [("tls_ca_file", "CA_FILE"), ("tls_client_cert", "CLIENT__CERT"), ("tls_client_key", "CLIENT__KEY")]
    for attr, var in names:
        (tmp_path / f"{attr}.pem").write_text(getattr(security, attr))  # PEM text -> files the config names
        env[f"DASK_DISTRIBUTED__COMM__TLS__{var}"] = str(tmp_path / f"{attr}.pem")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tls",
                                  security=security, dashboard_address=None) as cluster:
        assert cluster.scheduler_address.startswith("tls://")
        done = subprocess.run(
            [sys.executable, "-m", "dask_mcpca", "fit", stores["single"], "--scheduler", cluster.scheduler_address,
             "--no-progress", "-o", str(tmp_path / "m.json")],
            env=env, capture_output=True, text=True, timeout=TIMEOUT,
        )
    assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(load(tmp_path / "m.json").components_, MCPCA().fit(stores["single"]).components_,
                               rtol=1e-9, atol=1e-12)


def test_overlap_rule_compares_paths_and_urls_both_ways(tmp_path, monkeypatch):
    """One rule for every output check: inside or holding, local paths, file:// URLs and remote URLs,
    a scheme under any of its fsspec names (s3a://, local://); a URL is never split at its scheme's
    colon, even when a local ./s3 exists (it used to be, and then no URL overlapped anything)."""
    from dask_mcpca._io import split_store_path
    from dask_mcpca.cli.outputs import _overlaps, refuse_inside_input

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s3").mkdir()
    assert split_store_path("s3://b/archive/x.zarr") == ("s3://b/archive/x.zarr", None)
    store = str(tmp_path / "data" / "x.zarr")
    refused = [
        ("s3://b/archive", "s3://b/archive/x.zarr"),  # holds it
        ("s3://b/archive/x.zarr/out", "s3://b/archive/x.zarr"),  # inside it
        ("s3://b/archive/", "s3://b/archive/x.zarr/"),
        ("file://" + str(tmp_path / "data"), store),  # a file:// URL is its local path
        (store + "/m.json", "file://" + store),
        ("local://" + str(tmp_path / "data"), store),  # fsspec's other name for a local path
        ("s3a://b/archive", "s3://b/archive/x.zarr"),  # fsspec's other name for s3://
        ("S3://b/archive/x.zarr/out", "s3a://b/archive/x.zarr"),
    ]
    accepted = [
        ("s3://b/arch", "s3://b/archive/x.zarr"),  # a sibling prefix, not a parent
        ("s3://b/other.zarr", "s3://b/archive/x.zarr"),
        (str(tmp_path / "data" / "y.zarr"), store),
        ("s3://b" + store, store),  # a remote URL never overlaps a local path
    ]
    for output, source in refused:
        assert _overlaps(output, source) and _overlaps(source, output), (output, source)
        with pytest.raises(Exception, match="overlap the input store"):
            refuse_inside_input(output, source, "--output")
    for output, source in accepted:
        assert not _overlaps(output, source), (output, source)
        refuse_inside_input(output, source, "--output")
