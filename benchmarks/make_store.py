"""Benchmark data: a Zarr v3 store of Gaussian rows with ~5 % outliers.

The store is written one row chunk at a time, so a store far larger than
memory can be made; chunk ``i`` is drawn from its own seed, so the data do not
depend on the order in which chunks are written.  Stores are cached under
``benchmarks/data/`` (git-ignored) by size, dtype, chunking and seed, and
carry their ground truth in the Zarr attributes.

The model
---------
Inliers are ``N(0, V diag(lam) V^T)`` with ``lam`` geometric from 10 to 0.1
and ``V`` a random rotation (seeded).  Each row is an outlier with
probability ``outlier_fraction``; outliers form a tight cluster at
``OUTLIER_DISTANCE * sqrt(lam[0])`` along the *weakest* true direction
``V[:, -1]``.  That cluster alone adds more variance along ``V[:, -1]`` than
the strongest inlier direction has, so ordinary PCA's first component points
at the outliers, while a robust fit should recover ``V``.

Command line::

    python benchmarks/make_store.py --rows 5000000 --cols 10 --dtype float64
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["StoreInfo", "make_store", "truth", "DATA_DIR"]

#: Where generated stores are cached (git-ignored).
DATA_DIR = Path(__file__).resolve().parent / "data"

#: Rows per Zarr chunk unless told otherwise.
CHUNK_ROWS = 1_000_000

#: Distance of the outlier cluster from the centre, in units of sqrt(lam[0]).
OUTLIER_DISTANCE = 10.0

#: Standard deviation of the outlier cluster, per coordinate.
OUTLIER_SPREAD = 1.0


@dataclass(frozen=True)
class StoreInfo:
    """A generated store and the truth it was drawn from.

    Attributes
    ----------
    path : Path
        The Zarr store (a directory).
    components : ndarray of shape (p, p)
        True principal directions of the inliers, as rows, strongest first.
    variances : ndarray of shape (p,)
        True inlier variance along each direction.
    n_rows, n_cols : int
    dtype : str
    chunk_rows : int
    outlier_fraction : float
    nbytes : int
        Uncompressed size of the data.
    store_bytes : int
        Size of the store on disk.
    """

    path: Path
    components: np.ndarray
    variances: np.ndarray
    n_rows: int
    n_cols: int
    dtype: str
    chunk_rows: int
    outlier_fraction: float
    nbytes: int
    store_bytes: int


def truth(n_cols: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """True inlier directions (rows, strongest first) and variances."""
    rng = np.random.default_rng([seed, 0])
    Q, R = np.linalg.qr(rng.standard_normal((n_cols, n_cols)))
    V = Q * np.sign(np.diag(R))  # a Haar-random rotation
    lam = np.geomspace(10.0, 0.1, n_cols) if n_cols > 1 else np.array([10.0])
    return V.T, lam


def _chunk(i: int, n: int, components, variances, *, outlier_fraction: float, seed: int) -> np.ndarray:
    """Rows of chunk ``i`` (float64), from the chunk's own seed."""
    rng = np.random.default_rng([seed, 1, i])
    p = len(variances)
    X = (rng.standard_normal((n, p)) * np.sqrt(variances)) @ components
    out = rng.random(n) < outlier_fraction
    n_out = int(out.sum())
    centre = OUTLIER_DISTANCE * np.sqrt(variances[0]) * components[-1]
    X[out] = centre + OUTLIER_SPREAD * rng.standard_normal((n_out, p))
    return X


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _default_path(n_rows, n_cols, dtype, chunk_rows, outlier_fraction, seed) -> Path:
    name = f"gauss_{n_rows}x{n_cols}_{dtype}_c{chunk_rows}_o{outlier_fraction:g}_s{seed}.zarr"
    return DATA_DIR / name


def make_store(
    n_rows: int,
    n_cols: int,
    *,
    dtype: str = "float64",
    chunk_rows: int = CHUNK_ROWS,
    outlier_fraction: float = 0.05,
    seed: int = 0,
    path: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> StoreInfo:
    """Return a cached Gaussian-plus-outliers Zarr store, writing it if needed.

    Parameters
    ----------
    n_rows, n_cols : int
        Shape of the array.
    dtype : {"float64", "float32"}
        Stored dtype (the rows are drawn in float64 and cast).
    chunk_rows : int
        Rows per Zarr chunk; each chunk spans all columns.
    outlier_fraction : float
        Probability that a row is an outlier.
    seed : int
        Seed of the rotation and of every chunk.
    path : path-like, optional
        Where to write; default ``benchmarks/data/<name from the parameters>``.
    overwrite : bool
        Write again even if a complete store is cached.
    """
    import zarr

    from dask_mcpca._atomic import atomic_path

    if dtype not in ("float64", "float32"):
        raise ValueError(f"dtype={dtype!r}; expected 'float64' or 'float32'")
    chunk_rows = int(min(chunk_rows, n_rows))
    path = Path(path) if path is not None else _default_path(
        n_rows, n_cols, dtype, chunk_rows, outlier_fraction, seed
    )
    components, variances = truth(n_cols, seed=seed)
    if overwrite or not (path / "zarr.json").exists():
        with atomic_path(path) as tmp:
            arr = zarr.create_array(
                store=tmp,
                shape=(n_rows, n_cols),
                chunks=(chunk_rows, n_cols),
                dtype=dtype,
                attributes={
                    "generator": "benchmarks/make_store.py",
                    "seed": seed,
                    "outlier_fraction": outlier_fraction,
                    "components": components.tolist(),
                    "variances": variances.tolist(),
                },
            )
            for i, start in enumerate(range(0, n_rows, chunk_rows)):
                n = min(chunk_rows, n_rows - start)
                block = _chunk(i, n, components, variances, outlier_fraction=outlier_fraction, seed=seed)
                arr[start : start + n] = block.astype(dtype)
    return StoreInfo(
        path=path,
        components=components,
        variances=variances,
        n_rows=n_rows,
        n_cols=n_cols,
        dtype=dtype,
        chunk_rows=chunk_rows,
        outlier_fraction=outlier_fraction,
        nbytes=n_rows * n_cols * np.dtype(dtype).itemsize,
        store_bytes=_du(path),
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--cols", type=int, default=10)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--chunk-rows", type=int, default=CHUNK_ROWS)
    parser.add_argument("--outlier-fraction", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--path", default=None)
    parser.add_argument("--overwrite", action="store_true")
    a = parser.parse_args(argv)
    info = make_store(
        a.rows,
        a.cols,
        dtype=a.dtype,
        chunk_rows=a.chunk_rows,
        outlier_fraction=a.outlier_fraction,
        seed=a.seed,
        path=a.path,
        overwrite=a.overwrite,
    )
    print(f"{info.path}  {info.n_rows} x {info.n_cols} {info.dtype}  "
          f"{info.nbytes / 1e6:.0f} MB raw, {info.store_bytes / 1e6:.0f} MB on disk")


if __name__ == "__main__":
    main()
