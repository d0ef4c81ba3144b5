"""``dask_mcpca.load``: a model written by :meth:`MCPCA.save` read back as an :class:`~dask_mcpca.MCPCA`.

The codec (:mod:`._persist`) knows arrays and parameters, not the
estimator; here it is told which class to rebuild.
"""

from __future__ import annotations

import os

from . import _persist
from ._estimator import MCPCA

__all__ = ["load"]


def load(path: str | os.PathLike, *, storage_options: dict | None = None) -> MCPCA:
    """Read a model written by :meth:`MCPCA.save`.

    Parameters
    ----------
    path : str or path-like
        The model file, or an fsspec URL (``s3://bucket/model.json``).
    storage_options : dict, optional
        fsspec options for a URL.

    Returns
    -------
    model : MCPCA
        Fitted, with the saved parameters and attributes; it computes bit for
        bit what the saved model did.

    Raises
    ------
    FileNotFoundError
        No file at ``path``.
    ModelFormatError
        The file is not a dask-mcpca model, is damaged, or was written by a
        newer format version.

    See Also
    --------
    MCPCA.save : Write a model.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> from dask_mcpca import MCPCA, load
    >>> X = np.random.default_rng(0).normal(size=(500, 3))
    >>> model = MCPCA().fit(X)
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     model.save(os.path.join(folder, "model.json"))
    ...     loaded = load(os.path.join(folder, "model.json"))
    >>> bool((loaded.components_ == model.components_).all())
    True
    """
    return _persist.load(path, MCPCA, storage_options=storage_options)
