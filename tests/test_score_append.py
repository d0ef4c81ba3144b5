"""``dask-mcpca score --append``: only the new rows read and scored, the store put in place whole.

Real Zarr stores on disk, grown in place as an archive grows; the command run
in process through :func:`dask_mcpca.cli.main`.  The expected output of an
append is a full ``score`` of the grown archive into another store, array for
array (every output is a function of its row, and ``top_channel`` also of the
row before; floats to 1e-12, as BLAS may round another block's rows in the
last bit), and the
expected reads are the input's chunks that hold new rows, computed here from
the chunk size.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from conftest import FileOpens

from dask_mcpca import MCPCA
from dask_mcpca._model import CONTEXT_ROWS
from dask_mcpca.cli import SCORE_ARRAYS, main

N, P, CHUNK = 30_000, 4, 2_000
FIRST = 20_500  # rows scored first: not on a chunk boundary of the input or of the output
SCALES = np.array([3.0, 1.0, 0.5, 0.2])


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(11).normal(size=(N, P)) * SCALES


@pytest.fixture(scope="module")
def model(data, tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "m.json"
    MCPCA().fit(data[:FIRST]).save(path)
    return str(path)


def _grow(path, X) -> None:
    """Write ``X`` as the Zarr array ``path``: created, or resized and its new rows written (an archive growing)."""
    if os.path.exists(path):
        z = zarr.open_array(str(path), mode="r+")
        old = z.shape[0]
        z.resize(X.shape)
        z[old:] = X[old:]
    else:
        zarr.create_array(str(path), shape=X.shape, chunks=(CHUNK, X.shape[1]), dtype=X.dtype)[:] = X


def _cli(capsys, *args) -> tuple[int, str, str]:
    rc = main([*map(str, args), "--no-progress"])
    out, err = capsys.readouterr()
    return rc, out, err


def _snapshot(path) -> dict:
    """Every file under ``path``: its content's SHA-256."""
    out = {}
    for folder, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(folder, f), "rb") as fh:
                out[os.path.relpath(os.path.join(folder, f), path)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def _assert_same_scores(a, b) -> None:
    ga, gb = zarr.open_group(str(a), mode="r"), zarr.open_group(str(b), mode="r")
    assert ga.attrs["outputs"] == gb.attrs["outputs"] and set(ga.attrs["outputs"]) <= set(SCORE_ARRAYS)
    for name in ga.attrs["outputs"]:
        x, y = ga[name][:], gb[name][:]
        assert x.dtype == y.dtype and x.shape == y.shape, name
        if x.dtype.kind == "f":  # BLAS may round a block of other rows in its last bit
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12 * np.nanmax(np.abs(y)), err_msg=name)
        else:
            assert np.array_equal(x, y), name
    assert ga.attrs["rows"] == gb.attrs["rows"]


@pytest.fixture
def grown(data, model, tmp_path, capsys):
    """An archive of FIRST rows scored into ``scores.zarr``, then grown to N rows."""
    store = tmp_path / "archive.zarr"
    _grow(store, data[:FIRST])
    out = tmp_path / "out" / "scores.zarr"
    rc, _, err = _cli(capsys, "score", store, "-m", model, "-o", out)
    assert rc == 0, err
    _grow(store, data)
    return store, out


def test_append_reads_only_the_new_rows_and_equals_a_full_score(grown, model, tmp_path, capsys):
    store, out = grown
    with FileOpens(store) as reads:
        rc, text, err = _cli(capsys, "score", store, "-m", model, "-o", out, "--append")
    assert rc == 0, err
    assert f"{N - FIRST:,} new rows ({FIRST:,}:{N:,})" in text
    chunks = sorted(int(name.split("/")[1]) for name in reads.opened if name.startswith("c/"))
    # each chunk holding a new row or one of the CONTEXT_ROWS rows before them (a stuck run), once, and
    # chunk 0: row 0, the older row of the store's fingerprint checked (the other, row FIRST - 1, is in those)
    assert chunks == [0, *range((FIRST - CONTEXT_ROWS) // CHUNK, -(-N // CHUNK))]

    full = tmp_path / "full.zarr"
    assert _cli(capsys, "score", store, "-m", model, "-o", full)[0] == 0
    _assert_same_scores(out, full)
    assert zarr.open_group(str(out), mode="r").attrs["rows"] == [0, N]
    assert sorted(os.listdir(out.parent)) == ["scores.zarr"]  # no temporary, no old version left

    before = _snapshot(out)
    rc, text, _ = _cli(capsys, "score", store, "-m", model, "-o", out, "--append")
    assert rc == 0 and "nothing to append" in text
    assert _snapshot(out) == before


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_appends_in_several_steps_equal_one_score(data, model, tmp_path, capsys):
    store, out = tmp_path / "archive.zarr", tmp_path / "scores.zarr"
    for stop in (7_000, 7_001, 15_999, N):  # the first creates the output: --append on a missing store
        _grow(store, data[:stop])
        rc, _, err = _cli(capsys, "score", store, "-m", model, "-o", out, "--append")
        assert rc == 0, err
    full = tmp_path / "full.zarr"
    assert _cli(capsys, "score", store, "-m", model, "-o", full)[0] == 0
    _assert_same_scores(out, full)


def test_a_failed_append_leaves_the_previous_output(grown, data, model, capsys):
    store, out = grown
    # the model's nan_policy is "raise": the last chunk's task fails while others have written
    zarr.open_array(str(store), mode="r+")[N - 3] = np.nan
    before = _snapshot(out)
    rc, _, err = _cli(capsys, "score", store, "-m", model, "-o", out, "--append")
    assert rc == 2 and "NaN" in err and len(err.strip().splitlines()) == 1
    assert _snapshot(out) == before
    assert sorted(os.listdir(out.parent)) == ["scores.zarr"]
    assert zarr.open_group(str(out), mode="r").attrs["rows"] == [0, FIRST]


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_another_model_starts_a_segment(grown, data, model, tmp_path, capsys):
    """An updated (or any other) model over the same channels scores the new rows; the store says which."""
    store, out = grown
    other = tmp_path / "other.json"
    MCPCA().fit(data[:FIRST] * 2).save(other)
    rc, text, err = _cli(capsys, "score", store, "-m", other, "-o", out, "--append")
    assert rc == 0, err
    assert "another model" in text and "segment 1 (an index into the store's 'segments' attribute)" in text
    attrs = zarr.open_group(str(out), mode="r").attrs
    digests = [hashlib.sha256(open(m, "rb").read()).hexdigest() for m in (model, other)]
    assert [s["rows"] for s in attrs["segments"]] == [[0, FIRST], [FIRST, N]]
    assert [s["model_sha256"] for s in attrs["segments"]] == digests
    assert attrs["model_sha256"] == digests[1] and attrs["rows"] == [0, N]
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"  # each segment holds its model's full score
    assert _cli(capsys, "score", store, "-m", model, "-o", a)[0] == 0
    assert _cli(capsys, "score", store, "-m", other, "-o", b)[0] == 0
    got = zarr.open_group(str(out), mode="r")
    for name in got.attrs["outputs"]:
        np.testing.assert_array_equal(got[name][:FIRST], zarr.open_group(str(a), mode="r")[name][:FIRST])
        np.testing.assert_array_equal(got[name][FIRST:], zarr.open_group(str(b), mode="r")[name][FIRST:])


def test_other_data_is_refused(grown, data, model, tmp_path, capsys):
    store, out = grown
    copy = tmp_path / "copy.zarr"
    _grow(copy, data)
    before = _snapshot(out)
    rc, _, err = _cli(capsys, "score", copy, "-m", model, "-o", out, "--append")
    assert rc == 2 and "other data" in err and "copy.zarr" in err
    short = tmp_path / "short.zarr"
    _grow(short, data[:1000])
    rc, _, err = _cli(capsys, "score", short, "-m", model, "-o", out, "--append")
    assert rc == 2 and "other data" in err
    assert _snapshot(out) == before


def test_a_store_shorter_than_the_output_is_refused(data, model, tmp_path, capsys):
    store, out = tmp_path / "archive.zarr", tmp_path / "scores.zarr"
    _grow(store, data)
    assert _cli(capsys, "score", store, "-m", model, "-o", out)[0] == 0
    zarr.open_array(str(store), mode="r+").resize((FIRST, P))  # the archive lost rows
    before = _snapshot(out)
    rc, _, err = _cli(capsys, "score", store, "-m", model, "-o", out, "--append")
    assert rc == 2 and f"{FIRST:,} rows, fewer than the {N:,} already scored" in err
    assert _snapshot(out) == before


@pytest.mark.parametrize("extra, mention", [(["--overwrite"], "pass one of them"),
                                            (["--rows", "5:"], "no --rows"),
                                            (["--time", "a/b"], "no --time")])
def test_options_that_do_not_go_with_append(grown, model, capsys, extra, mention):
    store, out = grown
    before = _snapshot(out)
    rc, _, err = _cli(capsys, "score", store, "-m", model, "-o", out, "--append", *extra)
    assert rc == 2 and mention in err and len(err.strip().splitlines()) == 1
    assert _snapshot(out) == before


def test_an_output_without_provenance_is_refused(grown, model, capsys):
    store, out = grown
    del zarr.open_group(str(out), mode="r+").attrs["rows"]  # as written before score recorded its rows
    rc, _, err = _cli(capsys, "score", store, "-m", model, "-o", out, "--append")
    assert rc == 2 and "--overwrite" in err and "older" in err


def test_a_folder_that_is_no_score_store_is_refused(data, model, tmp_path, capsys):
    store = tmp_path / "archive.zarr"
    _grow(store, data)
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    rc, _, err = _cli(capsys, "score", store, "-m", model, "-o", folder, "--append")
    assert rc == 2 and "not a Zarr store" in err
    assert os.listdir(folder) == ["keep.txt"]


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_append_to_an_xarray_archive_equals_a_full_score(data, model, tmp_path, capsys):
    times = pd.date_range("2024-01-01", periods=N, freq="min")
    ds = xr.Dataset({f"c{i}": ("time", data[:, i]) for i in range(P)}, coords={"time": times})
    store, out, full = (str(tmp_path / n) for n in ("archive.zarr", "scores.zarr", "full.zarr"))
    ds.isel(time=slice(None, FIRST)).chunk(time=CHUNK).to_zarr(store, mode="w")
    assert _cli(capsys, "score", store, "-m", model, "-o", out)[0] == 0
    ds.isel(time=slice(FIRST, None)).chunk(time=CHUNK).to_zarr(store, append_dim="time", align_chunks=True)
    rc, _, err = _cli(capsys, "score", store, "-m", model, "-o", out, "--append")
    assert rc == 0, err
    assert _cli(capsys, "score", store, "-m", model, "-o", full)[0] == 0
    a, b = xr.open_zarr(out), xr.open_zarr(full)
    xr.testing.assert_identical(a, b)
    assert a.sizes["time"] == N and a.attrs["rows"] == [0, N]


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_append_keeps_the_outputs_and_dtype_of_the_store(data, model, tmp_path, capsys):
    store, out = tmp_path / "archive.zarr", tmp_path / "scores.zarr"
    _grow(store, data[:FIRST])
    chosen = ["--outputs", "d2,outlier,top_channel", "--dtype", "float32"]
    assert _cli(capsys, "score", store, "-m", model, "-o", out, *chosen)[0] == 0
    _grow(store, data)
    before = _snapshot(out)
    rc, _, err = _cli(capsys, "score", store, "-m", model, "-o", out, "--append", "--outputs", "all")
    assert rc == 2 and "--outputs differs" in err
    assert _snapshot(out) == before
    rc, _, err = _cli(capsys, "score", store, "-m", model, "-o", out, "--append")
    assert rc == 0, err
    full = tmp_path / "full.zarr"
    assert _cli(capsys, "score", store, "-m", model, "-o", full, *chosen)[0] == 0
    _assert_same_scores(out, full)
    g = zarr.open_group(str(out), mode="r")
    assert sorted(g.array_keys()) == ["d2", "outlier", "top_channel"] and g["d2"].dtype == np.float32


@pytest.mark.slow
def test_an_append_killed_mid_write_leaves_the_previous_output(model, tmp_path):
    """SIGKILL while ``score --append`` writes: the old store is intact and readable (its old-row chunks are
    shared with the temporary as hard links, never written); the next run removes the temporary."""
    import subprocess
    import sys

    from _stall import kill_once_writing, stalled_last_chunk

    rng = np.random.default_rng(5)
    store, out = tmp_path / "archive.zarr", tmp_path / "out" / "scores.zarr"
    big = rng.normal(size=(1_200_000, P)) * SCALES
    _grow(store, big[:200_000])
    command = [sys.executable, "-m", "dask_mcpca", "score", str(store), "-m", model, "-o", str(out), "--no-progress"]
    assert subprocess.run(command, capture_output=True).returncode == 0
    _grow(store, big)
    before = _snapshot(out)
    with stalled_last_chunk(store):
        kill_once_writing(subprocess.Popen([*command, "--append"], stdout=subprocess.PIPE, stderr=subprocess.PIPE),
                          out.parent)
    assert [n for n in os.listdir(out.parent) if n.endswith(".tmp")]  # the temporary the kill left
    assert _snapshot(out) == before
    assert zarr.open_group(str(out), mode="r")["d2"].shape == (200_000,)
    assert subprocess.run([*command, "--append"], capture_output=True).returncode == 0
    assert os.listdir(out.parent) == ["scores.zarr"]
    assert zarr.open_group(str(out), mode="r").attrs["rows"] == [0, 1_200_000]


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
def test_a_stuck_stretch_across_the_append_is_named_as_in_a_full_score(tmp_path, capsys):
    """top_channel of the first new row looks at the last old one (a sensor stuck since before the
    append, beside a near-copy of itself: the row alone names the copy)."""
    rng = np.random.default_rng(4)
    q = rng.normal(size=(N, 1)) + 0.3 * rng.normal(size=(N, 2))
    clean = np.hstack([q[:, :1], q[:, :1], q[:, 1:]]) + 0.03 * rng.normal(size=(N, 3))  # channels 0 and 1: twins
    path = tmp_path / "m.json"
    fitted = MCPCA().fit(clean[:10_000])
    fitted.save(path)
    for start in range(FIRST - 200, FIRST):  # the first stretch whose row FIRST only the held rule names right
        X = clean.copy()
        X[start : FIRST + 50, 1] = X[start, 1]
        row = X[FIRST : FIRST + 1]
        if fitted.is_outlier(row)[0] and fitted.channel_contributions(row)[0].argmax() != 1:
            break
    else:
        pytest.fail("no stretch start in range gives a flagged row FIRST whose contributions name the twin")
    store, out, full = tmp_path / "archive.zarr", tmp_path / "scores.zarr", tmp_path / "full.zarr"
    _grow(store, X[:FIRST])
    assert _cli(capsys, "score", store, "-m", path, "-o", out)[0] == 0
    _grow(store, X)
    assert _cli(capsys, "score", store, "-m", path, "-o", out, "--append")[0] == 0
    assert _cli(capsys, "score", store, "-m", path, "-o", full)[0] == 0
    _assert_same_scores(out, full)
    assert zarr.open_group(str(out), mode="r")["top_channel"][FIRST] == 1


def test_an_append_at_a_chunk_boundary_reads_the_new_chunks_and_the_one_before(data, model, tmp_path, capsys):
    """New rows that begin a chunk (an archive grown by whole chunks): the chunk before is read for the
    CONTEXT_ROWS rows before them, and the append equals a full score."""
    store, out, full = tmp_path / "archive.zarr", tmp_path / "scores.zarr", tmp_path / "full.zarr"
    first = 10 * CHUNK
    _grow(store, data[:first])
    assert _cli(capsys, "score", store, "-m", model, "-o", out)[0] == 0
    _grow(store, data)
    with FileOpens(store) as reads:
        assert _cli(capsys, "score", store, "-m", model, "-o", out, "--append")[0] == 0
    chunks = sorted(int(name.split("/")[1]) for name in reads.opened if name.startswith("c/"))
    assert chunks == [0, *range((first - CONTEXT_ROWS) // CHUNK, -(-N // CHUNK))]  # 0: row 0, fingerprinted
    assert _cli(capsys, "score", store, "-m", model, "-o", full)[0] == 0
    _assert_same_scores(out, full)


def _digest(row) -> int:
    """63 bits of BLAKE2b over the row as float64 (the fingerprint's documented digest, computed here)."""
    return int.from_bytes(hashlib.blake2b(np.asarray(row, "<f8").tobytes(), digest_size=8).digest(), "little") >> 1


def test_rewritten_old_rows_are_refused(grown, data, model, capsys):
    """The input's scored rows rewritten (same shape, path and model): the store's fingerprint no longer
    matches, and the append refuses in one line (it used to add rows to 20,500 stale ones)."""
    store, out = grown
    attrs = zarr.open_group(str(out), mode="r").attrs
    assert attrs["row_digests"] == [[0, _digest(data[0])], [FIRST - 1, _digest(data[FIRST - 1])]]
    zarr.open_array(str(store), mode="r+")[:FIRST] = data[:FIRST] * 1.5  # recalibrated in place
    before = _snapshot(out)
    rc, _, err = _cli(capsys, "score", store, "-m", model, "-o", out, "--append")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"rows 0:{FIRST:,} changed since they were scored" in err and "--overwrite" in err
    assert _snapshot(out) == before
    assert sorted(os.listdir(out.parent)) == ["scores.zarr"]


def test_one_rewritten_sample_row_is_refused(grown, data, model, capsys):
    store, out = grown
    zarr.open_array(str(store), mode="r+")[0, 1] += 1e-9  # one cell of a sampled row, by a hair
    rc, _, err = _cli(capsys, "score", store, "-m", model, "-o", out, "--append")
    assert rc == 2 and "changed since they were scored" in err


def test_the_fingerprint_samples_a_row_in_65536_and_follows_appends(tmp_path, capsys):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(140_000, 3))
    path = tmp_path / "m.json"
    MCPCA().fit(X[:5000]).save(path)
    store, out = tmp_path / "archive.zarr", tmp_path / "scores.zarr"
    zarr.create_array(str(store), shape=(70_000, 3), chunks=(10_000, 3), dtype="f8")[:] = X[:70_000]
    assert _cli(capsys, "score", store, "-m", path, "-o", out)[0] == 0
    got = zarr.open_group(str(out), mode="r").attrs["row_digests"]
    assert got == [[i, _digest(X[i])] for i in (0, 65_536, 69_999)]
    z = zarr.open_array(str(store), mode="r+")
    z.resize((140_000, 3))
    z[70_000:] = X[70_000:]
    assert _cli(capsys, "score", store, "-m", path, "-o", out, "--append")[0] == 0
    got = zarr.open_group(str(out), mode="r").attrs["row_digests"]
    assert got == [[i, _digest(X[i])] for i in (0, 65_536, 131_072, 139_999)]  # 69,999 a last row no more


@pytest.mark.slow  # CI tier: keeps the development tier under 3 minutes
@pytest.mark.parametrize("append", [False, True])
def test_a_symlinked_output_store_is_written_through_the_link(data, model, tmp_path, capsys, append):
    """``-o link.zarr`` naming a store elsewhere: that store is replaced (or appended to) and the link stays."""
    store = tmp_path / "archive.zarr"
    _grow(store, data[:FIRST])
    (tmp_path / "stores").mkdir()
    real, link = tmp_path / "stores" / "scores.zarr", tmp_path / "scores.zarr"
    assert _cli(capsys, "score", store, "-m", model, "-o", real)[0] == 0
    os.symlink(real, link)
    _grow(store, data)
    extra = ["--append"] if append else ["--overwrite"]
    rc, _, err = _cli(capsys, "score", store, "-m", model, "-o", link, *extra)
    assert rc == 0, err
    assert os.path.islink(link) and os.readlink(link) == str(real)
    assert zarr.open_group(str(real), mode="r").attrs["rows"] == [0, N]
    assert sorted(os.listdir(tmp_path / "stores")) == ["scores.zarr"]
    full = tmp_path / "full.zarr"
    assert _cli(capsys, "score", store, "-m", model, "-o", full)[0] == 0
    _assert_same_scores(real, full)


def test_a_store_without_a_fingerprint_is_appended_to_and_gets_one(grown, data, model, capsys):
    """A store written before stores kept a fingerprint: nothing to check, the new rows' is recorded."""
    store, out = grown
    del zarr.open_group(str(out), mode="r+").attrs["row_digests"]
    rc, _, err = _cli(capsys, "score", store, "-m", model, "-o", out, "--append")
    assert rc == 0, err
    assert zarr.open_group(str(out), mode="r").attrs["row_digests"] == [[N - 1, _digest(data[N - 1])]]
