"""Command-line errors found in review: an ``update -o`` that replaced an existing file, a model file's
unknown parameter reported as a storage option, a NaN count read as the whole archive's, and
``file.h5:/x --dataset y`` read as a store named ``file.h5:/x``.

Run in process through :func:`dask_mcpca.cli.main`, on small stores written here; the expected
counts and positions come from the rows the test makes NaN itself.
"""

from __future__ import annotations

import json
import re

import h5py
import numpy as np
import pytest
from test_cli_update import _cli
from test_cli_update import _store as _zarr_store

from dask_mcpca import MCPCA, load

N, P, CHUNK = 2_000, 4, 500


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(11).normal(size=(N, P)) * np.array([3.0, 1.0, 0.5, 0.2])


def _store(path, X, chunk=CHUNK) -> str:
    return _zarr_store(path, X, chunk)


def _error_line(rc, err) -> str:
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------ update -o on an existing file
def test_update_refuses_an_existing_output_without_overwrite(data, tmp_path, capsys):
    store = _store(tmp_path / "a.zarr", data)
    model, notes = tmp_path / "m.json", tmp_path / "notes.txt"
    assert _cli(capsys, "fit", store, "--rows", ":1000", "-o", model)[0] == 0
    notes.write_text("my notes\n")
    model_before = model.read_bytes()
    rc, out, err = _cli(capsys, "update", store, "-m", model, "-o", notes)
    line = _error_line(rc, err)
    assert f"--output {str(notes)!r} exists; pass --overwrite to replace it" in line
    assert notes.read_text() == "my notes\n" and model.read_bytes() == model_before

    rc, out, err = _cli(capsys, "update", store, "-m", model, "-o", notes, "--overwrite")
    assert rc == 0, err
    assert load(notes).archive_rows_.tolist() == [[0, N]]  # the model read rows :1000, then 1000:N
    assert model.read_bytes() == model_before


def test_update_in_place_needs_no_overwrite(data, tmp_path, capsys):
    """``-o`` naming the ``--model`` file (as typed, or through another spelling of the path) is the
    default, an update in place: no --overwrite needed."""
    store = _store(tmp_path / "a.zarr", data)
    model = tmp_path / "m.json"
    assert _cli(capsys, "fit", store, "--rows", ":1000", "-o", model)[0] == 0
    rc, _, err = _cli(capsys, "update", store, "-m", model, "-o", tmp_path / "." / "m.json", "--rows", "1000:1500")
    assert rc == 0, err
    rc, _, err = _cli(capsys, "update", store, "-m", model, "-o", model)
    assert rc == 0, err
    assert load(model).archive_rows_.tolist() == [[0, N]]


def test_update_with_no_new_rows_says_nothing_was_written_to_the_output(data, tmp_path, capsys):
    store = _store(tmp_path / "a.zarr", data)
    model, new = tmp_path / "m.json", tmp_path / "new.json"
    assert _cli(capsys, "fit", store, "-o", model)[0] == 0
    rc, out, err = _cli(capsys, "update", store, "-m", model, "-o", new)
    assert rc == 0, err
    assert "no new rows" in out and f"nothing written to --output {new}" in out
    assert not new.exists()


# ------------------------------------------------------------------ a model file's unknown parameter
def _with_unknown_parameter(data, tmp_path, capsys):
    """A store and a model file fitted on it whose ``params`` hold ``"foo": 1``, which MCPCA does not take."""
    store = _store(tmp_path / "a.zarr", data)
    model, edited = tmp_path / "m.json", tmp_path / "e_foo.json"
    assert _cli(capsys, "fit", store, "-o", model)[0] == 0
    document = json.loads(model.read_text())
    document["params"]["foo"] = 1
    edited.write_text(json.dumps(document))
    return store, edited


@pytest.mark.parametrize("storage_option", [[], ["--storage-option", "foo=1"]])
def test_an_unknown_parameter_in_the_model_file_is_named_as_damage(data, tmp_path, capsys, storage_option):
    store, edited = _with_unknown_parameter(data, tmp_path, capsys)
    rc, _, err = _cli(capsys, "score", store, "-m", edited, "-o", tmp_path / "s.zarr", *storage_option)
    line = _error_line(rc, err)
    assert f"{str(edited)!r} is a damaged dask-mcpca model file" in line and "'foo'" in line, line
    assert "--storage-option" not in line and "unexpected keyword" not in line, line
    assert not (tmp_path / "s.zarr").exists()


def test_the_storage_option_rewrite_leaves_the_package_s_own_type_errors(data, tmp_path, capsys, monkeypatch):
    """Only a file system's refusal of a keyword the user passed reads as ``--storage-option NAME``: a
    TypeError that the package's own code raises (here the model file's ``MCPCA(**params)``, as before the
    parameters were checked by name) is reported as it is, though ``--storage-option foo=1`` was passed."""
    store, edited = _with_unknown_parameter(data, tmp_path, capsys)
    params = MCPCA.get_params
    monkeypatch.setattr(MCPCA, "get_params", lambda self, deep=True: {**params(self, deep), "foo": None})
    rc, _, err = _cli(capsys, "score", store, "-m", edited, "-o", tmp_path / "s.zarr", "--storage-option", "foo=1")
    line = _error_line(rc, err)
    assert "unexpected keyword argument 'foo'" in line and str(edited) in line, line
    assert "--storage-option" not in line, line


# ------------------------------------------------------------------ NaN rows in several blocks
def test_score_says_its_nan_count_is_one_block_s(data, tmp_path, capsys):
    """NaN rows in three blocks (3, 1 and 2 of them): the count said is of one block, and says so; it used to
    read "3 of 500 rows hold NaN or inf", as if the archive's 2,000 rows held 3 (``fit`` says 6 of 2,000)."""
    nan_rows = [10, 20, 30, 700, 1500, 1600]
    gappy = data.copy()
    gappy[nan_rows, 1] = np.nan
    clean, store = _store(tmp_path / "clean.zarr", data), _store(tmp_path / "gappy.zarr", gappy)
    model = tmp_path / "m.json"
    assert _cli(capsys, "fit", clean, "-o", model)[0] == 0
    rc, _, err = _cli(capsys, "score", store, "-m", model, "-o", tmp_path / "s.zarr")
    line = _error_line(rc, err)
    said = re.search(r"in a block of ([\d,]+) rows \(the first found; others may hold more\), (\d+) rows? holds? "
                     r"NaN or inf; clean them, or fit with --nan-policy omit", line)
    assert said is not None, line
    block, count = int(said.group(1).replace(",", "")), int(said.group(2))
    per_block = np.bincount(np.array(nan_rows) // block, minlength=-(-N // block))
    assert count in per_block[per_block > 0], (block, count, per_block)

    rc, _, err = _cli(capsys, "fit", store, "-o", tmp_path / "m2.json")
    assert f"{len(nan_rows)} of {N} rows hold NaN or inf" in _error_line(rc, err)


# ------------------------------------------------------------------ file.h5:/x with --dataset y
@pytest.fixture
def two_datasets(tmp_path):
    """An HDF5 file holding ``a`` (300 x 3) and ``grp/b`` (400 x 5)."""
    rng = np.random.default_rng(5)
    path = tmp_path / "multi.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("a", data=rng.normal(size=(300, 3)))
        f.create_dataset("grp/b", data=rng.normal(size=(400, 5)))
    return path


def test_a_dataset_in_the_path_and_another_in_dataset_are_refused(two_datasets, tmp_path, capsys):
    out = tmp_path / "m.json"
    rc, _, err = _cli(capsys, "fit", f"{two_datasets}:/grp/b", "--dataset", "a", "-o", out)
    line = _error_line(rc, err)
    assert "'/grp/b'" in line and "--dataset a" in line and "no such store" not in line, line
    assert not out.exists()


@pytest.mark.parametrize("dataset", ["grp/b", "/grp/b"])
def test_the_same_dataset_named_twice_is_read(two_datasets, tmp_path, capsys, dataset):
    out = tmp_path / "m.json"
    rc, _, err = _cli(capsys, "fit", f"{two_datasets}:/grp/b", "--dataset", dataset, "-o", out)
    assert rc == 0, err
    got = load(out)
    assert (got.n_features_in_, got.archive_rows_.tolist()) == (5, [[0, 400]])  # grp/b's shape
