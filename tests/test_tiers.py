"""The order in which pytest-xdist hands out the test files (tests/conftest.py, pyproject.toml).

The CI tier's time depends on it: files go to the two processes whole, in the
collection order, longest first, so that neither ends alone on a long file.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from types import SimpleNamespace

import conftest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

TESTS = Path(__file__).resolve().parent


def test_every_file_named_longest_first_exists():
    """A renamed file would drop out of the order without a word."""
    missing = [name for name in conftest.LONGEST_FIRST if not (TESTS / name).is_file()]
    assert not missing, missing
    assert len(set(conftest.LONGEST_FIRST)) == len(conftest.LONGEST_FIRST)


def test_xdist_keeps_the_collection_order_of_whole_files():
    options = shlex.split(tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]
                          ["ini_options"]["addopts"])
    assert "--no-loadscope-reorder" in options
    assert options[options.index("--dist") + 1] == "loadfile"


def test_dispatch_order_is_longest_first_then_most_tests_first():
    longest = conftest.LONGEST_FIRST
    files = {"test_few.py": 1, "test_many.py": 3, longest[1]: 2, longest[0]: 1}
    items = [SimpleNamespace(path=TESTS / name, i=i) for name, n in files.items() for i in range(n)]
    conftest._dispatch_order(items)
    assert [item.path.name for item in items] == [longest[0], longest[1], longest[1], "test_many.py",
                                                  "test_many.py", "test_many.py", "test_few.py"]
    assert [item.i for item in items if item.path.name == "test_many.py"] == [0, 1, 2]  # a file keeps its order
