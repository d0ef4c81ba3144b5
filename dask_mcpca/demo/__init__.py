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

Modules: :mod:`.archive` (the generator and its truth), :mod:`.evaluate`
(PCA's pass, angles, outlier counts), :mod:`.report` (the tables and the
PNG), :mod:`.run` (:func:`run_demo`, what ``dask-mcpca demo`` calls).
"""
from .archive import CHANNELS, KINDS, TRUE_LOADINGS, Faults, make_archive, make_faults, true_variances
from .evaluate import DemoResult, angles_deg, subspace_angle_deg
from .run import run_demo

__all__ = [
    "make_archive",
    "make_faults",
    "run_demo",
    "true_variances",
    "angles_deg",
    "subspace_angle_deg",
    "Faults",
    "DemoResult",
    "TRUE_LOADINGS",
    "CHANNELS",
    "KINDS",
]
