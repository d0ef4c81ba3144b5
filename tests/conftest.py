"""Helpers shared by the test files: comparing fits, and array-likes that record reads.

Imported by name (``from conftest import assert_same_fit``): pytest puts this
folder on ``sys.path``, as it does for ``_cluster`` and ``paper_reference``.
"""

from __future__ import annotations

import atexit
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

# numba caches the package's compiled loops for the tests in the checkout's ``.numba-cache``
# (ignored by git), never in the user's cache (dask_mcpca._compiled.CACHE_DIR): set before
# anything imports numba (importing dask.array does), and inherited by pytest-xdist's workers and
# by the processes the tests start.  A fresh clone (CI) compiles them once, later sessions load
# them.  Compiled or loaded, the loops give the same bits (their helpers are inlined;
# tests/test_same_everywhere.py checks it with folders of its own, one compiling, the others
# loading), and no test compares bits with a record (tests/test_refactor_identity.py has
# tolerances).  DASK_MCPCA_TESTS_NUMBA_CACHE names another folder; empty: a temporary one per session.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NUMBA_CACHE = os.environ.get("DASK_MCPCA_TESTS_NUMBA_CACHE")
if _NUMBA_CACHE is None:
    _NUMBA_CACHE = os.path.join(_ROOT, ".numba-cache")
elif not _NUMBA_CACHE:
    _NUMBA_CACHE = tempfile.mkdtemp(prefix="dask-mcpca-tests-numba-")
    atexit.register(shutil.rmtree, _NUMBA_CACHE, True)
os.environ["DASK_MCPCA_TESTS_NUMBA_CACHE"] = os.environ["NUMBA_CACHE_DIR"] = _NUMBA_CACHE

# Where the environment forbids bytecode files (PYTHONDONTWRITEBYTECODE, as in the sandbox CI runs in),
# each of the ~150 Python processes the full tier starts (commands, cluster workers, pytest-xdist's
# workers) compiled the package and the test files from source again: 0.35 s of CPU a process that
# imports the estimator.  The tests' processes write it, as Python does by default, to ``__pycache__``
# folders (ignored by git; installed packages have theirs already).  Set in pytest's first process, it
# reaches every process started after it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# scikit-learn's array-API checks (tests/test_sklearn_checks.py: with array-API dispatch on, numpy
# input must give the same results) run only when scipy sees SCIPY_ARRAY_API=1 at its import, and
# skip otherwise: set before anything imports scipy.
os.environ.setdefault("SCIPY_ARRAY_API", "1")

import dask.array as da  # noqa: E402 - after NUMBA_CACHE_DIR
import numpy as np  # noqa: E402


#: Two tiers.  ``python -m pytest`` is the development tier: every module, none of the tests
#: marked ``slow`` (real clusters, object-store servers, processes that must time out, the
#: paper solver's thousands of passes), under 3 minutes on 2 cores (on every core: ``-n auto`` in
#: ``pyproject.toml``).  ``--full`` (CI and
#: ``.ci/run``) runs them too.  Slow tests are deselected, not skipped.
def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", default=False,
                     help="also run the tests marked slow (the CI tier; see tests/conftest.py)")


#: The longest test files of the full tier, longest first (their wall seconds on 2 cores, session 8: 67, 63,
#: 57, 50, 49, 41, 41, 24, 23, 22, 21, 21, 20, 20).  CI runs the files on two processes, whole
#: (``--dist loadfile``: their module fixtures, S3 servers and clusters, are made once), handed out in
#: collection order (``--no-loadscope-reorder``, pyproject.toml).  Started first, the long files run beside
#: the many short ones.  pytest-xdist's own order (most tests first) had put the install's two tests, the
#: README's six and the sklearn floor's two, 85 s together, at the end: one process ran them alone while
#: the other had finished 33 s before.
LONGEST_FIRST = (
    "test_writes_and_hangs.py", "test_cli.py", "test_mcpca.py", "test_object_store.py", "test_distributed.py",
    "test_install.py", "test_score_append.py", "test_report.py", "test_readme.py", "test_same_everywhere.py",
    "test_sklearn_floor.py", "test_numerics.py", "test_recipes.py", "test_invariance.py",
)


def _dispatch_order(items: list) -> None:
    """Sort ``items`` (stably, so a file's tests keep their order) for pytest-xdist's ``loadfile``:
    :data:`LONGEST_FIRST`, then the other files by their number of tests, most first (the order
    pytest-xdist chose by itself)."""
    counts = collections.Counter(item.path for item in items)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), -counts[item.path]))


#: Set by pytest's first process while a fresh clone's loops compile: the file that says they are done.
_WARM_UP_DONE = "DASK_MCPCA_TESTS_WARM_UP_DONE"


def pytest_configure(config):
    """In a fresh clone (CI), compile the package's loops once, in a process of its own started before
    pytest-xdist starts its workers, which wait for it after collecting (:func:`pytest_collection_finish`):
    otherwise each worker, and each command-line process a test starts before the cache is filled,
    compiled the same loops again (a fresh clone's full tier took 555 s against 512 s in a checkout
    whose cache was full).  The compilation (12 s) runs while the workers import and collect (9 s).
    Only while the cache holds no loop."""
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return
    if os.path.isdir(_NUMBA_CACHE) and any(name.endswith(".nbi") for _, _, files in os.walk(_NUMBA_CACHE)
                                            for name in files):
        return
    done = tempfile.mkdtemp(prefix="dask-mcpca-tests-warm-up-")
    atexit.register(shutil.rmtree, done, True)
    done = os.environ[_WARM_UP_DONE] = os.path.join(done, "done")
    here = os.path.dirname(os.path.abspath(__file__))
    code = f"import conftest\ntry:\n    conftest.compile_the_loops()\nfinally:\n    open({done!r}, 'w').close()\n"
    config._warm_up = subprocess.Popen([sys.executable, "-c", code], cwd=here,
                                       env={**os.environ, "PYTHONPATH": os.pathsep.join([here, _ROOT])})


def pytest_unconfigure(config):
    warm_up = getattr(config, "_warm_up", None)
    if warm_up is not None:
        warm_up.wait()


def pytest_collection_finish(session):
    """A pytest-xdist worker of a fresh clone waits for the loops to be compiled (:func:`pytest_configure`)."""
    done = os.environ.get(_WARM_UP_DONE)
    if done and hasattr(session.config, "workerinput"):
        deadline = time.monotonic() + 300
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.1)


def compile_the_loops() -> None:
    """The calls that compile the loops most tests use: fits of float64 and float32 rows (the kernel
    passes), the per-row distances, channel ranking and shift rule of ``score_rows``, and a partial fit's
    gaps."""
    from dask_mcpca import MCPCA

    rng = np.random.default_rng(0)
    X = rng.normal(size=(4000, 5)) * [4.0, 2.0, 1.0, 0.5, 0.3]
    for dtype in (np.float64, np.float32):
        rows = X.astype(dtype)
        model = MCPCA(n_components=2).fit(rows)
        model.score_rows(rows)
        model.mahalanobis(rows)
    X[rng.random(X.shape) < 0.02] = np.nan
    MCPCA(n_components=2, nan_policy="partial").fit(X)


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--full"):
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]
    _dispatch_order(items)


#: The fitted arrays compared by default.
FITTED_ARRAYS = ("components_", "explained_variance_", "mean_", "sigmas_", "covariance_")


def assert_same_fit(
    a,
    b,
    *,
    rtol: float = 1e-10,
    atol: float = 1e-12,
    names: tuple[str, ...] = FITTED_ARRAYS,
    up_to_sign: bool = False,
    same_passes: bool = False,
) -> None:
    """Two fitted models agree: each attribute in ``names``, ``n_samples_``, optionally ``n_passes_``.

    ``atol`` is in units of the attribute's largest magnitude (at least 1), so
    one tolerance serves components (<= 1) and variances or centres in data
    units.  ``up_to_sign`` compares components by ``|cos|`` of matching rows
    (to ``rtol``), for transformations that may flip a row's sign.  Scalars
    in ``names`` (``n_iter_``, ``converged_``, ...) are compared the same way.
    """
    for name in names:
        va, vb = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
        assert va.shape == vb.shape, name
        if up_to_sign and name == "components_":
            np.testing.assert_allclose(np.abs(np.sum(va * vb, axis=1)), 1.0, atol=rtol, err_msg=name)
            continue
        finite = vb[np.isfinite(vb)] if vb.dtype.kind == "f" else vb
        scale = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
        np.testing.assert_allclose(va, vb, rtol=rtol, atol=atol * scale, err_msg=name)
    assert a.n_samples_ == b.n_samples_
    if same_passes:
        assert a.n_passes_ == b.n_passes_


def planted_rows(n: int, p: int, k: int = 4, seed: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Rows near a planted ``k``-dimensional subspace (SDs 6, 5, 4, 3, ...; noise SD 0.3), the first 3 %
    moved far off it (SD 5 in every channel); and the subspace's orthonormal basis (p x k)."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.normal(size=(p, k)))[0]
    X = rng.normal(size=(n, k)) * np.arange(6.0, 6.0 - k, -1.0) @ basis.T + 0.3 * rng.normal(size=(n, p))
    X[: n * 3 // 100] += rng.normal(size=(n * 3 // 100, p)) * 5
    return X, basis


def assert_close_fits(a, b, X, *, rtol: float = 1e-9) -> None:
    """Two fits of ``X`` by one estimator whose arithmetic differs in order only: the same passes and flags,
    centre, variances and offset within ``rtol``, components within ``rtol`` up to sign."""
    assert a.n_passes_ == b.n_passes_ >= 2
    for name in ("mean_", "explained_variance_", "noise_variance_", "offset_"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=rtol, err_msg=name)
    np.testing.assert_allclose(np.abs(a.components_ @ b.components_.T), np.eye(a.n_components_), atol=rtol)
    assert np.array_equal(a.predict(X), b.predict(X))


def assert_same_model(a, b) -> None:
    """Parameters and every fitted attribute identical (NaN equal to NaN), types kept."""
    assert a.get_params() == b.get_params()
    fa, fb = fitted_attributes(a), fitted_attributes(b)
    assert fa.keys() == fb.keys()
    for name, va in fa.items():
        vb = fb[name]
        if isinstance(va, np.ndarray):
            assert isinstance(vb, np.ndarray), name
            assert va.dtype == vb.dtype and va.shape == vb.shape, name
            assert np.array_equal(va, vb, equal_nan=va.dtype.kind == "f"), name
        else:
            assert type(va) is type(vb) or (np.isscalar(va) and float(va) == float(vb)), name
            assert va == vb or (va != va and vb != vb), name


def cli_status(*args) -> int:
    """``dask-mcpca ARGS`` called in this process (``dask_mcpca.cli.main``, as the console script calls it),
    its arguments as strings: the exit status, argparse's own refusals (``SystemExit``) included."""
    from dask_mcpca.cli import main

    try:
        return main([str(a) for a in args])
    except SystemExit as exit:  # argparse's own errors
        return exit.code


def fitted_attributes(model) -> dict:
    """The public fitted attributes of ``model`` (names ending in ``_``)."""
    return {k: v for k, v in vars(model).items() if k.endswith("_") and not k.startswith("_")}


class Interrupted(RuntimeError):
    """Raised by :class:`RecordingRows` to stop a fit in a given pass."""


class RecordingRows:
    """An array-like over ``X`` that records every non-empty row read.

    ``reads`` lists ``(row start, row stop)`` in the order read; ``passes``
    counts reads of row 0 (a pass reads every block once, so a read of the
    first block marks a new pass).  With ``fail_on_pass``, every read from
    that pass on raises :class:`Interrupted`.  Reads of an empty slice (dask
    reads one for the meta) are not recorded.
    """

    def __init__(self, X: np.ndarray, *, fail_on_pass: int | None = None):
        self.X = X
        self.shape, self.dtype, self.ndim = X.shape, X.dtype, X.ndim
        self.fail_on_pass = fail_on_pass
        self.reads: list[tuple[int, int]] = []
        self.passes = 0
        self._lock = threading.Lock()

    def __getitem__(self, key):
        rows = key[0] if isinstance(key, tuple) else key
        start, stop, _ = rows.indices(self.shape[0])
        with self._lock:
            if stop > start:
                self.reads.append((start, stop))
                self.passes += start == 0
            if self.fail_on_pass is not None and self.passes >= self.fail_on_pass:
                raise Interrupted(f"interrupted in pass {self.passes}")
        return self.X[key]

    def as_dask(self, rows_per_block: int) -> da.Array:
        """This array as a dask array of ``rows_per_block``-row blocks (full rows)."""
        return da.from_array(
            self, chunks=(rows_per_block, -1), asarray=True, lock=False, name=f"recording-{id(self)}"
        )


class FileOpens:
    """Record the files under ``folder`` opened by this process inside the block (a real store read
    by a real command: Python's ``open`` audit event, no mock).

    ``opened`` lists their paths relative to ``folder``, once per open, in order.  An audit hook
    cannot be removed: it stays installed and records only while a block is active.
    """

    _active: list[FileOpens] = []
    _installed = False

    def __init__(self, folder):
        self.folder = os.path.realpath(os.fspath(folder)) + os.sep
        self.opened: list[str] = []

    @classmethod
    def _hook(cls, event, args):
        if event != "open" or not cls._active or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path = os.fsdecode(args[0])
        for rec in cls._active:
            full = os.path.realpath(path)
            if full.startswith(rec.folder):
                rec.opened.append(full[len(rec.folder):])

    def __enter__(self):
        import sys

        if not FileOpens._installed:
            sys.addaudithook(FileOpens._hook)
            FileOpens._installed = True
        FileOpens._active.append(self)
        return self

    def __exit__(self, *exc):
        FileOpens._active.remove(self)
        return False
