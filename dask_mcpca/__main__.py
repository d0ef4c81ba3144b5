"""``python -m dask_mcpca``: the ``dask-mcpca`` command line."""

from ._console import main

main()
