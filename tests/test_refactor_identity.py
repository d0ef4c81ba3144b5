"""A refactor changes no output: fits compared with golden values recorded on a named commit.

This is a refactor-identity test, the one place in the suite where the
expected values come from the code itself, on purpose: the values in
``refactor_identity.json`` were recorded by this file's ``--record`` mode.
They are not a truth about robust PCA (the other tests check that against
independent answers); they say that a change meant to be a pure refactor
leaves every fitted output as it was.

History of the record (``RECORDED_ON`` names the latest):

- b0a069c: before the block results and the paper solver's last pass became
  typed dataclasses (issue 12); that refactor reproduced them bit for bit.
- 9ad346e: the checkpoint files only, when format 6 added the repeated whole
  rows to the robust state (the format-5 file written by b0a069c,
  ``OLD_CHECKPOINT``, is kept and is now refused by name).
- 215ff77: the faster block kernel (a reused workspace, power-of-two scaling by
  multiplication, grouped column reductions) changed the order of some sums;
  against the b0a069c record the fits moved by at most 1.6e-14 of an output's
  magnitude in float64 and 1.4e-8 in float32, with the same pass counts.
- 2695628: the compiled loops (``dask_mcpca/_compiled.py``) sum in another
  order; against the 215ff77 record the fits moved by at most 2.0e-13 of an
  output's magnitude in float64 and 9.2e-7 in float32, with the same pass
  counts except the float32 paper fit (124 passes, 123 before).
- 26b7973: the environment names numba's version and the CPU it compiles for
  (the compiled loops' bits depend on them); every output as recorded on
  2695628.
- 51cec7c: the compiled loops take sub-blocks holding NaN rows; the two
  nan_policy="omit" fits moved by at most 2.6e-15 of an output's
  magnitude, with the same pass counts; the other fits are unchanged.
- ae4f883: the compiled moments pass leaves NaN rows out itself; the paper
  nan_policy="omit" fit moved by at most 3.3e-16 of an output's magnitude,
  with the same pass count; the other fits are unchanged.
- 4fa4c70: the default solver's kernel pass is one compiled sweep per block,
  which sums in another order; against the ae4f883 record the fits moved by
  at most 7.8e-14 of an output's magnitude in float64 (the resumed fit's
  outlier cutoff) and 3.5e-7 in float32, with the same pass counts except
  the float32 paper fit (123 passes, 124 before).
- 3f64f1a: the same code, recorded with its loops compiled in the process. numba's loops
  give other last bits when compiled in the process than when loaded from its cache (the
  4fa4c70 record was made with a warm cache, and a fresh clone's CI, compiling them, failed
  it), so every test session now compiles them into a cache folder of its own
  (``tests/conftest.py``), and so does ``--record``. The two records differ by at most
  6.9e-14 of an output's magnitude in float64 and 1.7e-8 in float32, with the same pass
  counts.

- 0d50908: checkpoint format 7 (the robust state holds each channel's rounding-error
  variance), recorded on another machine (numba's CPU znver4, not rocketlake; numpy
  without AVX512_SPR); against the 3f64f1a record every fit differs by at most 6.0e-14 of
  an output's magnitude in float64 and 8.3e-7 in float32, with the same pass counts.
- 4296692: the paper solver's last component's variance (and a single channel's, and the
  discarded directions' total) comes from the row sample (c3f4c7e, review 7): the paper
  fits' variances moved by up to 2.8e-4 of the largest (the last one), their covariance_
  by up to 0.16 of its largest entry with the mean centre; the default solver's fits by
  at most 8e-14 in float64 and 4.6e-7 in float32 (this machine's numba CPU, znver5), with
  the same pass counts.
- 2e81fdd: every paper-solver variance comes from the row sample (2bdbcc0, review 4: the
  first p - 1 were weighted variances at the last kernel size, 75 % too high on clean
  Gaussian data): the paper fits' explained_variance_ moved by up to 0.88 of its value and
  their covariance_ with it; their components and pass counts, and every default-solver
  output, are as recorded on 4296692 (the same values). The checkpoint files' headers
  hold format 9's order-sensitive fingerprint (2e81fdd, review 7).

What is compared: ``components_``, ``explained_variance_``, ``mean_``,
``covariance_``, ``outlier_cutoff_`` and ``n_passes_`` of a handful of fits
(both solvers, float64 and float32 Zarr stores of several chunks, NaN rows
under ``nan_policy="omit"``, a checkpointed fit interrupted and resumed), and
the content of the checkpoint files a fit writes (its on-disk form must not
change silently).

The values are compared with a tolerance per stored dtype (``RTOL``), on
every machine: no bit digest, so the test depends on no core count, numba
cache state, BLAS kernel or numpy SIMD path (the same code gives other last
bits with another BLAS kernel or SIMD path: an FMA, a different summation
order).  The record still names the environment it was made in
(``environment``) and each output's sha256, for the one who records again.
``n_passes_`` is compared exactly for the default solver (2-4 passes, which
no round-off moves) and to within one pass for the paper solver's hundreds
(its iterations can turn round-off into a different stopping step).  The
tolerances were measured on the recording machine by forcing
other kernels (``OPENBLAS_CORETYPE=Haswell`` or ``Sandybridge`` with numpy's
AVX-512, or AVX2 too, disabled): float64 fits moved by at most 1.1e-13 of an
output's largest magnitude (the calibrated outlier cutoff; the components by
5e-15), float32 fits by up to 2.6e-7 (their products are float32 within a
GEMM, whose blocking is the kernel's), and one float32 paper fit took one
pass more.  So 1e-12 would be too tight on other machines; the tolerances
still catch any change of the estimator (one more or less row in a fit's
sample moves its outputs by far more than 1e-11).

Record again (only on purpose, for a change that is meant to change outputs)
with ``python tests/test_refactor_identity.py --record "why"`` on a commit,
add a line to the history above, and say so in the commit message.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import Interrupted, RecordingRows, assert_same_model

from dask_mcpca import MCPCA, load

pytestmark = pytest.mark.slow  # the CI tier (tests/conftest.py): real processes, servers or timeouts

zarr = pytest.importorskip("zarr")

HERE = Path(__file__).parent
#: The recorded digests and values, and the environment they were recorded in.
RECORD = HERE / "refactor_identity.json"
#: A checkpoint written by b0a069c (a finished paper fit, robust centre): format 5 as it was.
OLD_CHECKPOINT = HERE / "data" / "b0a069c_paper.ckpt.npz"
#: The commit the digests were last recorded on (the history is in the module docstring).
RECORDED_ON = "2e81fdd"

#: Fitted attributes compared.
OUTPUTS = ("components_", "explained_variance_", "mean_", "covariance_", "outlier_cutoff_", "n_passes_")
#: Tolerance by the stores' dtype (see the module docstring), in units of each output's largest
#: magnitude (at least 1): about 100 and 40 times the deviations measured with other kernels.
RTOL = {"f64": 1e-11, "f32": 1e-5}

N_ROWS, N_FEATURES, CHUNK_ROWS = 3000, 4, 200  # 15 row blocks (the robust start reads them all)
N_ROWS_WIDE = 4000  # 10 blocks of 400 rows (_io.MIN_BLOCKS): too few for a spread, read fully too

#: The fits: the store they read and the estimator's parameters.
CASES = {
    "auto-f64": ("f64", {}),
    "auto-f32": ("f32", {}),
    "auto-f64-small-sample": ("f64-wide", {"n_components": 2, "sample_size": 400, "random_state": 3}),
    "auto-nan-omit": ("f64-nan", {"nan_policy": "omit"}),
    "paper-f64": ("f64", {"solver": "paper", "n_decay": 4}),
    "paper-f32": ("f32", {"solver": "paper", "n_decay": 4}),
    "paper-f64-mean-centre": ("f64", {"solver": "paper", "n_decay": 3, "center": "mean", "n_components": 2}),
    "paper-nan-omit": ("f64-nan", {"solver": "paper", "n_decay": 3, "nan_policy": "omit"}),
}
#: Fits interrupted in a pass (its number) and resumed from their checkpoint.
RESUMED = {
    "auto-f64-resumed": ("f64", {"tol": 1e-10, "max_iter": 30, "sample_size": 300}, 4),
    "paper-f64-resumed": ("f64", {"solver": "paper", "n_decay": 4}, 7),
}
#: The fit whose checkpoint file is ``OLD_CHECKPOINT``.
OLD_CHECKPOINT_FIT = ("f64", {"solver": "paper", "n_decay": 4})


def _data(n: int, *, seed: int = 12) -> np.ndarray:
    """Correlated columns far from 0 and not of unit spread (the working unit is not 1), 5 % outliers."""
    rng = np.random.default_rng(seed)
    mix = np.array([[3.0, 0.0, 0.0, 0.0], [1.2, 1.0, 0.0, 0.0], [0.3, -0.4, 0.5, 0.0], [0.0, 0.2, 0.1, 0.05]])
    X = rng.normal(size=(n, N_FEATURES)) @ mix.T * 37.0 + [5.0e3, -120.0, 0.0, 7.0]
    bad = rng.choice(n, n // 20, replace=False)
    X[bad] += rng.normal(size=(len(bad), N_FEATURES)) * 40.0 + [0.0, 900.0, 450.0, -30.0]
    return X


def _stores(root: Path) -> dict[str, str]:
    """The Zarr stores on disk, by name."""
    X, wide = _data(N_ROWS), _data(N_ROWS_WIDE, seed=13)
    with_nan = X.copy()
    with_nan[[5, 404, 405, 1999, 2999], [0, 1, 3, 2, 0]] = np.nan
    with_nan[777, 2] = np.inf
    arrays = {"f64": X, "f32": X.astype(np.float32), "f64-wide": wide, "f64-nan": with_nan}
    paths = {}
    for name, values in arrays.items():
        path = root / f"{name}.zarr"
        z = zarr.create_array(path, shape=values.shape, chunks=(CHUNK_ROWS, N_FEATURES), dtype=values.dtype)
        z[:] = values
        paths[name] = str(path)
    return paths


def _fit(X, kw: dict, **extra) -> MCPCA:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a ConvergenceWarning is part of what is recorded, not a failure
        return MCPCA(**kw, **extra).fit(X)


def _resumed(stores: dict, name: str, tmp: Path) -> MCPCA:
    """The fit ``RESUMED[name]``, interrupted in its pass and resumed from its checkpoint."""
    store, kw, fail_on_pass = RESUMED[name]
    path = tmp / f"{name}.ckpt.npz"
    reader = RecordingRows(zarr.open_array(stores[store], mode="r"), fail_on_pass=fail_on_pass)
    with pytest.raises(Interrupted):
        _fit(reader.as_dask(CHUNK_ROWS), kw, checkpoint=path)
    return _fit(stores[store], kw, checkpoint=path)


def _entry(value) -> dict:
    """The sha256 of an output's bytes (with its dtype and shape), and its values (exact in JSON)."""
    arr = np.asarray(value)  # tobytes() is in C order whatever the layout
    digest = hashlib.sha256(f"{arr.dtype.str}{arr.shape}".encode() + arr.tobytes()).hexdigest()
    return {"sha256": digest, "dtype": arr.dtype.str, "shape": list(arr.shape), "values": arr.ravel().tolist()}


def _outputs(model: MCPCA) -> dict:
    return {name: _entry(getattr(model, name)) for name in OUTPUTS}


def _checkpoint_content(path: Path) -> dict:
    """A checkpoint file's on-disk form: its header and each array's entry (zip timestamps aside)."""
    with np.load(path, allow_pickle=False) as z:
        header = json.loads(str(z["__header__"]))
        arrays = {k: _entry(z[k]) for k in sorted(z.files) if k != "__header__"}
    return {"header": _entry(np.frombuffer(json.dumps(header, sort_keys=True).encode(), np.uint8)),
            "states": header["states"], "arrays": arrays}


def environment() -> dict:
    """What the bits of a fit depend on besides the code."""
    from threadpoolctl import threadpool_info

    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

        simd = sorted(t for t in __cpu_dispatch__ if __cpu_features__.get(t))
    except ImportError:  # a numpy without this private module: never bit-identical
        simd = None
    blas = sorted({(lib["internal_api"], lib["version"], lib["architecture"])
                   for lib in threadpool_info() if lib["user_api"] == "blas"}, key=str)
    try:  # the compiled loops' bits depend on numba's version and the CPU it compiles for
        import numba
        from llvmlite import binding

        compiled = [numba.__version__, numba.config.CPU_NAME or binding.get_host_cpu_name()]
    except ImportError:
        compiled = None
    return {"numpy": np.__version__, "machine": platform.machine(), "system": platform.system(),
            "numpy_simd": simd, "blas": [list(lib) for lib in blas], "numba": compiled}


def _compute(tmp: Path) -> dict:
    """Every recorded quantity, computed by the code as it stands."""
    stores = _stores(tmp)
    fits = {name: _outputs(_fit(stores[store], kw)) for name, (store, kw) in CASES.items()}
    fits.update({name: _outputs(_resumed(stores, name, tmp)) for name in RESUMED})
    files = {}
    for name in ("auto-f64", "paper-f64"):
        store, kw = CASES[name]
        path = tmp / f"{name}-written.ckpt.npz"
        _fit(stores[store], kw, checkpoint=path)
        files[name] = _checkpoint_content(path)
    return {"fits": fits, "checkpoint_files": files}


@pytest.fixture(scope="module")
def recorded() -> dict:
    record = json.loads(RECORD.read_text())
    assert record["commit"] == RECORDED_ON, "recorded again: name the new commit in RECORDED_ON and the docstring"
    return record


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict:
    return _stores(tmp_path_factory.mktemp("stores"))


def _assert_unchanged(got: dict, want: dict, what: str, *, store: str = "f64", paper: bool = False) -> None:
    """Each output in ``want``: the same dtype and shape, values within ``RTOL``, the passes as the
    module docstring says."""
    rtol = RTOL[store[:3]]
    for name, entry in want.items():
        assert got[name]["dtype"] == entry["dtype"] and got[name]["shape"] == entry["shape"], f"{what}: {name}"
        a, b = np.asarray(got[name]["values"], dtype=float), np.asarray(entry["values"], dtype=float)
        if name == "n_passes_":
            assert abs(float(a.item() - b.item())) <= (1 if paper else 0), f"{what}: {a} passes, {b} recorded"
            continue
        scale = max(1.0, float(np.abs(b).max(initial=0.0)))
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale, err_msg=f"{what}: {name}")


def _is_paper(kw: dict) -> bool:
    return kw.get("solver") == "paper"


@pytest.mark.parametrize("case", CASES)
def test_fit_is_unchanged(case, stores, recorded, tmp_path):
    store, kw = CASES[case]
    model = _fit(stores[store], kw)
    _assert_unchanged(_outputs(model), recorded["fits"][case], case, store=store, paper=_is_paper(kw))
    _assert_loads_as_saved(model, tmp_path)


@pytest.mark.parametrize("case", RESUMED)
def test_resumed_fit_is_unchanged(case, stores, recorded, tmp_path):
    model = _resumed(stores, case, tmp_path)
    store, kw, _ = RESUMED[case]
    _assert_unchanged(_outputs(model), recorded["fits"][case], case, store=store, paper=_is_paper(kw))
    _assert_loads_as_saved(model, tmp_path)


def _assert_loads_as_saved(model: MCPCA, tmp_path: Path) -> None:
    """Every fit of this file, saved and loaded, is the same model (test_model_files' round trip, on the fits
    made here rather than made again there)."""
    model.save(tmp_path / "model.json")
    model.set_params(checkpoint=None)  # a checkpoint's path is not carried into a loaded model
    assert_same_model(model, load(tmp_path / "model.json"))


@pytest.mark.parametrize("case", ["auto-f64", "paper-f64"])
def test_checkpoint_file_is_unchanged(case, stores, recorded, tmp_path):
    """The file a fit writes: the same header layout, array names, dtypes and shapes, close values."""
    store, kw = CASES[case]
    path = tmp_path / "fit.ckpt.npz"
    _fit(stores[store], kw, checkpoint=path)
    got, want = _checkpoint_content(path), recorded["checkpoint_files"][case]
    assert got["states"].keys() == want["states"].keys()
    for kind, meta in want["states"].items():  # the layout: each field's kind (value, list, dict of arrays)
        assert got["states"][kind].keys() == meta.keys(), kind
        for field, m in meta.items():
            assert got["states"][kind][field].keys() == m.keys(), (kind, field)
            g = got["states"][kind][field]
            if "value" not in m or not isinstance(m["value"], (int, float)) or isinstance(m["value"], bool):
                assert g == m, (kind, field)
            elif isinstance(m["value"], float):  # a radius, a scale: within the tolerance (NaN: NaN)
                np.testing.assert_allclose(g["value"], m["value"], rtol=0, atol=RTOL["f64"] * max(1.0, abs(m["value"])),
                                           err_msg=f"{kind}.{field}")
            else:  # a count: the paper solver's may move by one, as its passes
                assert abs(g["value"] - m["value"]) <= (1 if _is_paper(kw) else 0), (kind, field)
    assert got["arrays"].keys() == want["arrays"].keys()
    _assert_unchanged(got["arrays"], want["arrays"], f"{case} checkpoint")


def test_checkpoint_written_by_b0a069c_is_refused_by_name(stores, tmp_path):
    """A format-5 file (written by b0a069c, before the repeated whole rows joined the robust state)
    is refused with an error naming both formats, never resumed with a state missing a field."""
    from dask_mcpca import CheckpointMismatchError

    store, kw = OLD_CHECKPOINT_FIT
    path = tmp_path / "old.ckpt.npz"
    shutil.copyfile(OLD_CHECKPOINT, path)
    with pytest.raises(CheckpointMismatchError, match="checkpoint-9.*checkpoint-5"):
        _fit(stores[store], kw, checkpoint=path)


def _record(reason: str) -> None:
    """Write ``RECORD`` from the code as it stands, saying why (see the module docstring).

    ``OLD_CHECKPOINT`` is history (the format-5 file b0a069c wrote) and is never rewritten.
    """
    import subprocess
    import tempfile

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=HERE, check=True).stdout.strip()

    if git("status", "--porcelain", "--", "../dask_mcpca"):
        sys.exit("dask_mcpca/ has uncommitted changes: record on a commit, so that the record can name it")
    commit = git("rev-parse", "--short", "HEAD")
    with tempfile.TemporaryDirectory() as tmp:
        record = {
            "comment": (
                f"Recorded on commit {commit} by `python tests/test_refactor_identity.py --record REASON`: "
                f"{reason} A pure refactor must reproduce these outputs within the test's tolerances on any machine."
            ),
            "commit": commit,
            "environment": environment(),
            **_compute(Path(tmp)),
        }
    RECORD.write_text(_dumps(record) + "\n")


def _dumps(value, depth: int = 0) -> str:
    """JSON with one line per output (its digest and values), nested by outputs, fits and sections."""
    if not isinstance(value, dict) or depth == 3 or "sha256" in value:
        return json.dumps(value)
    pad = " " * (depth + 1)
    items = ",\n".join(f"{pad}{json.dumps(k)}: {_dumps(v, depth + 1)}" for k, v in value.items())
    return "{\n" + items + "\n" + " " * depth + "}"


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--record":
        sys.exit(f'usage: python {sys.argv[0]} --record "why the outputs change"   (writes {RECORD.name})')
    _record(sys.argv[2])
