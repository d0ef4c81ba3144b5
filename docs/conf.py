"""Sphinx configuration of the dask_mcpca documentation.

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html``
(``tests/test_docs.py`` runs it in the full test tier, warnings as errors).
"""

import dask_mcpca

project = "dask_mcpca"
author = "dask_mcpca contributors"
copyright = "dask_mcpca contributors, BSD-3-Clause"
release = dask_mcpca.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_parser",
    "sphinxarg.ext",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]
# keep "--option" as typed (no en dash) in the command-line reference
smartquotes = False

# Markdown: $...$ and $$...$$ maths, ::: fences, heading anchors for #links
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

# API reference: numpydoc renders the docstrings' sections; the class's methods
# are documented by ``:members:`` in api.rst, not by numpydoc's member tables.
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"

html_theme = "pydata_sphinx_theme"
html_title = f"dask_mcpca {release}"
html_theme_options = {"navigation_with_keys": False}
