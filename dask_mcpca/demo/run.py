"""``dask-mcpca demo``: generate the archive, fit, compare with PCA, print and plot."""

from __future__ import annotations

import os
import sys
import time

import dask.array as da

from .._estimator import MCPCA
from .._schedule import outlier_cutoff_d2
from .archive import CHANNELS, KINDS, TRUE_LOADINGS, make_archive, true_variances
from .evaluate import DemoResult, angles_deg, evaluate, subspace_angle_deg
from .report import outlier_table, plot, table

__all__ = ["run_demo"]


#: What the demo writes into its folder (replaced on every run), and the file that marks the folder as
#: the demo's: a folder without it that already holds one of these names is refused, not overwritten.
DEMO_FILES = ("sensors.zarr", "truth.zarr", "model.json", "report.png")
MARKER = ".dask-mcpca-demo"


def _claim_folder(out: str) -> None:
    if os.path.isdir(out) and not os.path.exists(os.path.join(out, MARKER)):
        clash = [name for name in DEMO_FILES if os.path.lexists(os.path.join(out, name))]
        if clash:
            raise ValueError(
                f"demo: {out!r} already holds {', '.join(clash)}, which the demo did not write; "
                "choose another --out (the demo replaces these names in its own folder)"
            )
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, MARKER), "w") as f:
        f.write("written by dask-mcpca demo; it replaces " + ", ".join(DEMO_FILES) + " here\n")


def run_demo(
    *, rows: int = 1_000_000, out="mcpca-demo", seed: int = 0, progress: bool = True, stream=None
) -> DemoResult:
    """Generate the archive, fit MCPCA and PCA, print the comparison, write the report.

    Parameters
    ----------
    rows : int
        Rows of the synthetic archive.
    out : str or path-like
        Folder for ``sensors.zarr``, ``truth.zarr``, ``model.json`` and
        ``report.png`` (created; those four are replaced in a folder the demo
        wrote before, and a folder that holds any of them otherwise is refused).
    seed : int
        Seed of the generator.
    progress : bool
        Progress line per pass of the fit, on stderr.
    stream : file-like, default=sys.stdout
        Where the tables go.
    """
    stream = stream if stream is not None else sys.stdout
    say = lambda *a: print(*a, file=stream, flush=True)  # noqa: E731
    out = os.fspath(out)
    _claim_folder(out)
    seconds = {}
    t0 = time.perf_counter()
    sensors, truth, faults = make_archive(out, n_rows=rows, seed=seed)
    seconds["generate"] = time.perf_counter() - t0
    n_faulty = {k: faults.n_rows_of(k) for k in KINDS}
    say(
        f"dask-mcpca demo: {rows:,} rows x {len(CHANNELS)} channels, "
        f"3 latent factors + noise + slow drift, seed {seed}"
    )
    say(
        f"faults: {len(faults.spikes):,} spikes ({n_faulty[1]:,} rows), {len(faults.stuck)} stuck sensors "
        f"({n_faulty[2]:,} rows), {len(faults.swapped)} mislabelled stretches ({n_faulty[3]:,} rows): "
        f"{sum(n_faulty.values()) / rows:.1%} of rows"
    )
    say(f"archive written to {sensors} (truth: {truth}) in {seconds['generate']:.1f} s\n")

    # The store's own chunks are the row blocks (about 6 MB each), so both
    # cores work even on a small archive.
    X = da.from_zarr(sensors)
    t = time.perf_counter()
    model = MCPCA(progress=progress, nan_policy="omit").fit(X)
    seconds["fit"] = time.perf_counter() - t
    model_path = os.path.join(out, "model.json")
    model.save(model_path)
    n_blocks = len(X.chunks[0])
    say(f"gaps: {rows - model.n_samples_:,} rows hold a NaN and are left out (nan_policy='omit')")
    say(
        f"MCPCA fit: {model.n_passes_} passes over {n_blocks} block{'s' * (n_blocks != 1)} "
        f"in {seconds['fit']:.1f} s -> {model_path}"
    )

    (pca_components, pca_var), counts, sample, seconds["evaluate"] = evaluate(X, truth, model, faults, seed)
    say(f"ordinary PCA (covariance pass) and outlier counts: 2 passes in {seconds['evaluate']:.1f} s\n")
    W = TRUE_LOADINGS
    result = DemoResult(
        n_rows=rows,
        angles_pca=angles_deg(pca_components, W),
        angles_mcpca=angles_deg(model.components_, W),
        subspace_pca=subspace_angle_deg(pca_components, W),
        subspace_mcpca=subspace_angle_deg(model.components_, W),
        variances_true=true_variances(),
        variances_pca=pca_var,
        variances_mcpca=model.explained_variance_,
        counts=counts,
        n_passes=model.n_passes_,
        seconds=seconds,
        paths={"sensors": sensors, "truth": truth, "model": model_path, "report": os.path.join(out, "report.png")},
        cutoff=model.outlier_cutoff_,
    )
    say("Principal axes vs the generator's true loadings (angles in degrees)")
    say(table(result) + "\n")
    say(
        f"Outliers: MCPCA flags d^2 above its calibrated cutoff ({model.outlier_cutoff_:.1f}); PCA, above the "
        f"chi-square(12) 99.8 % quantile ({outlier_cutoff_d2(len(CHANNELS)):.1f})"
    )
    say(outlier_table(result) + "\n")
    t = time.perf_counter()
    plot(result.paths["report"], result, pca_components, model, sample, seed)
    seconds["report"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t0
    say(f"report written to {result.paths['report']} ({seconds['total']:.1f} s in all)")
    say(
        f"next: dask-mcpca fit {sensors} --nan-policy omit   |   "
        f"dask-mcpca score {sensors} --model {model_path} --output scores.zarr"
    )
    return result
