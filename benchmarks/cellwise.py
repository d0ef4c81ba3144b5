"""Cells you cannot trust (issue 33): a wide factor-model archive whose cells glitch one by one.

Each cell is replaced, with probability ``eps`` and independently per channel,
by a value 8-20 channel standard deviations off (sign at random), so a share
``1 - (1 - eps)^p`` of the rows holds at least one bad cell.  The channels are
standardised (the truth is known in those units): a 5-factor model with factor
standard deviations 10 to 4 and unit noise.  For each setting the methods run
in turn on the same data (one run, alternated):

- classical PCA (scikit-learn),
- ``MCPCA()``, the default row-wise robust fit,
- ``MCPCA(cellwise=True)``,
- robpy's DDC (cells flagged, then imputed) followed by PCA,
- robpy's ROBPCA (row-wise),
- scikit-learn's MinCovDet (p <= 30).

Reported: the top-5 subspace's largest principal angle to the truth, the
largest relative error of the top-5 variances, the share of bad cells named
and of clean cells named (methods with per-cell output), the share of rows
flagged, and the fit time.  ``oracle`` is classical PCA of the same rows
before the glitches: the sampling error that no method can beat.

Three more tables, for the issue's other targets:

- **A saturating channel** (40,000 rows x 16, 3 strong factors, one channel
  clipped at its 97th percentile; the channel mostly its own noise, or
  following the factors): the share of clipped rows flagged by ``MCPCA()``,
  against the other rows and against the same rows before the clipping.
- **A sensor stuck while another channel is offline** (20,000 x 8, channel 0
  offline over 30 %% of the rows in stretches, channel 3 stuck at a
  plausible value for 400 rows that all lie in an offline stretch): recall of
  its rows and the share where ``top_channel`` names channel 3.
- **Real recordings** (aeon's BasicMotions and Daphnet, faults injected as in
  ``robustness.py``, 5 draws): ``MCPCA()`` against ``MCPCA(cellwise=True)``:
  rows flagged on the clean recording, rows holding a flagged cell on it,
  false alarms and recall per fault kind on the faulty copies (a row found:
  flagged, or holding a flagged cell), and the top-3 subspace's move
  between the clean and the faulty fit.  This decides the default.

- **p = 300 at 100,000 rows**, where the sampling error is small enough to
  check a 1 degree target (at 20,000 rows PCA of the clean rows is itself
  1.9 degrees off).

Run: ``python benchmarks/cellwise.py [--n 20000] [--quick] [--wide-only]``;
writes ``benchmarks/CELLWISE.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # robustness.py: the real recordings and faults

from dask_mcpca import MCPCA
from dask_mcpca.testing import clipped_channel, stuck_in_outage

RESULTS = Path(__file__).resolve().parent / "CELLWISE.md"
K = 5


def archive(n: int, p: int, eps: float, seed: int = 0):
    """Rows, the true top-K basis and variances, the clean rows and the mask of bad cells."""
    rng = np.random.default_rng(seed)
    L = np.linalg.qr(rng.standard_normal((p, K)))[0]
    sv = np.linspace(10, 4, K)
    clean = (rng.standard_normal((n, K)) * sv) @ L.T + rng.standard_normal((n, p))
    sd = np.sqrt((L**2 * sv**2).sum(axis=1) + 1)
    clean /= sd
    bad = rng.random((n, p)) < eps
    X = clean.copy()
    X[bad] = rng.uniform(8, 20, bad.sum()) * rng.choice([-1, 1], bad.sum())
    S = ((L * sv**2) @ L.T + np.eye(p)) / np.outer(sd, sd)
    w, V = np.linalg.eigh(S)
    return X, V[:, ::-1][:, :K], w[::-1][:K], clean, bad


def angle(A: np.ndarray, B: np.ndarray) -> float:
    s = np.linalg.svd(np.linalg.qr(A)[0].T @ np.linalg.qr(B)[0], compute_uv=False)
    return float(np.degrees(np.arccos(np.clip(s.min(), -1.0, 1.0))))


def _eig(S: np.ndarray):
    w, V = np.linalg.eigh(S)
    return V[:, ::-1][:, :K], w[::-1][:K]


def run_pca(X):
    from sklearn.decomposition import PCA

    m = PCA(K).fit(X)
    return m.components_.T, m.explained_variance_, None, None


def run_mcpca(X, cellwise: bool):
    m = MCPCA(cellwise=cellwise, random_state=0).fit(X)
    cells = np.asarray(m.cell_outliers(X)) if cellwise else None
    return m.components_[:K].T, m.explained_variance_[:K], cells, np.asarray(m.is_outlier(X))


def run_ddc_pca(X):
    import pandas as pd
    from robpy.outliers import DDC
    from sklearn.decomposition import PCA

    frame = pd.DataFrame(X)  # robpy's DDC takes a DataFrame only
    ddc = DDC().fit(frame)
    cells = np.asarray(ddc.cellwise_outliers_, bool)
    imputed = np.asarray(ddc.impute(frame))
    m = PCA(K).fit(imputed)
    return m.components_.T, m.explained_variance_, cells, None


def run_robpca(X):
    from robpy.pca import ROBPCA

    m = ROBPCA(n_components=K).fit(X)
    comps = np.asarray(m.components_)
    comps = comps if comps.shape[0] == X.shape[1] else comps.T
    return comps[:, :K], np.asarray(m.explained_variance_)[:K], None, None


def run_mcd(X):
    from sklearn.covariance import MinCovDet

    m = MinCovDet(random_state=0).fit(X)
    V, w = _eig(m.covariance_)
    return V, w, None, np.asarray(m.mahalanobis(X) > 0)


METHODS = {
    "PCA": run_pca,
    "MCPCA()": lambda X: run_mcpca(X, False),
    "MCPCA(cellwise=True)": lambda X: run_mcpca(X, True),
    "DDC + PCA (robpy)": run_ddc_pca,
    "ROBPCA (robpy)": run_robpca,
    "MinCovDet": run_mcd,
}


def _clipped_rows(own_noise: bool):
    """Flags of ``MCPCA()`` before and after the clipping of :func:`dask_mcpca.testing.clipped_channel`,
    the oracle's flags after it, the clipped rows' mask, and the learned limit and the clip."""
    X, clipped, sat, limit = clipped_channel(own_noise=own_noise)
    before = np.asarray(MCPCA().fit(X).is_outlier(X))
    model = MCPCA().fit(clipped)
    after = np.asarray(model.is_outlier(clipped))
    return before, after, _oracle_flags(X, sat), sat, model.saturation_limits_[2, 1], limit


def _oracle_flags(X: np.ndarray, sat: np.ndarray, channel: int = 2, q: float = 0.998) -> np.ndarray:
    """What the rows' true law flags after the clipping: the mean and covariance of the clean rows
    (no fault in them), each row's squared Mahalanobis distance against the chi-square ``q`` quantile,
    a clipped row's on its other channels (the censored cell left out, as a missing one)."""
    from scipy import stats

    mu, S = X.mean(axis=0), np.cov(X, rowvar=False)
    other = np.arange(X.shape[1]) != channel

    def d2(Y, C):
        return np.einsum("ij,ij->i", Y, np.linalg.solve(C, Y.T).T)

    full = d2(X - mu, S) > stats.chi2.ppf(q, X.shape[1])
    censored = d2(X[:, other] - mu[other], S[np.ix_(other, other)]) > stats.chi2.ppf(q, X.shape[1] - 1)
    return np.where(sat, censored, full)


SATURATION_BEGIN, SATURATION_END = "## A saturating channel", "## A sensor stuck while another"


def saturation_table() -> list[str]:
    lines = [
        "## A saturating channel (40,000 x 16, 3 factors, one channel clipped at its 97th percentile)",
        "",
        "| clipped channel | rows | flagged by `MCPCA()` | the same rows before the clipping | "
        "the oracle, clipped cell left out | learned limit (the clip) |",
        "|---|---|---|---|---|---|",
    ]
    for own_noise, what in ((True, "mostly its own noise"), (False, "follows the factors")):
        before, flags, oracle, sat, learned, limit = _clipped_rows(own_noise)
        ratios = " | ".join(f"{f[sat].mean() / f[~sat].mean():.2f}" for f in (flags, before, oracle))
        pooled = _pooled_ratio(own_noise)
        lines += [f"| {what} | clipped (3 %) | {flags[sat].mean():.4f} | {before[sat].mean():.4f} | "
                  f"{oracle[sat].mean():.4f} | {learned:.4f} ({limit:.4f}) |",
                  f"| {what} | the others | {flags[~sat].mean():.4f} | {before[~sat].mean():.4f} | "
                  f"{oracle[~sat].mean():.4f} | |",
                  f"| {what} | clipped / the others | {ratios} | |",
                  f"| {what} | clipped / the others, draws 1-{POOLED_DRAWS} pooled | {pooled:.2f} | | | |"]
    lines += [
        "",
        "A reading at the limit is judged as censored (`_censored`): the row's distance with the quantity at its "
        "most plausible value at or beyond the limit, less what any reading beyond the limit costs on its own. "
        "Where the clipped channel follows the factors, its top 3 % are the factors' tail: judged on the other "
        "cells alone (the oracle's column, the clean rows' own mean and covariance, chi-square 99.8 %), those "
        "rows are flagged about three times as often as the others, as they were before any clipping. Being at "
        "the limit is ordinary for such a channel, so what the limit itself costs is not counted against the "
        "row; the distance past it is, so a process excursion that the limit hides is still seen, and so is a "
        "fault on another channel or a reading at the limit that the other channels place far inside the range "
        "(tests/test_quantized.py). Issue 33's target, clipped rows flagged within 2x of the others: met in "
        "every row of the table. Before the limits were learned (the code before commit c58e36a) the clipped "
        "rows of the second archive were flagged 0.0692 against 0.0019 for the others; with the cell left out "
        "(before commit 2c1d436), 3.36x; judged given the quantity without charging the distance past the "
        "limit (2c1d436, which forgave excursions), 1.09x over the same draws.",
        "",
    ]
    return lines


#: Draws pooled for the ratio of the saturation table (about 1,200 clipped rows each).
POOLED_DRAWS = 6


def _pooled_ratio(own_noise: bool) -> float:
    """The share of clipped rows flagged by ``MCPCA()`` over that of the others, draws pooled."""
    at_limit, others = [], []
    for seed in range(1, POOLED_DRAWS + 1):
        _, clipped, sat, _ = clipped_channel(own_noise=own_noise, seed=seed)
        flags = np.asarray(MCPCA().fit(clipped).is_outlier(clipped))
        at_limit.append(flags[sat])
        others.append(flags[~sat])
    return float(np.concatenate(at_limit).mean() / np.concatenate(others).mean())


def stuck_in_gaps_table() -> list[str]:
    X, stuck = stuck_in_outage()
    model = MCPCA(nan_policy="partial").fit(X)
    flags = np.asarray(model.is_outlier(X))
    top = np.asarray(model.score_rows(X, outputs=("top_channel",))["top_channel"])
    return [
        "## A sensor stuck while another channel is offline (20,000 x 8, `nan_policy=\"partial\"`)",
        "",
        "| stuck rows (all with channel 0 offline) | recall | `top_channel` names the stuck channel | "
        "false alarms, other rows |",
        "|---|---|---|---|",
        f"| {stuck.sum()} | {flags[stuck].mean():.3f} | {(top[stuck] == 3).mean():.3f} | "
        f"{flags[~stuck].mean():.4f} |",
        "",
    ]


def real_table(seeds: int = 5) -> list[str]:
    import robustness as R

    cache = Path.home() / ".cache" / "dask_mcpca-bench"
    lines = [
        "## Real recordings: the default fit against `cellwise=True` (faults injected as in robustness.py)",
        "",
        "| data | fit | rows flagged, clean | rows with a flagged cell, clean | false alarms (rows / rows or "
        "cells) | " + " | ".join(f"recall {k} (rows / rows or cells)" for k in R.FAULTS) + " | subspace move (deg) |",
        "|---|---|---|---|---|" + "---|" * len(R.FAULTS) + "---|",
    ]
    clean_shares = {}  # (recording, cellwise) -> (clean rows flagged, clean rows with a flagged cell)
    for name, X in R.sensor_data(cache).items():
        for cellwise in (False, True):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                clean = MCPCA(cellwise=cellwise).fit(X)
                clean_cells = np.asarray(clean.cell_outliers(X)).any(axis=1)
                clean_rows = np.asarray(clean.is_outlier(X))
                rows = []
                for seed in range(seeds):
                    Xf, kinds = R.inject_faults(X, seed)
                    m = MCPCA(cellwise=cellwise).fit(Xf)
                    flagged = np.asarray(m.is_outlier(Xf))
                    found = flagged | np.asarray(m.cell_outliers(Xf)).any(axis=1)
                    rows.append([flagged[kinds == ""].mean(), found[kinds == ""].mean(),
                                 *[v for k in R.FAULTS for v in (flagged[kinds == k].mean(), found[kinds == k].mean())],
                                 R._subspace(clean.components_, m.components_)])
            med = np.median(np.array(rows), axis=0)
            recall = " | ".join(f"{med[2 + 2 * i]:.3f} / {med[3 + 2 * i]:.3f}" for i in range(len(R.FAULTS)))
            lines.append(f"| {name} | {'cellwise' if cellwise else 'default'} | {clean_rows.mean():.4f} | "
                         f"{clean_cells.mean():.4f} | {med[0]:.4f} / {med[1]:.4f} | {recall} | {med[-1]:.2f} |")
            print(lines[-1], flush=True)
            clean_shares[name, cellwise] = (clean_rows.mean(), clean_cells.mean())
    per_recording = "; ".join(
        f"{name}: cells in {clean_shares[name, True][1]:.3f} of the clean rows against "
        f"{clean_shares[name, False][1]:.3f}, rows {clean_shares[name, True][0]:.4f} against "
        f"{clean_shares[name, False][0]:.4f}" for name in dict.fromkeys(n for n, _ in clean_shares))
    lines += [
        "",
        "The cell flags of the default fit are those of `cell_outliers` under the row-wise model (the "
        "chi-square(1) 99.9 % cutoff). On these recordings (several activities, heavy tails), a cellwise fit "
        f"flags cells in more of the clean rows than the default's model does ({per_recording}): `cellwise` "
        "stays off by default, and a row-wise fit that finds no clean majority says so (`BreakdownWarning`) "
        "and names it.",
        "",
    ]
    return lines


WIDE_BEGIN, WIDE_END = "<!-- begin wide -->", "<!-- end wide -->"
BREAKS_BEGIN, BREAKS_END = "<!-- begin breaks -->", "<!-- end breaks -->"


def _replace_section(text: str, begin: str, end: str, section: str, *, after: str | None = None) -> str:
    """``text`` with the section between the markers replaced, or inserted after the line ``after``
    (else at the end)."""
    if begin in text:
        head, rest = text.split(begin, 1)
        return head + section + rest.split(end, 1)[1]
    if after is not None and after in text:
        i = text.index(after) + len(after)
        return text[:i] + "\n\n" + section + text[i:]
    return text.rstrip("\n") + "\n\n" + section + "\n"


def breaks_table(text: str) -> str:
    """Where each method breaks, from the grid's rows of a results file: per p, the smallest eps at
    which it no longer holds (angle <= oracle + 1 deg and variances within 10 %)."""
    holds: dict[str, dict[int, list[tuple[float, str]]]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 10 or not cells[0].isdigit() or cells[8] not in ("yes", "no"):
            continue
        p, eps, name = int(cells[0]), float(cells[1].rstrip("%")), cells[3]
        holds.setdefault(name, {}).setdefault(p, []).append((eps, cells[8]))
    ps = sorted({p for per in holds.values() for p in per})
    out = [BREAKS_BEGIN, "## Where each method breaks (the grid above)", "",
           "| method | " + " | ".join(f"p = {p}" for p in ps) + " |", "|---|" + "---|" * len(ps)]
    for name, per in holds.items():
        row = []
        for p in ps:
            runs = sorted(per.get(p, []))
            broken = [e for e, ok in runs if ok == "no"]
            row.append("—" if not runs else (f"at eps = {min(broken):g} %" if broken else
                                               f"holds to {runs[-1][0]:g} %"))
        out.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join([*out, BREAKS_END])


def wide_table(n: int = 100_000) -> list[str]:
    """p = 300 with 100,000 rows, where PCA of the clean rows is within 0.9 deg of the truth (at 20,000 rows
    it is 1.9 deg off: the grid above cannot show a 1 deg target there)."""
    import dask.array as da

    lines = [WIDE_BEGIN, f"## p = 300 at {n:,} rows (chunks of 20,000)", "",
             "| eps | rows with a bad cell | oracle | `MCPCA()` | `MCPCA(cellwise=True)` | its variances | "
             "cells named (bad / clean) | passes | time (s) |", "|---|---|---|---|---|---|---|---|---|"]
    for eps in (0.005, 0.01, 0.02, 0.05):
        X, V, lam, clean, bad = archive(n, 300, eps)
        oracle = angle(V, run_pca(clean)[0])
        data = da.from_array(X, chunks=(20_000, 300))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            default = MCPCA(random_state=0).fit(data)
            t = time.perf_counter()
            m = MCPCA(cellwise=True, random_state=0).fit(data)
            dt = time.perf_counter() - t
        cells = np.asarray(m.cell_outliers(X))
        var = float(np.max(np.abs(m.explained_variance_[:K] / lam - 1)))
        lines.append(f"| {eps:.1%} | {bad.any(axis=1).mean():.0%} | {oracle:.2f} | "
                     f"{angle(V, default.components_[:K].T):.2f} | {angle(V, m.components_[:K].T):.2f} | {var:.1%} | "
                     f"{cells[bad].mean():.3f} / {cells[~bad].mean():.4f} | {m.n_passes_} | {dt:.0f} |")
        print(lines[-1], flush=True)
    lines += ["", "The peers are left out here: robpy's DDC took 40 s at 20,000 x 100 and is in memory only.",
              WIDE_END]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true", help="p = 30 and 100 only, eps = 1 and 5 %%")
    parser.add_argument("--wide-only", action="store_true",
                        help="only the p = 300 table at 100,000 rows, replaced in the existing results file")
    parser.add_argument("--saturation-only", action="store_true",
                        help="only the saturating channel's table, replaced in the existing results file")
    args = parser.parse_args()
    if args.saturation_only:
        head, rest = RESULTS.read_text().split(SATURATION_BEGIN, 1)
        tail = SATURATION_END + rest.split(SATURATION_END, 1)[1]
        RESULTS.write_text(head + "\n".join(saturation_table()) + "\n" + tail)
        return
    if args.wide_only:
        text = _replace_section(RESULTS.read_text(), WIDE_BEGIN, WIDE_END, "\n".join(wide_table()))
        RESULTS.write_text(_replace_section(text, BREAKS_BEGIN, BREAKS_END, breaks_table(text),
                                            after="## A saturating channel"))
        return
    ps = (30, 100) if args.quick else (30, 100, 300)
    epss = (0.01, 0.05) if args.quick else (0.005, 0.01, 0.02, 0.05)
    lines = [
        "# Cells you cannot trust (benchmarks/cellwise.py)",
        "",
        f"Command: `python benchmarks/cellwise.py --n {args.n}{' --quick' if args.quick else ''}`; 2-core machine; "
        "seed 0. Angle: largest principal angle of the top-5 subspace to the truth (deg); var: largest "
        "relative error of the top-5 variances; cells named: share of bad cells flagged / share of clean "
        "cells flagged; rows: share of rows flagged as outliers. `oracle` is PCA of the same rows before "
        "the glitches. A method 'holds' at angle <= oracle + 1 deg and var <= 10 %.",
        "",
        "| p | eps | rows with a bad cell | method | angle | var | cells named (bad / clean) | rows flagged | "
        "holds | time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in ps:
        for eps in epss:
            X, V, lam, clean, bad = archive(args.n, p, eps)
            oracle = angle(V, run_pca(clean)[0])
            share = bad.any(axis=1).mean()
            lines.append(f"| {p} | {eps:.1%} | {share:.0%} | oracle (clean rows, PCA) | {oracle:.2f} | | | | | |")
            for name, func in METHODS.items():
                if name == "MinCovDet" and p > 30:
                    continue
                t = time.perf_counter()
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        comps, var, cells, rows = func(X)
                except Exception as err:  # a peer that fails is reported, not fatal
                    lines.append(f"| {p} | {eps:.1%} | {share:.0%} | {name} | failed: {type(err).__name__} | | | | | |")
                    print(lines[-1], err, flush=True)
                    continue
                dt = time.perf_counter() - t
                a = angle(V, comps)
                v = float(np.max(np.abs(np.asarray(var)[:K] / lam - 1)))
                named = "—" if cells is None else f"{cells[bad].mean():.3f} / {cells[~bad].mean():.4f}"
                flagged = "—" if rows is None else f"{rows.mean():.3f}"
                holds = "yes" if a <= oracle + 1 and v <= 0.10 else "no"
                lines.append(f"| {p} | {eps:.1%} | {share:.0%} | {name} | {a:.2f} | {v:.1%} | {named} | {flagged} | "
                             f"{holds} | {dt:.1f} |")
                print(lines[-1], flush=True)
    lines += ["", *saturation_table(), *stuck_in_gaps_table(), *real_table(), *([] if args.quick else wide_table())]
    text = "\n".join(lines) + "\n"
    RESULTS.write_text(_replace_section(text, BREAKS_BEGIN, BREAKS_END, breaks_table(text)))


if __name__ == "__main__":
    main()
