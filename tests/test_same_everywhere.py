"""Same store, same seed, same model: whatever the machine's core count, the scheduler, numba's
cache state or ``NUMBA_DISABLE_JIT`` (issue 23).

Every fit here runs in a process of its own, started as a user would start one, on a real Zarr
store on disk: a process that sees 2, 8 or 32 cores (``os.cpu_count`` and the CPU affinity
patched before anything is imported, so dask's thread pool follows too), the threaded, the
synchronous and the multiprocessing scheduler (its pool forked), a process that compiles numba's loops into an
empty cache and one that loads them, and one with ``NUMBA_DISABLE_JIT=1`` (the numpy spelling).
The block layout, the row sample and the order of the sums depend on the data only, so the
fits agree bit for bit, except the numpy spelling's, whose float64 sums add in another order
(to 1e-6 degrees and 1e-9 of the cutoff, float64 and float32 stores alike).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import zarr

pytestmark = pytest.mark.slow  # the CI tier (tests/conftest.py): real processes, servers or timeouts

#: Run in each child: patch the core count, then fit the stores with each scheduler.
_CHILD = r"""
import json, os, sys
config = json.loads(sys.argv[1])
cores = config["cores"]
os.cpu_count = lambda: cores
if hasattr(os, "process_cpu_count"):
    os.process_cpu_count = lambda: cores
if hasattr(os, "sched_getaffinity"):
    os.sched_getaffinity = lambda pid: set(range(cores))

def main():
    import dask
    from dask_mcpca import MCPCA, _block, _io
    out = {"compiled": _block.COMPILED, "min_blocks": _io.MIN_BLOCKS, "fits": []}
    for store, scheduler, checkpoint in config["fits"]:
        # the process pool forked, not spawned: each spawned worker imported the package again (11 of 15 s)
        with dask.config.set({"scheduler": scheduler, "multiprocessing.context": "fork"}):
            model = MCPCA(checkpoint=checkpoint).fit(store)
        out["fits"].append({
            "store": store, "scheduler": scheduler, "n_blocks": len(_io.as_row_blocks(store).chunks[0]),
            "components": model.components_.tolist(), "variance": model.explained_variance_.tolist(),
            "cutoff": float(model.outlier_cutoff_), "passes": model.n_passes_,
            "partial_reads": model.n_partial_reads_, "blocks_read": model.n_blocks_read_,
        })
    print(json.dumps(out))

if __name__ == "__main__":
    main()
"""


def _store(path, dtype) -> str:
    """120,000 rows x 6 (3 factors, noise, 3 % outliers) in 2,000-row chunks: 60 chunks, so
    that a layout that followed the core count gave 4 blocks on 2 cores and 60 on 32; six times the
    row sample (``sample_size``), so that the fits sample."""
    rng = np.random.default_rng(7)
    n, p = 120_000, 6
    X = rng.normal(size=(n, 3)) @ rng.normal(size=(3, p)) * [3.0, 2.0, 1.0, 1.0, 1.0, 1.0]
    X += 0.3 * rng.normal(size=(n, p))
    bad = rng.random(n) < 0.03
    X[bad] += rng.normal(scale=20.0, size=(bad.sum(), p))
    arr = zarr.create_array(str(path), shape=X.shape, chunks=(2_000, p), dtype=dtype)
    arr[:] = X.astype(dtype)
    return str(path)


def _run(config: dict, env_extra: dict, numba_cache) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_DISABLE_JIT", "DASK_MCPCA_CACHE_DIR")}
    env.update(NUMBA_CACHE_DIR=str(numba_cache), **env_extra)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(config)], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def _angles_deg(a, b) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    a = a * np.sign(np.sum(a * b, axis=1))[:, None]
    return np.degrees(2 * np.arcsin(np.minimum(np.linalg.norm(a - b, axis=1) / 2, 1.0)))


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    """One fit of each store in each kind of process (4 processes in all)."""
    tmp = tmp_path_factory.mktemp("same-everywhere")
    f32, f64 = _store(tmp / "f32.zarr", "float32"), _store(tmp / "f64.zarr", "float64")
    ckpt = str(tmp / "fit.ckpt")
    cold = tmp / "numba-cold"  # empty: the first process compiles the loops, the later ones load them
    runs = {
        2: _run({"cores": 2, "fits": [[f32, "threads", ckpt], [f32, "sync", None], [f32, "processes", None],
                                      [f64, "threads", None]]}, {}, cold),
        8: _run({"cores": 8, "fits": [[f32, "threads", None], [f64, "threads", None]]}, {}, cold),
        32: _run({"cores": 32, "fits": [[f32, "threads", None], [f32, "threads", ckpt]]}, {}, cold),
        "nojit": _run({"cores": 2, "fits": [[f32, "threads", None], [f64, "threads", None]]},
                      {"NUMBA_DISABLE_JIT": "1"}, cold),
    }
    return f32, f64, runs


def _fit(runs, key, store, scheduler="threads", index=0):
    return [f for f in runs[key]["fits"] if f["store"] == store and f["scheduler"] == scheduler][index]


def test_layout_does_not_follow_the_core_count(fits):
    f32, _, runs = fits
    assert {runs[k]["min_blocks"] for k in runs} == {8}
    # 60 chunks / 8 blocks: 7 chunks (14,000 rows) a block, 9 blocks, whatever the cores
    assert {_fit(runs, k, f32)["n_blocks"] for k in (2, 8, 32, "nojit")} == {9}


def test_same_bits_on_2_8_and_32_cores_and_every_scheduler(fits):
    """Core counts, schedulers, and numba's cache state (2 cores compiled the loops, 8 and 32 loaded them)."""
    f32, f64, runs = fits
    ref = _fit(runs, 2, f32)
    others = [_fit(runs, 8, f32), _fit(runs, 32, f32), _fit(runs, 2, f32, "sync"), _fit(runs, 2, f32, "processes")]
    for other in others:
        for key in ("components", "variance", "cutoff", "passes", "partial_reads", "blocks_read"):
            assert other[key] == ref[key], (other["scheduler"], key)
    assert _fit(runs, 8, f64) == _fit(runs, 2, f64)


def test_checkpoint_written_on_2_cores_resumes_on_32(fits):
    f32, _, runs = fits
    written, resumed = _fit(runs, 2, f32), _fit(runs, 32, f32, index=1)
    assert resumed["passes"] < written["passes"]  # it resumed, after the pass that checks the data
    assert resumed["components"] == written["components"]
    assert resumed["cutoff"] == written["cutoff"]


def test_numba_disabled_takes_the_numpy_spelling_and_gives_the_same_model(fits):
    """``NUMBA_DISABLE_JIT=1``: the numpy spelling, not the loops run as Python.  Its float64
    sums add in another order: the model agrees to 1e-6 degrees and 1e-9 of the cutoff, on the
    float32 store too, all 6 components (the noise components' variances lie 1e-3 apart: float32
    sums turned them by up to 0.014 degrees, issue 23)."""
    f32, f64, runs = fits
    assert runs["nojit"]["compiled"] is False and runs[2]["compiled"] is True
    for store in (f64, f32):
        ref, nojit = _fit(runs, 2, store), _fit(runs, "nojit", store)
        assert nojit["passes"] == ref["passes"] and nojit["partial_reads"] == ref["partial_reads"]
        assert _angles_deg(nojit["components"], ref["components"]).max() < 1e-6
        assert abs(nojit["cutoff"] / ref["cutoff"] - 1) < 1e-9
