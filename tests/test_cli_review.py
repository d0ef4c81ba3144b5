"""Command-line errors found in review: an ``update -o`` that replaced an existing file, a model file's
unknown parameter reported as a storage option, a NaN count read as the whole archive's, and
``file.h5:/x --dataset y`` read as a store named ``file.h5:/x``.

Run in process through :func:`dask_mcpca.cli.main`, on small stores written here; the expected
counts and positions come from the rows the test makes NaN itself.
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from dask_mcpca import load
from dask_mcpca.cli import main

N, P, CHUNK = 2_000, 4, 500


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(11).normal(size=(N, P)) * np.array([3.0, 1.0, 0.5, 0.2])


def _store(path, X, chunk=CHUNK) -> str:
    z = zarr.create_array(str(path), shape=X.shape, chunks=(chunk, X.shape[1]), dtype=X.dtype)
    z[:] = X
    return str(path)


def _cli(capsys, *args) -> tuple[int, str, str]:
    rc = main([*map(str, args), "--no-progress"])
    out, err = capsys.readouterr()
    return rc, out, err


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
