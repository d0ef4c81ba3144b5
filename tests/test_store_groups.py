"""Groups as input: a Zarr group whose arrays sit in subgroups is listed as an HDF5 file is (at any depth),
and a zarr.Group or h5py.Group object is read as a path to it is (review 7 of 2026-11-28, points 2 and 3)."""

import numpy as np
import pytest

from dask_mcpca import MCPCA
from dask_mcpca._io import as_row_blocks

zarr = pytest.importorskip("zarr")
h5py = pytest.importorskip("h5py")


def _data():
    return np.random.default_rng(7).normal(size=(300, 4))


def _nested_zarr(path, X, names=("x",), zarr_format=3):
    g = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    sub = g.create_group("sub")
    for name in names:
        a = sub.create_array(name, shape=X.shape, chunks=(100, X.shape[1]), dtype="f8")
        a[:] = X
    return str(path)


def _nested_h5(path, X, names=("x",)):
    with h5py.File(path, "w") as f:
        for name in names:
            f.create_dataset(f"sub/{name}", data=X)
    return str(path)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_zarr_group_whose_only_array_is_nested_is_read_as_that_array(tmp_path, zarr_format):
    X = _data()
    store = _nested_zarr(tmp_path / "g.zarr", X, zarr_format=zarr_format)
    h5 = _nested_h5(tmp_path / "g.h5", X)
    for source in (store, h5, store + ":/sub/x", h5 + ":/sub/x"):
        assert np.array_equal(np.asarray(as_row_blocks(source)), X), source


def test_a_zarr_group_with_nested_arrays_lists_them_all(tmp_path):
    X = _data()
    store = _nested_zarr(tmp_path / "g.zarr", X, names=("x", "y"))
    with pytest.raises(KeyError, match=r"holds 2 arrays \['sub/x', 'sub/y'\]; name one"):
        as_row_blocks(store)
    h5 = _nested_h5(tmp_path / "g.h5", X, names=("x", "y"))
    with pytest.raises(KeyError, match=r"holds 2 datasets \['sub/x', 'sub/y'\]"):
        as_row_blocks(h5)
    assert np.array_equal(np.asarray(as_row_blocks(store + ":/sub/y")), X)


def test_a_group_object_is_read_as_a_path_to_it(tmp_path):
    X = _data()
    one = zarr.open_group(_nested_zarr(tmp_path / "one.zarr", X), mode="r")
    assert np.array_equal(np.asarray(as_row_blocks(one)), X)
    assert np.array_equal(np.asarray(as_row_blocks(one["sub"])), X)
    with h5py.File(_nested_h5(tmp_path / "one.h5", X), "r") as f:
        assert np.array_equal(np.asarray(as_row_blocks(f)), X)
        assert np.array_equal(np.asarray(as_row_blocks(f["sub"])), X)
    assert MCPCA().fit(one).n_features_in_ == X.shape[1]


def test_a_group_object_with_several_arrays_is_refused_with_their_names(tmp_path):
    X = _data()
    two = zarr.open_group(_nested_zarr(tmp_path / "two.zarr", X, names=("x", "y")), mode="r")
    with pytest.raises(KeyError, match=r"holds 2 arrays \['sub/x', 'sub/y'\]; pass one of them, group\[name\]"):
        MCPCA().fit(two)
    with h5py.File(_nested_h5(tmp_path / "two.h5", X, names=("x", "y")), "r") as f, pytest.raises(
        KeyError, match=r"holds 2 datasets \['sub/x', 'sub/y'\]; pass one of them, group\[name\]"
    ):
        MCPCA().fit(f)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_arrays_alike_in_one_store_stay_apart_in_one_graph(tmp_path, zarr_format):
    """Two arrays of one store with the same shape, dtype, chunks and attributes but other values are
    two arrays in one dask graph (their dask names differ), and a store's attributes, which do not change
    what is read, do not rename it."""
    g = zarr.open_group(str(tmp_path / "two.zarr"), mode="w", zarr_format=zarr_format)
    X = _data()
    for name, values in (("a", X), ("sub/b", 2 * X)):
        a = g.create_array(name, shape=X.shape, chunks=(100, X.shape[1]), dtype="f8")
        a[:] = values
        a.attrs["note"] = "the same"
    A, B = as_row_blocks(g["a"]), as_row_blocks(g["sub/b"])
    np.testing.assert_allclose((A + B).compute(), 3 * X)
    before = A.name
    g["a"].attrs["note"] = "x" * 100_000
    assert as_row_blocks(zarr.open_array(str(tmp_path / "two.zarr"), path="a", mode="r")).name == before


def test_one_path_on_two_filesystems_is_two_arrays(tmp_path):
    """The same path in an in-memory fsspec filesystem and on the local disk, other values: two dask names,
    and their sum is the sum of both (review of 2026-11-28: the store's path alone named them alike, and
    dask read one of them twice)."""
    X = _data()
    where = str(tmp_path / "same.zarr")
    z = zarr.open_array(f"memory://{where}", mode="w", shape=X.shape, chunks=(100, X.shape[1]), dtype="f8")
    z[:] = X
    local = zarr.open_array(where, mode="w", shape=X.shape, chunks=(100, X.shape[1]), dtype="f8")
    local[:] = 2 * X
    A = as_row_blocks(zarr.open_array(f"memory://{where}", mode="r"))
    B = as_row_blocks(f"file://{where}")
    assert A.name != B.name
    np.testing.assert_allclose((A + B).compute(), 3 * X)
