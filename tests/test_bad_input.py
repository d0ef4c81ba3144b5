"""Bad input: non-finite values, invalid parameters, odd dtypes and chunks, broken stores.

Every error must name what is wrong (the parameter and what is allowed, the
number of bad rows, the path of the store), and parameter errors must come
before any pass over the data.
"""

from __future__ import annotations

import glob
import os
import uuid
from collections import Counter

import dask.array as da
import numpy as np
import pytest
from conftest import RecordingRows, assert_same_fit

from dask_mcpca import MCPCA, NonFiniteRowsError, NumericalRangeError, check_params

SOLVERS = [
    pytest.param({}, id="auto"),
    pytest.param({"solver": "paper", "n_decay": 4}, id="paper"),
]

def _data(n=300, p=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, p)) * np.geomspace(3.0, 0.3, p)


def _with_row(value, row=5):
    X = _data()
    X[row] = value
    return X


def _counting(X, rows_per_block):
    reader = RecordingRows(X)
    return reader, reader.as_dask(rows_per_block)


def _block_reads(reader) -> Counter:
    """How often each row block (by its first row) was read."""
    return Counter(start for start, _ in reader.reads)


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
        assert sorted(_block_reads(reader)) == [0, 100, 200, 300]
        assert set(_block_reads(reader).values()) == {m.n_passes_}
        counts[policy] = m.n_passes_
    assert counts["raise"] == counts["omit"]

    X[250, 1] = np.nan
    reader, data = _counting(X, 100)
    with pytest.raises(ValueError, match="1 of 400 rows"):
        MCPCA(**kw).fit(data)
    assert _block_reads(reader) == Counter({0: 1, 100: 1, 200: 1, 300: 1})


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
    assert_same_fit(omit, deleted)
    # also through dask blocks whose boundaries do not line up with the deletion
    omit_d = MCPCA(nan_policy="omit", sample_size=1000, **kw).fit(da.from_array(gappy, chunks=(70, -1)))
    assert_same_fit(omit_d, deleted, rtol=1e-8, atol=1e-10)


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
    ("n_components", 0, "an int in the range [1, inf) or None"),
    ("n_components", -2, "an int in the range [1, inf) or None"),
    ("n_components", 1.5, "an int in the range [1, inf) or None"),
    ("solver", "fast", "a str among"),
    ("solver", None, "a str among"),
    ("center", "median", "or a bool among {False}"),
    ("center", True, "or a bool among {False}"),
    ("eta", 0.0, "a float in the range (0.0, 1.0)"),
    ("eta", 1.0, "a float in the range (0.0, 1.0)"),
    ("eta", 1.5, "a float in the range (0.0, 1.0)"),
    ("eta", float("nan"), "a float in the range (0.0, 1.0)"),
    ("n_decay", 0, "an int in the range [1, inf)"),
    ("n_decay", 2.0, "an int in the range [1, inf)"),
    ("kernel_factor", float("inf"), "a float in the range [0.001, 1000000.0]"),
    ("kernel_factor", 0.0, "a float in the range [0.001, 1000000.0]"),
    ("kernel_factor", 1e-10, "a float in the range [0.001, 1000000.0]"),
    ("kernel_factor", 1e154, "a float in the range [0.001, 1000000.0]"),
    ("kernel_factor", 1e200, "a float in the range [0.001, 1000000.0]"),
    ("tol", 0.0, "a float in the range (0.0, inf) or None"),
    ("max_iter", 0, "an int in the range [1, inf) or None"),
    ("nan_policy", "ignore", "a str among"),
    ("sample_size", 5, "an int in the range [10, inf)"),
    ("random_state", -1, "an int in the range [0, 18446744073709551615] or None"),
    ("progress", "yes", "an instance of 'bool'"),
]


@pytest.mark.parametrize("name, value, expected", INVALID)
def test_invalid_parameter_named_before_any_pass(name, value, expected):
    """scikit-learn's message: the parameter, what was expected, the value given."""
    with pytest.raises(ValueError) as err:
        MCPCA(**{name: value}).fit(_untouchable(200, 3))
    msg = str(err.value)
    assert f"The {name!r} parameter of MCPCA must be" in msg
    assert expected in msg
    assert f"Got {value!r} instead" in msg


def test_check_params_is_the_check_fit_makes():
    assert check_params(MCPCA(solver="paper", center=False)) is None
    with pytest.raises(ValueError, match="'sample_size' parameter of MCPCA"):
        check_params(MCPCA(sample_size=3))


@pytest.mark.parametrize(
    "shape, kw, match",
    [
        ((200, 3), {"n_components": 4}, "n_components=4 is invalid; X has only 3 features"),
        ((4, 3), {}, "X has 4 rows and 3 features; solver='auto' with center='robust' needs at least 5"),
        ((4, 3), {"solver": "paper", "n_decay": 3}, "needs at least 5 rows"),
        ((1, 3), {"solver": "paper", "center": "mean"}, r"1 sample\(s\) \(shape=\(1, 3\)\) while a minimum of 2"),
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
        (np.zeros((0, 3)), r"empty: .* 0 sample\(s\) \(shape=\(0, 3\)\)"),
        (np.zeros((10, 0)), r"empty: .* 0 feature\(s\) \(shape=\(10, 0\)\)"),
        (da.zeros((0, 3), chunks=(1, 3)), r"empty: .* 0 sample\(s\) \(shape=\(0, 3\)\)"),
        (np.array([["a", "b"], ["c", "d"]]), "must hold numbers"),
        (np.ones((10, 2), dtype=complex), "Complex data not supported"),
    ],
    ids=["1d", "3d", "no-rows", "no-columns", "dask-no-rows", "strings", "complex"],
)
def test_bad_shapes_and_dtypes(X, match):
    with pytest.raises(ValueError, match=match):
        MCPCA().fit(X)


def test_one_dimensional_input_says_how_to_reshape():
    with pytest.raises(ValueError, match=r"Reshape your data either using array.reshape\(-1, 1\)"):
        MCPCA().fit(np.zeros(10))


def test_sparse_input_is_refused_by_name():
    scipy_sparse = pytest.importorskip("scipy.sparse")
    with pytest.raises(TypeError, match="Sparse data was passed .* dense data is required"):
        MCPCA().fit(scipy_sparse.csr_matrix(_data()))


def test_numeric_object_array_is_converted():
    X = _data()
    assert_same_fit(MCPCA().fit(X.astype(object)), MCPCA().fit(X), rtol=0, atol=0)
    bad = X.astype(object)
    bad[0, 0] = {"not": "a number"}
    with pytest.raises(TypeError, match="must be a string or a real number"):
        MCPCA().fit(bad)


@pytest.mark.parametrize("kind", ["numpy", "dask"])
@pytest.mark.parametrize("method", ["transform", "score_samples", "is_outlier", "mahalanobis"])
def test_default_policy_refuses_nan_rows_after_the_fit_too(kind, method):
    m = MCPCA(n_components=2).fit(_data())
    gappy, _, _ = _with_gaps()
    data = gappy if kind == "numpy" else da.from_array(gappy, chunks=(70, -1))
    with pytest.raises(NonFiniteRowsError, match="holds? NaN or inf; .* nan_policy='omit'"):
        np.asarray(getattr(m, method)(data))


# ------------------------------------------------- conversions and chunks
@pytest.mark.parametrize("kw", SOLVERS)
def test_integer_and_boolean_data_are_converted(kw):
    rng = np.random.default_rng(3)
    ints = np.rint(rng.normal(size=(300, 3)) * [30, 10, 3]).astype(np.int32)
    assert_same_fit(MCPCA(**kw).fit(ints), MCPCA(**kw).fit(ints.astype(np.float64)))
    assert_same_fit(MCPCA(**kw).fit(da.from_array(ints, chunks=100)), MCPCA(**kw).fit(ints.astype(float)), rtol=1e-9)
    bools = np.column_stack([ints[:, 0] > 0, ints[:, 1] > 5, ints[:, 2] > -3])
    assert_same_fit(MCPCA(**kw).fit(bools), MCPCA(**kw).fit(bools.astype(np.float64)))


@pytest.mark.parametrize("via", ["to_dask_array", "values"])
def test_unknown_chunk_sizes_are_resolved(via):
    import dask.dataframe as dd  # the test extra installs dask[dataframe]
    import pandas as pd
    X = _data(n=300)
    frame = dd.from_pandas(pd.DataFrame(X, columns=["a", "b", "c"]), npartitions=3)
    arr = frame.to_dask_array() if via == "to_dask_array" else frame.values
    assert np.isnan(arr.chunks[0]).all()  # the case this test is about
    assert_same_fit(MCPCA().fit(arr), MCPCA().fit(X), rtol=1e-9)


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
    assert_same_fit(MCPCA().fit(store + ":/data"), MCPCA().fit(X), rtol=1e-9)

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


def test_a_store_behind_fsspec_is_named_by_its_url_not_its_repr():
    """An fsspec-backed store (s3://, memory://) was named '<FsspecStore(S3FileSystem, bkt/plain.zarr)>'."""
    import zarr

    url = f"memory://bad-input/{uuid.uuid4().hex}/gappy.zarr"
    z = zarr.open_array(url, mode="w", shape=(400, 3), chunks=(100, 3), dtype="f8")
    z[:200] = _data(n=200)  # rows 200: never written: no chunk files
    with pytest.raises(ValueError) as err:
        MCPCA().fit(zarr.open_array(url, mode="r"))
    assert repr(url) in str(err.value) and "FsspecStore" not in str(err.value)


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


def test_a_missing_chunk_is_refused_through_a_url_and_in_memory_too(tmp_path):
    """Stores other than a local folder (a file:// URL, an S3 one, memory) are listed through
    the store's own API; they used to be read with the fill value in place of the missing chunk."""
    zarr = pytest.importorskip("zarr")
    store = _zarr_store(tmp_path / "partial.zarr", _data(n=400))
    os.remove(os.path.join(store, "c", "2", "0"))
    with pytest.raises(ValueError, match=r"rows 200:300 \(1 of 4 row chunks missing\)"):
        MCPCA().fit("file://" + store)
    memory = zarr.create_array(zarr.storage.MemoryStore(), shape=(400, 3), chunks=(100, 3), dtype="f8")
    memory[:300] = _data(n=300)
    with pytest.raises(ValueError, match=r"rows 300:400 \(1 of 4 row chunks missing\)"):
        MCPCA().fit(memory)
    memory[300:] = _data(n=100)
    assert MCPCA().fit(memory).n_samples_ == 400


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


# ------------------------------------------------------- the contract table
# Every bad input the package knows, with the error it gets: (id, how to
# build the call, error type, a fragment the message must hold).  ``make``
# takes the test's tmp_path and returns a zero-argument callable that fails.
def _fitted(n_components=2):
    return MCPCA(n_components=n_components).fit(_data())


def _sparse(tmp_path):
    sparse = pytest.importorskip("scipy.sparse")
    X = sparse.random(300, 3, density=0.5, format="csr", random_state=0)
    return lambda: MCPCA().fit(X)


def _dataset(tmp_path):
    xr = pytest.importorskip("xarray")
    ds = xr.Dataset({"sensors": (("time", "channel"), _data()), "quality": ("time", np.ones(300))})
    return lambda: MCPCA().fit(ds)


def _masked(tmp_path):
    X = np.ma.masked_array(_data(), mask=np.zeros((300, 3), bool))
    X.mask[5, 1] = True
    return lambda: MCPCA().fit(X)


def _text_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not an array\n")
    return lambda: MCPCA().fit(str(path))


def _h5_with_text_name(tmp_path):
    path = tmp_path / "notes.h5"
    path.write_text("not HDF5 either\n")
    return lambda: MCPCA().fit(str(path) + ":/data")


def _inverse_wrong_width(tmp_path):
    model = _fitted(2)
    return lambda: model.inverse_transform(np.zeros((5, 3)))


def _transform_wrong_width(tmp_path):
    model = _fitted(2)
    return lambda: model.transform(np.zeros((5, 4)))


CONTRACT = [
    ("1-D", lambda t: lambda: MCPCA().fit(np.zeros(10)), ValueError, "must be 2-D"),
    ("empty", lambda t: lambda: MCPCA().fit(np.zeros((0, 3))), ValueError, "X is empty"),
    ("strings", lambda t: lambda: MCPCA().fit(np.array([["a", "b"]] * 9)), ValueError, "must hold numbers"),
    ("NaN", lambda t: lambda: MCPCA().fit(np.where(np.eye(300, 3) > 0, np.nan, _data())), ValueError,
     "nan_policy='omit'"),
    ("scipy.sparse", _sparse, TypeError, "Sparse data was passed (csr_matrix), but dense data is required"),
    ("xarray.Dataset", _dataset, TypeError, "xarray.Dataset; pass one of its variables"),
    ("masked array", _masked, TypeError, "masked array"),
    ("missing store", lambda t: lambda: MCPCA().fit(str(t / "none.zarr")), FileNotFoundError, "none.zarr"),
    ("text file", _text_file, ValueError, "notes.txt' is neither a Zarr store"),
    ("text file named .h5", _h5_with_text_name, ValueError, "notes.h5' is neither a Zarr store"),
    ("checkpoint=5", lambda t: lambda: MCPCA(checkpoint=5).fit(_data()), ValueError,
     "'checkpoint' parameter of MCPCA must be"),
    ("random_state=-1", lambda t: lambda: MCPCA(random_state=-1).fit(_data()), ValueError,
     "'random_state' parameter of MCPCA must be an int in the range"),
    ("random_state=2**70", lambda t: lambda: MCPCA(random_state=2**70).fit(_data()), ValueError,
     "Got 1180591620717411303424 instead"),
    ("n_components too many", lambda t: lambda: MCPCA(4).fit(_data()), ValueError, "X has only 3 features"),
    ("sample_size below p + 2", lambda t: lambda: MCPCA(sample_size=15).fit(_untouchable(5000, 20)),
     ValueError, "sample_size=15 is invalid"),
    ("transform: other width", _transform_wrong_width, ValueError,
     "X has 4 features, but MCPCA is expecting 3 features"),
    ("inverse_transform: other width", _inverse_wrong_width, ValueError,
     "inverse_transform takes scores of shape (n_samples, 2)"),
    # Numerics: what float64 cannot hold is named (tests/test_numerics.py has the generated cases)
    ("X * 1e-300", lambda t: lambda: MCPCA().fit(_data() * 1e-300), NumericalRangeError,
     "below the smallest normal float64 number and cannot be reported; multiply the data by a power of two"),
    ("X * 1e300", lambda t: lambda: MCPCA().fit(_data() * 1e300), NumericalRangeError,
     "above the largest float64 number"),
    ("paper: a row of 1e160", lambda t: lambda: MCPCA(solver="paper").fit(_with_row(1e160)), NumericalRangeError,
     "unweighted scatter of the data about the centre (Algorithm 3, line 1"),
    ("center='mean': a row of 1e308", lambda t: lambda: MCPCA(center="mean").fit(_with_row(1e308)),
     NumericalRangeError, "use center='robust'"),
    ("kernel_factor=1e200", lambda t: lambda: MCPCA(kernel_factor=1e200).fit(_data()), ValueError,
     "'kernel_factor' parameter of MCPCA must be a float in the range [0.001, 1000000.0]"),
]


def test_finite_extreme_rows_are_rows():
    """Rows of 1e308, -1e308 and 1e160 are finite: no NonFiniteRowsError; the default flags them."""
    X = _with_row(1e308)
    X[7], X[9] = -1e308, 1e160
    model = MCPCA().fit(X)
    assert model.n_samples_ == 300
    assert model.is_outlier(X[[5, 7, 9]]).all()
    assert np.isinf(model.mahalanobis(X[[5, 7]])).all()


@pytest.mark.parametrize("make, error, fragment", [c[1:] for c in CONTRACT], ids=[c[0] for c in CONTRACT])
def test_contract(tmp_path, make, error, fragment):
    call = make(tmp_path)
    with pytest.raises(error) as err:
        call()
    assert fragment in str(err.value)
    # raised by the package (or by scikit-learn's check of the parameters the
    # package declares), not from deep inside numpy, scipy or dask
    package = os.path.dirname(__import__("dask_mcpca").__file__)
    origin = str(err.traceback[-1].frame.code.path)
    sklearn_check = os.path.join("sklearn", "utils", "_param_validation.py")
    assert origin.startswith(package) or origin.endswith(sklearn_check), origin


@pytest.mark.parametrize("seed", range(8))
def test_a_too_small_sample_size_fails_for_every_seed(seed):
    """Whether the Bernoulli row sample is large enough must not depend on the seed."""
    X = np.random.default_rng(seed).normal(size=(5000, 20))
    with pytest.raises(ValueError, match="sample_size=40 is invalid; .* at least 22 rows"):
        MCPCA(sample_size=40, random_state=seed).fit(X)


# --------------------------------------------------------- model files
def _model_document(tmp_path):
    import json

    path = tmp_path / "good.json"
    _fitted(2).save(path)
    return json.loads(path.read_text())


def _set(doc, name, values=None, **fields):
    attr = doc["attributes"][name]
    if isinstance(attr, dict):
        if values is not None:
            attr["data"] = values
        attr.update(fields)
    else:
        doc["attributes"][name] = values


def _edit(fn):
    def edit(doc):
        fn(doc)
        return doc
    return edit


BAD_MODELS = [
    ("mean_ of the wrong shape", _edit(lambda d: _set(d, "mean_", [0.0, 0.0], shape=[2])),
     "mean_ must be a float array of shape (3,)"),
    ("NaN in components_", _edit(lambda d: d["attributes"]["components_"]["data"].__setitem__(0, "NaN")),
     "components_ holds 1 non-finite value"),
    ("kernel_scale_ = 0", _edit(lambda d: _set(d, "kernel_scale_", 0)), "kernel_scale_=0 must be a float in"),
    ("negative variance", _edit(lambda d: d["attributes"]["explained_variance_"]["data"].__setitem__(1, -1.0)),
     "explained_variance_ holds negative values"),
    ("components not orthonormal", _edit(lambda d: d["attributes"]["components_"]["data"].__setitem__(0, 3.0)),
     "components_ are not orthonormal"),
    ("integer components", _edit(lambda d: _set(d, "components_", [1, 0, 0, 0, 1, 0], dtype="<i8")),
     "components_ must be a float array"),
    ("missing mean_", _edit(lambda d: d["attributes"].pop("mean_")), "mean_ missing"),
    ("n_components_ above n_features_in_", _edit(lambda d: _set(d, "n_components_", 7)), "n_components_=7"),
    ("bad parameter", _edit(lambda d: d["params"].__setitem__("solver", "fast")),
     "'solver' parameter of MCPCA must be"),
    ("attribute shadowing a method", _edit(lambda d: d["attributes"].__setitem__("__class__", 1)),
     "bad attribute name '__class__'"),
    ("no attributes", _edit(lambda d: d.pop("attributes")), "needs a \"params\" and an \"attributes\" object"),
    # the model's invariants: each broken by an edit a person could make to the JSON
    ("variances increasing", _edit(lambda d: d["attributes"]["explained_variance_"]["data"].reverse()),
     "explained_variance_ must not increase"),
    ("first variance zero", _edit(lambda d: d["attributes"]["explained_variance_"]["data"].__setitem__(0, 0.0)),
     "explained_variance_[0]=0.0 must be > 0"),
    ("rows of components_ swapped", _edit(lambda d: _swap_rows(d["attributes"]["components_"])),
     "components_[0] does not carry explained_variance_[0]"),
    ("ratios not over one total", _edit(lambda d: d["attributes"]["explained_variance_ratio_"]["data"].reverse()),
     "explained_variance_ratio_ is not explained_variance_ over one total"),
    ("kernel_scale_ = 1e-300", _edit(lambda d: _set(d, "kernel_scale_", 1e-300)),
     "kernel_scale_=1e-300 must be a float in"),
    ("kernel_scale_ = 1e+300", _edit(lambda d: _set(d, "kernel_scale_", 1e300)),
     "kernel_scale_=1e+300 must be a float in"),
    ("outlier_cutoff_ = Infinity", _edit(lambda d: _set(d, "outlier_cutoff_", "Infinity")),
     "outlier_cutoff_=inf must be a finite float > 0"),
    ("outlier_cutoff_ = 0", _edit(lambda d: _set(d, "outlier_cutoff_", 0.0)),
     "outlier_cutoff_=0.0 must be a finite float > 0"),
    ("outlier_cutoff_ against the threshold",
     _edit(lambda d: _set(d, "outlier_cutoff_", 2 * _value(d, "outlier_cutoff_"))),
     "does not match outlier_cutoff_ and kernel_scale_"),
]


def _swap_rows(array):
    """Swap the first two rows of a saved 2-D array (its flat, C-ordered data)."""
    width = array["shape"][1]
    data = array["data"]
    data[:width], data[width:2 * width] = data[width:2 * width], data[:width]


def _value(doc, name):
    return doc["attributes"][name]


@pytest.mark.parametrize("edit, fragment", [c[1:] for c in BAD_MODELS], ids=[c[0] for c in BAD_MODELS])
def test_load_refuses_a_damaged_model(tmp_path, edit, fragment):
    import json

    from dask_mcpca import load
    from dask_mcpca._persist import ModelFormatError

    path = tmp_path / "edited.json"
    path.write_text(json.dumps(edit(_model_document(tmp_path))))
    with pytest.raises(ModelFormatError) as err:
        load(path)
    assert "edited.json" in str(err.value) and fragment in str(err.value)


@pytest.mark.slow  # CI tier: writes and reads a file of the size limit (3 s)
@pytest.mark.parametrize("what", ["/dev/zero", "nested", "huge"])
def test_load_reads_a_bounded_amount(tmp_path, what):
    from dask_mcpca import _persist, load

    if what == "/dev/zero":
        path, fragment = "/dev/zero", "not a regular file"
    elif what == "nested":
        path, fragment = tmp_path / "deep.json", "nested too deeply"
        path.write_text('{"format": "dask-mcpca-model", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    else:
        path, fragment = tmp_path / "huge.json", "larger than"
        with open(path, "wb") as f:  # sparse: no disk or memory used for the hole
            f.truncate(_persist.MAX_MODEL_BYTES + 1)
    with pytest.raises(_persist.ModelFormatError, match=fragment):
        load(path)


# ------------------------------------------------- errors in the user's terms (issue 35, point 6)
def _xarray_store(path, times):
    xr = pytest.importorskip("xarray")
    X = _data(n=len(times))
    xr.Dataset({c: ("time", X[:, j]) for j, c in enumerate("abc")}, coords={"time": times}).to_zarr(
        path, mode="w", consolidated=False)
    return str(path)


def _cli_error(capsys, *argv) -> str:
    from dask_mcpca.cli import main

    assert main([*map(str, argv), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_time_on_an_unsorted_coordinate_says_it_is_not_sorted(tmp_path, capsys):
    pd = pytest.importorskip("pandas")
    times = pd.date_range("2024-01-01", periods=300, freq="min")[np.random.default_rng(2).permutation(300)]
    store = _xarray_store(tmp_path / "unsorted.zarr", times)
    err = _cli_error(capsys, "fit", store, "--time", "2024-01-01:2024-01-02", "-o", tmp_path / "m.json")
    assert "'time' is not sorted" in err and "sortby('time')" in err and "--rows START:STOP" in err
    assert "not labels" not in err and not (tmp_path / "m.json").exists()
    from dask_mcpca import open_archive
    from dask_mcpca._exceptions import SelectionError

    with pytest.raises(SelectionError, match="is not sorted.*with rows="):
        open_archive(store, time=slice("2024-01-01", "2024-01-02"))


@pytest.mark.parametrize("names, twice", [
    (["a"] * 50_000, "'a'"),
    ([f"v{i}" for i in range(25_000)] * 2, "'v0', 'v1'"),
])
def test_fifty_thousand_variables_are_refused_in_one_short_line(tmp_path, capsys, names, twice):
    pd = pytest.importorskip("pandas")
    store = _xarray_store(tmp_path / "x.zarr", pd.date_range("2024-01-01", periods=300, freq="min"))
    err = _cli_error(capsys, "fit", store, "--variables", ",".join(names), "-o", tmp_path / "m.json")
    assert f"name {twice}" in err and "(50,000 in all)" in err and len(err) < 400, err


def test_fifty_thousand_unknown_variables_are_named_in_one_short_line(tmp_path, capsys):
    pd = pytest.importorskip("pandas")
    store = _xarray_store(tmp_path / "x.zarr", pd.date_range("2024-01-01", periods=300, freq="min"))
    names = ",".join(f"v{i}" for i in range(50_000))
    err = _cli_error(capsys, "fit", store, "--variables", names, "-o", tmp_path / "m.json")
    assert "no variable(s) ['v0', 'v1'" in err and "(50,000 in all)" in err and "it has ['a', 'b', 'c']" in err
    assert len(err) < 400, err


def test_the_nan_refusal_names_partial_in_the_callers_spelling(tmp_path, capsys):
    X = _data()
    X[7, 1] = np.nan
    with pytest.raises(NonFiniteRowsError, match="nan_policy='omit'.*nan_policy='partial'.*observed cells"):
        MCPCA().fit(X)
    with pytest.raises(NonFiniteRowsError, match="nan_policy='partial'"):
        MCPCA().fit(_data()).transform(X)
    err = _cli_error(capsys, "fit", _zarr_store(tmp_path / "nan.zarr", X), "-o", tmp_path / "m.json")
    assert "--nan-policy omit" in err and "--nan-policy partial" in err and "nan_policy" not in err


# -------------------------------------- rows judged on fewer channels (issue 35, point 7)
def _with_gaps_in(n=3000, gaps=240, seed=4):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4)) * np.array([3.0, 1.0, 0.5, 0.2])
    rows = rng.choice(n, gaps, replace=False)
    X[rows, rng.integers(0, 4, gaps)] = np.nan  # one cell each: the rows with a gap are these
    return X


def test_the_rows_judged_on_fewer_channels_are_counted_saved_and_printed(tmp_path, capsys):
    from dask_mcpca import load
    from dask_mcpca.cli import main

    X = _with_gaps_in()
    gappy = int(np.isnan(X).any(axis=1).sum())
    assert gappy == 240
    assert MCPCA(nan_policy="partial").fit(X).n_samples_partial_ == gappy
    assert MCPCA(nan_policy="omit").fit(X).n_samples_partial_ == 0
    updated = MCPCA(nan_policy="partial").fit(X[:2000]).partial_fit(X[2000:])  # the update's rows
    assert updated.n_samples_partial_ == int(np.isnan(X[2000:]).any(axis=1).sum())
    store, model = _zarr_store(tmp_path / "gaps.zarr", X), tmp_path / "m.json"
    assert main(["fit", store, "--nan-policy", "partial", "-o", str(model), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"rows judged on fewer channels {gappy} of {len(X):,} (some cells missing" in out
    assert load(model).n_samples_partial_ == gappy
    assert main(["fit", _zarr_store(tmp_path / "whole.zarr", _data()), "-o", str(tmp_path / "w.json"),
                 "--no-progress"]) == 0
    assert "fewer channels" not in capsys.readouterr().out  # raise: every row used is whole


def test_a_count_of_partial_rows_above_the_rows_used_is_refused_on_load(tmp_path):
    import json

    from dask_mcpca import ModelFormatError, load

    path = tmp_path / "m.json"
    MCPCA(nan_policy="partial").fit(_with_gaps_in()).save(path)
    doc = json.loads(path.read_text())
    doc["attributes"]["n_samples_partial_"] = doc["attributes"]["n_samples_"] + 1
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelFormatError, match=r"n_samples_partial_=3001 must be an int in \[0, 3000\]"):
        load(path)
    del doc["attributes"]["n_samples_partial_"]  # a file written before the count: loads without it
    path.write_text(json.dumps(doc))
    assert not hasattr(load(path), "n_samples_partial_")


@pytest.mark.parametrize("kw", [{"nan_policy": "partial"}, {"cellwise": True}])
def test_the_ordinary_mean_of_rows_with_gaps_is_refused(kw):
    """With gaps that depend on the values (channel 0 offline whenever channel 1 reads high), the ordinary
    mean the fit took was the complete rows' mean, 5 spreads from the data's; refused, naming the fix."""
    rng = np.random.default_rng(0)
    X = rng.multivariate_normal(np.zeros(4), 0.9 * np.ones((4, 4)) + 0.1 * np.eye(4), size=2000)
    X[X[:, 1] > 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"center='mean' with .*center='robust'"):
        MCPCA(center="mean", **kw).fit(X)


def test_a_dask_array_of_one_row_chunks_samples_enough_rows():
    """800 rows x 40 in one-row dask chunks: the first read sampled a spread of 32 one-row blocks and
    refused the fit as '800 usable rows are too few for 40 features'.  Expected: the fit of the same rows
    in one chunk (the sample then holds every row: the same model)."""
    import dask.array as da

    rng = np.random.default_rng(5)
    X = rng.normal(size=(800, 4)) @ rng.normal(size=(4, 40)) + 0.3 * rng.normal(size=(800, 40))
    whole = MCPCA(random_state=0).fit(X)
    small = MCPCA(random_state=0).fit(da.from_array(X, chunks=(1, 40)))
    np.testing.assert_allclose(small.explained_variance_, whole.explained_variance_, rtol=1e-8)
    assert small.outlier_cutoff_ == pytest.approx(whole.outlier_cutoff_, rel=1e-8)
