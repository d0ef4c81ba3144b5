"""Why the default misses the Daphnet subspace target, and the p = 3 paper20 accuracy cell.

ROBUSTNESS.md: on Daphnet S06R02E0 the top-3 subspace of the faulty fit is
8.2 deg from the clean fit's (target <= 5 deg).  ACCURACY.md: at p = 3 with
20 % paper-type outliers the default is 1.29x max(best robust peer, PCA on
the clean rows) (target <= 1.25x).  This script measures where both come
from and what changing the final, inclusive kernel does to them; it writes
``benchmarks/SWAP_DIAGNOSIS.md``.

1. **How well the data determine the clean top-3 subspace**: the default's
   eigenvalues, the angle between fits on random halves of the clean rows,
   on 90 % subsamples, and after replacing 3 % of the rows by copies of
   other clean rows from the bulk's tail.
2. **Which fault, and which step**: the angle with one fault kind at a time,
   with the swapped rows (and the spike rows) dropped, of the core and of
   the final kernel, and of the final kernel evaluated under the clean
   fit's core.
3. **Can a row statistic tell swapped rows from clean ones**: the share of
   swapped rows above the clean rows' 90 % and 99 % quantiles of d^2 (core,
   fitted model), of the largest cellwise residual (each cell given the
   others, under the fitted model), of robpy's DDC row statistic, and of a
   test built for this fault alone (how much swapping some pair of channels
   back lowers d^2).
4. **The final kernel's radius and shape**: the Daphnet and BasicMotions
   angles and the p = 3 paper20 ratio for several ``FINAL_QUANTILE`` values
   (the solver itself), and for bounded-influence final weights (emulated in
   memory from the fitted core).

Usage::

    python benchmarks/swap_diagnosis.py [--seeds 5] [--accuracy-seeds 24] [--cache ~/.cache/dask_mcpca-bench]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import warnings
from itertools import combinations
from pathlib import Path
from unittest import mock

import numpy as np
import scipy.linalg
from scipy import stats

sys.path.insert(0, os.path.dirname(__file__))
from robustness import FAULTS, inject_faults, sensor_data

import dask_mcpca._robust_sample as _robust_sample
from dask_mcpca import MCPCA
from dask_mcpca._repeated import held_out
from dask_mcpca.testing import make_scenario

DAPHNET, BASIC = "Daphnet S06R02E0", "BasicMotions"

#: What the tables say (written for the run recorded in SWAP_DIAGNOSIS.md; rerun and reread).
READING = """\
**Reading.** The Daphnet miss is the swapped rows (table 2: alone 7.4 deg; the four faults 8.2 deg, without
the swapped rows 2.4 deg, without the swapped and the spike rows 0.9 deg), through the final kernel's sums
(the final kernel evaluated under the clean fit's core still turns 6.2 deg; with the swapped rows left out
of its sums, 2.2 deg). The frozen record is a repeated row, left out of every pass (alone it turns the
subspace 0.3-0.6 deg; 0.9-9.9 deg before whole rows were compared, when the per-channel rule missed it in
draws 1 and 2); the 2 % spike rows, flagged and without weight, still move the fit of the other faults by
about 1.5 deg (not traced further). The swapped rows are inliers of this recording by every row statistic
tried (table 3): at the 1 % false-alarm level, 2-3 % of them by d^2 or a cellwise residual, 2 % by DDC,
6 % by a test that knows the fault's form; 86 % lie inside the final radius and they carry their full share
of its weight. The recording's top-3 subspace is fragile (table 1): its third and fourth eigenvalues are
1.34x apart, and 3 % of the rows replaced by copies of its own tail rows move it 2.5 deg. Changing the
final kernel does not help (table 4): a narrower radius leaves the subspace to the core, which is itself
unstable here (49 deg between the clean and faulty cores), and the other final weights give 6.4-12.9 deg
while changing the clean answer by 3-12 deg. The p = 3 paper20 cell pulls the other way: its 20 % wide
outliers are a heavy tail to the calibration, and only a radius that costs Daphnet 15-33 deg meets it.
Both misses are a trade-off of the inclusive final kernel, not a defect a constant can fix.
"""


# ------------------------------------------------------------- helpers
def _subspace(a, b, k=3):
    """Largest principal angle (deg) between the top-k row subspaces of a and b."""
    return float(np.degrees(scipy.linalg.subspace_angles(a[:k].T, b[:k].T).max()))


def _top(S):
    return np.linalg.eigh(S)[1][:, ::-1].T


def _fit(X, **params):
    """The default fit, and its robust state (core and final kernel) and working unit."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = MCPCA(**params).fit(X)
    return model, model._robust_state, model._robust_unit  # what a warm_start refit continues from


def _pca(X):
    return _top(np.cov(X, rowvar=False))


def _d2(Y, location, scatter):
    Z = Y - location
    return np.einsum("ij,jk,ik->i", Z, np.linalg.pinv(scatter), Z)


def _weighted_scatter(Y, w):
    mu = w @ Y / w.sum()
    Z = Y - mu
    return (Z * w[:, None]).T @ Z / w.sum()


def _final_variant(X, robust, unit, kind):
    """The final kernel's scatter, recomputed in memory from the fitted core with another weight."""
    Y = np.ldexp(X, -unit)
    Y = Y[~held_out(Y, robust)]
    d2 = np.maximum(_d2(Y, robust.location, robust.scatter), 1e-300)
    q_core, q_final, c2 = robust.cutoff, robust.final_cutoff, robust.kernel_size2
    weights = {
        "flat top to the final radius (the default)": np.exp(-np.maximum(d2 - q_final, 0) / (2 * c2)),
        "Huber: min(1, q_core / d2)": np.minimum(1, q_core / d2),
        "Huber: min(1, q_final / d2)": np.minimum(1, q_final / d2),
        "min(1, sqrt(q_core / d2))": np.minimum(1, np.sqrt(q_core / d2)),
        "flat top to q_core, fall-off c2 = 20": np.exp(-np.maximum(d2 - q_core, 0) / 40),
        "flat top to q_core, fall-off c2 = 60": np.exp(-np.maximum(d2 - q_core, 0) / 120),
    }
    return _weighted_scatter(Y, weights[kind])


VARIANTS = (
    "flat top to the final radius (the default)",
    "Huber: min(1, q_core / d2)",
    "Huber: min(1, q_final / d2)",
    "min(1, sqrt(q_core / d2))",
    "flat top to q_core, fall-off c2 = 20",
    "flat top to q_core, fall-off c2 = 60",
)


def _med(values, spec=".1f"):
    values = np.asarray(values, float)
    return f"{np.median(values):{spec}} ({', '.join(format(v, spec) for v in values)})"


# -------------------------------------------------------------- tables
def stability_table(data, seeds: int) -> list[str]:
    lines = [
        "| data | eigenvalue ratios l1/l2, l2/l3, l3/l4, l4/l5 (default; PCA) | random halves: MCPCA, PCA | "
        "90 % subsample vs all | 3 % of rows replaced by copies of clean tail rows |",
        "|---|---|---|---|---|",
    ]
    for name in (DAPHNET, BASIC):
        X = data[name]
        n = len(X)
        model = _fit(X)[0]
        lam = model.explained_variance_
        pca_lam = np.linalg.eigvalsh(np.cov(X, rowvar=False))[::-1]
        rng = np.random.default_rng(0)
        halves, pca_halves, sub90, tail = [], [], [], []
        d2 = model.mahalanobis(X)
        band = np.flatnonzero((d2 > np.quantile(d2, 0.75)) & (d2 < np.quantile(d2, 0.95)))
        for _ in range(2 * seeds):
            perm = rng.permutation(n)
            a, b = perm[: n // 2], perm[n // 2 :]
            halves.append(_subspace(_fit(X[a])[0].components_, _fit(X[b])[0].components_))
            pca_halves.append(_subspace(_pca(X[a]), _pca(X[b])))
            sub90.append(_subspace(model.components_, _fit(X[perm[: int(0.9 * n)]])[0].components_))
            rows = perm[: int(0.03 * n)]
            Xr = X.copy()
            Xr[rows] = X[rng.choice(band, len(rows))]
            tail.append(_subspace(model.components_, _fit(Xr)[0].components_))
        ratios = ", ".join(f"{r:.2f}" for r in lam[:4] / lam[1:5])
        pca_ratios = ", ".join(f"{r:.2f}" for r in pca_lam[:4] / pca_lam[1:5])
        lines.append(
            f"| {name} | {ratios}; {pca_ratios} | {np.median(halves):.1f}, {np.median(pca_halves):.1f} "
            f"(MCPCA max {np.max(halves):.1f}) | {np.median(sub90):.1f} (max {np.max(sub90):.1f}) | "
            f"{np.median(tail):.1f} (max {np.max(tail):.1f}) |"
        )
        print(lines[-1], flush=True)
    return lines


def _only(X, seed, kinds):
    """``inject_faults``'s faulty rows for the kinds in ``kinds``, the other faulty rows left clean."""
    Xf, labels = inject_faults(X, seed)
    out = X.copy()
    keep = np.isin(labels, kinds)
    out[keep] = Xf[keep]
    return out, labels


def source_table(data, seeds: int) -> list[str]:
    X = data[DAPHNET]
    clean, rc, uc = _fit(X)
    lines = ["| Daphnet, faulty fit | top-3 subspace, clean vs faulty (deg): median (per draw) |", "|---|---|"]
    rows = {}
    for kind in FAULTS:
        rows[f"{kind} rows only"] = [_subspace(clean.components_, _fit(_only(X, s, [kind])[0])[0].components_)
                                     for s in range(seeds)]
    rows["all four faults (ROBUSTNESS.md)"] = []
    rows["all four faults, swapped rows dropped"] = []
    rows["all four faults, swapped and spike rows dropped"] = []
    rows["all four faults, every faulty row dropped"] = []
    rows["core fixed point, all four faults"] = []
    rows["final kernel, all four faults, under the clean fit's core"] = []
    rows["final kernel, all four faults, swapped rows left out of its sums"] = []
    for s in range(seeds):
        Xf, labels = inject_faults(X, s)
        model, rf, uf = _fit(Xf)
        rows["all four faults (ROBUSTNESS.md)"].append(_subspace(clean.components_, model.components_))
        for what, drop in (("swapped rows", labels == "swap"),
                           ("swapped and spike rows", np.isin(labels, ["swap", "spike"])),
                           ("every faulty row", labels != "")):
            rows[f"all four faults, {what} dropped"].append(
                _subspace(clean.components_, _fit(Xf[~drop])[0].components_))
        rows["core fixed point, all four faults"].append(_subspace(_top(rc.scatter), _top(rf.scatter)))
        free = ~held_out(np.ldexp(Xf, -uf), rf)
        for label, state, unit, keep in (
            ("final kernel, all four faults, under the clean fit's core", rc, uc, free),
            ("final kernel, all four faults, swapped rows left out of its sums", rf, uf, free & (labels != "swap")),
        ):
            Y = np.ldexp(Xf, -unit)
            w = np.exp(-np.maximum(_d2(Y[keep], state.location, state.scatter) - state.final_cutoff, 0)
                       / (2 * state.kernel_size2))
            rows[label].append(_subspace(_top(rc.final_scatter), _top(_weighted_scatter(Y[keep], w))))
    for what, values in rows.items():
        lines.append(f"| {what} | {_med(values)} |")
        print(lines[-1], flush=True)
    lines += ["", f"Core vs final kernel of the clean fit: {_subspace(_top(rc.scatter), _top(rc.final_scatter)):.1f} "
              f"deg apart; radii q_core {rc.cutoff:.1f}, q_final {rc.final_cutoff:.1f} (d^2 under the core); "
              f"support {rc.core_support:.2f} and {rc.support:.2f}."]
    return lines


def _cell_residual(Y, location, scatter):
    """Largest squared standardised residual of a cell given the row's other cells (Gaussian model)."""
    P = np.linalg.pinv(scatter)
    G = (Y - location) @ P
    return np.max(G**2 / np.diag(P), axis=1)


def _swap_gain(Y, location, scatter):
    """How much swapping back the best pair of channels lowers d^2 (a test for this fault alone)."""
    d0 = _d2(Y, location, scatter)
    gain = np.zeros(len(Y))
    for a, b in combinations(range(Y.shape[1]), 2):
        Z = Y.copy()
        Z[:, [a, b]] = Z[:, [b, a]]
        gain = np.maximum(gain, d0 - _d2(Z, location, scatter))
    return gain


def _ddc_rows(X):
    import pandas as pd
    from robpy.outliers.ddc import DDC

    ddc = DDC().fit(pd.DataFrame(X))
    r2 = np.nan_to_num(np.asarray(ddc.standardized_residuals_, float)) ** 2
    return np.mean(stats.chi2.cdf(r2, 1), axis=1)  # DDC's row statistic before its cutoff


def separability_table(data, seeds: int) -> list[str]:
    X = data[DAPHNET]
    stats_by = {}
    inside = []
    for s in range(seeds):
        Xf, labels = inject_faults(X, s)
        model, rf, uf = _fit(Xf)
        Y = np.ldexp(Xf, -uf)
        loc, S = rf.final_location, rf.final_scatter
        values = {
            "d^2 under the core": _d2(Y, rf.location, rf.scatter),
            "d^2 under the fitted model (`mahalanobis`)": np.asarray(model.mahalanobis(Xf)),
            "largest cellwise residual, fitted model": _cell_residual(Y, loc, S),
            "DDC row statistic (robpy)": _ddc_rows(Xf),
            "gain in d^2 from swapping a pair back (knows the fault)": _swap_gain(Y, loc, S),
        }
        clean, swap = labels == "", labels == "swap"
        for name, v in values.items():
            q90, q99 = np.quantile(v[clean], [0.90, 0.99])
            stats_by.setdefault(name, []).append((np.mean(v[swap] > q90), np.mean(v[swap] > q99)))
        d2 = values["d^2 under the core"]
        w = np.exp(-np.maximum(d2 - rf.final_cutoff, 0) / (2 * rf.kernel_size2))
        inside.append((np.mean(d2[swap] <= rf.cutoff), np.mean(d2[swap] <= rf.final_cutoff), w[swap].sum() / w.sum()))
    lines = ["| statistic | swapped rows above the clean rows' 90 % quantile | ... above their 99 % quantile |",
             "|---|---|---|"]
    for name, pairs in stats_by.items():
        pairs = np.array(pairs)
        lines.append(f"| {name} | {_med(pairs[:, 0], '.2f')} | {_med(pairs[:, 1], '.2f')} |")
        print(lines[-1], flush=True)
    inside = np.array(inside)
    lines += ["", f"Swapped rows inside the core radius: {_med(inside[:, 0], '.2f')}; inside the final radius: "
              f"{_med(inside[:, 1], '.2f')}; their share of the final kernel's weight: {_med(inside[:, 2], '.3f')} "
              "(they are 3 % of the rows)."]
    return lines


def _paper20_ratio(seeds: int, final_quantiles) -> dict:
    from sklearn.covariance import MinCovDet

    def angle(est, true):
        est = est[:3] / np.linalg.norm(est[:3], axis=1, keepdims=True)
        return np.degrees(np.arccos(np.clip(np.abs(np.sum(est * true[:3], axis=1)), 0, 1))).max()

    rows, share = [], []
    for seed in range(seeds):
        s = make_scenario("paper20", n=20_000, p=3, seed=seed)
        mcd = _top(MinCovDet(random_state=0).fit(s.X).covariance_)
        row = [angle(mcd, s.components), angle(_pca(s.X[~s.outliers]), s.components)]
        for q in final_quantiles:
            with mock.patch.object(_robust_sample, "FINAL_QUANTILE", q):
                model, robust, unit = _fit(s.X)
            row.append(angle(model.components_, s.components))
            if q == 0.99:  # the default: the outliers' share of its final kernel's weight
                d2 = _d2(np.ldexp(s.X, -unit), robust.location, robust.scatter)
                w = np.exp(-np.maximum(d2 - robust.final_cutoff, 0) / (2 * robust.kernel_size2))
                share.append(w[s.outliers].sum() / w.sum())
        rows.append(row)
    med = np.median(np.array(rows), axis=0)
    bar = max(med[0], med[1])
    return {q: (med[2 + i], med[2 + i] / bar) for i, q in enumerate(final_quantiles)} | {
        "bar": bar, "share": float(np.median(share))}


FINAL_QUANTILES = (0.95, 0.975, 0.99, 0.995, 0.999)


def final_kernel_table(data, seeds: int, accuracy_seeds: int) -> list[str]:
    paper20 = _paper20_ratio(accuracy_seeds, FINAL_QUANTILES)
    lines = [f"`FINAL_QUANTILE` (the solver itself; 0.99 is the default). p = 3 paper20: {accuracy_seeds} seeds, "
             f"bar = max(MinCovDet, PCA on the clean rows) = {paper20['bar']:.2f} deg; at the default 0.99 the "
             f"outliers (20 % of the rows) carry {paper20['share']:.3f} of the final kernel's weight.", "",
             "| FINAL_QUANTILE | Daphnet, clean vs faulty (deg) | BasicMotions (deg) | p = 3 paper20 angle, ratio |",
             "|---|---|---|---|"]
    for q in FINAL_QUANTILES:
        angles = []
        with mock.patch.object(_robust_sample, "FINAL_QUANTILE", q):
            for name in (DAPHNET, BASIC):
                X = data[name]
                clean = _fit(X)[0].components_
                angles.append([_subspace(clean, _fit(inject_faults(X, s)[0])[0].components_) for s in range(seeds)])
        a, r = paper20[q]
        lines.append(f"| {q} | {_med(angles[0])} | {_med(angles[1])} | {a:.2f}, {r:.2f}x |")
        print(lines[-1], flush=True)
    lines += ["", "Other final weights, emulated in memory from the fitted core (d^2 under the core; rows holding "
              "repeated values left out, as in the solver):", "",
              "| final weight | Daphnet, clean vs faulty (deg) | its clean subspace vs the default's (deg) |",
              "|---|---|---|"]
    X = data[DAPHNET]
    _, rc, uc = _fit(X)
    faulty = [_fit(inject_faults(X, s)[0])[1:] for s in range(seeds)]
    default = _top(_final_variant(X, rc, uc, VARIANTS[0]))
    for kind in VARIANTS:
        ref = _top(_final_variant(X, rc, uc, kind))
        angles = [_subspace(ref, _top(_final_variant(inject_faults(X, s)[0], rf, uf, kind)))
                  for s, (rf, uf) in enumerate(faulty)]
        lines.append(f"| {kind} | {_med(angles)} | {_subspace(ref, default):.1f} |")
        print(lines[-1], flush=True)
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5, help="fault draws (random halves: twice as many)")
    ap.add_argument("--accuracy-seeds", type=int, default=24, help="seeds of the p = 3 paper20 cell")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "dask_mcpca-bench")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "SWAP_DIAGNOSIS.md"))
    args = ap.parse_args(argv)
    data = sensor_data(args.cache)
    sections = [
        ("1. How well the clean recordings determine their top-3 subspace", stability_table(data, args.seeds)),
        ("2. Which fault, and which step of the default", source_table(data, args.seeds)),
        ("3. Can a row statistic tell Daphnet's swapped rows from its clean rows",
         separability_table(data, args.seeds)),
        ("4. The final kernel's radius and shape", final_kernel_table(data, args.seeds, args.accuracy_seeds)),
    ]
    out = [
        "# Why the Daphnet subspace target and the p = 3 paper20 cell are missed (benchmarks/swap_diagnosis.py)",
        "",
        f"Medians over {args.seeds} fault draws of benchmarks/robustness.py (per draw in brackets). "
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; numpy {np.__version__}.",
        f"Command: `python benchmarks/swap_diagnosis.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
        READING,
    ]
    for title, lines in sections:
        out += [f"## {title}", "", *lines, ""]
    Path(args.out).write_text("\n".join(out))


if __name__ == "__main__":
    main()
