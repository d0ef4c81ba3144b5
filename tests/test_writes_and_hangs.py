"""Issue 23, writes and hangs: every write goes to exactly what the user named, nothing waits forever,
and every command-line error names the option the user typed, in one line, exit 2.

Real parts only: files, FIFOs, sockets and device nodes on disk, ``dask-mcpca`` run as a subprocess,
the S3 server (moto) of ``test_object_store``, and a local TCP server that accepts and never answers.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from _cluster import subprocess_env

from dask_mcpca import MCPCA, ModelFormatError, load
from dask_mcpca._atomic import PUBLISHING_MARKER, atomic_path, url_store_state
from dask_mcpca._urls import S3_TIMEOUTS, with_timeouts
from dask_mcpca._waits import DEFAULT_WAIT_LIMIT, MIN_WAIT_LIMIT, WAIT_LIMIT_ENV

pytestmark = pytest.mark.slow  # the CI tier (tests/conftest.py): real processes, servers or timeouts

#: Seconds a command that must not hang may take, start-up included (a generous bound, not a timing).
NO_HANG = 120


def _cli(*args, timeout: float = NO_HANG, cwd=None, env=None):
    """``dask-mcpca ARGS`` as a real subprocess: (exit code, stdout, stderr); ``env`` added to the environment."""
    proc = subprocess.run(
        [sys.executable, "-m", "dask_mcpca", *map(str, args)], capture_output=True, text=True,
        timeout=timeout, env={**subprocess_env(), **(env or {})}, cwd=cwd,
    )
    return proc.returncode, proc.stdout, proc.stderr


def _in_process(capsys, *args) -> tuple[int, str]:
    """``dask-mcpca ARGS`` called in this process (``dask_mcpca.cli.main``, as the console script calls it):
    (exit code, stderr).  For the many one-line refusals, each of which a subprocess made 1.7-2 s long."""
    from conftest import cli_status

    capsys.readouterr()
    rc = cli_status(*args)
    return rc, capsys.readouterr().err


def _error_line(err: str) -> str:
    """The stderr of a failed command: exactly one line (warnings of libraries aside)."""
    lines = [ln for ln in err.splitlines() if ln.strip() and "Warning" not in ln and "warnings.warn" not in ln]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    rng = np.random.default_rng(3)
    path = tmp_path_factory.mktemp("model") / "model.json"
    MCPCA().fit(rng.normal(size=(2_000, 4)) @ rng.normal(size=(4, 4))).save(path)
    return path


@pytest.fixture(scope="module")
def plant(tmp_path_factory):
    """An xarray archive (four 1-D variables along time) and a plain Zarr array, 2 000 rows."""
    d = tmp_path_factory.mktemp("plant")
    X = np.random.default_rng(4).normal(size=(2_000, 4))
    ds = xr.Dataset({c: ("time", X[:, j]) for j, c in enumerate("abcd")},
                    coords={"time": pd.date_range("2025-01-01", periods=2_000, freq="1min")})
    ds.to_zarr(d / "plant.zarr", mode="w")
    zarr.create_array(d / "plain.zarr", shape=X.shape, chunks=(500, 4), dtype="f8")[:] = X
    return {"plant": d / "plant.zarr", "plain": d / "plain.zarr"}


# ------------------------------------------------------------- files that are not regular files
def test_save_never_replaces_a_fifo_or_a_socket(tmp_path, model_file):
    model = load(model_file)
    fifo = tmp_path / "model.json"
    os.mkfifo(fifo)
    with pytest.raises(FileExistsError, match=f"cannot write '{fifo}'.*FIFO"):
        model.save(fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    sock_path = tmp_path / "sock.json"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        with pytest.raises(FileExistsError, match="socket"):
            model.save(sock_path)
        assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["model.json", "sock.json"]  # no temporary left


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="mknod of a device needs root")
def test_save_never_replaces_a_device_node(tmp_path, model_file):
    node = tmp_path / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers
    with pytest.raises(FileExistsError, match=f"'{node}'.*character device"):
        load(model_file).save(node)
    assert stat.S_ISCHR(os.lstat(node).st_mode)
    rc, _, err = _cli("fit", model_file.parent, "--output", node, "--no-progress")  # refused before any work
    assert rc == 2 and "--output" in _error_line(err) and "character device" in err
    assert stat.S_ISCHR(os.lstat(node).st_mode)


def test_save_onto_a_directory_names_it(tmp_path, model_file):
    (tmp_path / "m.json").mkdir()
    with pytest.raises(IsADirectoryError, match="m.json"):
        load(model_file).save(tmp_path / "m.json")


def test_a_save_that_cannot_be_completed_names_the_path(tmp_path, model_file):
    (tmp_path / "file").write_text("not a folder")
    target = tmp_path / "file" / "model.json"
    with pytest.raises(OSError, match=f"cannot write '{target}'") as info:
        load(model_file).save(target)
    assert "\n" not in str(info.value)


def test_load_of_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "model.json"
    os.mkfifo(fifo)
    script = "import sys; from dask_mcpca import load; load(sys.argv[1])"
    proc = subprocess.run([sys.executable, "-c", script, str(fifo)], capture_output=True, text=True,
                          timeout=NO_HANG, env=subprocess_env())
    assert proc.returncode == 1 and "ModelFormatError" in proc.stderr and "FIFO" in proc.stderr
    with pytest.raises(ModelFormatError, match="not a regular file"):
        load(fifo)
    rc, _, err = _cli("fit", fifo, "--output", tmp_path / "m.json", "--no-progress")  # a FIFO as the store
    assert rc == 2 and "FIFO" in _error_line(err)


# ------------------------------------------------------- local outputs: only what the user named
@pytest.mark.parametrize("layout", ["user files", "only .zattrs", "zarr.json is a folder", "zarr.json not JSON"])
def test_score_overwrite_replaces_only_a_zarr_store(tmp_path, plant, model_file, layout, capsys):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "data.csv").write_text("a,b\n1,2\n")
    if layout == "only .zattrs":
        (out / ".zattrs").write_text("{}")
    elif layout == "zarr.json is a folder":
        (out / "zarr.json").mkdir()
    elif layout == "zarr.json not JSON":
        (out / "zarr.json").write_text("my notes")
    rc, err = _in_process(capsys, "score", plant["plain"], "--model", model_file, "--output", out, "--overwrite",
                          "--no-progress")
    assert rc == 2 and "is not a Zarr store" in _error_line(err)
    assert (out / "data.csv").read_text() == "a,b\n1,2\n"


def test_a_folder_put_where_the_store_goes_during_the_write_is_kept(tmp_path):
    """What is checked before the work is checked again at the rename: a folder that appears meanwhile stays."""
    from dask_mcpca.cli.outputs import output_store

    out = tmp_path / "scores.zarr"
    with pytest.raises(FileExistsError, match="scores.zarr"):
        with output_store(str(out), None, overwrite=True) as tmp:
            zarr.open_group(tmp, mode="w").attrs["x"] = 1
            out.mkdir()
            (out / "data.csv").write_text("mine")
    assert os.listdir(out) == ["data.csv"]
    assert [n for n in os.listdir(tmp_path) if n != "scores.zarr"] == []  # the temporary is gone
    with pytest.raises(FileExistsError):
        with atomic_path(tmp_path / "new.zarr", replace=lambda p: False) as tmp:
            os.mkdir(tmp)
            os.mkdir(tmp_path / "new.zarr")


def test_demo_never_writes_into_a_folder_it_did_not_make(tmp_path, capsys):
    mine = tmp_path / "home"
    mine.mkdir()
    (mine / "thesis.tex").write_text("mine")
    rc, err = _in_process(capsys, "demo", "--rows", "2000", "--out", mine, "--no-progress")
    assert rc == 2 and "--out" in _error_line(err) and "thesis.tex" in err
    assert os.listdir(mine) == ["thesis.tex"]  # not even the demo's marker
    (tmp_path / "file").write_text("x")
    rc, err = _in_process(capsys, "demo", "--rows", "2000", "--out", tmp_path / "file", "--no-progress")
    assert rc == 2 and "not a folder" in _error_line(err)


# ------------------------------------------------------------------ command-line errors
@pytest.mark.parametrize(
    "args, expected",
    [
        (["--rows", "5:2"], "--rows"),
        (["--rows", "0:0"], "--rows"),
        (["--rows", "99999999:"], "--rows 99999999:"),
        (["--rows", "0:10", "--time", "2030-01-01/2030-02-01"], "--rows 0:10 with --time"),
        (["--time", "2030-01-01/2030-02-01"], "--time"),
        (["--time", "foo:bar"], "--time foo:bar"),
        (["--time", "foo/"], "--time foo:"),
        (["--storage-option", "a.=1"], "--storage-option"),
        (["--storage-option", "a=1", "--storage-option", "a.b=2"], "--storage-option"),
        (["--nan-policy", "partial", "--solver", "paper"], "--nan-policy partial"),
        (["--variables", "a,b,a"], "--variables a,b,a name 'a' more than once"),
        (["--variables", "b,b,c,c"], "name 'b', 'c' more than once"),
    ],
)
def test_cli_errors_name_the_option_as_typed(plant, tmp_path, args, expected, capsys):
    rc, err = _in_process(capsys, "fit", plant["plant"], "--output", tmp_path / "m.json", "--no-progress", *args)
    line = _error_line(err)
    assert rc == 2 and expected in line, line
    assert "X is empty" not in line and "TypeError" not in line.split(expected)[0]
    assert "nan_policy=" not in line and "solver=" not in line
    assert not (tmp_path / "m.json").exists()


def test_duplicate_variables_are_refused_by_name(plant):
    from dask_mcpca import open_archive

    with pytest.raises(ValueError, match="name 'a' more than once"):
        open_archive(plant["plant"], variables=["a", "b", "a"])
    assert open_archive(plant["plant"], variables=["b", "a"]).shape == (2_000, 2)  # each once: fine


def test_version_is_the_installed_distributions():
    from importlib.metadata import version

    rc, out, _ = _cli("--version")
    assert rc == 0 and out.strip() == f"dask-mcpca {version('dask-mcpca')}"


def test_fit_replaces_a_model_file_only_with_overwrite(plant, tmp_path, capsys):
    target = tmp_path / "m.json"
    target.write_text("a model the user keeps")
    rc, err = _in_process(capsys, "fit", plant["plain"], "--output", target, "--no-progress")
    line = _error_line(err)
    assert rc == 2 and "--output" in line and "--overwrite" in line and str(target) in line
    assert target.read_text() == "a model the user keeps"
    rc, err = _in_process(capsys, "fit", plant["plain"], "--output", target, "--no-progress", "--overwrite")
    assert rc == 0, err
    assert load(target).n_features_in_ == 4


@pytest.mark.parametrize("command", ["fit", "score"])
def test_an_object_store_output_with_an_empty_segment_is_named(plant, model_file, command, capsys):
    url = "s3://bkt//x" + (".json" if command == "fit" else ".zarr")
    extra = ["--model", model_file] if command == "score" else []
    rc, err = _in_process(capsys, command, plant["plain"], *extra, "--output", url, "--no-progress")
    line = _error_line(err)
    assert rc == 2 and f"--output {url!r}" in line and "'//'" in line


def test_a_closed_port_is_one_line(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, _, err = _cli("fit", "s3://bucket/x.zarr", "--output", tmp_path / "m.json", "--no-progress",
                      "--storage-option", f"endpoint_url=http://127.0.0.1:{port}")
    assert rc == 2 and "s3://bucket/x.zarr" in _error_line(err)
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "option, expected",
    [
        ("client_kwargs=1", "storage option client_kwargs=1 must be a mapping"),
        ("s3_additional_kwargs=x", "storage option s3_additional_kwargs='x' must be a mapping"),
        ("config_kwargs.read_timeout=abc", "config_kwargs.read_timeout='abc' must be a number of seconds > 0"),
        ("config_kwargs.connect_timeout=0", "config_kwargs.connect_timeout=0 must be a number of seconds > 0"),
        ("nosuchoption=1", "--storage-option nosuchoption=... is not an option"),
    ],
)
def test_a_malformed_storage_option_is_named(tmp_path, option, expected, capsys):
    with socket.socket() as s:  # refused before any request: a port nobody listens on does
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, err = _in_process(capsys, "fit", "s3://bucket/x.zarr", "--output", tmp_path / "m.json", "--no-progress",
                          "--storage-option", f"endpoint_url=http://127.0.0.1:{port}", "--storage-option", option)
    line = _error_line(err)
    assert rc == 2 and expected in line, line
    assert "AttributeError" not in line and "TypeError" not in line


# ----------------------------------------------------------- an endpoint that never answers
@contextlib.contextmanager
def _silent_server(lifetime: float = 2 * NO_HANG):
    """A TCP server on 127.0.0.1 that accepts connections and never answers; stops by itself."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    stop = threading.Event()
    accepted = []

    def serve():
        end = time.monotonic() + lifetime
        while not stop.is_set() and time.monotonic() < end:
            with contextlib.suppress(OSError):
                accepted.append(server.accept()[0])
        for c in accepted:
            c.close()
        server.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}", accepted
    finally:
        stop.set()
        thread.join(5)


def test_s3_urls_get_timeouts_the_user_can_change(monkeypatch):
    pytest.importorskip("s3fs")
    from dask_mcpca._urls import url_to_fs

    monkeypatch.delenv(WAIT_LIMIT_ENV, raising=False)
    options = with_timeouts("s3://b/x.zarr", {"endpoint_url": "http://127.0.0.1:1"})
    assert {k: v for k, v in options["config_kwargs"].items() if k != "http_session_cls"} == S3_TIMEOUTS
    assert options["endpoint_url"] == "http://127.0.0.1:1"
    # 5 s3fs tries x 2 botocore attempts x the read timeout, and their backoff (7 s), fill the limit exactly
    assert S3_TIMEOUTS["read_timeout"] == pytest.approx((DEFAULT_WAIT_LIMIT - 7) / 10)
    monkeypatch.setenv(WAIT_LIMIT_ENV, "17")
    assert with_timeouts("s3://b/x.zarr", None)["config_kwargs"]["read_timeout"] == pytest.approx(1.0)
    for bad in ("abc", "inf", "5"):
        monkeypatch.setenv(WAIT_LIMIT_ENV, bad)
        with pytest.raises(ValueError, match=f"{WAIT_LIMIT_ENV}='{bad}' must be a number of seconds"):
            with_timeouts("s3://b/x.zarr", None)
    monkeypatch.delenv(WAIT_LIMIT_ENV)
    mine = with_timeouts("s3://b/x.zarr", {"config_kwargs": {"read_timeout": 3}})["config_kwargs"]
    assert mine["read_timeout"] == 3 and mine["connect_timeout"] == S3_TIMEOUTS["connect_timeout"]
    assert with_timeouts("gs://b/x.zarr", {"token": "anon"}) == {"token": "anon"}  # another backend's own
    assert with_timeouts("local.zarr", None) is None
    fs, _ = url_to_fs("s3://b/x.zarr", {"endpoint_url": "http://127.0.0.1:1", "skip_instance_cache": True})
    assert fs.config_kwargs["read_timeout"] == S3_TIMEOUTS["read_timeout"]


def test_a_fit_from_an_endpoint_that_never_answers_fails_within_its_timeout(tmp_path, monkeypatch):
    pytest.importorskip("s3fs")
    for k, v in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    with _silent_server() as (endpoint, accepted):
        # one botocore attempt per s3fs try (2 by default, docs/errors.md): the timeout is what is tested
        options = {"endpoint_url": endpoint,
                   "config_kwargs": {"read_timeout": 0.3, "retries": {"total_max_attempts": 1}}}
        started = time.monotonic()
        with pytest.raises((OSError, ValueError), match="s3://b/x.zarr"):
            MCPCA().fit("s3://b/x.zarr", storage_options=options)
        assert time.monotonic() - started < NO_HANG
        assert accepted  # it did reach the server, which never answered
        rc, _, err = _cli("fit", "s3://b/x.zarr", "--output", tmp_path / "m.json", "--no-progress",
                          "--storage-option", f"endpoint_url={endpoint}",
                          "--storage-option", "config_kwargs.read_timeout=0.3",
                          "--storage-option", "config_kwargs.retries.total_max_attempts=1")
        assert rc == 2 and "timeout" in _error_line(err).lower()


# ------------------------------------------------- every wait ends within the one wait limit
#: The wait limit these tests run under (the shortest $DASK_MCPCA_WAIT_LIMIT accepted), and the seconds a
#: command may take beyond it (interpreter start-up, imports and the work before the wait, on a loaded
#: CI machine): a command still running then is the failure, raised as subprocess.TimeoutExpired.
LIMIT, MARGIN = MIN_WAIT_LIMIT, 60
LIMITED = {WAIT_LIMIT_ENV: str(LIMIT), "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
           "AWS_DEFAULT_REGION": "us-east-1"}


def _waited_out(err: str, what: str) -> str:
    """The one error line of a wait that reached the limit: names ``what`` and the variable that changes it."""
    line = _error_line(err)
    assert what in line and WAIT_LIMIT_ENV in line and "Traceback" not in err, line
    return line


#: The commands whose model (``"model"``) or output (``"output"``) is on an endpoint that never answers,
#: with their other arguments: each waits on the one limit; they wait side by side (``_waited_side_by_side``).
_MODEL_ON_SILENT = {f"model, {c}": c for c in ("update", "score", "report")}
_OUTPUT_ON_SILENT = {f"output, {c}": (c, o) for c, o in (
    ("report", "s3://b/r.png"), ("score", "s3://b/s.zarr"), ("update", "s3://b/m.json"), ("fit", "s3://b/m.json"))}


def _waited_side_by_side(runs: dict) -> dict:
    """Each of ``runs`` (name -> (argv, env)) as a real subprocess against its own silent server, all at once:
    the waits are the test, and seven of them in a row were a minute of the CI tier.  name -> (rc, stderr,
    whether the server was reached)."""
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(_silent_server()) for name in runs}
        procs = {name: subprocess.Popen(
            [sys.executable, "-m", "dask_mcpca", *map(str, argv), "--storage-option",
             f"endpoint_url={servers[name][0]}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**subprocess_env(), **env})
            for name, (argv, env) in runs.items()}
        try:
            errs = {name: proc.communicate(timeout=LIMIT + MARGIN)[1] for name, proc in procs.items()}
        finally:
            for proc in procs.values():
                proc.kill()
        return {name: (procs[name].returncode, errs[name], bool(servers[name][1])) for name in runs}


def test_a_model_or_an_output_on_an_endpoint_that_never_answers_ends_within_the_wait_limit(plant, model_file,
                                                                                             tmp_path):
    """A model file on it: one request, bounded, then one line (the model's path is never asked about again as a
    folder).  An output on it: ``report -o`` fails before the pass (the events CSV is the first object), and a
    PNG, a score store or a model file that would not be answered ends the same way."""
    pytest.importorskip("s3fs")
    quiet = {"PYTHONWARNINGS": "ignore"}  # update warns about the model's rows, which is not what is tested
    runs = {}
    for name, command in _MODEL_ON_SILENT.items():
        out = tmp_path / name.replace(", ", "-")
        out.mkdir()
        outputs = {"update": [], "score": ["--output", out / "s.zarr"], "report": ["--output", out / "r.png"]}
        runs[name] = ([command, plant["plain"], "--model", "s3://b/model.json", *outputs[command], "--no-progress"],
                      LIMITED)
    for name, (command, output) in _OUTPUT_ON_SILENT.items():
        model = ["--model", model_file] if command != "fit" else []
        rows = ["--rows", "0:1000"] if command == "update" else []
        runs[name] = ([command, plant["plain"], *model, *rows, "--output", output, "--no-progress"],
                      {**LIMITED, **quiet})
    for name, (rc, err, reached) in _waited_side_by_side(runs).items():
        assert reached, name  # it reached the server, which never answered
        if name in _MODEL_ON_SILENT:
            line = _waited_out(err, "'s3://b/model.json'")
            assert rc == 2 and "did not answer" in line and "cannot read" in line, (name, line)
            assert os.listdir(tmp_path / name.replace(", ", "-")) == [], name
        else:
            line = _waited_out(err, "s3://b/")
            assert rc == 2 and "did not answer" in line and "cannot write" in line, (name, line)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="stalls a read on a named pipe")
def test_a_score_whose_workers_are_all_killed_ends_within_the_wait_limit(tmp_path, model_file):
    """Every worker (and its nanny) killed mid-score: the scheduler would hold the tasks forever. Cancelled
    once it has had no worker for the limit, in one line, and no output published."""
    from _cluster import ProcessCluster
    from _stall import stalled_last_chunk, wait_until_writing

    big = str(tmp_path / "big.zarr")
    z = zarr.create_array(big, shape=(20_000, 4), chunks=(2_000, 4), dtype="f8")
    z[:] = np.random.default_rng(5).normal(size=z.shape)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with ProcessCluster(tmp_path / "cluster", n_workers=2) as cluster, stalled_last_chunk(big):
        proc = subprocess.Popen(
            [sys.executable, "-m", "dask_mcpca", "score", big, "--model", str(model_file), "--output",
             str(out_dir / "scores.zarr"), "--no-progress", "--scheduler", cluster.address],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**subprocess_env(), **LIMITED},
        )
        try:
            wait_until_writing(proc, out_dir)  # the computation has started (its last read stalled)
            cluster.kill_workers()
            _, err = proc.communicate(timeout=LIMIT + MARGIN)
        finally:
            proc.kill()
    line = _waited_out(err, "has had no workers")
    assert proc.returncode == 2 and cluster.address in line and "lost its 2 workers" in line, line
    assert "scores.zarr" not in os.listdir(out_dir)


# ------------------------------------------------------------------- object-store outputs
try:  # the S3 server and its archives, as test_object_store starts them
    from test_object_store import BUCKET, data, fitted, model_url, s3, stores  # noqa: F401
except pytest.skip.Exception:
    BUCKET = None


def _fs(stores):
    import s3fs

    return s3fs.S3FileSystem(endpoint_url=stores["options"]["endpoint_url"], skip_instance_cache=True)


def test_an_s3_store_without_its_endpoint_is_one_line(stores, tmp_path):
    """The moto server's store named without --storage-option endpoint_url: AWS is asked, and refuses."""
    rc, _, err = _cli("fit", stores["plain"], "--output", tmp_path / "m.json", "--no-progress")
    assert rc == 2 and stores["plain"] in _error_line(err)
    assert "Traceback" not in err and not (tmp_path / "m.json").exists()


@pytest.mark.skipif(BUCKET is None, reason="needs s3fs and moto")
def test_score_overwrite_never_replaces_a_prefix_of_other_objects(stores, model_url):
    fs = _fs(stores)
    fs.pipe_file(f"{BUCKET}/precious/data.csv", b"a,b\n1,2\n")
    fs.pipe_file(f"{BUCKET}/precious.json", b"{}")
    endpoint = f"endpoint_url={stores['options']['endpoint_url']}"
    for out in (f"s3://{BUCKET}/precious", f"s3://{BUCKET}/precious.json"):
        rc, _, err = _cli("score", stores["plain"], "--model", model_url, "--output", out, "--overwrite",
                          "--no-progress", "--storage-option", endpoint)
        assert rc == 2 and "is not a Zarr store" in _error_line(err) and out in err
    fs.invalidate_cache()
    assert fs.cat_file(f"{BUCKET}/precious/data.csv") == b"a,b\n1,2\n"
    assert fs.cat_file(f"{BUCKET}/precious.json") == b"{}"
    assert [p for p in fs.ls(BUCKET, detail=False) if ".precious" in p] == []  # no temporary left


@pytest.mark.skipif(BUCKET is None, reason="needs s3fs and moto")
def test_an_interrupted_publication_is_recognised_by_its_marker(stores, data, fitted, model_url, monkeypatch):
    """A publication that fails before its root metadata leaves its marker; --overwrite replaces that."""
    import s3fs

    from dask_mcpca.cli import main

    options = stores["options"]
    out = f"s3://{BUCKET}/interrupted.zarr"
    original = s3fs.S3FileSystem._cp_file  # what fs.copy does for each object

    async def copy_but_not_the_root(self, path1, path2, *args, **kwargs):
        if str(path2).endswith("interrupted.zarr/zarr.json"):
            raise ConnectionResetError("the network went away")
        return await original(self, path1, path2, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_cp_file", copy_but_not_the_root)
    argv = ["score", stores["plain"], "--model", model_url, "--output", out, "--no-progress",
            "--storage-option", f"endpoint_url={options['endpoint_url']}"]
    assert main(argv) == 2
    fs = _fs(stores)
    assert url_store_state(fs, f"{BUCKET}/interrupted.zarr") == "interrupted"
    assert fs.isfile(f"{BUCKET}/interrupted.zarr/{PUBLISHING_MARKER}")
    monkeypatch.setattr(s3fs.S3FileSystem, "_cp_file", original)
    assert main(argv) == 2  # exists: --overwrite is still asked for
    assert main([*argv, "--overwrite"]) == 0
    assert url_store_state(fs, f"{BUCKET}/interrupted.zarr") == "zarr"
    assert not fs.exists(f"{BUCKET}/interrupted.zarr/{PUBLISHING_MARKER}")
    g = zarr.open_group(out, mode="r", storage_options=options)
    np.testing.assert_allclose(g["d2"][:], fitted.mahalanobis(data), rtol=1e-6)  # the default outputs
