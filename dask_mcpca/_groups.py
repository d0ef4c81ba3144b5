"""The array inside a Zarr group or an HDF5 file, at any depth: named, or the only one.

A store path (``store.zarr``, ``file.h5``, ``store.zarr:/name``) and a group object are read
alike (:mod:`._io`): an array in a subgroup is found, a group whose only array is nested is
read as that array, and a group of several arrays is refused with their names listed.
"""

from __future__ import annotations

__all__ = ["array_in", "hdf5_datasets", "single_hdf5_dataset", "zarr_arrays"]


def zarr_arrays(group) -> list[str]:
    """Paths of every array in the Zarr ``group``, at any depth (``"sub/x"``), sorted.

    As an HDF5 file lists its datasets (``visititems``): an array in a subgroup
    is found, and a group whose only array is nested is read as that array.
    """
    import zarr

    if hasattr(group, "members"):  # zarr 3 (both formats)
        return sorted(name for name, node in group.members(max_depth=None) if isinstance(node, zarr.Array))
    names: list[str] = []
    group.visititems(lambda name, node: names.append(name) if isinstance(node, zarr.Array) else None)
    return sorted(names)


def array_in(node, path: str, dataset: str | None, how: str = "name one with dataset= or as 'store.zarr:/name'"):
    """The 2-D array ``dataset`` of the Zarr group ``node`` (or ``node`` itself, an array).

    Without ``dataset`` the group must hold exactly one array, at any depth;
    otherwise the KeyError lists them all and says ``how`` to name one.
    """
    import zarr

    if isinstance(node, zarr.Array):
        if dataset not in (None, "", "/"):
            raise KeyError(f"Zarr store {path!r} is a single array; it has no dataset {dataset!r}")
        return node
    names = zarr_arrays(node)
    if dataset is None:
        if len(names) != 1:
            raise KeyError(f"Zarr group {path!r} holds {len(names)} arrays {names}; {how}")
        dataset = names[0]
    try:
        arr = node[dataset.strip("/")]
    except KeyError:
        raise KeyError(f"Zarr store {path!r} has no dataset {dataset!r}; it has {names}") from None
    if not isinstance(arr, zarr.Array):
        raise KeyError(f"{dataset!r} in Zarr store {path!r} is a group, not an array")
    return arr


def hdf5_datasets(group) -> list[str]:
    """Paths of every dataset in the h5py ``group`` (a file is one), at any depth, in the order h5py visits them."""
    import h5py

    names: list[str] = []
    group.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    return names


def single_hdf5_dataset(path: str) -> str:
    """The path of the HDF5 file's one dataset, at any depth; a KeyError listing them where it holds several."""
    import h5py

    with h5py.File(path, "r") as f:
        names = hdf5_datasets(f)
    if len(names) != 1:
        raise KeyError(
            f"HDF5 file {path!r} holds {len(names)} datasets {names}; name one as 'file.h5:/name'"
        )
    return names[0]
