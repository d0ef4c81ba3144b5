"""Where numba caches the compiled loops of :mod:`._compiled` (its ``CACHE_DIR``).

Never in the package's folder, which an install may not let us write and
which a later install of another kind (``pip install -e``) would leave
behind as a stray ``dask_mcpca`` folder in ``site-packages`` that shadows
it. In order: ``DASK_MCPCA_CACHE_DIR`` (empty: no disk cache, compile in
each process); else numba's own ``NUMBA_CACHE_DIR`` if the user set one;
else the user's cache folder (``$XDG_CACHE_HOME`` or ``~/.cache`` on Linux,
``~/Library/Caches`` on macOS, ``%LOCALAPPDATA%`` on Windows), under
``dask_mcpca/numba``. numba keeps one sub-folder per source folder, so two
installs never share entries. A folder that cannot be written means no disk
cache (each process compiles, about 4 s), never a write elsewhere.
"""

from __future__ import annotations

import os
import sys
import tempfile

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; the numpy spelling still works without it
    numba = None

__all__ = ["cache_dir"]


def _user_cache_root() -> str:
    """The user's cache folder, as ``platformdirs.user_cache_dir`` finds it (without the dependency)."""
    if sys.platform == "win32":
        return os.environ.get("LOCALAPPDATA") or os.path.join(os.path.expanduser("~"), "AppData", "Local")
    if sys.platform == "darwin":
        return os.path.join(os.path.expanduser("~"), "Library", "Caches")
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")


def _writable(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            return True
    except OSError:
        return False


def cache_dir() -> str | None:
    """Where numba caches the compiled loops (see the module docstring); None: no disk cache."""
    if numba is None:
        return None
    if "DASK_MCPCA_CACHE_DIR" in os.environ:
        path = os.environ["DASK_MCPCA_CACHE_DIR"]
    else:
        path = numba.config.CACHE_DIR or os.path.join(_user_cache_root(), "dask_mcpca", "numba")
    path = os.path.abspath(os.path.expanduser(path)) if path else ""
    return path if path and _writable(path) else None
