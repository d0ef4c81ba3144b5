"""The documentation's measured figures (``docs/*.md``): where each span's value lives.

:data:`DOCS_FIGURES` maps a span's name to its :class:`_figure.Figure`, grouped
by page (archives, monitoring, comparison, report, algorithm, performance);
``benchmarks/_front.py`` merges them into its ``FIGURES`` and fills the spans.
"""

from __future__ import annotations

import re

from _figure import (
    ACCURACY,
    ATTRIBUTION,
    BIG_ROWS,
    CELLS,
    GROUP,
    NUM,
    RESULTS,
    ROBUST,
    ROBUST_ROWS,
    SCENARIOS,
    Figure,
    column_pattern,
    percent,
    speed_section,
)

__all__ = ["DOCS_FIGURES"]

_XARRAY = "benchmarks/XARRAY_PATH.md"
_MISSING = "benchmarks/MISSING.md"
_GAPS = (("generated 200k x 10", "partial"),)
_FAULTS = ("spike", "stuck", "drift", "bias")
#: The generated attribution cells but the stuck sensor of a near-duplicate pair (no per-row rule names it).
_SINGLE = tuple((s, f) for s in SCENARIOS for f in _FAULTS if (s, f) != (SCENARIOS[1], "stuck"))
_REAL_STUCK = (("BasicMotions", "stuck"), ("Daphnet S06R02E0", "stuck"))
_CLIP = "follows the factors", "clipped (3 %)"
_NOISE = "mostly its own noise"
_MEASURES = ("wall", "compute", "CPU")

_MONITOR = "benchmarks/MONITORING.md"
#: A seed's row of the plant archive's stuck-after-fit table: recall now, before, then four more numbers.
_PLANT_SEED = r"(?m)^\| \d \| {} \| {} \|(?: [\d.]+ \|){{4}}$"


_SWAP = "benchmarks/SWAP_DIAGNOSIS.md"
_REAL = {"bm": "BasicMotions", "daphnet": "Daphnet S06R02E0"}
_METHODS = {"": "MCPCA", "-mcd": "MinCovDet"}
_F1_SETS = {"outliers": (("hbk", "75 x 3"), ("wood", "20 x 6"), ("starsCYG", "47 x 2"), ("bushfire", "38 x 5")),
            "small": (("stackloss", "21 x 4"), ("Animals (log)", "28 x 2"), ("salinity (X1-X3)", "28 x 3"),
                      ("delivery (n.prod, distance)", "25 x 2"))}
_SMALL_SIZES = (("20", "5"), ("40", "8"), ("100", "20"), ("20", "8"))
_OTHER_WEIGHTS = ("Huber: min(1, q_core / d2)", "Huber: min(1, q_final / d2)", "min(1, sqrt(q_core / d2))",
                  "flat top to q_core, fall-off c2 = 20", "flat top to q_core, fall-off c2 = 60")


def _robust_figures() -> dict[str, Figure]:
    """comparison.md's table of ROBUSTNESS.md: each real recording's flags, recalls and angles; the classic sets."""
    figs = {}
    for tag, data in _REAL.items():
        for m, method in _METHODS.items():
            row = ((data, method),)
            figs[f"rob-{tag}-flagged{m}"] = percent(ROBUST, None, row, 2)
            figs[f"rob-{tag}-false{m}"] = percent(ROBUST, None, row, 3)
            figs[f"rob-{tag}-recall{m}"] = Figure(ROBUST, None, row, (4, 5, 7), "{:.2f}")
            figs[f"rob-{tag}-angle{m}"] = Figure(ROBUST, None, row, (8,), "{:.1f}")
        for m, method in (("pca", "PCA"), ("robpca", "ROBPCA"), ("spherical", "spherical PCA")):
            figs[f"rob-{tag}-angle-{m}"] = Figure(ROBUST, None, ((data, method),), (8,), "{:.1f}")
        figs[f"rob-{tag}-swap"] = Figure(ROBUST, None, ((data, "MCPCA"),), (6,), "{:.2f}")
    for name, sets in _F1_SETS.items():
        for m, method in _METHODS.items():
            figs[f"rob-f1-{name}{m}"] = Figure(ROBUST, None, tuple((*d, method) for d in sets), (6,), "", ", ")
    for m, method in (*_METHODS.items(), ("-robpca", "ROBPCA"), ("-pca", "PCA")):
        figs[f"rob-grid{m}"] = Figure(ROBUST, None, pattern=rf"\*\*{method}\*\*: under 10 deg in (\d+) of")
    for m, method in _METHODS.items():
        rows = tuple((*size, method) for size in _SMALL_SIZES)
        figs[f"rob-small-median{m}"] = percent(ROBUST, None, rows, 3, 0, spread=True)
        figs[f"rob-small-worst{m}"] = percent(ROBUST, None, rows, 4, 1 if m == "" else 0, spread=True)
    return figs


def _accuracy_figures() -> dict[str, Figure]:
    """comparison.md's summary of ACCURACY.md: clean-data ratios per p, the missed cell, the variances."""
    figs = {f"acc-clean-p{p}": Figure(ACCURACY, None, pattern=rf"p={p} clean: .*PCA [\d.]+ deg \(ratio ([\d.]+)\)")
            for p in (3, 10, 50)}
    figs["acc-missed"] = Figure(ACCURACY, None, template="{0}° against MinCovDet's {1}° ({2}x",
                                pattern=r"p=3 paper20: default ([\d.]+) deg, best robust peer ([\d.]+) deg, "
                                        r"bar [\d.]+ deg \(ratio ([\d.]+)\)")
    ps = ("3", "10", "50")
    default = "MCPCA default"
    figs["acc-var-outliers"] = Figure(ACCURACY, None, tuple((p, s, default) for p in ps for s in
                                                             ("orthogonal10", "cluster10", "cluster25")),
                                      (5,), "{:.2f}", spread=True)
    figs["acc-var-paper20"] = Figure(ACCURACY, None, (("3", "paper20", default),), (5,), "{:.2f}")
    figs["acc-var-t3"] = Figure(ACCURACY, None, tuple((p, "t3", default) for p in ps), (5,), "{:.2f}", spread=True)
    figs["acc-var-t3-mcd"] = Figure(ACCURACY, None, tuple((p, "t3", "MinCovDet") for p in ps), (5,), "{:.2f}",
                                    spread=True)
    return figs


def _swap_figures() -> dict[str, Figure]:
    """comparison.md's summary of SWAP_DIAGNOSIS.md: why Daphnet's subspace and the p = 3 paper20 cell are missed."""
    share = {"d2": ("d^2 under the core", "d^2 under the fitted model (`mahalanobis`)"),
             "cellwise": ("largest cellwise residual, fitted model",), "ddc": ("DDC row statistic (robpy)",),
             "test": ("gain in d^2 from swapping a pair back (knows the fault)",)}
    figs = {f"swap-above-{k}": percent(_SWAP, None, tuple((r,) for r in rows), 2, 0, spread=True)
            for k, rows in share.items()}
    for name, row in (("alone", "swap rows only"), ("dropped", "all four faults, swapped rows dropped"),
                      ("spike-dropped", "all four faults, swapped and spike rows dropped")):
        figs[f"swap-{name}"] = Figure(_SWAP, None, ((row,),), (1,), "{:.1f}")
    figs |= {
        "swap-inside": Figure(_SWAP, None, fmt="{:.0f}", scale=100, pattern=r"inside the final radius: ([\d.]+)"),
        "swap-eig": Figure(_SWAP, None, pattern=r"\| Daphnet S06R02E0 \| [\d.]+, [\d.]+, ([\d.]+),"),
        "swap-halves": Figure(_SWAP, None, pattern=r"\| Daphnet S06R02E0 \| [^|]+ \| ([\d.]+), "),
        "swap-copies": Figure(_SWAP, None, (("Daphnet S06R02E0",),), (4,), "{:.1f}"),
        "swap-narrow": Figure(_SWAP, None, (("0.975",),), (1,), "{:.1f}"),
        "swap-weights": Figure(_SWAP, None, tuple((w,) for w in _OTHER_WEIGHTS), (1,), "{:.1f}", spread=True),
        "swap-frozen": Figure(_SWAP, None, template="{1}°; now {0}°",
                              pattern=r"alone it turns the\s+subspace ([\d.]+-[\d.]+) deg; [\d.]+-([\d.]+) deg before"),
        "swap-paper20": Figure(_SWAP, None, pattern=r"\| 0\.99 \| [^|]+ \| [^|]+ \| [\d.]+, ([\d.]+)x \|"),
        "swap-paper20-weight": Figure(_SWAP, None, fmt="{:.0f}", scale=100,
                                      pattern=r"carry ([\d.]+) of the final kernel's weight"),
        "swap-radius95": Figure(_SWAP, None, template="{1}x, and turn Daphnet's subspace {0}°",
                                pattern=r"\| 0\.95 \| ([\d.]+) \([^|]+ \| [^|]+ \| [\d.]+, ([\d.]+)x \|"),
        "rob-frozen-draws": Figure(ROBUST, None, fmt="{:.2f}", spread=True,
                                   pattern=r"([\d.]+)(?=(?:, [\d.]+)*; top-3 subspace)"),
    }
    return figs


_DRIFT = "benchmarks/DRIFT.md"
_REPORT_ROWS = {"1m": "1,000,000", "100m": "100,000,000"}
_BEFORE_CAP = r"before \(every one of the ([\d.]+) million events formatted into the CSV\) \| [\d.]+ \| ([\d.]+) \|"


def _report_figures() -> dict[str, Figure]:
    """report.md's figures from DRIFT.md: the report's time and memory against `score`, the drift windows."""
    figs = {f"report-{tag}-{what}": Figure(_DRIFT, None, ((rows, "`dask-mcpca report --window 1000000`"),), (col,),
                                           "{:.0f}" if what == "mib" else "")
            for tag, rows in _REPORT_ROWS.items() for what, col in (("s", 2), ("mib", 4))}
    return figs | {
        "report-ratio": Figure(_DRIFT, None, template="{1} and {0}",
                               pattern=r"Time at 100M rows: \*\*([\d.]+)x\*\* one `score`.*?; ([\d.]+)x at 1M rows"),
        "report-memory": Figure(_DRIFT, None, pattern=r"Peak memory at 100M rows: \d+ / \d+ MiB = \*\*([\d.]+)x\*\*"),
        "report-events": Figure(_DRIFT, None, pattern=_BEFORE_CAP),
        "report-uncapped": Figure(_DRIFT, None, fmt="{:.1f}", template="{1}", pattern=_BEFORE_CAP),
        "drift-stationary": Figure(_DRIFT, None, pattern=r"at most \*\*(\d+)\*\* in a seed"),
        "drift-regime": Figure(_DRIFT, None, pattern=r"at least \*\*(\d+ of \d+)\*\* in a seed"),
        "drift-appended": Figure(_DRIFT, None, pattern=r"appended weeks, windows called drift: \*\*(\d+ of \d+)\*\*"),
        "drift-angles": Figure(_DRIFT, None, pattern=r"it is (\d+-\d+) degrees on ordinary days"),
    }


_HEAVY = "benchmarks/HEAVY_TAILS.md"
_SHIFT = "benchmarks/SHIFT.md"
#: SHIFT.md's row for a bias of ``{}`` conditional SDs: recall, the row distance's recall, rows flagged after it.
_SHIFT_ROW = r"(?m)^\| {} \| [\d.]+ \(([\d.]+-[\d.]+)\) \| [\d.]+ \(([\d.]+-[\d.]+)\) \| \d+ \((\d+-\d+)\) \|$"
#: ROBUSTNESS.md's NYC bias row with every component kept (scale None): recall, its worst position.
_NYC_BIAS = (r"(?m)^\| NYC weather 2013, raw units \| wind_speed \(mph\) \| None \| None \| [\d.]+ \| "
             r"([\d.]+) \(([\d.]+)\) \| ([\d.]+) \(([\d.]+)\) \|")
_BM_ACTIVITIES = tuple(f"BasicMotions, {a}" for a in ("standing", "running", "walking", "badminton"))
_ADC_REGIME = "MCPCA flags ([\\d.]+)% of the rows at rest and ([\\d.]+)% of the moving ones"


def _flagged(data: str, size: str, when: str, digits: int = 1) -> Figure:
    """HEAVY_TAILS.md: the share of ``data``'s normal rows flagged by MCPCA ``when`` (before, after), in percent."""
    return percent(_HEAVY, None, ((data, size, f"MCPCA {when}"),), 3, digits)


#: The data sets of ROBUSTNESS.md's unit table.
_UNIT_DATA = ("BasicMotions", "Daphnet S06R02E0", "generated factor data (5 % outliers)",
              "generated tight factors (5 % cross-channel faults)")


def _algorithm_figures() -> dict[str, Figure]:
    """algorithm.md's figures: the kernel's profile, the heavy-tailed cutoff's before and after, quantized channels."""
    daphnet, bleeding = ("Daphnet S06R02E0", "7040 x 9"), ("KDD-TSAD 135 InternalBleeding16 (lags 0-3)", "7498 x 4")
    figs = {f"heavy-{tag}": Figure(_HEAVY, None, ((*data, "MCPCA before"), (*data, "MCPCA after")), (3,), "{:.1f}",
                                   " % → ", scale=100)
            for tag, data in (("daphnet", daphnet), ("t3", ("multivariate t, 3 dof", "20000 x 6")),
                              ("t5", ("multivariate t, 5 dof", "20000 x 6")))}
    figs |= {f"heavy-bm-{when}": percent(_HEAVY, None, tuple((a, "2000 x 6", f"MCPCA {when}") for a in _BM_ACTIVITIES),
                                      3, spread=True) for when in ("before", "after")}
    figs |= {
        "heavy-bleeding-before": _flagged(*bleeding, "before"),
        "heavy-bleeding-after": _flagged(*bleeding, "after", 2),
        "heavy-gauss-before": _flagged("Gaussian (control)", "20000 x 6", "before", 2),
        "heavy-gauss-after": _flagged("Gaussian (control)", "20000 x 6", "after", 2),
        "heavy-daphnet-q": Figure(_HEAVY, None, ((*daphnet, "MCPCA after"),), (7, 6), "{:,.0f}", " (cutoff now "),
        "heavy-standing-q": Figure(_HEAVY, None, (("BasicMotions, standing", "2000 x 6", "MCPCA after"),), (7, 6),
                                   "{:,.0f}", " ("),
        "heavy-trade": Figure(_HEAVY, None, template="{0} and {2} of the injected spikes (8-15 sd on one channel) "
                                                     "found, against {1} and {3}",
                              pattern=r"\| Daphnet S06R02E0 \| \d+ \| \d+ \| ([\d.]+) \| ([\d.]+) \|\n"
                                      r"\| BasicMotions, standing \| \d+ \| \d+ \| ([\d.]+) \| ([\d.]+) \|"),
        "heavy-tried": Figure(_HEAVY, None, template="{0} % on them but drop spike recall to {1}",
                              pattern=r"reach ([\d.]+-[\d.]+) % on the recordings "
                                      r"but leave ([\d.]+-[\d.]+) of the spikes"),
        "heavy-paper20": Figure(_HEAVY, None, template="{0} to {1}",
                                pattern=r"widen the cutoff: recall ([\d.]+) -> ([\d.]*\d)"),
        "heavy-spike-after": Figure(_HEAVY, None, tuple((d, "after") for d in (daphnet[0], *_BM_ACTIVITIES)), (3,),
                                    "{:.2f}", spread=True),
        "heavy-spike-before": Figure(_HEAVY, None, tuple((d, "before") for d in (daphnet[0], *_BM_ACTIVITIES)), (3,),
                                     "{:.2f}", spread=True),
        "heavy-nyc": Figure(_HEAVY, None, template="{1} recall ({0} before; false alarms {3} %, {2} % before; with "
                                                   "`n_components=2` {4} either way)",
                            pattern=r"recall ([\d.]+) -> ([\d.]+), false alarms ([\d.]+) % -> ([\d.]+) %; "
                                    r"with n_components=2: ([\d.]+) both"),
        "heavy-mixture-recall": Figure(_HEAVY, None, template="{1}, {0} before",
                                       pattern=r"spike recall ([\d.]+) -> ([\d.]+) on seed"),
        "heavy-mixture-clean": Figure(_HEAVY, None, template="{0} % to {1}",
                                      pattern=r"clean rows flagged ([\d.]+-[\d.]+) % -> ([\d.]+-[\d.]+) %"),
        "heavy-missing": Figure(_HEAVY, None, template="stuck {0} → {1}, bias {2} → {3}, spike {4} → {5} "
                                                       "(false alarms {6} % → {7} %)",
                                pattern=r"single faulty cells: stuck ([\d.]+) -> ([\d.]+), bias ([\d.]+) -> ([\d.]+), "
                                        r"spike ([\d.]+) -> ([\d.]+); false alarms ([\d.]+) % -> ([\d.]+) %"),
        "heavy-ecg": Figure(_HEAVY, None, pattern=r"lag-embedded ECG \((\d+) % of normal rows flagged"),
        "kernel-numpy": Figure(RESULTS, None, fmt="{:.1f}", spread=True, divide=(1, 0),
                               pattern=r"\| default radii \(chi-square 97\.5 % and 99 %\) \| \*\*([\d.]+)\*\* \| "
                                       r"[\d.]+ \| ([\d.]+) \|"),
        "kernel-xtx": Figure(RESULTS, None, fmt="{:.1f}", spread=True,
                             pattern=r"one sweep at the default radii / `X.T @ X` in memory: ([\d.]+)x"),
        "full-passes-20m": Figure(RESULTS, speed_section("float64"), (("MCPCA().fit(store) (auto)",),), (4,)),
        "full-passes-100m": Figure(RESULTS, "scaling", (("100,000,000",),), (6,)),
        "rob-stuck-frozen": Figure(ROBUST, None, ROBUST_ROWS, (5, 7), "{:.2f}", spread=True),
        "adc-rest": Figure(ROBUST, None, (("ADC at rest, noise 0.3 steps",),), (1,), "{:.0f}", scale=100),
        "adc-moving": Figure(ROBUST, None, fmt="{:.0f}", template="{1}", pattern=_ADC_REGIME),
        "adc-moving-all": percent(ROBUST, None, (("ADC at rest, noise 0.3 steps, moving 20 %",),), 1, 0),
        "adc-resting": Figure(ROBUST, None, fmt="{:.1f}", template="{0}", pattern=_ADC_REGIME),
        "adc-wide": Figure(ROBUST, None, pattern=r"The moving rows spread (\d+) times as wide"),
        "adc-mcd": Figure(ROBUST, None, pattern=r"MinCovDet \(chi-square 99\.8 %\) [\d.]+% and ([\d.]+)%"),
        "adc-contamination": Figure(ROBUST, None, pattern=r"`MCPCA\(contamination=0\.01\)` flags ([\d.]+)%"),
    }
    # ROBUSTNESS.md's unit table, column "agreement, worst of the factor sets", scale=None with 2 components
    figs["units-k2-worst"] = percent(ROBUST, None, tuple((d, "None", "2") for d in _UNIT_DATA), 3, spread=True)
    return figs


_ROUNDS = r" ([\d.]+) \(rounds ([\d.]+-[\d.]+)\)"
_FIT_ROW = (("MCPCA().fit(store) (auto)",),)
_SCORE_ROW = (("`score` (default: `monitoring`, float32)",),)
_SCORE_FLOOR = "score-floor-20000000x10-float64"
_MIB_ROWS = (("1,000,000",), ("8,000,000",), ("32,000,000",), ("100,000,000",))
_PROCESS_ROW = (("`dask-mcpca fit STORE`, as a process",),)
_SCORE_ALL_ROW = (("`score --outputs all --dtype float64`",),)
#: A speed table's row: its median, then its min-max (the median a group or not, as ``{1}`` says).
_MEDIAN_RANGE = r"\| {0} \| {1} \| ([\d.]+)-([\d.]+) \|"


def _floor_figures(section: str, tag: str) -> dict[str, Figure]:
    """performance.md's table of the fit against its floor: one column, from one speed section of RESULTS.md."""
    ratio = {"pass": "mcpca_pass / xtx", "fit": "mcpca_fit / xtx", "process": "mcpca_fit_process / xtx",
             "daskml": "mcpca_fit / daskml_pca"}
    figs = {f"floor-{tag}-{k}": Figure(RESULTS, section, template="{0} ({1})", pattern=re.escape(name) + _ROUNDS)
            for k, name in ratio.items()}
    return figs | {
        f"floor-{tag}-xtx-s": Figure(RESULTS, section, fmt="{:.2f}", template="{0} ({1}-{2})",
                                     pattern=_MEDIAN_RANGE.format(r"`\(X\.T @ X\)\.compute\(\)` \(dask\)", GROUP)),
        f"floor-{tag}-fit-s": Figure(RESULTS, section, _FIT_ROW, (1,), "{:.2f}"),
        f"floor-{tag}-fit-range": Figure(RESULTS, section, fmt="{:.2f}", template="{0}-{1}",
                                         pattern=_MEDIAN_RANGE.format(r"MCPCA\(\)\.fit\(store\) \(auto\)", NUM)),
        f"floor-{tag}-passes": Figure(RESULTS, section, _FIT_ROW, (4,)),
        f"floor-{tag}-process-s": Figure(RESULTS, section, _PROCESS_ROW, (1,), "{:.2f}"),
        f"floor-{tag}-mcd": Figure(RESULTS, section, fmt="{:.0f}",
                                   pattern=r"MinCovDet / MCPCA, in memory on 200,000 rows: \*\*([\d.]+)\*\*"),
    }


def _performance_figures() -> dict[str, Figure]:
    """performance.md's figures from RESULTS.md: the floor, the malloc, memory and time against n, workers, score."""
    figs = {}
    for dtype in ("float64", "float32"):
        short = dtype[-2:]
        figs |= _floor_figures(speed_section(dtype), f"f{short}m")
        figs |= _floor_figures(f"speed-20000000x10-{dtype}", f"f{short}g")
    floors = ("m", f"{_SCORE_FLOOR}-console-malloc"), ("g", _SCORE_FLOOR), ("2m", "score-floor-2000000x10-float64")
    for tag, section in floors:
        figs |= {
            f"score-{tag}-s": Figure(RESULTS, section, _SCORE_ROW, (1,), "{:.2f}"),
            f"score-{tag}-ratios": Figure(RESULTS, section, _SCORE_ROW, (4, 5), "{:.2f}", "x the copy and "),
            f"score-{tag}-copy-s": Figure(RESULTS, section, (("copy (floor)",),), (1,), "{:.2f}"),
            f"score-{tag}-xtx-s": Figure(RESULTS, section, (("`(X.T @ X).compute()`",),), (1,), "{:.2f}"),
            f"score-{tag}-all": Figure(RESULTS, section, _SCORE_ALL_ROW, (4,), "{:.2f}"),
        }
    workers = {(w, m): ((w, m),) for w in ("1", "2") for m in ("glibc's defaults", "the command's setting")}
    return figs | {
        "malloc-faults": Figure(RESULTS, None, template="{0} pages, spent {1} s in the kernel against {2} s of its "
                                                         "own work, and took {3} s",
                                pattern=r"made\s+([\d,]+) minor faults and spent ([\d.]+-[\d.]+) s of system time "
                                        r"against ([\d.]+) s of user time, and took\s+([\d.]+-[\d.]+) s"),
        "malloc-peak": Figure(RESULTS, "memory-x10", BIG_ROWS[:2], (10,), "{:.0f}", spread=True),
        "malloc-peak-100m": Figure(RESULTS, "memory-x10", BIG_ROWS[2:], (10,), "{:.0f}"),
        "malloc-100m-s": Figure(RESULTS, "memory-x10", BIG_ROWS[2:], (12, 8), "{:.1f}", " s instead of "),
        **{f"workers-{w}-{'cmd' if m.startswith('the') else 'glibc'}-{what}": Figure(RESULTS, "worker-malloc", row,
                                                                                   (col,), "{:.2f}")
           for (w, m), row in workers.items() for what, col in (("fit", 3), ("xtx", 2))},
        **{f"workers-peak-{tag}": Figure(RESULTS, "worker-malloc", tuple((w, m) for w in "12"), (5,), "{:.0f}",
                                         spread=True)
           for tag, m in (("glibc", "glibc's defaults"), ("cmd", "the command's setting"))},
        "memory-1m": Figure(RESULTS, "memory-x10", (("1,000,000",),), (4,), "{:.0f}"),
        "memory-malloc-all": Figure(RESULTS, "memory-x10", _MIB_ROWS[:3], (10,), "{:.0f}", ", "),
        "memory-f32": Figure(RESULTS, "scaling", (("20,000,000", "float32"), ("100,000,000", "float32")), (9,),
                             "{:.0f}", " and "),
        "memory-imports": Figure(RESULTS, "scaling", (("20,000,000", "float32"),), (10,), "{:.0f}"),
        "memory-wide": Figure(RESULTS, "memory-x300-float32", (("1,000,000",), ("10,000,000",)), (4,), "{:.0f}",
                              " and "),
        "memory-wide-ratio": Figure(RESULTS, "memory-x300-float32", (("10,000,000",),), (7,)),
        "scaling-f64-small": Figure(RESULTS, "scaling", (("1,000,000", "float64"), ("5,000,000", "float64")), (5,),
                                    "{:.2f}", " and "),
        "scaling-f64-20m": Figure(RESULTS, "scaling", (("20,000,000", "float64"),), (5,), "{:.2f}"),
        "scaling-f32": Figure(RESULTS, "scaling", (("20,000,000", "float32"), ("100,000,000", "float32")), (5,),
                              "{:.2f}", " at 20M and "),
        "scaling-f32-100m-s": Figure(RESULTS, "scaling", (("100,000,000", "float32"),), (3,), "{:.1f}"),
        "scaling-f32-100m-passes": Figure(RESULTS, "scaling", template="{0} full passes plus {1} of 100 blocks",
                                          pattern=r"\| 100,000,000 \| float32 \| 100 \| [\d.]+ \| [\d.]+ \| [\d.]+ \| "
                                                  r"(\d+) \| \d+ \((\d+)\)"),
        "scaling-workers": Figure(RESULTS, "scaling", (("1",), ("2",)), (1,), "{:.1f}", " and "),
        "scaling-threads": Figure(RESULTS, "scaling", (("threads (2)",),), (1,), "{:.1f}"),
        "report-mib": Figure(RESULTS, "report-memory-x6-float32", _MIB_ROWS[:1] + (("10,000,000",),) + _MIB_ROWS[3:],
                             (4,), "{:.0f}", " / "),
        "report-mib-before": Figure(RESULTS, "report-memory-x6-float32", template="{0} / {1} / {2}",
                                    pattern=r"([\d,]+), ([\d,]+) and ([\d,]+) MiB\s+at 1M, 10M and 100M rows"),
        "report-score": Figure(RESULTS, "report-speed",
                               template="{2}x one `dask-mcpca score` of the store ({1} s vs {0} s",
                               pattern=r"(?s)\| `dask-mcpca score` \| ([\d.]+) \|.*"
                                       r"\| `dask-mcpca report` \| ([\d.]+) \|.*"
                                       r"report / score: \*\*([\d.]+)\*\*"),
    }


_WORKERS = "benchmarks/WORKERS.md"
_WIDE_ROWS = {"p100": "factor 200k x 100 float32, Zarr", "p300": "factor 200k x 300 float32, Zarr"}
_P_ROWS = tuple((p, "200,000") for p in ("10", "100", "300", "500"))
_PROFILE_TIMES = (r"(?s)`X\.T @ X` on the same rows: \*\*([\d.]+) ms\*\*.*?"
                  r"\| default radii \(chi-square 97\.5 % and 99 %\) \| \*\*[\d.]+\*\* \| [\d.]+ \| ([\d.]+) \|")


def _workers_cell(shape: str, method: str, workers: int, col: int) -> str:
    """A pattern for cell ``col`` of WORKERS.md's row (method, workers) under the ``### shape`` heading."""
    return rf"(?s)### {re.escape(shape)}\n.*?\| {re.escape(method)} \| {workers} \|(?:[^|\n]*\|){{{col - 2}}} ([\d.]+)"


def _scaling_figures() -> dict[str, Figure]:
    """performance.md's kernel, gaps at wide p, per-pass bytes and workers' figures."""
    figs = {}
    for dtype in ("float64", "float32"):
        sec, row = f"profile-10-{dtype}", (("default radii (chi-square 97.5 % and 99 %)",),)
        figs[f"kernel-{dtype}"] = Figure(RESULTS, sec, row, (1, 3), "{:.1f}", " ms instead of ")
        figs[f"kernel-{dtype}-two"] = Figure(RESULTS, sec, row, (2,), "{:.1f}")
        figs[f"kernel-{dtype}-xtx"] = Figure(RESULTS, sec, pattern=r"in memory: ([\d.]+)x")
    figs["kernel-numpy-xtx"] = Figure(RESULTS, None, fmt="{:.1f}", spread=True, divide=(1, 0), pattern=_PROFILE_TIMES)
    for tag, row in _WIDE_ROWS.items():
        figs[f"gaps-{tag}"] = Figure(_MISSING, "partial-wide", ((row,),), (4, 5), "{:.1f}", spread=True)
        figs[f"gaps-{tag}-rows"] = Figure(_MISSING, "partial-wide", ((row,),), (1,))
    figs["gaps-before"] = Figure(_MISSING, "partial-wide", fmt="{:.1f}", template="{0}x and {1}x",
                                 pattern=r"partial / complete ([\d.]+) at p = 100, ([\d.]+) at p = 300")
    one = (("1",),)
    ks = (("300", "None"), ("300", "10"), ("300", "50"))
    figs |= {
        "wide-k-recall-300": Figure(RESULTS, "wide-components", ks, (7,), "{:.2f}"),
        "wide-k-alarms-300": Figure(RESULTS, "wide-components", ks, (6,), "{:.4f}"),
        "wide-k-cells-300": Figure(RESULTS, "wide-components", ks, (8,), "{:.3f}"),
        "wide-k-breakdown-300": Figure(RESULTS, "wide-components", ks, (9,)),
        "wide-k-recall-1000": Figure(RESULTS, "wide-components", tuple(("1000", k) for _, k in ks), (7,), "{:.2f}"),
        "wide-k-alarms-1000": Figure(RESULTS, "wide-components", tuple(("1000", k) for _, k in ks), (6,), "{:.4f}"),
        "wide-k-client-1000": Figure(RESULTS, "wide-components", (("1000", "None"), ("1000", "10")), (3,), "{:.1f}",
                                     " s and "),
        "wide-k-judge": Figure(RESULTS, "wide-components", (("300", "None"), ("300", "10"), ("1000", "None"),
                                                            ("1000", "10")), (5,), "{:.2f}"),
        "pass-block-mib": Figure(RESULTS, "per-pass", fmt="{:.0f}", pattern=r"full pass \(([\d.]+) MiB each\)"),
        "pass-block-result": Figure(RESULTS, "per-pass", one, (5,), "{:.1f}"),
        "pass-result": Figure(RESULTS, "per-pass", one, (6,), "{:.0f}"),
        **{f"pass-moved-{w}": Figure(RESULTS, "per-pass", ((w,),), (8,), "{:.0f}") for w in "24"},
        "pass-transfers": Figure(RESULTS, "per-pass", template="{0} and {1}",
                                 pattern=r"\((\d+) transfers\) \| [\d.]+ KiB \|\n\| 4 \|.*\((\d+) transfers\)"),
        "pass-tasks": Figure(RESULTS, "per-pass", one, (4,)),
        **{f"pass-fit-s-{w}": Figure(RESULTS, "per-pass", ((w,),), (1,), "{:.2f}") for w in "124"},
        "workers-peak-all": Figure(RESULTS, "worker-malloc", (), fmt="{:.0f}", spread=True,
                                   pattern=r"(?m)^\| \d \| [^|]+ \| [^|]+ \| [^|]+ \| [^|]+ \| (\d+) \|"),
        "client-p": Figure(RESULTS, "scaling", _P_ROWS, (7,), "{:.2f}", spread=True),
        "client-p-all": Figure(RESULTS, "scaling", (*_P_ROWS, ("1000", "200,000")), (7,), "{:.2f}", spread=True),
        "client-p-1000": Figure(RESULTS, "scaling", (("1000", "200,000"),), (7,), "{:.2f}"),
        # scaling-wide (200,000 float64 rows): CPU fit / X^T X pass, the passes in X^T X passes, non-pass s
        "wide-cpu": Figure(RESULTS, "scaling-wide", (("10",), ("100",), ("300",), ("1000",)), (6,), "{:.2f}", ", "),
        "wide-cpu-before": Figure(RESULTS, "scaling-wide", (("300 before",), ("1000 before",)), (6,), "{:.2f}",
                                  " and "),
        "wide-in-passes": Figure(RESULTS, "scaling-wide", (("300",), ("1000",)), (9,), "{:.2f}", " and "),
        "wide-nonpass-1000": Figure(RESULTS, "scaling-wide", (("1000",),), (10, 3), "{:.1f}", " s of "),
        # scaling-wide-1m (1M float64 rows): fit / X^T X pass with the bulk's kept sums, and weighing every row
        "wide-1m": Figure(RESULTS, "scaling-wide-1m", (("100",), ("300",), ("1000",)), (5,), "{:.2f}", ", "),
        "wide-1m-before": Figure(RESULTS, "scaling-wide-1m", (("100 before",), ("300 before",), ("1000 before",)),
                                 (5,), "{:.2f}", ", "),
        "wide-1m-nonpass-1000": Figure(RESULTS, "scaling-wide-1m", (("1000",),), (11,), "{:.2f}"),
        # bulk-block: a later pass's blocks, and every row weighed, over X.T @ X (2 threads, in memory)
        "bulk-later": Figure(RESULTS, "bulk-block", (("100",), ("300",), ("1000",)), (8,), "{:.2f}", ", "),
        "bulk-every": Figure(RESULTS, "bulk-block", (("100",), ("300",), ("1000",)), (6,), "{:.2f}", ", "),
        "bulk-collect": Figure(RESULTS, "bulk-block", (("100",), ("300",), ("1000",)), (7,), "{:.2f}", ", "),
        # profile-wide: a robust step's float64 block at p = 300, CPU over X.T @ X: now, before, the two products
        **{f"wide-block-300{tag}": Figure(RESULTS, "profile-wide", (("300", "33,333", "float64"),), (col,), "{:.2f}")
           for tag, col in (("", 8), ("-before", 9), ("-floor", 10))},
    }
    shapes = {"10": "20,000,000 x 10 float32", "100": "2,000,000 x 100 float32"}
    for p, shape in shapes.items():
        for method, tag in (("X^T X pass", "xtx"), ("MCPCA().fit", "fit"), ("dask-ml PCA", "daskml")):
            cells = {"1": (1, 2), "2": (2, 2), "speedup": (2, 3)}  # seconds on 1 and 2 workers, the speed-up at 2
            figs |= {f"wk-{p}-{tag}-{k}": Figure(_WORKERS, None, fmt="{:.2f}", pattern=_workers_cell(shape, method, *c))
                     for k, c in cells.items()}
    for w in (1, 2):
        figs[f"wk-100-fit-passes-{w}"] = Figure(_WORKERS, None, fmt="{:.1f}",
                                                pattern=_workers_cell(shapes["100"], "MCPCA().fit", w, 5))
    figs["wk-100-fit-speedup-short"] = Figure(_WORKERS, None, fmt="{:.1f}",
                                              pattern=_workers_cell(shapes["100"], "MCPCA().fit", 2, 3))
    return figs


#: The documentation's figures (docs/*.md), by page.
DOCS_FIGURES: dict[str, Figure] = {
    # archives.md
    "xarray-ratio": Figure(_XARRAY, "after", tuple((c, m) for c in ("`fit`", "`score`") for m in _MEASURES),
                           (4,), "{:.2f}", spread=True),
    "attr-recon": percent(ATTRIBUTION, None, _SINGLE, 6, 0, spread=True),
    "attr-recon-pair": percent(ATTRIBUTION, None, ((SCENARIOS[1], "stuck"),), 6),
    "attr-whitened": percent(ATTRIBUTION, None, tuple((s, f) for s in SCENARIOS for f in _FAULTS), 4, 0, spread=True),
    "attr-named-stuck": percent(ATTRIBUTION, None, tuple((s, "stuck") for s in SCENARIOS), 7, spread=True),
    "attr-named-real-stuck": percent(ATTRIBUTION, None, _REAL_STUCK, 7),
    "attr-recon-real-stuck": percent(ATTRIBUTION, None, _REAL_STUCK, 6, spread=True),
    "missing-p10": Figure(_MISSING, None, (("factor 50k x 10", "90 % of rows, random"),), (6, 5), "{:.2f}",
                          " against "),
    "missing-p30": Figure(_MISSING, None, (("factor 100k x 30", "90 % of rows, random"),), (6, 5), "{:.2f}",
                          " against "),
    "missing-em-inflation": Figure(_MISSING, None, pattern=r"about x([\d.]+-[\d.]+) at 90 % of rows with the gap"),
    "missing-wide-ratio": Figure(_MISSING, "partial-wide", (("factor 200k x 100 float32, Zarr",),), (4,), "{:.1f}"),
    "missing-wide-before": Figure(_MISSING, None, pattern=r"went from ([\d.]+)x to [\d.]+x the complete fit"),
    "missing-angle": Figure(_MISSING, None, _GAPS, (2,)),
    "missing-recall": Figure(_MISSING, None, _GAPS, (4, 5, 6), "{:.2f}", spread=True),
    "missing-false": percent(_MISSING, None, _GAPS, (7, 8), 2, " % there against "),
    "missing-passes": Figure(_MISSING, None, _GAPS, (9,)),
    "missing-time": Figure(_MISSING, None, pattern=r"gave ratios of ([\d.]+) \(200k x 10\)"),
    "cells-stuck-offline": Figure(CELLS, None, (("400",),), (1, 2), "{:.2f}", ", named "),
    "clip-unlearned": Figure(CELLS, None, fmt="{:.2f}", scale=100, template="{0} % of the time against {1} %",
                             pattern=r"were flagged ([\d.]+) against ([\d.]+) for the others"),
    "clip-factors": percent(CELLS, None, (_CLIP,), 2, 2),
    "clip-factors-before": percent(CELLS, None, (_CLIP,), 3, 2),
    "clip-pooled": Figure(CELLS, None, ((_CLIP[0], "clipped / the others, draws 1-6 pooled"),), (2,), "{:.2f}"),
    "clip-noise": percent(CELLS, None, ((_NOISE, "clipped (3 %)"), (_NOISE, "the others")), 2, 2, " % against "),
    # monitoring.md
    "update-angle": Figure(_MONITOR, None, fmt="{:.2f}", pattern=r"Worst over all: angle ([\d.]+) deg"),
    "update-var": Figure(_MONITOR, None, fmt="{:.1f}",
                         pattern=r"variance difference [\d.]+ % \(top 3\), ([\d.]+) % \(all\)"),
    "update-var-gaussian": Figure(_MONITOR, None, fmt="{:.2f}", spread=True,
                                  pattern=column_pattern("clean|paper5|orthogonal10|cluster10", 4)),
    "update-agree": Figure(_MONITOR, None, fmt="{:.2f}", pattern=r"flags agree on ([\d.]+) % of the rows"),
    "update-s": Figure(_MONITOR, None, fmt="{:.2f}", spread=True, pattern=column_pattern(r"\w+", 8)),
    "update-fit-s": Figure(_MONITOR, None, fmt="{:.1f}", spread=True, pattern=column_pattern(r"\w+", 9)),
    "stuck-after-fit": Figure(_MONITOR, None, fmt="{:.3f}", spread=True, pattern=_PLANT_SEED.format(GROUP, NUM)),
    "stuck-after-fit-was": Figure(_MONITOR, None, fmt="{:.2f}", spread=True, pattern=_PLANT_SEED.format(NUM, GROUP)),
    "append-ratio": Figure(_MONITOR, None, pattern=r"Append / full: \*\*([\d.]+)\*\*"),
    "shift-1sd": Figure(_SHIFT, None, pattern=_SHIFT_ROW.format(1), template="{0} of its rows, where the row "
                        "distance finds {1}"),
    "shift-half-sd": Figure(_SHIFT, None, pattern=_SHIFT_ROW.format(0.5), template="{0}"),
    "shift-after": Figure(_SHIFT, None, pattern=_SHIFT_ROW.format(2), template="{2}"),
    "shift-clean": Figure(_SHIFT, None, pattern=r"rows flagged by the shift rule alone: ([\d.]+-[\d.]+)"),
    "shift-real": Figure(_SHIFT, None, spread=True, fmt="{:.4f}",
                         pattern=r"(?m)^\| (?:NYC|BasicMotions|Daphnet)[^|]*\| [\d,]+ x \d+ \| [\d.]+ \| ([\d.]+) \|$"),
    "shift-nyc": Figure(ROBUST, None, pattern=_NYC_BIAS,
                        template="{0} (worst position {1}), false alarms {2} ({3} at most)"),
    # comparison.md
    **_robust_figures(),
    **_accuracy_figures(),
    **_swap_figures(),
    # report.md
    **_report_figures(),
    # algorithm.md
    **_algorithm_figures(),
    # performance.md
    **_performance_figures(),
    **_scaling_figures(),
}
