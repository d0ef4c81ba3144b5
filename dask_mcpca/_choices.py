"""The estimator's string options, as constants that load nothing.

The command line's parser offers them as ``choices`` (``--solver``,
``--center``, ``--nan-policy``) without importing the estimator, so
``dask-mcpca --version``, ``--help`` and an argument error start without
dask, numpy's heavier users or scikit-learn.  :mod:`._estimator` validates
with the same tuples.
"""

from __future__ import annotations

__all__ = ["SOLVERS", "CENTERS", "NAN_POLICIES", "CLI_CENTERS", "CLI_SCALES"]

SOLVERS = ("auto", "paper")
CENTERS = ("robust", "mean", False)
NAN_POLICIES = ("raise", "omit", "partial")

#: ``--center`` as the command line spells it: the estimator's values, with ``none`` for ``center=False``.
CLI_CENTERS = {("none" if c is False else c): c for c in CENTERS}

#: ``--scale`` as the command line spells it: ``none`` for ``scale=None`` (:data:`._scale.SCALES`).
CLI_SCALES = {"none": None, "robust": "robust"}
