"""Where a measured figure lives in a results file, and helpers that address many alike.

:class:`Figure` is the record :mod:`_front` reads (``benchmarks/_front.py``); the
constants name the results files and table rows that both the README's figures
and the documentation's (:mod:`_front_docs`) read.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Figure", "percent", "column_pattern", "speed_section", "RESULTS", "ROBUST", "ROBUST_ROWS", "MODES",
           "BIG_ROWS", "ACCURACY", "ATTRIBUTION", "SCENARIOS", "CELLS", "NUM", "GROUP"]

RESULTS = "benchmarks/RESULTS.md"
ROBUST = "benchmarks/ROBUSTNESS.md"
ROBUST_ROWS = (("BasicMotions", "MCPCA"), ("Daphnet S06R02E0", "MCPCA"))
MODES = "benchmarks/MODES.md"
BIG_ROWS = (("8,000,000",), ("32,000,000",), ("100,000,000",))
ACCURACY = "benchmarks/ACCURACY.md"
ATTRIBUTION = "benchmarks/ATTRIBUTION.md"
SCENARIOS = ("(a) random loadings", "(b) redundant sensor pairs", "(c) units 1e-3 to 1e3")
CELLS = "benchmarks/CELLWISE.md"
#: A number in a pattern, and a number captured as a group.
NUM, GROUP = r"[\d.]+", r"([\d.]+)"


@dataclass(frozen=True)
class Figure:
    """Where one figure lives and how it is written.

    Parameters
    ----------
    path : str
        The results file, relative to the repository root.
    section : str or None
        The ``<!-- begin KEY -->`` section of ``path``; None: the whole file.
    rows : tuple of tuple of str
        Table rows, each named by its first cells (stripped; the first such row
        of the section); empty with ``pattern``.
    cols : tuple of int
        The columns read from each row (0 = the first cell).
    fmt : str
        Format of each number read from a cell (its leading number); ``""`` keeps the cell's text.
    join : str
        Between the columns of a row.
    spread : bool
        Several rows: write ``min-max`` of the numbers instead of each.  With ``pattern``:
        it may match several times, and each group becomes the ``min-max`` of its matches.
    pattern : str
        A regular expression searched in the section instead of rows; its groups fill ``template``.
    template : str
        ``str.format`` template for the pattern's groups.
    scale : float
        Each number read is multiplied by it before ``fmt`` (100: a share written in percent).
    divide : tuple of int
        With ``pattern``: each match becomes its group ``divide[0]`` over its group ``divide[1]``
        (a ratio the results file gives as two numbers); empty: the groups as they are.
    """

    path: str
    section: str | None = None
    rows: tuple[tuple[str, ...], ...] = ()
    cols: tuple[int, ...] = (1,)
    fmt: str = ""
    join: str = " / "
    spread: bool = False
    pattern: str = ""
    template: str = "{0}"
    scale: float = 1.0
    divide: tuple[int, ...] = ()


def speed_section(dtype: str) -> str:
    """RESULTS.md's section of the 20M x 10 speed run in ``dtype`` with the command line's malloc."""
    return f"speed-20000000x10-{dtype}-console-malloc"


def percent(path: str, section: str | None, rows: tuple[tuple[str, ...], ...], cols: int | tuple[int, ...],
            digits: int = 1, join: str = " % and ", spread: bool = False) -> Figure:
    """Shares of rows (0.0019) written in percent (0.19) to ``digits`` decimals."""
    cols = cols if isinstance(cols, tuple) else (cols,)
    return Figure(path, section, rows, cols, f"{{:.{digits}f}}", join, spread, scale=100)


def column_pattern(first: str, col: int) -> str:
    """A pattern for the leading number of cell ``col`` of every table row whose first cell matches ``first``."""
    return rf"(?m)^\| (?:{first}) \|(?:[^|\n]*\|){{{col - 1}}} ([\d.]+)"
