"""The demo's synthetic sensor archive and its truth (see :mod:`dask_mcpca.demo`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .._atomic import atomic_path

__all__ = [
    "make_archive",
    "make_faults",
    "true_variances",
    "Faults",
    "TRUE_LOADINGS",
    "CHANNELS",
    "KINDS",
    "CHUNK_ROWS",
]

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
