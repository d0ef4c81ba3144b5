"""Robust PCA by maximum correntropy power iterations, on chunked Dask arrays.

Where things live:

- ``_io``: opening data (numpy, dask, Zarr, HDF5) as row blocks; ``_archive``: an archive written
  by xarray opened once and its rows selected; ``_stacked``: its 1-D variables read a row block at a time
- ``_stats``: a pass's plan and what a row block returns (``BlockStats``, ``combine``)
- ``_block``: the router: which kernel computes a row block (``block_stats``, ``choose_route``)
- ``_kernels`` / ``_compiled``: the kernels: the numpy spelling and the compiled loops;
  ``_partial_stats``: rows with missing cells; ``_block_rows``: the rows' helpers they share
- ``_passes``: one pass = the block kernel everywhere + a tree reduction
- ``_power``: the p x p power iteration, deflation and Woodbury updates
- ``_schedule``: kernel sizes (the paper's decay, the default's rule)
- ``_paper`` / ``_robust``: the two solvers (``_robust_step``, ``_robust_sample``, ``_robust_warm``:
  the default's state and full-data step, its sample stage, its warm step and update);
  ``_start`` (the robust start) and ``_repeated`` (stuck sensors, frozen records, quantized
  channels) serve ``_robust``
- ``_estimator``: the scikit-learn estimator ``MCPCA`` (parameters, the fit entry points), with
  ``partial_fit`` (``_partial_fit``), the operating modes (``_mode_methods``) and ``save`` (``_save``) mixed
  in; ``_params``: the parameters' constraints and their check (``check_params``); ``_load``: ``load``;
  ``_fit``: how it is fitted (a typed ``FitResult``); ``_precision``,
  ``_distances``, ``_ranking``, ``_stuck``, ``_model``: the fitted model's algebra (precision and
  contributions; distances; the channel each row names; stuck cells; weights, flags and the per-row
  methods' block functions); ``_base``: its
  per-row public methods (as scikit-learn's ``_BasePCA``), with the outlier detector's (``_detector``)
  and the per-channel ones (``_channel_methods``) mixed in; what they share in ``_row_methods``
- ``_drift``: the drift windows of ``report --window``; ``_report_plot``: the report's PNG;
  ``_score_store``: a score store written and read back (``open_scores``); ``_score_append``:
  ``score --append``
- ``testing``: generated data with known truth, for the tests and the benchmarks
- ``_checkpoint``, ``_persist``, ``_update_checks``, ``_model_file``: resumable fits, the saved model's checks
  (those of its ``partial_fit`` sums apart) and its JSON file
- ``_exceptions``: the public errors and warnings (all exported here)
- ``_urls``: what a path or URL names, its filesystem and bytes (the read path); ``_atomic``:
  files and stores written whole or not at all
- ``_labels``: names in, names out (feature names, DataArray rows and coordinates)
- ``_report``: ``dask-mcpca report``, one streaming pass summarised as a PNG and events
- ``_console``: the console script (the process's malloc, see ``_malloc``), then
  ``cli``: the ``dask-mcpca`` command line starts here (the parser, ``main``; the estimator's
  option values from ``_choices``, so the parser loads nothing heavy); its commands
  in ``cli.fit`` (fit, update), ``cli.score`` and ``cli.report`` (report, demo); what they
  share in ``cli.common`` (the archive named, one-line errors), ``cli.scheduler``
  (``--scheduler``) and ``cli.outputs`` (output locations and stores)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ._version import __version__

# The public names load on first use (SPEC 1's lazy loading): the console script
# (``_console``) sets the process's malloc before dask, numpy and scikit-learn load.
_HOMES = {
    "MCPCA": "._estimator",
    "load": "._load",
    "check_params": "._params",
    "open_archive": "._archive",
    "open_scores": "._score_store",
    "NonFiniteRowsError": "._exceptions",
    "NumericalRangeError": "._exceptions",
    "CheckpointMismatchError": "._exceptions",
    "ModelFormatError": "._exceptions",
    "SelectionError": "._exceptions",
    "AppendError": "._exceptions",
    "BreakdownWarning": "._exceptions",
    "NoUsableRowsWarning": "._exceptions",
}

__all__ = [
    "MCPCA",
    "load",
    "check_params",
    "open_archive",
    "open_scores",
    "NonFiniteRowsError",
    "NumericalRangeError",
    "CheckpointMismatchError",
    "ModelFormatError",
    "SelectionError",
    "AppendError",
    "BreakdownWarning",
    "NoUsableRowsWarning",
    "__version__",
]

if TYPE_CHECKING:  # what static tools see
    from ._archive import open_archive
    from ._estimator import MCPCA
    from ._exceptions import (
        AppendError,
        BreakdownWarning,
        CheckpointMismatchError,
        ModelFormatError,
        NonFiniteRowsError,
        NoUsableRowsWarning,
        NumericalRangeError,
        SelectionError,
    )
    from ._load import load
    from ._params import check_params
    from ._score_store import open_scores


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # once loaded, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
