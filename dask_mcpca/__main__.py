"""``python -m dask_mcpca``: the ``dask-mcpca`` command line."""

from ._cli import main

raise SystemExit(main())
