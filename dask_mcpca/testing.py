"""Generated data with known truth, for the tests and the benchmarks (as ``numpy.testing``).

Importable by both (``from dask_mcpca.testing import make_scenario``), so the
tests do not reach into ``benchmarks/``.

Inliers are Gaussian with eigenvalues ``10 * 0.7**i`` along a random
orthonormal basis, centred away from the origin.  Each scenario replaces a
fraction of the rows by a kind of contamination (issue 4):

==============  ==========================================================
clean           no contamination
paper5/paper20  5 % / 20 % of rows from N(mu, 15 Lambda) with Lambda diagonal in
                the coordinate axes (not the components), as in the paper
orthogonal10    10 % of inlier rows shifted 8 sd (of component 1) along
                the last component
cluster10/25    10 % / 25 % in a tight cluster (sd 0.05 of component 1) far
                out (8 sd of component 1) in the plane of components 2-3
t3              multivariate t with 3 degrees of freedom (no labels)
gaps5           clean data with 5 % of rows holding a NaN (sensor gaps)
==============  ==========================================================

:func:`plant_archive` draws a plant's archive over days (daily cycles,
autocorrelated factors, an outage, a saturating and a quantized channel,
spikes, a stuck sensor, optionally a change of regime) with its truth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "SCENARIOS",
    "Sample",
    "make_scenario",
    "true_basis",
    "cluster_cell",
    "clipped_channel",
    "stuck_in_outage",
    "PlantArchive",
    "plant_archive",
    "write_plant_archive",
]

SCENARIOS = ("clean", "paper5", "paper20", "orthogonal10", "cluster10", "cluster25", "t3", "gaps5")


@dataclass
class Sample:
    """Data with its truth: components (rows), eigenvalues, centre, outlier rows."""

    X: np.ndarray
    components: np.ndarray
    eigenvalues: np.ndarray
    center: np.ndarray
    outliers: np.ndarray  # bool per row; all False where nothing is labelled


def true_basis(p: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues ``10 * 0.7**i`` and a random orthonormal basis (rows)."""
    rng = np.random.default_rng(10_000 + seed)
    Q, R = np.linalg.qr(rng.normal(size=(p, p)))
    Q = Q * np.sign(np.diag(R))
    return 10.0 * 0.7 ** np.arange(p), Q.T


def make_scenario(name: str, *, n: int = 20_000, p: int = 10, seed: int = 0) -> Sample:
    """Draw one data set of the scenario ``name`` (see the module docstring)."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; choose from {SCENARIOS}")
    lam, V = true_basis(p, seed)
    rng = np.random.default_rng(seed)
    center = 5.0 + rng.normal(size=p)
    Z = rng.normal(size=(n, p)) * np.sqrt(lam)
    if name == "t3":
        Z = Z / np.sqrt(rng.chisquare(3, size=(n, 1)) / 3)
    X = center + Z @ V
    bad = np.zeros(n, bool)
    s1 = np.sqrt(lam[0])
    if name in ("paper5", "paper20"):
        k = int(n * (0.05 if name == "paper5" else 0.20))
        rows = rng.choice(n, k, replace=False)
        X[rows] = center + rng.normal(size=(k, p)) * np.sqrt(15 * lam)
        bad[rows] = True
    elif name == "orthogonal10":
        rows = rng.choice(n, n // 10, replace=False)
        X[rows] += 8 * s1 * V[-1]
        bad[rows] = True
    elif name in ("cluster10", "cluster25"):
        k = int(n * (0.10 if name == "cluster10" else 0.25))
        rows = rng.choice(n, k, replace=False)
        where = center + 8 * s1 * (V[1] + V[min(2, p - 1)]) / np.linalg.norm(V[1] + V[min(2, p - 1)])
        X[rows] = where + 0.05 * s1 * rng.normal(size=(k, p))
        bad[rows] = True
    elif name == "gaps5":
        rows = rng.choice(n, n // 20, replace=False)
        X[rows, rng.integers(0, p, size=len(rows))] = np.nan
    return Sample(X=X, components=V, eigenvalues=lam, center=center, outliers=bad)


def cluster_cell(eps: float, D: float, seed: int, n: int = 4000, p: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian rows (:func:`true_basis`) whose first ``eps * n`` rows are a tight cluster at
    distance ``D`` (in the spreads of components 3 and 4) in their plane; returns (X, basis rows)."""
    lam, V = true_basis(p, seed)
    rng = np.random.default_rng(seed)
    X = (rng.normal(size=(n, p)) * np.sqrt(lam)) @ V
    k = int(eps * n)
    where = D * (np.sqrt(lam[2]) * V[2] + np.sqrt(lam[3]) * V[3]) / np.sqrt(2)
    X[:k] = where + 0.05 * np.sqrt(lam[-1]) * rng.normal(size=(k, p))
    return X, V


def clipped_channel(*, own_noise: bool = False, n: int = 40_000, seed: int = 1):
    """A 16-channel archive of 3 strong factors whose channel 2 saturates at its 97th percentile.

    Returns ``(X, clipped, saturated, limit)``: the rows before and after the clipping, the mask of the
    clipped rows and the limit.  With ``own_noise`` channel 2 is mostly its own noise (its high
    readings are not the factors' tail); else it follows the factors as the others do.
    """
    rng = np.random.default_rng(seed)
    p, k = 16, 3
    L = rng.normal(size=(p, k))
    X = rng.normal(size=(n, k)) @ L.T + 0.2 * rng.normal(size=(n, p))
    if own_noise:
        X[:, 2] = 0.3 * X[:, 2] + rng.normal(size=n)
    limit = np.quantile(X[:, 2], 0.97)
    saturated = X[:, 2] >= limit
    clipped = X.copy()
    clipped[saturated, 2] = limit
    return X, clipped, saturated, limit


def stuck_in_outage(*, n: int = 20_000, seed: int = 0):
    """An 8-channel archive whose channel 0 is offline (NaN) in 12 stretches of 500 rows, and whose
    channel 3 holds one plausible value exactly over 400 rows that all lie in the first stretch.

    Returns ``(X, stuck)``: the rows and the mask of the stuck rows.
    """
    rng = np.random.default_rng(seed)
    p = 8
    A = rng.normal(size=(p, p))
    X = rng.multivariate_normal(np.zeros(p), A @ A.T / p + np.eye(p), size=n)
    gap = np.zeros(n, bool)
    for s in rng.integers(0, n - 500, 12):
        gap[s : s + 500] = True
    X[gap, 0] = np.nan
    stuck = np.zeros(n, bool)
    first = np.flatnonzero(gap)[0]
    stuck[first : first + 400] = True
    X[stuck, 3] = np.round(np.nanmedian(X[:, 3]) + 0.3, 6)
    return X, stuck


#: Signals of one unit of :func:`plant_archive` (channel ``unit2_pressure_outlet`` and so on).
PLANT_SIGNALS = ("flow_inlet", "flow_outlet", "pressure_inlet", "pressure_outlet", "temp_bearing", "temp_coolant",
                 "vibration_axial", "motor_current")
#: Correlation times, in days, of the AR(1) factors of :func:`plant_archive` (hours to days).
PLANT_FACTOR_DAYS = (2.0, 0.5, 0.125, 1.0)


@dataclass
class PlantArchive:
    """A generated plant archive and its truth (see :func:`plant_archive`).

    Row spans are ``(start, stop)`` row positions, stop exclusive; ``None`` where the archive has none.
    """

    X: np.ndarray  # (n, p) float64; NaN in the outage
    time: np.ndarray  # (n,) datetime64[ns]
    channels: list[str]
    rows_per_day: int
    regime_rows: tuple[int, int] | None  # rows under the changed loadings
    regime_channels: np.ndarray  # channels whose loadings turn there
    outage_rows: tuple[int, int] | None  # rows where outage_channels are NaN
    outage_channels: np.ndarray
    spike_rows: np.ndarray  # (m,) isolated spikes: row and channel of each
    spike_channels: np.ndarray
    stuck_rows: tuple[int, int] | None  # rows where stuck_channel holds one value exactly
    stuck_channel: int
    saturating_channel: int  # clipped at saturation_limit (its 97th percentile)
    saturation_limit: float
    quantized_channel: int  # rounded to multiples of quantum
    quantum: float


def plant_archive(*, days: float = 30, rows_per_day: int = 1440, channels: int = 24, seed: int = 0,
                  regime_start: float | None = None, regime_days: float = 3.0, regime_angle: float = 30.0,
                  outage: tuple[float, float] | None = (0.82, 1.7), spikes: int = 200,
                  stuck: tuple[float, float] | None = (0.35, 0.25)) -> PlantArchive:
    """A plant's archive over ``days`` days, ``rows_per_day`` rows a day, with its truth.

    ``channels`` channels of units of ``len(PLANT_SIGNALS)`` signals, offset
    and scaled as real sensors are.  Each channel is a mix of a daily cycle
    (a load whose amplitude varies from day to day), four AR(1) factors of
    correlation times ``PLANT_FACTOR_DAYS`` (3 hours to 2 days) and its own
    noise.  Planted, each optional:

    - a change of regime from day ``regime_start`` for ``regime_days`` days:
      on the channels of unit 3 (or the last unit), the loadings of the first
      two factors turn into each other by ``regime_angle`` degrees;
    - an outage ``(start, days)``: the first three channels of unit 2 are
      NaN from day ``start * days`` (a share of the archive) for ``days`` days;
    - ``spikes`` isolated spikes of 8-20 noise spreads on random cells;
    - a stuck sensor ``(start, days)``: one channel holds its value of day
      ``start * days`` exactly for ``days`` days;
    - always: one channel saturates at its 97th percentile, one is quantized
      to a fifth of its spread.

    Returns
    -------
    PlantArchive
        The rows (float64), their times (from 2025-01-01, one row every
        ``86400 / rows_per_day`` seconds), the channel names and the truth.

    Examples
    --------
    >>> from dask_mcpca.testing import plant_archive
    >>> a = plant_archive(days=2, rows_per_day=240, channels=16, seed=1)
    >>> a.X.shape, a.channels[9]
    ((480, 16), 'unit2_flow_outlet')
    """
    from scipy.signal import lfilter

    if channels < len(PLANT_SIGNALS) or rows_per_day < 2 or days <= 0:
        raise ValueError(f"plant_archive needs channels >= {len(PLANT_SIGNALS)}, rows_per_day >= 2 and days > 0; "
                         f"got {channels}, {rows_per_day}, {days}")
    rng = np.random.default_rng(seed)
    n, p, unit = int(round(days * rows_per_day)), channels, len(PLANT_SIGNALS)
    names = [f"unit{j // unit + 1}_{PLANT_SIGNALS[j % unit]}" for j in range(p)]
    t_day = np.arange(n) / rows_per_day  # time in days
    # latents: the daily load (amplitude varying by day), then AR(1) factors of unit variance
    amplitude = 1.0 + 0.25 * rng.normal(size=int(np.ceil(days)) + 1)
    load = amplitude[t_day.astype(int)] * (np.sin(2 * np.pi * t_day) + 0.3 * np.sin(4 * np.pi * t_day + 1.0))
    factors = np.empty((n, len(PLANT_FACTOR_DAYS)))
    for i, tau in enumerate(PLANT_FACTOR_DAYS):
        a = np.exp(-1.0 / (tau * rows_per_day))
        factors[:, i] = lfilter([np.sqrt(1 - a * a)], [1.0, -a], rng.normal(size=n), zi=[a * rng.normal()])[0]
    weights = np.array([2.0, 3.0, 2.0, 1.5, 1.0])[:, None]  # the load, then the factors
    loadings = rng.normal(size=(1 + len(PLANT_FACTOR_DAYS), p)) * weights
    noise = rng.uniform(0.2, 0.5, size=p)
    latent = np.column_stack([load, factors])
    Z = latent @ loadings + rng.normal(size=(n, p)) * noise
    unit3 = np.arange(2 * unit, min(3 * unit, p)) if p >= 3 * unit else np.arange(p - unit, p)
    regime = None
    if regime_start is not None:
        a, b = int(round(regime_start * rows_per_day)), min(n, int(round((regime_start + regime_days) * rows_per_day)))
        turn = np.radians(regime_angle)
        L = loadings.copy()
        f1, f2 = loadings[1, unit3], loadings[2, unit3]
        L[1, unit3] = np.cos(turn) * f1 + np.sin(turn) * f2
        L[2, unit3] = -np.sin(turn) * f1 + np.cos(turn) * f2
        Z[a:b] = latent[a:b] @ L + rng.normal(size=(b - a, p)) * noise
        regime = (a, b)
    scale = rng.uniform(0.5, 20.0, size=p)
    X = 100.0 + 10 * rng.normal(size=p) + Z * scale  # offsets and units of real sensors
    saturating, quantized = unit - 1, unit + 1  # unit1_motor_current, unit2_flow_outlet
    limit = float(np.quantile(X[:, saturating], 0.97))
    np.minimum(X[:, saturating], limit, out=X[:, saturating])
    quantum = float(np.std(X[:, quantized]) / 5)
    X[:, quantized] = np.round(X[:, quantized] / quantum) * quantum
    spike_rows = np.sort(rng.choice(n, min(spikes, n), replace=False))
    spike_channels = rng.integers(0, p, len(spike_rows))
    X[spike_rows, spike_channels] += rng.choice([-1, 1], len(spike_rows)) * rng.uniform(8, 20, len(spike_rows)) * (
        noise * scale)[spike_channels]
    stuck_rows, stuck_channel = None, 2 * unit + 3 if p > 2 * unit + 3 else p - 1
    if stuck is not None:
        a = int(stuck[0] * n)
        b = min(n, a + max(1, int(round(stuck[1] * rows_per_day))))
        X[a:b, stuck_channel] = X[a, stuck_channel]
        stuck_rows = (a, b)
    outage_rows, outage_channels = None, np.arange(unit, unit + 3) if p >= unit + 3 else np.arange(0, 1)
    if outage is not None:
        a = int(outage[0] * n)
        b = min(n, a + max(1, int(round(outage[1] * rows_per_day))))
        X[a:b, outage_channels] = np.nan
        outage_rows = (a, b)
    step = np.timedelta64(int(round(86_400e9 / rows_per_day)), "ns")
    time = np.datetime64("2025-01-01T00:00", "ns") + np.arange(n) * step
    return PlantArchive(X=X, time=time, channels=names, rows_per_day=rows_per_day, regime_rows=regime,
                        regime_channels=unit3 if regime is not None else np.zeros(0, int), outage_rows=outage_rows,
                        outage_channels=outage_channels if outage is not None else np.zeros(0, int),
                        spike_rows=spike_rows, spike_channels=spike_channels, stuck_rows=stuck_rows,
                        stuck_channel=stuck_channel, saturating_channel=saturating, saturation_limit=limit,
                        quantized_channel=quantized, quantum=quantum)


def write_plant_archive(archive: PlantArchive, path, *, rows: slice = slice(None), chunk: int = 20_000,
                        mode: str = "w-") -> None:
    """Write ``archive`` (its ``rows``) to the Zarr store ``path`` as an xarray Dataset: one float32
    variable per channel along ``time``, their order in the ``channels`` attribute (``mode="a"`` with
    ``rows`` after the written ones appends)."""
    import xarray as xr

    X, time = archive.X[rows], archive.time[rows]
    ds = xr.Dataset({c: ("time", X[:, j].astype(np.float32)) for j, c in enumerate(archive.channels)},
                    coords={"time": time}, attrs={"channels": list(archive.channels)}).chunk({"time": chunk})
    if mode == "a":
        ds.to_zarr(path, append_dim="time", consolidated=False)
    else:
        ds.to_zarr(path, mode=mode, consolidated=False)
