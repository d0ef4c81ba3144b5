"""Zarr archives on an object store: a real S3-compatible server (moto) on 127.0.0.1.

The server is ``python -m moto.server`` in its own process; a scheduler and
two workers (``tests/_cluster.py``) read the archive from it.  Credentials
come from the environment (``AWS_ACCESS_KEY_ID``, ...), as s3fs reads them,
on the client and on the workers; the endpoint is a storage option
(``--storage-option endpoint_url=...``).
"""

from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from _cluster import ProcessCluster

from dask_mcpca import MCPCA, load, open_archive
from dask_mcpca.cli import main

pytestmark = pytest.mark.slow  # the CI tier (tests/conftest.py): real processes, servers or timeouts

N_ROWS, CHANNELS = 20_000, ["T1", "T2", "P1", "P2", "V1"]
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
BUCKET = "archive"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(log) -> tuple[subprocess.Popen, str]:
    """A moto S3 server on a free port of 127.0.0.1 with bucket ``BUCKET``, once it answers."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
    )
    endpoint = f"http://127.0.0.1:{port}"
    import s3fs

    deadline = time.monotonic() + 30
    while True:
        try:
            s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True).mkdir(BUCKET)
            return proc, endpoint
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise
            time.sleep(0.2)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The endpoint URL of a fresh S3 server with credentials in the environment; stopped after."""
    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    log = open(tmp_path_factory.mktemp("s3") / "moto.log", "wb")
    proc = None
    try:
        proc, endpoint = _start_server(log)
        yield endpoint
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        log.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(N_ROWS, len(CHANNELS))) @ rng.normal(size=(len(CHANNELS), len(CHANNELS)))
    X[100:160, 2] = 40.0  # a stuck channel: P1
    return X


@pytest.fixture(scope="module")
def stores(s3, data):
    """A plain Zarr array and an xarray archive (1-D variables along time) on the S3 server."""
    options = {"endpoint_url": s3}
    plain = f"s3://{BUCKET}/plain.zarr"
    z = zarr.create_array(plain, shape=data.shape, chunks=(2_000, len(CHANNELS)), dtype="f8", storage_options=options)
    z[:] = data
    labelled = f"s3://{BUCKET}/plant.zarr"
    time_ = pd.date_range("2025-06-01", periods=N_ROWS, freq="1min")
    ds = xr.Dataset({c: ("time", data[:, j]) for j, c in enumerate(CHANNELS)}, coords={"time": time_})
    ds.chunk({"time": 2_000}).to_zarr(labelled, storage_options=options)
    return {"plain": plain, "labelled": labelled, "options": options}


@pytest.fixture(scope="module")
def cluster(s3, tmp_path_factory):
    # started after the credentials are in the environment: the workers inherit them
    with ProcessCluster(tmp_path_factory.mktemp("cluster"), n_workers=2, nthreads=1, memory_limit="1GiB") as c:
        yield c


def _run(*args) -> int:
    return main([str(a) for a in args] + ["--no-progress"])


def test_fit_an_s3_url_as_the_local_data(stores, data):
    model = MCPCA().fit(stores["plain"], storage_options=stores["options"])
    expected = MCPCA().fit(data)
    np.testing.assert_allclose(model.components_, expected.components_, atol=1e-10)
    X = open_archive(stores["labelled"], storage_options=stores["options"])
    assert isinstance(X, xr.DataArray) and X.dims == ("time", "channel")
    assert list(MCPCA().fit(X).feature_names_in_) == sorted(CHANNELS)


def test_a_missing_url_is_a_file_not_found_error(stores):
    with pytest.raises(FileNotFoundError, match="s3://archive/nope.zarr"):
        MCPCA().fit(f"s3://{BUCKET}/nope.zarr", storage_options=stores["options"])


def test_cli_fit_score_report_on_s3_with_a_cluster(stores, cluster, tmp_path):
    endpoint = f"endpoint_url={stores['options']['endpoint_url']}"
    on_cluster = ["--storage-option", endpoint, "--scheduler", cluster.address]
    model_path = tmp_path / "model.json"
    assert _run("fit", stores["labelled"], "--output", model_path, *on_cluster) == 0
    model = load(model_path)
    assert sorted(model.feature_names_in_) == sorted(CHANNELS)

    scores = f"s3://{BUCKET}/scores.zarr"
    assert _run("score", stores["labelled"], "--model", model_path, "--output", scores, "--outputs", "all",
                *on_cluster) == 0
    ds = xr.open_zarr(scores, storage_options=stores["options"])
    assert ds.attrs["complete"] is True
    assert ds["contributions"].dims == ("time", "channel") and ds["outlier"].dims == ("time",)
    assert ds.indexes["time"][0] == pd.Timestamp("2025-06-01")
    assert ds["outlier"][100:160].all()
    assert _run("score", stores["labelled"], "--model", model_path, "--output", scores, *on_cluster) == 2
    assert _run("score", stores["labelled"], "--model", model_path, "--output", scores, "--overwrite",
                *on_cluster) == 0

    png = f"s3://{BUCKET}/reports/report.png"
    assert _run("report", stores["labelled"], "--model", model_path, "--output", png, *on_cluster) == 0
    import fsspec

    with fsspec.open(png, "rb", **stores["options"]) as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with fsspec.open(f"s3://{BUCKET}/reports/report.csv", "rt", **stores["options"]) as f:
        events = list(csv.DictReader(f))
    stuck = [e for e in events if int(e["start_row"]) <= 100 < int(e["stop_row"])]
    assert stuck and stuck[0]["channel_1"] == "P1"


# ------------------------------------------------- every path takes storage_options
METHODS = ["transform", "score_samples", "mahalanobis", "is_outlier", "channel_contributions"]


@pytest.fixture(scope="module")
def fitted(data):
    return MCPCA().fit(data)


@pytest.mark.parametrize("method", METHODS)
def test_every_method_reads_an_s3_url_with_storage_options(stores, data, fitted, method):
    got = getattr(fitted, method)(stores["plain"], storage_options=stores["options"])
    expected = getattr(fitted, method)(data)  # the same rows from memory
    np.testing.assert_allclose(np.asarray(got.compute()), expected, rtol=1e-12, atol=1e-12)


def test_fit_transform_reads_an_s3_url_twice_with_storage_options(stores, data):
    got = MCPCA(n_components=2).fit_transform(stores["plain"], storage_options=stores["options"])
    np.testing.assert_allclose(got.compute(), MCPCA(n_components=2).fit_transform(data), rtol=1e-9, atol=1e-9)


def test_a_url_whose_backend_is_missing_names_the_package(tmp_path):
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("gcsfs is installed")
    with pytest.raises(ImportError, match=r"gcsfs.*dask-mcpca\[cloud\]"):
        MCPCA().fit("gs://bucket/archive.zarr")


# ------------------------------------------------------------- models on S3
def _fs(stores):
    import s3fs

    return s3fs.S3FileSystem(endpoint_url=stores["options"]["endpoint_url"], skip_instance_cache=True)


def test_model_round_trip_through_s3_is_bit_identical_to_a_local_one(stores, fitted, tmp_path):
    from conftest import assert_same_model

    url = f"s3://{BUCKET}/models/model.json"
    fitted.save(url, storage_options=stores["options"])
    fitted.save(tmp_path / "model.json")
    from_s3 = load(url, storage_options=stores["options"])
    local = load(tmp_path / "model.json")
    assert_same_model(from_s3, local)
    assert from_s3.components_.tobytes() == fitted.components_.tobytes()
    assert _fs(stores).cat_file(url) == (tmp_path / "model.json").read_bytes()


def test_a_model_url_whose_backend_is_missing_names_the_package(fitted):
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("gcsfs is installed")
    for call in (lambda: fitted.save("gs://bucket/model.json"), lambda: load("gs://bucket/model.json")):
        with pytest.raises(ImportError, match=r"gcsfs.*dask-mcpca\[cloud\]"):
            call()


def test_a_missing_or_damaged_model_on_s3_is_named(stores, fitted):
    from dask_mcpca import ModelFormatError

    with pytest.raises(FileNotFoundError, match="no such model file: 's3://archive/models/none.json'"):
        load(f"s3://{BUCKET}/models/none.json", storage_options=stores["options"])
    with pytest.raises(ModelFormatError, match="is a directory"):
        load(f"s3://{BUCKET}/models", storage_options=stores["options"])
    _fs(stores).pipe_file(f"{BUCKET}/models/half.json", b'{"format": "dask-mcpca-model", "format_ver')
    with pytest.raises(ModelFormatError, match="not JSON"):
        load(f"s3://{BUCKET}/models/half.json", storage_options=stores["options"])


def test_a_failed_save_leaves_the_old_model_on_s3(stores, fitted, data):
    from sklearn.base import clone

    url = f"s3://{BUCKET}/models/kept.json"
    fitted.save(url, storage_options=stores["options"])
    before = _fs(stores).cat_file(url)
    other = clone(fitted).fit(data[:5_000])
    other.unsupported_ = object()  # cannot be encoded: the save fails before anything is written
    with pytest.raises(TypeError, match="unsupported_"):
        other.save(url, storage_options=stores["options"])
    assert _fs(stores).cat_file(url) == before


def test_a_writer_killed_mid_upload_leaves_the_old_object(stores):
    """S3 publishes a multipart upload only when it is completed: a writer killed during one changes nothing."""
    from _cluster import subprocess_env

    fs = _fs(stores)
    key = f"{BUCKET}/models/large.json"
    fs.pipe_file(key, b"the old model")
    size = 160 * 2**20  # above 2 x 50 MiB: s3fs uploads it in parts
    script = (
        "import sys; from dask_mcpca._atomic import write_bytes; "
        f"write_bytes('s3://{key}', b'x' * {size}, storage_options={{'endpoint_url': sys.argv[1]}})"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, stores["options"]["endpoint_url"]], env=subprocess_env())
    try:
        deadline = time.monotonic() + 120
        while not fs.call_s3("list_multipart_uploads", Bucket=BUCKET).get("Uploads"):
            assert proc.poll() is None and time.monotonic() < deadline, "no multipart upload was started"
            time.sleep(0.01)
        proc.kill()
        proc.wait(30)
    finally:
        proc.kill()
    fs.invalidate_cache()
    assert fs.cat_file(key) == b"the old model"


def test_cli_reads_and_writes_the_model_on_s3(stores, tmp_path):
    endpoint = ["--storage-option", f"endpoint_url={stores['options']['endpoint_url']}"]
    model_url = f"s3://{BUCKET}/models/cli.json"
    assert _run("fit", stores["plain"], "--output", model_url, *endpoint) == 0
    model = load(model_url, storage_options=stores["options"])
    assert _run("score", stores["plain"], "--model", model_url, "--output", tmp_path / "s.zarr", *endpoint) == 0
    np.testing.assert_array_equal(
        zarr.open_group(tmp_path / "s.zarr", mode="r")["outlier"][:],
        model.is_outlier(stores["plain"], storage_options=stores["options"]).compute(),
    )
    assert _run("report", stores["plain"], "--model", model_url, "--output", tmp_path / "r.png", *endpoint) == 0
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------ score's output on S3
def _temporaries(fs, name: str) -> list[str]:
    fs.invalidate_cache()
    return [p for p in fs.ls(BUCKET, detail=False) if p.rpartition("/")[2].startswith(f".{name}.")]


@pytest.fixture(scope="module")
def model_url(stores, fitted):
    url = f"s3://{BUCKET}/models/score.json"
    fitted.save(url, storage_options=stores["options"])
    return url


def test_a_failed_score_leaves_the_old_output_and_no_temporary(stores, data, fitted, model_url):
    endpoint = ["--storage-option", f"endpoint_url={stores['options']['endpoint_url']}"]
    out = f"s3://{BUCKET}/kept-scores.zarr"
    assert _run("score", stores["plain"], "--model", model_url, "--output", out, *endpoint) == 0
    old = zarr.open_group(out, mode="r", storage_options=stores["options"])
    assert old.attrs["complete"] is True
    d2 = old["d2"][:]  # the default outputs, in float32
    np.testing.assert_allclose(d2, fitted.mahalanobis(data), rtol=1e-6)
    gappy = data.copy()
    gappy[N_ROWS - 10] = np.nan  # the model refuses NaN rows (nan_policy="raise"): the last blocks fail
    gappy_url = f"s3://{BUCKET}/gappy.zarr"
    z = zarr.create_array(gappy_url, shape=gappy.shape, chunks=(2_000, len(CHANNELS)), dtype="f8",
                          storage_options=stores["options"])
    z[:] = gappy
    rc = _run("score", gappy_url, "--model", model_url, "--output", out, "--overwrite", *endpoint)
    assert rc == 2
    kept = zarr.open_group(out, mode="r", storage_options=stores["options"])
    np.testing.assert_array_equal(kept["d2"][:], d2)
    assert _temporaries(_fs(stores), "kept-scores.zarr") == []


def test_score_killed_mid_write_on_s3_keeps_the_old_output(stores, data, fitted, model_url):
    """SIGKILL while ``score`` writes to S3: readers still see the old output; the next score cleans up."""
    from _cluster import subprocess_env

    options = stores["options"]
    endpoint = ["--storage-option", f"endpoint_url={options['endpoint_url']}"]
    out = f"s3://{BUCKET}/killed-scores.zarr"
    assert _run("score", stores["plain"], "--model", model_url, "--output", out, *endpoint) == 0
    d2 = zarr.open_group(out, mode="r", storage_options=options)["d2"][:]
    big = np.random.default_rng(5).normal(size=(400_000, len(CHANNELS)))
    big_url = f"s3://{BUCKET}/big.zarr"
    zarr.create_array(big_url, shape=big.shape, chunks=(4_000, len(CHANNELS)), dtype="f8",
                      storage_options=options)[:] = big
    fs = _fs(stores)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dask_mcpca", "score", big_url, "--model", model_url, "--output", out,
         "--overwrite", "--no-progress", *endpoint],
        env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(fs.find(t) for t in _temporaries(fs, "killed-scores.zarr")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        proc.kill()
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert _temporaries(fs, "killed-scores.zarr")  # left by the kill
    old = zarr.open_group(out, mode="r", storage_options=options)  # the old output, whole
    assert old.attrs["complete"] is True
    np.testing.assert_array_equal(old["d2"][:], d2)
    assert _run("score", big_url, "--model", model_url, "--output", out, "--overwrite", *endpoint) == 0
    assert _temporaries(fs, "killed-scores.zarr") == []
    np.testing.assert_allclose(
        zarr.open_group(out, mode="r", storage_options=options)["d2"][:], fitted.mahalanobis(big), rtol=1e-6
    )


def test_overwrite_repairs_an_output_left_without_root_metadata(stores, data, fitted, model_url):
    """A publication interrupted before the root ``zarr.json`` leaves objects that readers see as no
    store; ``score --overwrite`` replaces them (fsspec refused the empty list of metadata to hide)."""
    options = stores["options"]
    endpoint = ["--storage-option", f"endpoint_url={options['endpoint_url']}"]
    out = f"s3://{BUCKET}/half-scores.zarr"
    fs = _fs(stores)
    fs.pipe(f"{BUCKET}/half-scores.zarr/d2/c/0", b"chunk bytes of an interrupted publication")
    from dask_mcpca._atomic import PUBLISHING_MARKER  # written first by a publication, deleted last

    fs.pipe(f"{BUCKET}/half-scores.zarr/{PUBLISHING_MARKER}", b"publishing")
    with pytest.raises(Exception):  # noqa: B017 -- zarr's error for a prefix without metadata varies by version
        zarr.open_group(out, mode="r", storage_options=options)
    assert _run("score", stores["plain"], "--model", model_url, "--output", out, "--overwrite", *endpoint) == 0
    fs.invalidate_cache()
    g = zarr.open_group(out, mode="r", storage_options=options)
    np.testing.assert_allclose(g["d2"][:], fitted.mahalanobis(data), rtol=1e-6)


def test_a_server_killed_mid_fit_ends_the_fit_in_one_line(s3, tmp_path):
    """The S3 server dies while ``dask-mcpca fit`` reads the archive (its own server, killed after
    150 chunk reads of the 400 of a pass): exit 2 within the documented 10 s timeouts, one line
    naming the store and the rows it could not read, no traceback, no asyncio noise, no model."""
    log_path = tmp_path / "moto.log"
    with open(log_path, "wb") as log:
        proc, endpoint = _start_server(log)
        try:
            url = f"s3://{BUCKET}/doomed.zarr"
            X = np.random.default_rng(0).normal(size=(400_000, 5))
            z = zarr.create_array(url, shape=X.shape, chunks=(1_000, 5), dtype="f8",
                                  storage_options={"endpoint_url": endpoint})
            z[:] = X
            model = tmp_path / "model.json"
            child = subprocess.Popen(
                [sys.executable, "-m", "dask_mcpca", "fit", url, "--storage-option", f"endpoint_url={endpoint}",
                 "-o", str(model), "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            while log_path.read_text().count("GET /archive/doomed.zarr/c/") < 150 and child.poll() is None:
                time.sleep(0.05)
            assert child.poll() is None, child.communicate()  # still reading: the kill is mid-fit
            proc.kill()
            killed = time.monotonic()
            _, err = child.communicate(timeout=120)
        finally:
            proc.kill()
            proc.wait(10)
    assert child.returncode == 2
    assert time.monotonic() - killed < 60
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("dask-mcpca fit: error: cannot read rows ") and url in lines[0]
    assert not model.exists()
