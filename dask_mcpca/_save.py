"""``MCPCA.save``: the fitted model written as one JSON file (the codec: :mod:`._persist`); read back by
:func:`dask_mcpca.load` (:mod:`._load`)."""

from __future__ import annotations

import os

from . import _persist

__all__ = ["SaveMixin"]


class SaveMixin:
    """:meth:`~MCPCA.save`, for :class:`~dask_mcpca.MCPCA`."""

    def save(self, path: str | os.PathLike, *, storage_options: dict | None = None) -> None:
        """Write the fitted model to ``path`` as JSON (no pickle).

        Read it back with :func:`dask_mcpca.load`; the format is described
        in :mod:`dask_mcpca._persist`.  The file is replaced atomically: a
        local file is written beside it and renamed; on an object store
        (``s3://bucket/model.json``) it is one object, which the store
        publishes whole or not at all.

        Parameters
        ----------
        path : str or path-like
            Destination file or fsspec URL; replaced atomically if it exists.
        storage_options : dict, optional
            fsspec options for a URL (``{"endpoint_url": ...}``, credentials).

        Raises
        ------
        ValueError
            ``set_params`` changed, since the fit, a parameter that defines the
            fitted model (``scale``, ``center``, ``solver``, ``cellwise``,
            ``n_components``, or a ``kernel_factor`` its kernels cannot have):
            the file would describe another model than it holds.  Set it back,
            or refit.  ``nan_policy``, ``progress`` and the parameters that only
            steer a fit may change.

        See Also
        --------
        dask_mcpca.load : Read the model back.

        Examples
        --------
        >>> import numpy as np
        >>> from dask_mcpca import MCPCA
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(1000, 3)) * [3.0, 1.0, 0.3]
        >>> model = MCPCA(n_components=2).fit(X)
        >>> import os, tempfile
        >>> from dask_mcpca import load
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     model.save(os.path.join(folder, "model.json"))
        ...     loaded = load(os.path.join(folder, "model.json"))
        >>> bool((loaded.transform(X) == model.transform(X)).all())
        True
        """
        _persist.save(self, path, storage_options=storage_options)
