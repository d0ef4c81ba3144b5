"""Bad input: non-finite values, invalid parameters, odd dtypes and chunks, broken stores.

Every error must name what is wrong (the parameter and what is allowed, the
number of bad rows, the path of the store), and parameter errors must come
before any pass over the data.
"""

from __future__ import annotations

import glob
import os
import threading
from collections import Counter

import dask.array as da
import numpy as np
import pytest

from dask_mcpca import MCPCA

SOLVERS = [
    pytest.param({}, id="auto"),
    pytest.param({"solver": "paper", "n_decay": 4}, id="paper"),
]

FITTED = ("components_", "explained_variance_", "mean_", "sigmas_", "covariance_")


def _data(n=300, p=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, p)) * np.geomspace(3.0, 0.3, p)


def _assert_same_fit(a, b, *, rtol=1e-10, atol=1e-12):
    for name in FITTED:
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=rtol, atol=atol, err_msg=name)
    assert a.n_samples_ == b.n_samples_


class _CountingRows:
    """Array-like over ``X`` that counts how often each row block is read."""

    def __init__(self, X):
        self.X, self.shape, self.dtype, self.ndim = X, X.shape, X.dtype, X.ndim
        self.reads = Counter()
        self._lock = threading.Lock()

    def __getitem__(self, key):
        rows = key[0]
        if rows.stop > rows.start:  # dask reads an empty slice for the meta
            with self._lock:
                self.reads[rows.start] += 1
        return self.X[key]


def _counting(X, rows_per_block):
    reader = _CountingRows(X)
    name = f"counting-{id(reader)}"
    return reader, da.from_array(reader, chunks=(rows_per_block, -1), asarray=True, lock=False, name=name)


def _untouchable(n, p, rows_per_block=50):
    """A dask array whose blocks fail if computed: proof that no pass was made."""

    def boom(block):
        raise AssertionError("a block was computed: a pass was made before validation")

    return da.zeros((n, p), chunks=(rows_per_block, p)).map_blocks(boom, dtype=float)


# ---------------------------------------------------------------- NaN / inf
@pytest.mark.parametrize("kw", SOLVERS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("kind", ["numpy", "dask"])
def test_nonfinite_raises_with_count_and_hint(kw, bad, kind):
    X = _data()
    X[[3, 77, 150], [0, 2, 1]] = bad
    X[77, 1] = bad  # two bad values in one row still count as one row
    data = X if kind == "numpy" else da.from_array(X, chunks=(64, -1))
    with pytest.raises(ValueError) as err:
        MCPCA(**kw).fit(data)
    msg = str(err.value)
    assert "3 of 300 rows" in msg
    assert "nan_policy='omit'" in msg


@pytest.mark.parametrize("kw", SOLVERS)
def test_nonfinite_check_costs_no_extra_pass(kw):
    """The check rides on the passes the fit makes anyway.

    Every block is read exactly ``n_passes_`` times, with the check
    (``"raise"``) as without it (``"omit"``); with NaN present, the fit stops
    after the first pass, having read every block once.
    """
    X = _data(n=400)
    counts = {}
    for policy in ("raise", "omit"):
        reader, data = _counting(X, 100)
        m = MCPCA(nan_policy=policy, **kw).fit(data)
        assert sorted(reader.reads) == [0, 100, 200, 300]
        assert set(reader.reads.values()) == {m.n_passes_}
        counts[policy] = m.n_passes_
    assert counts["raise"] == counts["omit"]

    X[250, 1] = np.nan
    reader, data = _counting(X, 100)
    with pytest.raises(ValueError, match="1 of 400 rows"):
        MCPCA(**kw).fit(data)
    assert reader.reads == Counter({0: 1, 100: 1, 200: 1, 300: 1})


def _with_gaps(seed=1):
    X = _data(n=300, seed=seed)
    gappy = X.copy()
    gaps = np.array([0, 5, 6, 7, 120, 121, 299])
    gappy[gaps[:3], 0] = np.nan  # sensor gaps: NaN in one or more columns
    gappy[gaps[3], :] = np.nan
    gappy[gaps[4], 2] = np.inf
    gappy[gaps[5], 1] = -np.inf
    gappy[gaps[6], [0, 2]] = np.nan
    keep = np.ones(len(X), bool)
    keep[gaps] = False
    return gappy, X[keep], keep


@pytest.mark.parametrize("kw", SOLVERS)
def test_omit_equals_fit_without_those_rows(kw):
    """``nan_policy="omit"`` equals deleting the rows first.

    With ``sample_size >= n`` the robust start sees the same rows in both
    fits.  With subsampling the two fits draw different row samples (the
    sample is keyed by the global row index, which deletion shifts), so they
    agree only statistically; that case is not asserted here.
    """
    gappy, clean, _ = _with_gaps()
    omit = MCPCA(nan_policy="omit", sample_size=1000, **kw).fit(gappy)
    deleted = MCPCA(sample_size=1000, **kw).fit(clean)
    assert omit.n_samples_ == len(clean) == 293
    _assert_same_fit(omit, deleted)
    # also through dask blocks whose boundaries do not line up with the deletion
    omit_d = MCPCA(nan_policy="omit", sample_size=1000, **kw).fit(da.from_array(gappy, chunks=(70, -1)))
    _assert_same_fit(omit_d, deleted, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("kind", ["numpy", "dask"])
def test_omit_transform_and_scores_are_nan_only_for_bad_rows(kind):
    gappy, clean, keep = _with_gaps()
    m = MCPCA(n_components=2, nan_policy="omit").fit(gappy)
    data = gappy if kind == "numpy" else da.from_array(gappy, chunks=(70, -1))
    outputs = {
        "transform": m.transform(data),
        "score_samples": m.score_samples(data),
        "mahalanobis": m.mahalanobis(data),
    }
    for name, out in outputs.items():
        if kind == "dask":
            assert isinstance(out, da.Array), name
            out = out.compute()
        out = out.reshape(len(gappy), -1)
        assert np.isnan(out[~keep]).all(), name
        assert np.isfinite(out[keep]).all(), name
    # the numbers for the good rows are those of the clean rows
    np.testing.assert_allclose(np.asarray(outputs["transform"])[keep] if kind == "numpy" else
                               outputs["transform"].compute()[keep], m.transform(clean), rtol=1e-12)


def test_omit_with_no_rows_left():
    X = np.full((20, 3), np.nan)
    with pytest.raises(ValueError, match="no rows left"):
        MCPCA(nan_policy="omit").fit(X)


def test_omit_with_too_few_rows_left():
    X = _data(n=20)
    X[:17, 0] = np.nan
    with pytest.raises(ValueError, match="3 usable rows are too few for 3 features"):
        MCPCA(nan_policy="omit").fit(X)


# ------------------------------------------------------ invalid parameters
INVALID = [
    ("n_components", 0, "int >= 1"),
    ("n_components", -2, "int >= 1"),
    ("n_components", 1.5, "int >= 1"),
    ("n_components", True, "int >= 1"),
    ("solver", "fast", "'auto', 'paper'"),
    ("solver", None, "'auto', 'paper'"),
    ("center", "median", "'robust', 'mean' or False"),
    ("center", True, "'robust', 'mean' or False"),
    ("eta", 0.0, "open interval (0, 1)"),
    ("eta", 1.0, "open interval (0, 1)"),
    ("eta", 1.5, "open interval (0, 1)"),
    ("eta", float("nan"), "open interval (0, 1)"),
    ("n_decay", 0, "int >= 1"),
    ("n_decay", 2.0, "int >= 1"),
    ("tol", 0.0, "float > 0"),
    ("max_iter", 0, "int >= 1"),
    ("nan_policy", "ignore", "'raise', 'omit'"),
    ("sample_size", 5, "int >= 10"),
]


@pytest.mark.parametrize("name, value, expected", INVALID)
def test_invalid_parameter_named_before_any_pass(name, value, expected):
    with pytest.raises(ValueError) as err:
        MCPCA(**{name: value}).fit(_untouchable(200, 3))
    msg = str(err.value)
    assert f"{name}={value!r}" in msg
    assert expected in msg


@pytest.mark.parametrize(
    "shape, kw, match",
    [
        ((200, 3), {"n_components": 4}, "n_components=4 is invalid; X has only 3 features"),
        ((4, 3), {}, "X has 4 rows and 3 features; solver='auto' with center='robust' needs at least 5"),
        ((4, 3), {"solver": "paper", "n_decay": 3}, "needs at least 5 rows"),
        ((1, 3), {"solver": "paper", "center": "mean"}, "X has 1 rows .* needs at least 2 rows"),
        ((5000, 20), {"sample_size": 15}, "sample_size=15 is invalid; .* at least 22 rows"),
    ],
)
def test_data_dependent_limits_before_any_pass(shape, kw, match):
    with pytest.raises(ValueError, match=match):
        MCPCA(**kw).fit(_untouchable(*shape))


def test_paper_with_fixed_centre_needs_only_two_rows():
    """The robust start (p + 2 rows) is not needed for solver="paper", center="mean"."""
    X = np.array([[1.0, 2.0], [3.0, 1.0]])
    m = MCPCA(solver="paper", center="mean", n_decay=3).fit(X)
    # two rows: the first component is the line through them, exactly
    d = (X[1] - X[0]) / np.linalg.norm(X[1] - X[0])
    assert abs(abs(m.components_[0] @ d) - 1) < 1e-6
    np.testing.assert_allclose(m.mean_, X.mean(axis=0))


@pytest.mark.parametrize(
    "X, match",
    [
        (np.zeros(10), r"2-D .* shape \(10,\)"),
        (np.zeros((4, 5, 6)), r"2-D .* shape \(4, 5, 6\)"),
        (np.zeros((0, 3)), r"empty: shape \(0, 3\)"),
        (np.zeros((10, 0)), r"empty: shape \(10, 0\)"),
        (da.zeros((0, 3), chunks=(1, 3)), r"empty: shape \(0, 3\)"),
        (np.array([["a", "b"], ["c", "d"]]), "must hold numbers"),
        (np.ones((10, 2), dtype=complex), "must hold numbers"),
    ],
    ids=["1d", "3d", "no-rows", "no-columns", "dask-no-rows", "strings", "complex"],
)
def test_bad_shapes_and_dtypes(X, match):
    with pytest.raises(ValueError, match=match):
        MCPCA().fit(X)


# ------------------------------------------------- conversions and chunks
@pytest.mark.parametrize("kw", SOLVERS)
def test_integer_and_boolean_data_are_converted(kw):
    rng = np.random.default_rng(3)
    ints = np.rint(rng.normal(size=(300, 3)) * [30, 10, 3]).astype(np.int32)
    _assert_same_fit(MCPCA(**kw).fit(ints), MCPCA(**kw).fit(ints.astype(np.float64)))
    _assert_same_fit(MCPCA(**kw).fit(da.from_array(ints, chunks=100)), MCPCA(**kw).fit(ints.astype(float)), rtol=1e-9)
    bools = np.column_stack([ints[:, 0] > 0, ints[:, 1] > 5, ints[:, 2] > -3])
    _assert_same_fit(MCPCA(**kw).fit(bools), MCPCA(**kw).fit(bools.astype(np.float64)))


@pytest.mark.parametrize("via", ["to_dask_array", "values"])
def test_unknown_chunk_sizes_are_resolved(via):
    dd = pytest.importorskip("dask.dataframe")
    pd = pytest.importorskip("pandas")
    X = _data(n=300)
    frame = dd.from_pandas(pd.DataFrame(X, columns=["a", "b", "c"]), npartitions=3)
    arr = frame.to_dask_array() if via == "to_dask_array" else frame.values
    assert np.isnan(arr.chunks[0]).all()  # the case this test is about
    _assert_same_fit(MCPCA().fit(arr), MCPCA().fit(X), rtol=1e-9)


# ------------------------------------------------------------ broken stores
def _zarr_store(path, X, *, group=False):
    zarr = pytest.importorskip("zarr")
    if group:
        g = zarr.open_group(str(path), mode="w")
        z = g.create_array("data", shape=X.shape, chunks=(100, X.shape[1]), dtype="f8")
    else:
        z = zarr.open(str(path), mode="w", shape=X.shape, chunks=(100, X.shape[1]), dtype="f8")
    z[:] = X
    return str(path)


def test_missing_store_names_the_path(tmp_path):
    for missing in [tmp_path / "nothing.zarr", str(tmp_path / "nothing.h5") + ":/data"]:
        with pytest.raises(FileNotFoundError, match=str(tmp_path / "nothing")):
            MCPCA().fit(str(missing))


def test_wrong_dataset_names_the_path_and_the_name(tmp_path):
    h5py = pytest.importorskip("h5py")
    X = _data()
    store = _zarr_store(tmp_path / "group.zarr", X, group=True)
    with pytest.raises(KeyError) as err:
        MCPCA().fit(store + ":/nope")
    assert store in str(err.value) and "nope" in str(err.value) and "data" in str(err.value)
    # the right name works through the same syntax
    _assert_same_fit(MCPCA().fit(store + ":/data"), MCPCA().fit(X), rtol=1e-9)

    h5 = tmp_path / "file.h5"
    with h5py.File(h5, "w") as f:
        f["data"] = X
    with pytest.raises(KeyError) as err:
        MCPCA().fit(f"{h5}:/nope")
    assert str(h5) in str(err.value) and "nope" in str(err.value)


def test_corrupt_zarr_chunk_names_the_store(tmp_path):
    store = _zarr_store(tmp_path / "broken.zarr", _data(n=400))
    chunk_files = sorted(
        f for f in glob.glob(os.path.join(store, "**"), recursive=True)
        if os.path.isfile(f) and not f.endswith((".json", ".zarray", ".zattrs", ".zgroup"))
    )
    assert len(chunk_files) == 4
    with open(chunk_files[2], "r+b") as fh:  # overwrite the compressed payload
        fh.seek(4)
        fh.write(b"\xff" * 32)
    with pytest.raises(OSError) as err:
        MCPCA().fit(store)
    assert store in str(err.value)
    assert "cannot read rows" in str(err.value)


def test_corrupt_hdf5_chunk_names_the_file(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "broken.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("data", data=_data(n=400), chunks=(100, 3), compression="gzip")
        offset = d.id.get_chunk_info(1).byte_offset
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(b"\x00\xff" * 40)
    with pytest.raises(OSError) as err:
        MCPCA().fit(f"{path}:/data")
    assert str(path) in str(err.value)


def test_zarr_store_with_a_missing_chunk_file_is_refused_when_opened(tmp_path):
    """Zarr reads a missing chunk as its fill value: fitting it would fit zeros."""
    store = _zarr_store(tmp_path / "partial.zarr", _data(n=400))
    os.remove(os.path.join(store, "c", "2", "0"))
    with pytest.raises(ValueError) as err:
        MCPCA().fit(store)
    msg = str(err.value)
    assert store in msg and "rows 200:300" in msg and "1 of 4 row chunks missing" in msg


def test_relative_paths_are_made_absolute(tmp_path, monkeypatch):
    from dask_mcpca._io import as_row_blocks, open_store

    _zarr_store(tmp_path / "rel.zarr", _data())
    monkeypatch.chdir(tmp_path)
    assert str(open_store("rel.zarr").store.root) == str(tmp_path / "rel.zarr")
    zarr = pytest.importorskip("zarr")
    # an array the user opened by a relative path is reopened by its absolute one
    X = as_row_blocks(zarr.open_array("rel.zarr", mode="r"))
    monkeypatch.chdir("/")
    np.testing.assert_array_equal(X.compute(), _data())
