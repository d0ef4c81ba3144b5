"""The demo: a synthetic sensor archive, robust vs ordinary PCA, and a PNG report.

The archive (``DIR/sensors.zarr``, one float32 array, rows = time) holds 12
channels driven by 3 latent factors with known loadings, isotropic noise, a
slow cycle, and three kinds of faults, each marked in ``DIR/truth.zarr``
(int8 per row, :data:`KINDS`):

- **spike**: one channel jumps by 10-60 of its standard deviations for 1-3 rows;
- **stuck**: one channel reads a constant (3-6 standard deviations off its
  mean) for a stretch of rows;
- **swapped**: mislabelled rows: for a stretch of rows the logger writes
  pressures P1, P2 under the names P3, P4 and the other way round.  Every
  value stays in its channel's usual range; only the correlations are wrong.

Besides, 0.2 % of the otherwise clean rows have a gap: one channel reads NaN
(a sensor dropout).  They are not faults; the fit leaves them out
(``nan_policy="omit"``) and they get no score.

About 5 % of the rows are faulty.  Ordinary PCA is pulled off the true axes
and its noise floor inflated, so a classical Mahalanobis screen misses most
faults; MCPCA recovers the axes and flags the faulty rows.

The slow cycle moves the first factor only, i.e. along the first true loading,
so the true principal axes of the clean rows are exactly the columns of
:data:`TRUE_LOADINGS` (the noise is isotropic).

The archive is written one store chunk at a time, every chunk from its own
seeded generator, so any number of rows fits in a bounded amount of memory.
:func:`run_demo` then fits :class:`MCPCA` through the threaded dask scheduler,
makes one more pass for ordinary PCA (the covariance), the outlier scores and
the precision / recall counts, prints the comparison and writes
``DIR/report.png``.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import dask
import dask.array as da
import numpy as np
import scipy.linalg

from ._atomic import atomic_path
from ._estimator import MCPCA
from ._schedule import outlier_cutoff_d2

__all__ = ["make_archive", "run_demo", "TRUE_LOADINGS", "CHANNELS", "KINDS"]

#: Channel names: four temperatures, four pressures, four vibration levels.
CHANNELS = ("T1", "T2", "T3", "T4", "P1", "P2", "P3", "P4", "V1", "V2", "V3", "V4")

#: Fault codes of ``truth.zarr`` (0 = clean row).
KINDS = {1: "spike", 2: "stuck", 3: "swapped"}


def _true_loadings() -> np.ndarray:
    # Three readable patterns ("load", "ambient", "flow"), made orthonormal.
    patterns = np.array(
        [
            [1.0, 1.0, 0.9, 0.9, 0.8, 0.8, 0.7, 0.7, 0.5, 0.5, 0.4, 0.4],
            [1.0, 0.9, 1.0, 0.9, 0.0, 0.1, 0.0, -0.1, -1.0, -0.9, -1.0, -0.9],
            [0.0, 0.2, -0.2, 0.0, 1.0, 1.0, -1.0, -1.0, 0.5, -0.5, 0.5, -0.5],
        ]
    ).T
    Q, _ = np.linalg.qr(patterns)
    return Q * np.sign(np.sum(Q * patterns, axis=0))  # each column points along its pattern


#: True loadings, shape (12, 3): orthonormal columns, one per latent factor.
TRUE_LOADINGS = _true_loadings()

#: Standard deviation of each latent factor (before the slow cycle).
FACTOR_SD = np.array([4.0, 2.5, 1.5])
#: Amplitude of the slow cycle added to the first factor (its variance: A^2 / 2).
DRIFT_AMPLITUDE = 3.0
#: Cycles of the slow drift over the archive.
DRIFT_CYCLES = 5
#: Standard deviation of the (isotropic) sensor noise.
NOISE_SD = 0.4
#: Channel offsets (readings are not centred).
OFFSETS = np.array([20.0, 21.0, 22.0, 23.0, 101.0, 102.0, 99.0, 98.0, 5.0, 5.5, 6.0, 6.5])

#: Channel order of a mislabelled row: P1, P2 and P3, P4 exchanged.
SWAP = np.array([0, 1, 2, 3, 6, 7, 4, 5, 8, 9, 10, 11])

#: Rows per store chunk (and per generator seed).
CHUNK_ROWS = 131_072
#: Spike heights, in standard deviations of the channel.
SPIKE_SIZE = (10.0, 60.0)
#: Fraction of rows that start a spike.
SPIKE_RATE = 0.003
#: Stuck stretches and swapped stretches, and the fraction of rows each kind covers.
N_STUCK, STUCK_FRACTION = 4, 0.012
N_SWAPPED, SWAPPED_FRACTION = 3, 0.03

#: Fraction of clean rows with one channel missing (NaN).
GAP_FRACTION = 0.002


def true_variances() -> np.ndarray:
    """Variance of the clean rows along each principal axis (3 factors, then noise)."""
    lam = FACTOR_SD**2 + NOISE_SD**2
    lam[0] += DRIFT_AMPLITUDE**2 / 2
    return np.concatenate([lam, np.full(len(CHANNELS) - 3, NOISE_SD**2)])


def _channel_sd() -> np.ndarray:
    return np.sqrt((TRUE_LOADINGS**2) @ (true_variances()[:3] - NOISE_SD**2) + NOISE_SD**2)


@dataclass
class Faults:
    """The faults of one archive: per kind, arrays of (start, length, channel, value)."""

    spikes: np.ndarray
    stuck: np.ndarray
    swapped: np.ndarray

    def n_rows_of(self, kind: int) -> int:
        ev = {1: self.spikes, 2: self.stuck, 3: self.swapped}[kind]
        return int(ev[:, 1].sum()) if len(ev) else 0


def _stretches(rng, n_rows: int, count: int, fraction: float, taken: list) -> list[tuple[int, int]]:
    """``count`` stretches covering about ``fraction`` of the rows, apart from ``taken``."""
    length = max(1, int(n_rows * fraction / count))
    out = []
    for _ in range(50 * count):
        if len(out) == count or length >= n_rows:
            break
        start = int(rng.integers(0, n_rows - length))
        if all(start + length <= s or start >= s + n for s, n in taken):
            taken.append((start, length))
            out.append((start, length))
    return sorted(out)


def _overlaps(starts: np.ndarray, ends: np.ndarray, stretches: list) -> np.ndarray:
    hit = np.zeros(len(starts), dtype=bool)
    for s, n in stretches:
        hit |= (starts < s + n) & (ends > s)
    return hit


def make_faults(n_rows: int, seed: int) -> Faults:
    """Place the faults of an archive of ``n_rows`` rows (a few per 1000 rows)."""
    rng = np.random.default_rng([seed, 1])
    sd = _channel_sd()
    p = len(CHANNELS)
    taken: list = []
    stuck_at = _stretches(rng, n_rows, N_STUCK, STUCK_FRACTION, taken)
    stuck = [
        (s, n, c, OFFSETS[c] + rng.choice([-1, 1]) * rng.uniform(3, 6) * sd[c])
        for (s, n), c in zip(stuck_at, rng.integers(0, p, len(stuck_at)), strict=True)
    ]
    swapped = [(s, n, -1, 0.0) for s, n in _stretches(rng, n_rows, N_SWAPPED, SWAPPED_FRACTION, taken)]
    starts = np.unique(rng.integers(0, max(1, n_rows - 3), rng.binomial(n_rows, SPIKE_RATE)))
    lengths = rng.integers(1, 4, len(starts))
    ends = starts + lengths
    keep = ~_overlaps(starts, ends, taken)
    keep &= np.concatenate([[True], starts[1:] >= ends[:-1]])  # spikes do not overlap
    channels = rng.integers(0, p, len(starts))
    heights = rng.uniform(*SPIKE_SIZE, len(starts)) * sd[channels]
    values = rng.choice([-1.0, 1.0], len(starts)) * heights
    spikes = np.column_stack([starts, lengths, channels, values])[keep]
    return Faults(spikes=_events(spikes), stuck=_events(stuck), swapped=_events(swapped))


def _events(rows) -> np.ndarray:
    return np.array(rows, dtype=np.float64).reshape(-1, 4)


def _clean_chunk(start: int, stop: int, n_rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 2, start // CHUNK_ROWS])
    n = stop - start
    F = rng.standard_normal((n, 3)) * FACTOR_SD
    t = np.arange(start, stop) / max(n_rows, 1)
    F[:, 0] += DRIFT_AMPLITUDE * np.sin(2 * np.pi * DRIFT_CYCLES * t)
    X = F @ TRUE_LOADINGS.T + rng.standard_normal((n, len(CHANNELS))) * NOISE_SD
    return X + OFFSETS


def _apply_faults(X: np.ndarray, kind: np.ndarray, start: int, faults: Faults) -> None:
    stop = start + len(X)
    for code, events in ((3, faults.swapped), (2, faults.stuck), (1, faults.spikes)):
        for s, n, c, v in events:
            s, e = max(int(s), start), min(int(s + n), stop)
            if s >= e:
                continue
            rows = slice(s - start, e - start)
            if code == 3:
                X[rows] = X[rows][:, SWAP]
            elif code == 2:
                X[rows, int(c)] = v
            else:
                X[rows, int(c)] += v
            kind[rows] = code


def _apply_gaps(X: np.ndarray, kind: np.ndarray, start: int, seed: int) -> None:
    """Sensor dropouts: one channel of a few clean rows reads NaN."""
    rng = np.random.default_rng([seed, 4, start // CHUNK_ROWS])
    rows = np.flatnonzero((kind == 0) & (rng.random(len(X)) < GAP_FRACTION))
    X[rows, rng.integers(0, X.shape[1], len(rows))] = np.nan


def make_archive(directory, *, n_rows: int, seed: int = 0) -> tuple[str, str, Faults]:
    """Write ``sensors.zarr`` and ``truth.zarr`` in ``directory``, one chunk at a time.

    Each store is written to a temporary sibling and renamed into place, so
    an interrupted run never leaves half an archive under the final name.

    Returns
    -------
    sensors_path, truth_path : str
    faults : Faults
    """
    import zarr

    if n_rows < 2:
        raise ValueError(f"demo: --rows must be at least 2; got {n_rows}")
    os.makedirs(directory, exist_ok=True)
    sensors_path = os.path.join(directory, "sensors.zarr")
    truth_path = os.path.join(directory, "truth.zarr")
    faults = make_faults(n_rows, seed)
    p = len(CHANNELS)
    chunk = min(CHUNK_ROWS, n_rows)
    with atomic_path(sensors_path) as tmp_x, atomic_path(truth_path) as tmp_t:
        zx = zarr.create_array(tmp_x, shape=(n_rows, p), chunks=(chunk, p), dtype="float32")
        zt = zarr.create_array(tmp_t, shape=(n_rows,), chunks=(chunk,), dtype="int8")
        zx.attrs.update(channels=list(CHANNELS), description="dask-mcpca demo sensor archive")
        zt.attrs.update(kinds={str(k): v for k, v in KINDS.items()})
        for start in range(0, n_rows, CHUNK_ROWS):
            stop = min(start + CHUNK_ROWS, n_rows)
            X = _clean_chunk(start, stop, n_rows, seed)
            kind = np.zeros(stop - start, dtype=np.int8)
            _apply_faults(X, kind, start, faults)
            _apply_gaps(X, kind, start, seed)
            zx[start:stop] = X.astype(np.float32)
            zt[start:stop] = kind
    return sensors_path, truth_path, faults


# ------------------------------------------------------------- evaluation
def angles_deg(estimated: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Angle between each estimated axis (row) and the true one (column), in degrees."""
    cos = np.abs(np.sum(estimated[: true.shape[1]].T * true, axis=0))
    return np.degrees(np.arccos(np.clip(cos, 0.0, 1.0)))


def subspace_angle_deg(estimated: np.ndarray, true: np.ndarray) -> float:
    """Largest principal angle between the spans of the first k estimated axes and the truth."""
    return float(np.degrees(scipy.linalg.subspace_angles(estimated[: true.shape[1]].T, true).max()))


def _covariance_pass(X: da.Array, shift: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ordinary mean and covariance of the complete rows in one pass (sums about ``shift``)."""
    Y = X.astype(np.float64) - shift
    complete = da.isfinite(Y).all(axis=1)
    Y = da.where(complete[:, None], Y, 0.0)
    s1, s2, n = dask.compute(Y.sum(axis=0), Y.T @ Y, complete.sum())
    mean = s1 / n
    cov = (s2 - n * np.outer(mean, mean)) / (n - 1)
    return mean + shift, cov


def _score_block(X, kind, offset, model, classical, n_keep_by_kind, seed):
    """Counts and a row sample of the outlier scores of one block (one task)."""
    X = np.asarray(X)
    kind = np.asarray(kind)
    flagged = model.is_outlier(X)
    d2 = model.mahalanobis(X)
    mean, prec, cut = classical
    Y = X.astype(np.float64) - mean
    flagged_pca = np.einsum("ij,jk,ik->i", Y, prec, Y) > cut
    counts = np.zeros((2, 4, 2), dtype=np.int64)  # method x kind x (flagged, total)
    for m, f in enumerate((flagged, flagged_pca)):
        for k in range(4):
            sel = kind == k
            counts[m, k] = (f[sel].sum(), sel.sum())
    # Keep every row of a kind with probability n_keep / n_rows_of_that_kind.
    rows = np.arange(offset, offset + len(X))
    u = np.random.default_rng([seed, 3, offset]).random(len(X))
    keep = u < n_keep_by_kind[kind]
    return counts, rows[keep], d2[keep].astype(np.float32), kind[keep]


@dataclass
class DemoResult:
    """What :func:`run_demo` measured (also printed)."""

    n_rows: int
    angles_pca: np.ndarray
    angles_mcpca: np.ndarray
    subspace_pca: float
    subspace_mcpca: float
    variances_true: np.ndarray
    variances_pca: np.ndarray
    variances_mcpca: np.ndarray
    counts: np.ndarray  # method (MCPCA, PCA) x kind (clean, spike, stuck, swapped) x (flagged, total)
    n_passes: int
    seconds: dict
    paths: dict

    def precision_recall(self, method: int = 0) -> tuple[float, float]:
        flagged, total = self.counts[method, :, 0], self.counts[method, :, 1]
        tp = flagged[1:].sum()
        precision = tp / flagged.sum() if flagged.sum() else float("nan")
        recall = tp / total[1:].sum() if total[1:].sum() else float("nan")
        return float(precision), float(recall)


def _evaluate(X, truth_path, model, faults, seed):
    n, p = X.shape
    t = time.perf_counter()
    pca_mean, pca_cov = _covariance_pass(X, model.mean_)
    lam, V = np.linalg.eigh(pca_cov)
    lam, V = lam[::-1], V[:, ::-1]
    V = V * np.sign(V[np.abs(V).argmax(axis=0), np.arange(p)])
    classical = (pca_mean, np.linalg.inv(pca_cov), outlier_cutoff_d2(p))
    # About 20 000 plotted rows per kind, whatever the archive's size.
    n_kind = np.array([n - sum(faults.n_rows_of(k) for k in KINDS)] + [faults.n_rows_of(k) for k in KINDS])
    n_keep = np.minimum(1.0, 20_000 / np.maximum(n_kind, 1))
    truth = da.from_zarr(truth_path).rechunk((X.chunks[0],))
    offsets = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]])
    tasks = [
        dask.delayed(_score_block)(xb, tb, int(off), model, classical, n_keep, seed)
        for xb, tb, off in zip(X.to_delayed()[:, 0], truth.to_delayed(), offsets, strict=True)
    ]
    parts = dask.compute(*tasks)
    counts = sum(part[0] for part in parts)
    sample = tuple(np.concatenate([part[i] for part in parts]) for i in (1, 2, 3))
    return (V.T, lam), counts, sample, time.perf_counter() - t


# ------------------------------------------------------------------ report
_COLORS = {"true": "#222222", "PCA": "#e07b39", "MCPCA": "#2a6fb0"}
_KIND_COLORS = {0: "#b8b8b8", 1: "#d62728", 2: "#9467bd", 3: "#2ca02c"}


def _panel_loadings(ax, i: int, result: DemoResult, pca_components, mcpca_components) -> None:
    x = np.arange(len(CHANNELS))
    true = TRUE_LOADINGS[:, i]
    for j, (name, v) in enumerate((("true", true), ("PCA", pca_components[i]), ("MCPCA", mcpca_components[i]))):
        v = v * (np.sign(v @ true) or 1.0)  # an axis has no sign: show it the way the truth points
        ax.bar(x + (j - 1) * 0.27, v, 0.27, color=_COLORS[name], label=name)
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(x, CHANNELS, fontsize=8)
    ax.set_ylim(-0.75, 0.75)
    ax.set_title(
        f"component {i + 1}: angle to truth\nPCA {result.angles_pca[i]:.1f}°   MCPCA {result.angles_mcpca[i]:.2f}°"
    )
    if i == 0:
        ax.set_ylabel("loading")
        ax.legend(loc="lower left", fontsize=8, frameon=False, ncol=3)


def _panel_variances(ax, result: DemoResult) -> None:
    k = np.arange(1, len(CHANNELS) + 1)
    ax.bar(k - 0.2, result.variances_pca, 0.4, color=_COLORS["PCA"], label="PCA")
    ax.bar(k + 0.2, result.variances_mcpca, 0.4, color=_COLORS["MCPCA"], label="MCPCA (robust)")
    ax.scatter(
        k, result.variances_true, marker="_", s=400, color=_COLORS["true"], lw=2.5, zorder=3, label="true (clean rows)"
    )
    ax.set_yscale("log")
    ax.set_xticks(k)
    ax.set_xlabel("component")
    ax.set_ylabel("explained variance (log)")
    ax.set_title("explained variance: PCA's noise floor is inflated by the faults")
    ax.legend(fontsize=8, frameon=False)


def _panel_flagged(ax, result: DemoResult) -> None:
    labels = ["all faults", *KINDS.values(), "false alarms\n(clean rows)"]
    xs = np.arange(len(labels))
    for j, (name, m) in enumerate((("PCA (classical Mahalanobis)", 1), ("MCPCA is_outlier", 0))):
        flagged, total = result.counts[m, :, 0], np.maximum(result.counts[m, :, 1], 1)
        shares = [flagged[1:].sum() / total[1:].sum(), *(flagged[k] / total[k] for k in KINDS), flagged[0] / total[0]]
        bars = ax.bar(xs + (j - 0.5) * 0.4, np.array(shares) * 100, 0.4, color=_COLORS["PCA" if m else "MCPCA"],
                      label=name)
        for bar, share in zip(bars, shares, strict=True):
            text = f"{share:.0%}" if share >= 0.01 or share == 0 else f"{share:.2%}"
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + 1.5, text, ha="center", fontsize=7.5)
    ax.set_xticks(xs, labels, fontsize=9)
    ax.set_ylim(0, 132)  # room for the legend above the bars
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylabel("rows flagged (%)")
    precision, recall = result.precision_recall(0)
    ax.set_title(
        f"rows flagged as outliers (d² > {outlier_cutoff_d2(len(CHANNELS)):.1f})\n"
        f"MCPCA: precision {precision:.1%}, recall {recall:.1%}"
    )
    ax.legend(fontsize=8, frameon=False, loc="upper center", ncol=2)


def _panel_scores(ax, result: DemoResult, sample) -> None:
    import matplotlib.ticker

    rows, d2, kind = sample
    scored = np.isfinite(d2)  # rows with a gap have no score
    rows, d2, kind = rows[scored], d2[scored], kind[scored]
    cut = outlier_cutoff_d2(len(CHANNELS))
    for k in (0, 1, 2, 3):  # clean rows first, faults drawn on top
        sel = kind == k
        n_total = result.counts[0, k, 1]
        shown = f"{sel.sum():,} of {n_total:,}" if sel.sum() < n_total else f"{n_total:,}"
        ax.scatter(
            rows[sel], np.maximum(d2[sel], 1e-2), s=2 if k == 0 else 4, color=_KIND_COLORS[k],
            alpha=0.5 if k == 0 else 0.8, lw=0, rasterized=True,
            label=f"{KINDS.get(k, 'clean')} ({shown} rows)",
        )
    ax.axhline(cut, color="black", lw=1, ls="--", label=f"is_outlier threshold d² = {cut:.1f}")
    ax.set_yscale("log")
    ax.set_xlim(0, result.n_rows)
    ax.set_ylim(1e-1, max(float(d2.max()) if len(d2) else cut, cut) * 30)  # room for the legend
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_xlabel("row (time)")
    ax.set_ylabel("robust squared distance d²")
    ax.set_title("outlier score of each row over time, coloured by the generator's truth")
    ax.legend(fontsize=8, markerscale=4, loc="upper left", ncol=5, frameon=True, framealpha=0.9)


def _plot(path, result: DemoResult, pca_components, model, sample, seed) -> None:
    """The PNG report: loadings, explained variance, rows flagged, scores over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.gridspec import GridSpec

    style = {"font.size": 10, "axes.titlesize": 11, "axes.spines.top": False, "axes.spines.right": False}
    with plt.rc_context(style):
        fig = plt.figure(figsize=(15, 11.5), dpi=110)
        gs = GridSpec(3, 6, figure=fig, height_ratios=[1.0, 1.0, 1.15], hspace=0.5, wspace=0.9, top=0.9, bottom=0.05)
        faulty = result.counts[0, 1:, 1].sum() / result.n_rows
        fig.suptitle(
            f"dask-mcpca demo: {result.n_rows:,} rows x {len(CHANNELS)} sensor channels, 3 latent factors, "
            f"{faulty:.1%} faulty rows (seed {seed})",
            fontsize=13,
            y=0.965,
        )
        for i in range(3):
            _panel_loadings(fig.add_subplot(gs[0, 2 * i : 2 * i + 2]), i, result, pca_components, model.components_)
        _panel_variances(fig.add_subplot(gs[1, 0:3]), result)
        _panel_flagged(fig.add_subplot(gs[1, 3:6]), result)
        _panel_scores(fig.add_subplot(gs[2, :]), result, sample)
        fig.savefig(path, bbox_inches="tight")
        plt.close(fig)


# --------------------------------------------------------------------- run
def _table(result: DemoResult) -> str:
    lines = [
        f"{'component':>9}  {'true var':>9}  {'PCA var':>9}  {'MCPCA var':>9}  {'PCA angle':>9}  {'MCPCA angle':>11}"
    ]
    for i in range(3):
        lines.append(
            f"{i + 1:>9}  {result.variances_true[i]:>9.3f}  {result.variances_pca[i]:>9.3f}  "
            f"{result.variances_mcpca[i]:>9.3f}  {result.angles_pca[i]:>8.2f}°  {result.angles_mcpca[i]:>10.2f}°"
        )
    noise = slice(3, None)
    lines.append(
        f"{'4-12':>9}  {result.variances_true[noise].mean():>9.3f}  {result.variances_pca[noise].mean():>9.3f}  "
        f"{result.variances_mcpca[noise].mean():>9.3f}  {'(mean noise variance)':>22}"
    )
    lines.append(
        f"{'subspace':>9}  {'':>9}  {'':>9}  {'':>9}  {result.subspace_pca:>8.2f}°  {result.subspace_mcpca:>10.2f}°"
        "   (largest principal angle, 3 components)"
    )
    return "\n".join(lines)


def _outlier_table(result: DemoResult) -> str:
    kinds = "".join(f"  {name:>8}" for name in KINDS.values())
    lines = [f"{'':>28}  {'precision':>9}  {'recall':>7}{kinds}  {'false alarms':>12}"]
    for name, m in (("MCPCA is_outlier", 0), ("PCA (classical Mahalanobis)", 1)):
        prec, rec = result.precision_recall(m)
        flagged, total = result.counts[m, :, 0], result.counts[m, :, 1]
        per_kind = "".join(f"  {flagged[k] / max(total[k], 1):>8.1%}" for k in KINDS)
        lines.append(f"{name:>28}  {prec:>9.1%}  {rec:>7.1%}{per_kind}  {flagged[0]:>12,}")
    return "\n".join(lines)


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
        ``report.png`` (created; those four are replaced).
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

    (pca_components, pca_var), counts, sample, seconds["evaluate"] = _evaluate(X, truth, model, faults, seed)
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
    )
    say("Principal axes vs the generator's true loadings (angles in degrees)")
    say(_table(result) + "\n")
    say(f"Outliers: rows with d^2 above the chi-square(12) 99.9 % quantile ({outlier_cutoff_d2(len(CHANNELS)):.1f})")
    say(_outlier_table(result) + "\n")
    t = time.perf_counter()
    _plot(result.paths["report"], result, pca_components, model, sample, seed)
    seconds["report"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t0
    say(f"report written to {result.paths['report']} ({seconds['total']:.1f} s in all)")
    say(
        f"next: dask-mcpca fit {sensors} --nan-policy omit   |   "
        f"dask-mcpca score {sensors} --model {model_path} --output scores.zarr"
    )
    return result
