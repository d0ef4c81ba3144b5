"""Long fits survive interruption; files and stores are written whole or not at all.

A fit with ``checkpoint=path`` writes its small state after every completed
step.  Interrupted (an exception from the data, or the process killed) and
started again with the same data and parameters, it resumes there and ends
exactly where an uninterrupted fit ends, with fewer passes.  A checkpoint of
another fit is refused.  :func:`dask_mcpca._atomic.atomic_path` replaces a
file or a directory (a Zarr store) in one rename, so a crash mid-write leaves
the previous content.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import dask.array as da
import numpy as np
import pytest
from conftest import Interrupted, RecordingRows, assert_same_fit

from dask_mcpca import MCPCA
from dask_mcpca._atomic import atomic_path, stale_temporaries
from dask_mcpca._checkpoint import CheckpointMismatchError

ROWS_PER_BLOCK = 200

SOLVERS = {
    # subsampled start + tight tolerance: the fixed point needs many full passes
    "auto": {"tol": 1e-12, "max_iter": 60, "sample_size": 100},
    # stopped by its bound, not by the tolerance: a resumed fit must not start the count afresh
    "auto-bounded": {"tol": 1e-15, "max_iter": 9, "sample_size": 100},
    "paper": {"solver": "paper", "n_decay": 4, "center": "mean"},
    "paper-robust-centre": {"solver": "paper", "n_decay": 3},
}

FITTED_ARRAYS = (
    "components_", "explained_variance_", "explained_variance_ratio_", "mean_", "covariance_", "sigmas_",
)
FITTED_SCALARS = ("noise_variance_", "kernel_scale_", "outlier_threshold_", "n_iter_", "converged_", "n_samples_")


def _data(n=600, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3)) * [3.0, 1.0, 0.3]
    X[:30] = rng.normal(size=(30, 3)) * 0.5 + [0.0, 12.0, 6.0]  # 5 % outliers
    return X


def _blocks(X):
    return da.from_array(X, chunks=(ROWS_PER_BLOCK, -1))


def _assert_same_end(resumed, fresh):
    """Equal to 1e-12: the resumed fit ends where the uninterrupted one ends."""
    assert_same_fit(resumed, fresh, rtol=1e-12, atol=1e-12, names=FITTED_ARRAYS + FITTED_SCALARS)


def _interrupt_at(X, kw, path, fail_on_pass):
    data = RecordingRows(X, fail_on_pass=fail_on_pass).as_dask(ROWS_PER_BLOCK)
    with pytest.raises(Interrupted):
        MCPCA(checkpoint=path, **kw).fit(data)
    assert os.path.exists(path)


@pytest.fixture(scope="module")
def fresh_fits():
    X = _data()
    return X, {name: MCPCA(**kw).fit(_blocks(X)) for name, kw in SOLVERS.items()}


# ------------------------------------------------------- resume after failure
@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("where", [0.3, 0.7])
def test_resume_after_injected_failure(solver, where, fresh_fits, tmp_path):
    X, fresh = fresh_fits[0], fresh_fits[1][solver]
    kw, path = SOLVERS[solver], tmp_path / "fit.ckpt.npz"
    total = fresh.n_passes_
    assert total >= 8  # the fit must be long enough to interrupt
    done = max(2, int(where * total))  # passes completed before the failure
    _interrupt_at(X, kw, path, fail_on_pass=done + 1)

    resumed = MCPCA(checkpoint=path, **kw).fit(_blocks(X))
    _assert_same_end(resumed, fresh)
    if solver.startswith("auto"):
        # every full step is saved: only the data check (1 pass) is repeated
        assert resumed.n_passes_ == 1 + total - done
    else:
        # the paper's state is saved per kernel size; the passes of the
        # interrupted size are made again
        assert 1 + total - done <= resumed.n_passes_ < total
    assert stale_temporaries(path) == []


@pytest.mark.parametrize("solver", SOLVERS)
def test_finished_checkpoint_resumes_at_the_end(solver, fresh_fits, tmp_path):
    X, fresh = fresh_fits[0], fresh_fits[1][solver]
    kw, path = SOLVERS[solver], tmp_path / "fit.ckpt.npz"
    first = MCPCA(checkpoint=path, **kw).fit(_blocks(X))
    _assert_same_end(first, fresh)
    assert first.n_passes_ == fresh.n_passes_
    again = MCPCA(checkpoint=path, **kw).fit(_blocks(X))
    _assert_same_end(again, fresh)
    assert again.n_passes_ == 1  # the pass that checks the data


def test_same_data_other_chunking_is_accepted(fresh_fits, tmp_path):
    X, fresh = fresh_fits[0], fresh_fits[1]["auto"]
    kw, path = SOLVERS["auto"], tmp_path / "fit.ckpt.npz"
    _interrupt_at(X, kw, path, fail_on_pass=5)
    resumed = MCPCA(checkpoint=path, **kw).fit(X)  # numpy, no dask blocks
    for name in ("components_", "explained_variance_", "mean_"):
        np.testing.assert_allclose(getattr(resumed, name), getattr(fresh, name), rtol=1e-9, atol=1e-12)
    assert resumed.n_passes_ < fresh.n_passes_


# ---------------------------------------------------------- kill for real
_CHILD = textwrap.dedent(
    """
    import json, sys, time
    import dask, dask.array as da, numpy as np
    from dask_mcpca import MCPCA

    X = np.load(sys.argv[1])
    kw = json.loads(sys.argv[3])

    def slow(block):
        time.sleep(0.05)
        return block

    data = da.from_array(X, chunks=({rows}, -1)).map_blocks(slow, dtype=X.dtype)
    with dask.config.set(scheduler="synchronous"):
        MCPCA(checkpoint=sys.argv[2], **kw).fit(data)
    print("finished")
    """
).format(rows=ROWS_PER_BLOCK)


def _steps_saved(path) -> int:
    """Completed steps recorded in a checkpoint (-1 while there is none)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(str(z["__header__"]))
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        return -1
    states = header["states"]
    steps = states.get("robust", {}).get("n_iter", {}).get("value", 0)
    paper = states.get("paper")
    if paper:
        steps += 100 * paper["component"]["value"] + paper["decay_step"]["value"]
    return steps


@pytest.mark.parametrize("solver", ["auto", "paper"])
@pytest.mark.slow
def test_resume_after_kill(solver, fresh_fits, tmp_path):
    X, fresh = fresh_fits[0], fresh_fits[1][solver]
    kw, path = SOLVERS[solver], tmp_path / "fit.ckpt.npz"
    np.save(tmp_path / "X.npy", X)
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "X.npy"), str(path), json.dumps(kw)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        first = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and child.poll() is None:
            steps = _steps_saved(path)
            if steps >= 0 and first is None:
                first = steps
            if first is not None and steps >= first + 2:  # the checkpoint has advanced
                break
            time.sleep(0.01)
        assert child.poll() is None, "the child ended before it could be killed: " + child.stderr.read()
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL

    killed_at = _steps_saved(path)
    assert killed_at >= first + 2
    resumed = MCPCA(checkpoint=path, **kw).fit(_blocks(X))
    _assert_same_end(resumed, fresh)
    assert resumed.n_passes_ < fresh.n_passes_
    assert stale_temporaries(path) == []  # even one left by the kill mid-write is cleaned


# ------------------------------------------------------------------ refusals
@pytest.fixture
def saved(tmp_path):
    """A checkpoint of an interrupted default fit, and its bytes."""
    X, kw, path = _data(), SOLVERS["auto"], tmp_path / "fit.ckpt.npz"
    _interrupt_at(X, kw, path, fail_on_pass=4)
    return X, kw, path, path.read_bytes()


def _other_values(X):
    Y = X.copy()
    Y[17] += 0.5
    return Y


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda X, kw: (_other_values(X), kw), "other data"),
        (lambda X, kw: (X[:-1], kw), "other data"),
        (lambda X, kw: (X * (1 + 1e-6), kw), "other data"),
        (lambda X, kw: (X, {**kw, "n_components": 2}), r"other parameters \(n_components\)"),
        (lambda X, kw: (X, {**kw, "tol": 1e-6}), r"other parameters \(tol\)"),
        (lambda X, kw: (X, {**kw, "center": "mean"}), r"other parameters \(center\)"),
        (lambda X, kw: (X, {**kw, "solver": "paper", "n_decay": 3}), r"other parameters \(n_decay, solver\)"),
        (lambda X, kw: (X, {**kw, "random_state": 1}), r"other parameters \(random_state\)"),
    ],
    ids=["values", "rows", "scale", "n_components", "tol", "center", "solver", "random_state"],
)
def test_checkpoint_of_another_fit_is_refused(saved, change, match):
    X, kw, path, before = saved
    X2, kw2 = change(X, kw)
    with pytest.raises(CheckpointMismatchError, match=match) as err:
        MCPCA(checkpoint=path, **kw2).fit(X2)
    assert str(path) in str(err.value)
    assert isinstance(err.value, ValueError)
    assert path.read_bytes() == before  # refused, not overwritten


@pytest.mark.parametrize("content", [b"not a checkpoint", b""], ids=["garbage", "empty"])
def test_unreadable_checkpoint_is_refused(tmp_path, content):
    path = tmp_path / "fit.ckpt.npz"
    path.write_bytes(content)
    with pytest.raises(CheckpointMismatchError, match="cannot be read"):
        MCPCA(checkpoint=path).fit(_data())
    assert path.read_bytes() == content


@pytest.mark.parametrize("version", [1, 5])
def test_checkpoint_of_an_older_format_is_refused(saved, version):
    """A version-1 file (written before the final re-weighting step), or a version-5 one (no repeated
    rows: resumed, it would give a frozen record weight), is not resumed."""
    X, kw, path, _ = saved
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(str(arrays["__header__"]))
    header["format"] = f"dask_mcpca-checkpoint-{version}"
    arrays["__header__"] = np.array(json.dumps(header))
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    before = path.read_bytes()
    with pytest.raises(CheckpointMismatchError, match=f"checkpoint-{version}"):
        MCPCA(checkpoint=path, **kw).fit(X)
    assert path.read_bytes() == before


def test_resume_keeps_the_repeated_rows(tmp_path):
    """A fit of data with a frozen record, interrupted and resumed, ends where the uninterrupted one
    does, with the same repeated row left out and flagged."""
    X = _data(n=2000)
    frozen = np.arange(50, 2000, 40)
    X[frozen] = X[1000]
    kw, path = {"tol": 1e-12, "max_iter": 60, "sample_size": 500}, tmp_path / "fit.ckpt.npz"
    fresh = MCPCA(**kw).fit(_blocks(X))
    np.testing.assert_array_equal(fresh.repeated_rows_, X[1000:1001])
    assert fresh.n_passes_ >= 5
    _interrupt_at(X, kw, path, fail_on_pass=4)
    resumed = MCPCA(checkpoint=path, **kw).fit(_blocks(X))
    _assert_same_end(resumed, fresh)
    np.testing.assert_array_equal(resumed.repeated_rows_, fresh.repeated_rows_)
    assert np.asarray(resumed.is_outlier(X))[frozen].all()


def test_npz_that_is_no_checkpoint_is_refused(tmp_path):
    path = tmp_path / "fit.ckpt.npz"
    np.savez(path, a=np.arange(3))
    with pytest.raises(CheckpointMismatchError, match="cannot be read"):
        MCPCA(checkpoint=path).fit(_data())


# ------------------------------------------------------ crash during a write
class _DiskFull(OSError):
    pass


def test_crash_while_writing_checkpoint_keeps_the_previous_one(saved, monkeypatch, fresh_fits):
    X, kw, path, before = saved
    real_savez = np.savez

    def half_then_crash(file, *args, **kwds):
        buf = io.BytesIO()
        real_savez(buf, *args, **kwds)
        file.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        raise _DiskFull("No space left on device")

    monkeypatch.setattr(np, "savez", half_then_crash)
    with pytest.raises(_DiskFull):
        MCPCA(checkpoint=path, **kw).fit(_blocks(X))
    assert path.read_bytes() == before
    assert stale_temporaries(path) == []
    assert sorted(os.listdir(path.parent)) == [path.name]

    monkeypatch.undo()
    resumed = MCPCA(checkpoint=path, **kw).fit(_blocks(X))
    _assert_same_end(resumed, fresh_fits[1]["auto"])


# ------------------------------------------------------------- atomic_path
def test_atomic_file_appears_only_when_complete(tmp_path):
    path = tmp_path / "model.json"
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write("new")
            f.flush()
            assert not path.exists()  # nothing under the name while writing
    assert path.read_text() == "new"
    assert os.listdir(tmp_path) == ["model.json"]


def test_atomic_file_exception_mid_write_keeps_old_content(tmp_path):
    path = tmp_path / "model.json"
    path.write_text("old")
    with pytest.raises(_DiskFull):
        with atomic_path(path) as tmp:
            with open(tmp, "w") as f:
                f.write("half of the ne")
            raise _DiskFull("No space left on device")
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["model.json"]
    with atomic_path(path) as tmp:  # and a later write replaces it
        with open(tmp, "w") as f:
            f.write("new")
    assert path.read_text() == "new"


def test_atomic_file_keyboard_interrupt_leaves_nothing(tmp_path):
    path = tmp_path / "model.json"
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(path) as tmp:
            with open(tmp, "w") as f:
                f.write("half")
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


def _write_store(path, X, *, extra=None):
    zarr = pytest.importorskip("zarr")
    z = zarr.open(str(path), mode="w", shape=X.shape, chunks=(50, X.shape[1]), dtype="f8")
    z[:] = X
    if extra:
        (path / extra).write_text("left over")


def _read_store(path):
    zarr = pytest.importorskip("zarr")
    return zarr.open(str(path), mode="r")[:]


def test_atomic_directory_replaces_a_store_whole(tmp_path):
    path = tmp_path / "scores.zarr"
    old, new = np.arange(300.0).reshape(100, 3), -np.arange(300.0).reshape(100, 3)
    _write_store(path, old, extra="old-only-file")
    with atomic_path(path) as tmp:
        _write_store(__import__("pathlib").Path(tmp), new)
        np.testing.assert_array_equal(_read_store(path), old)  # still the old store meanwhile
    np.testing.assert_array_equal(_read_store(path), new)
    assert not (path / "old-only-file").exists()  # nothing of the old store survives
    assert os.listdir(tmp_path) == ["scores.zarr"]


def test_atomic_directory_exception_mid_write_keeps_old_store(tmp_path):
    path = tmp_path / "scores.zarr"
    old = np.arange(300.0).reshape(100, 3)
    _write_store(path, old)
    with pytest.raises(_DiskFull):
        with atomic_path(path) as tmp:
            zarr = pytest.importorskip("zarr")
            z = zarr.open(tmp, mode="w", shape=(100, 3), chunks=(50, 3), dtype="f8")
            z[:50] = 1.0  # half the chunks written
            raise _DiskFull("No space left on device")
    np.testing.assert_array_equal(_read_store(path), old)
    assert os.listdir(tmp_path) == ["scores.zarr"]


def test_atomic_directory_failed_rename_restores_old_store(tmp_path, monkeypatch):
    """The second rename (new store into place) fails: the old store comes back."""
    path = tmp_path / "scores.zarr"
    old = np.arange(300.0).reshape(100, 3)
    _write_store(path, old)
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(src).endswith(".tmp"):
            raise _DiskFull("rename failed")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(_DiskFull):
        with atomic_path(path) as tmp:
            _write_store(__import__("pathlib").Path(tmp), np.zeros((100, 3)))
    monkeypatch.undo()
    np.testing.assert_array_equal(_read_store(path), old)
    assert os.listdir(tmp_path) == ["scores.zarr"]


def test_saved_model_survives_a_crash_mid_write(tmp_path, monkeypatch):
    """``MCPCA.save`` goes through atomic_path: a crash leaves the old model loadable."""
    from dask_mcpca import _atomic, load

    X = _data()
    path = tmp_path / "model.json"
    old = MCPCA(n_components=2).fit(X)
    old.save(path)
    before = path.read_bytes()

    class _HalfFile(io.BufferedWriter):
        def write(self, data):
            super().write(data[: len(data) // 2])
            raise _DiskFull("No space left on device")

    def crashing_open(file, mode="r", *args, **kwargs):
        if "w" in mode:
            return _HalfFile(builtins.open(file, "wb", buffering=0))
        return builtins.open(file, mode, *args, **kwargs)

    monkeypatch.setattr(_atomic, "open", crashing_open, raising=False)  # where the model's bytes are written
    with pytest.raises(_DiskFull):
        MCPCA(n_components=3).fit(X).save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["model.json"]
    np.testing.assert_array_equal(load(path).components_, old.components_)


def test_temporary_left_by_a_kill_mid_write_is_removed(saved, fresh_fits):
    """SIGKILL during a write leaves the temporary sibling; the next fit removes it."""
    X, kw, path, before = saved
    stale = path.parent / f".{path.name}.0badf00d.tmp"
    stale.write_bytes(before[: len(before) // 2])
    assert stale_temporaries(path) == [str(stale)]
    resumed = MCPCA(checkpoint=path, **kw).fit(_blocks(X))
    _assert_same_end(resumed, fresh_fits[1]["auto"])
    assert not stale.exists()
    assert sorted(os.listdir(path.parent)) == [path.name]


_KILLED_BETWEEN_RENAMES = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np, zarr
    from dask_mcpca._atomic import atomic_path

    real_replace = os.replace

    def replace_then_die(src, dst):  # the first rename (old store aside) happens, then SIGKILL
        real_replace(src, dst)
        os.kill(os.getpid(), signal.SIGKILL)

    path = sys.argv[1]
    with atomic_path(path) as tmp:
        zarr.open(tmp, mode="w", shape=(100, 3), chunks=(50, 3), dtype="f8")[:] = 7.0
        os.replace = replace_then_die
    """
)


@pytest.mark.parametrize("next_write", ["fails", "succeeds"])
def test_kill_between_the_two_renames_is_repaired_by_the_next_write(tmp_path, next_write):
    """SIGKILL after the old store was moved aside and before the new one was moved in."""
    path = tmp_path / "scores.zarr"
    old = np.arange(300.0).reshape(100, 3)
    _write_store(path, old)
    child = subprocess.run([sys.executable, "-c", _KILLED_BETWEEN_RENAMES, str(path)], capture_output=True, text=True)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert not path.exists()  # the window: no store under its name, the old one hidden as .old
    assert any(name.endswith(".tmp.old") for name in os.listdir(tmp_path))

    if next_write == "fails":
        with pytest.raises(RuntimeError):
            with atomic_path(path) as tmp:
                raise RuntimeError("the next run fails too")
        np.testing.assert_array_equal(_read_store(path), old)  # the old store is back
    else:
        with atomic_path(path) as tmp:
            _write_store(__import__("pathlib").Path(tmp), np.ones((100, 3)))
        np.testing.assert_array_equal(_read_store(path), np.ones((100, 3)))
    assert os.listdir(tmp_path) == ["scores.zarr"]  # no .tmp, no .tmp.old


def test_temporaries_of_a_live_writer_are_left_alone(tmp_path):
    """Two processes writing the same path: one must not delete the other's temporary."""
    path = tmp_path / "model.json"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f".model.json.0badf00d-{sleeper.pid}.tmp"
        live.write_text("being written")
        dead = tmp_path / ".model.json.0badf00d.tmp"  # no pid: left by a process long gone
        dead.write_text("left over")
        assert stale_temporaries(path) == [str(dead)]
        with atomic_path(path) as tmp:
            open(tmp, "w").write("{}")
        assert live.exists() and not dead.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert stale_temporaries(path) == [str(live)]


def _edit_header(path, edit):
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(str(arrays["__header__"]))
    edit(header)
    arrays["__header__"] = np.array(json.dumps(header))
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda h: h.pop("params"), "damaged header .*no 'params' dict"),
        (lambda h: h.__setitem__("states", []), "damaged header .*no 'states' dict"),
        (lambda h: h["data"].pop("scatter"), "damaged header .*fingerprint is incomplete"),
        (lambda h: h["states"].__setitem__("other", {}), r"damaged header .*unknown state\(s\) \['other'\]"),
    ],
    ids=["no-params", "states-a-list", "no-scatter", "unknown-state"],
)
def test_edited_checkpoint_header_is_refused(saved, edit, match):
    X, kw, path, _ = saved
    _edit_header(path, edit)
    before = path.read_bytes()
    with pytest.raises(CheckpointMismatchError, match=match):
        MCPCA(checkpoint=path, **kw).fit(X)
    assert path.read_bytes() == before


def test_numpy_integer_parameters_match_a_checkpoint_written_with_python_ints(tmp_path, fresh_fits):
    X = fresh_fits[0]
    path = tmp_path / "fit.ckpt.npz"
    first = MCPCA(n_components=2, checkpoint=path).fit(X)
    again = MCPCA(n_components=np.int64(2), sample_size=np.int32(20_000), checkpoint=path).fit(X)
    np.testing.assert_allclose(again.components_, first.components_, rtol=1e-12, atol=1e-14)
    assert again.n_passes_ == 1  # resumed at the end


def test_checkpoint_of_reflected_data_is_refused(saved):
    """``2 * mean - X`` has the mean and the scatter of X: the column ranges tell them apart."""
    X, kw, path, before = saved
    Y = 2 * X.mean(axis=0) - X
    np.testing.assert_allclose(Y.mean(axis=0), X.mean(axis=0), atol=1e-12)
    with pytest.raises(CheckpointMismatchError, match="other data"):
        MCPCA(checkpoint=path, **kw).fit(Y)
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "name, value, match",
    [
        ("robust:location", np.zeros(2), r"location has shape \(2,\)"),
        ("robust:scatter", np.full((3, 3), np.nan), "scatter holds NaN"),
        ("robust:location", np.array(["a", "b", "c"]), "location holds NaN, inf or no number"),
        ("robust:repeated_rows", np.zeros((1, 2)), r"repeated_rows has shape \(1, 2\), expected \(m, 3\)"),
    ],
    ids=["location-shape", "scatter-nan", "location-text", "repeated-rows-shape"],
)
def test_resumed_state_with_bad_arrays_is_refused(saved, name, value, match):
    X, kw, path, _ = saved
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    assert name in arrays and arrays[name].shape[-1] == X.shape[1]
    arrays[name] = value
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(CheckpointMismatchError, match="damaged 'robust' state .*" + match):
        MCPCA(checkpoint=path, **kw).fit(X)


@pytest.fixture
def saved_paper(tmp_path):
    """A checkpoint of a paper fit interrupted after a few kernel sizes (its state has a last pass)."""
    X, kw, path = _data(), SOLVERS["paper"], tmp_path / "fit.ckpt.npz"
    _interrupt_at(X, kw, path, fail_on_pass=12)
    return X, kw, path


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda a, h: a.__setitem__("paper:last_pass.S", np.full((3, 3), np.inf)), r"last_pass\.S holds NaN"),
        (lambda a, h: a.__setitem__("paper:last_pass.S", np.eye(2)), r"last_pass\.S has shape \(2, 2\)"),
        (lambda a, h: a.__setitem__("paper:last_pass.weight", np.array(np.nan)), r"last_pass\.weight holds NaN"),
        (lambda a, h: h["states"]["paper"]["last_pass"]["dict"].remove("sigma"), "sigma"),
    ],
    ids=["S-inf", "S-shape", "weight-nan", "no-sigma"],
)
def test_resumed_paper_state_with_a_bad_last_pass_is_refused(saved_paper, edit, match):
    """The paper solver's last pass (a ``LastPass``) is checked like every other saved array."""
    X, kw, path = saved_paper
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(str(arrays["__header__"]))
    assert header["states"]["paper"]["last_pass"] == {"dict": ["S", "sigma", "weight"]}  # format 5's layout
    edit(arrays, header)
    arrays["__header__"] = np.array(json.dumps(header))
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(CheckpointMismatchError, match="damaged 'paper' state .*" + match):
        MCPCA(checkpoint=path, **kw).fit(X)


def test_only_this_paths_own_temporaries_are_cleaned_up(tmp_path):
    """Cleanup matches a temporary's whole name, not a prefix: another output's leftovers
    (``scores.v2.zarr``'s, whose ``.old`` may be its only copy) and a user's own dot-file stay."""
    other = tmp_path / ".scores.v2.zarr.deadbeef-999999.tmp.old"  # scores.v2.zarr's writer, killed
    other.mkdir()
    (other / "zarr.json").write_text("{}")
    mine = tmp_path / ".model.json.draft.tmp"  # a user's file
    mine.write_text("mine")
    assert stale_temporaries(tmp_path / "scores") == []
    assert stale_temporaries(tmp_path / "model.json") == []
    for name in ("scores", "model.json"):
        with atomic_path(tmp_path / name) as tmp:
            open(tmp, "w").write("{}")
    assert (other / "zarr.json").exists() and mine.read_text() == "mine"


def test_a_symlink_then_dotdot_is_written_where_the_os_resolves_it(tmp_path):
    """``link/../name`` names the link target's parent's ``name`` (the OS's reading), not ``./name``:
    the command line's checks resolve paths that way, so the write does too."""
    (tmp_path / "elsewhere" / "sub").mkdir(parents=True)
    os.symlink(tmp_path / "elsewhere" / "sub", tmp_path / "ln")
    (tmp_path / "in.zarr").write_text("the input")
    with atomic_path(str(tmp_path / "ln" / ".." / "in.zarr")) as tmp:
        open(tmp, "w").write("output")
    assert (tmp_path / "in.zarr").read_text() == "the input"
    assert (tmp_path / "elsewhere" / "in.zarr").read_text() == "output"


def test_a_checkpoint_url_or_a_checkpoint_inside_the_input_store_is_refused(tmp_path):
    """A URL used to be written as a local file named like it (``./s3:/bucket/...``), and a
    checkpoint inside the store read would write into it; both are refused by name, before any pass."""
    from dask_mcpca import MCPCA

    X = np.random.default_rng(0).normal(size=(200, 3))
    with pytest.raises(ValueError, match=r"checkpoint='s3://bucket/fit.npz' is a URL"):
        MCPCA(checkpoint="s3://bucket/fit.npz").fit(X)
    store = tmp_path / "in.zarr"
    _write_store(store, X)
    before = sorted(p.name for p in store.rglob("*"))
    with pytest.raises(ValueError, match="inside the input store"):
        MCPCA(checkpoint=store / "fit.ckpt.npz").fit(str(store))
    assert sorted(p.name for p in store.rglob("*")) == before
    local = tmp_path / "fit.ckpt.npz"
    MCPCA(checkpoint="file://" + str(local)).fit(str(store))  # a file:// URL is its local path
    assert local.exists()


def test_float32_checkpoint_resumes_when_the_sums_run_in_another_order(tmp_path, monkeypatch):
    """The last digits of the moments depend on the order of the sums (the compiled loops' runs,
    numpy's GEMMs, another machine's BLAS).  float32 rows are worked in float64 (issue 23), so
    they move by far less than the fingerprint's tolerance: a checkpoint written with one order
    resumes with another, and data that really changed is still refused."""
    import dask_mcpca._block as block
    from dask_mcpca._block import PassPlan, block_stats

    X = _data().astype(np.float32)
    kw, path = SOLVERS["auto"], tmp_path / "fit.ckpt.npz"
    moments = []
    for compiled in (False, True):
        monkeypatch.setattr(block, "COMPILED", compiled)
        moments.append(block_stats(X, PassPlan(center=np.zeros(3))).in_units(0))
    rel = np.abs(moments[0].scatter - moments[1].scatter).max() / np.abs(moments[1].scatter).max()
    assert rel < 1e-12  # float32 products summed in float32 moved them by 1e-7 to 1e-6

    monkeypatch.setattr(block, "COMPILED", False)
    _interrupt_at(X, kw, path, fail_on_pass=4)
    monkeypatch.setattr(block, "COMPILED", True)
    resumed = MCPCA(checkpoint=path, **kw).fit(_blocks(X))
    fresh = MCPCA(**kw).fit(_blocks(X))
    np.testing.assert_allclose(np.abs(resumed.components_ @ fresh.components_.T), np.eye(3), atol=1e-10)
    assert resumed.n_passes_ < fresh.n_passes_  # resumed, not started afresh

    changed = X.copy()
    changed[100] *= 2  # the mean moves by about 1e-3 of its spread: other data
    with pytest.raises(CheckpointMismatchError, match="other data"):
        MCPCA(checkpoint=path, **kw).fit(_blocks(changed))


def test_a_checkpoint_of_a_many_block_store_is_refused_for_another_sharing_its_spread_blocks(tmp_path):
    """A store of 40 blocks is first read from a spread of them; the checkpoint's fingerprint was of those
    blocks alone, so another archive holding the same spread blocks resumed from it (0 passes, the old
    model). A checkpointed fit reads every block first."""
    from dask_mcpca._exceptions import CheckpointMismatchError
    from dask_mcpca._passes import spread_blocks

    rng = np.random.default_rng(3)
    X = rng.normal(size=(40_000, 5))
    path = tmp_path / "fit.ckpt.npz"
    MCPCA(n_components=2, checkpoint=path).fit(da.from_array(X, chunks=(1000, 5)))
    shared = (spread_blocks(40, 5)[:, None] * 1000 + np.arange(1000)).ravel()
    Y = rng.normal(size=(40_000, 5)) * [5, 1, 1, 1, 0.2]
    Y[shared] = X[shared]
    with pytest.raises(CheckpointMismatchError, match="written for other data"):
        MCPCA(n_components=2, checkpoint=path).fit(da.from_array(Y, chunks=(1000, 5)))


def test_a_model_resumed_from_a_finished_checkpoint_says_why_it_cannot_be_updated(tmp_path):
    """A rerun of a finished checkpointed fit runs no pass that sums the rows, so it keeps no sums for
    partial_fit; the refusal named only other causes, and its advice (refit) resumed the same checkpoint."""
    X = _data()
    path = tmp_path / "fit.ckpt.npz"
    assert hasattr(MCPCA(checkpoint=path).fit(_blocks(X)), "update_location_")
    again = MCPCA(checkpoint=path).fit(_blocks(X))
    assert not hasattr(again, "update_location_")
    with pytest.raises(ValueError, match="checkpoint of a finished fit"):
        again.partial_fit(X[:100])


def _zarr_store(path, X, rows_per_chunk):
    zarr = pytest.importorskip("zarr")
    z = zarr.open(str(path), mode="w", shape=X.shape, chunks=(rows_per_chunk, X.shape[1]), dtype="f8")
    z[:] = X
    return str(path)


@pytest.mark.parametrize("sample_size", [100, 10_000], ids=["sampled", "every-row"])
def test_a_checkpoint_of_the_same_rows_in_another_order_is_refused(tmp_path, sample_size):
    """The mean, scatter and ranges are order-free: the same rows in another order resumed from the
    checkpoint (and ended slightly off a fresh fit of them). The fingerprint holds the first pass's row
    sample, drawn by position, in row order (review 7, point 4)."""
    X = _data()
    kw, path = {**SOLVERS["auto"], "sample_size": sample_size}, tmp_path / "fit.ckpt.npz"
    MCPCA(checkpoint=path, **kw).fit(_zarr_store(tmp_path / "x.zarr", X, 150))
    before = path.read_bytes()
    permuted = X[np.random.default_rng(1).permutation(len(X))]
    swapped = X.copy()
    swapped[[200, 201]] = X[[201, 200]]  # two inlier rows: a sample of every row sees it
    changes = {"permuted": permuted, "reversed": X[::-1]}
    if sample_size >= len(X):
        changes["swapped"] = swapped
    for name, Y in changes.items():
        with pytest.raises(CheckpointMismatchError, match="written for other data"):
            MCPCA(checkpoint=path, **kw).fit(_zarr_store(tmp_path / f"{name}.zarr", Y, 150))
        assert path.read_bytes() == before, name
    # The same rows in the same order still resume, in another container and other chunks.
    resumed = MCPCA(checkpoint=path, **kw).fit(_blocks(X))
    assert resumed.n_passes_ == 1
