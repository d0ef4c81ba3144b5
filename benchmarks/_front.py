"""The measured figures of the README, CONTRIBUTING and docs/*.md, read from the results files instead of retyped.

Each figure in ``README.md``, ``CONTRIBUTING.md`` and ``docs/*.md`` sits in a marked span,
``<!-- figure:NAME -->VALUE<!-- /figure -->``; :data:`FIGURES` says where
NAME's value lives: a results file, the ``<!-- begin KEY -->`` section of it
that :func:`benchmarks._results.update_section` writes (or the whole file), and
either a table row (its first cells) and columns, or a regular expression.
``python benchmarks/_front.py`` rewrites the spans from the results files;
``--check`` exits 1 when one is stale.  ``tests/test_figures.py`` runs the
check in the fast tier, so a re-measured benchmark fails a test until the
file is regenerated.  The tiers' figures come from ``benchmarks/TIERS.md``,
which ``benchmarks/tiers.py`` writes; the documentation's figures are listed in
``benchmarks/_front_docs.py``, and :class:`Figure` lives in ``benchmarks/_figure.py``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from _figure import (
    ACCURACY,
    ATTRIBUTION,
    BIG_ROWS,
    CELLS,
    GROUP,
    MODES,
    NUM,
    RESULTS,
    ROBUST,
    ROBUST_ROWS,
    SCENARIOS,
    Figure,
    speed_section,
)
from _front_docs import DOCS_FIGURES

__all__ = ["FIGURES", "FRONT_FILES", "README", "Figure", "value", "spans", "render", "stale", "main"]

ROOT = Path(__file__).resolve().parent.parent
#: The file whose marked spans are generated.
README = ROOT / "README.md"
#: Every file with marked spans: the README, CONTRIBUTING's test tiers and the documentation's pages
#: (not docs/benchmarks/, which includes the results files themselves).
FRONT_FILES = (README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md")))
_SPAN = re.compile(r"<!-- figure:([a-z0-9][a-z0-9.-]*) -->(.*?)<!-- /figure -->", re.S)  # names in lower case


def _fit_figures(dtype: str, tag: str) -> dict[str, Figure]:
    sec = speed_section(dtype)
    return {
        f"fit-{tag}-s": Figure(RESULTS, sec, (("MCPCA().fit(store) (auto)",),), (1,), "{:.1f}"),
        f"fit-{tag}-xtx": Figure(
            RESULTS,
            sec,
            pattern=r"mcpca_fit / xtx ([\d.]+) \(rounds ([\d.]+-[\d.]+)\)",
            template="{0} (single rounds {1})",
        ),
        f"fit-{tag}-daskml": Figure(RESULTS, sec, pattern=r"MCPCA fit / dask-ml PCA fit: \*\*([\d.]+)\*\*"),
        f"fit-{tag}-process-s": Figure(RESULTS, sec, (("`dask-mcpca fit STORE`, as a process",),), (1,), "{:.1f}"),
    }


def _score_figures(section: str, tag: str) -> dict[str, Figure]:
    row = (("`score` (default: `monitoring`, float32)",),)
    return {
        f"score-{tag}-s": Figure(RESULTS, section, row, (1,), "{:.1f}"),
        f"score-{tag}-copy": Figure(RESULTS, section, row, (4,)),
        f"score-{tag}-xtx": Figure(RESULTS, section, row, (5,)),
    }


_PAPER = "docs/comparison.md"
_ADC = "ADC moving 20 % of the time (faults on the other channels)"
#: A row of the cellwise grid at p = 30 or 100 (20,000 rows): the method's cell, then angle, var, cells named.
_CELLS_GRID = r"\| (?:30|100) \| [\d.]+% \| \d+% \| {} \| ([\d.]+) \|"
#: A cellwise fit's row of the grid: angle, then its variances' error, bad / clean cells named (one of them a group).
_CELLS_ROW = r"\| MCPCA\(cellwise=True\) \| [\d.]+ \| {} \| {} / {} \|"

#: Every generated figure of the README, by the name its span carries.
FIGURES: dict[str, Figure] = {
    "paper-pca": Figure(_PAPER, None, (("5 % outliers", "PCA"),), (2, 3, 4)),
    "paper-mcpi": Figure(_PAPER, None, (("5 % outliers", "MCPI, solver='paper'"),), (2, 3, 4)),
    "paper-default": Figure(_PAPER, None, (("5 % outliers", "MCPCA default"),), (2, 3, 4)),
    **_fit_figures("float64", "f64"),
    **_fit_figures("float32", "f32"),
    **_score_figures("score-floor-20000000x10-float64-console-malloc", "malloc"),
    **_score_figures("score-floor-20000000x10-float64", "glibc"),
    "memory-peak": Figure(RESULTS, "memory-x10", BIG_ROWS, (4,), "{:.0f}", spread=True),
    "memory-peak-malloc": Figure(RESULTS, "memory-x10", BIG_ROWS, (10,), "{:.0f}", spread=True),
    "robust-recall": Figure(ROBUST, None, ROBUST_ROWS, (4, 5, 7), "{:.2f}", spread=True),
    "robust-false": Figure(ROBUST, None, ROBUST_ROWS, (3,), "{:.3f}", join=" and "),
    "robust-mcd-false": Figure(ROBUST, None, (("BasicMotions", "MinCovDet"), ("Daphnet S06R02E0", "MinCovDet")),
                               (3,), "{:.3f}", join=" and "),
    "modes-none": Figure(MODES, None, (("two states, 60/40 %", "`None`"),), (3,)),
    "modes-auto": Figure(MODES, None, (("two states, 60/40 %", "`auto`"),), (3,)),
    "modes-adc-none": Figure(MODES, None, ((_ADC, "`None`"),), (3,)),
    "modes-adc-auto": Figure(MODES, None, ((_ADC, "`auto`"),), (3,)),
    "modes-cost": Figure(MODES, None, (("`auto`",),), (2,)),
    "clean-pca-ratio": Figure(ACCURACY, None, fmt="{:.2f}", spread=True,
                              pattern=r"p=\d+ clean: .*PCA [\d.]+ deg \(ratio ([\d.]+)\)"),
    "attr-stuck": Figure(ATTRIBUTION, None, tuple((s, "stuck") for s in SCENARIOS), (7,), "{:.3f}", spread=True),
    "attr-stuck-pair": Figure(ATTRIBUTION, None, ((SCENARIOS[1], "stuck"),), (6,), "{:.3f}"),
    "attr-others": Figure(ATTRIBUTION, None, tuple((s, f) for s in SCENARIOS for f in ("spike", "drift", "bias")),
                          (7,), "{:.3f}", spread=True),
    "cells-oracle": Figure(CELLS, None, fmt="{:.2f}", spread=True,
                           pattern=_CELLS_GRID.format(r"oracle \(clean rows, PCA\)")),
    "cells-angle": Figure(CELLS, None, fmt="{:.2f}", spread=True,
                          pattern=_CELLS_GRID.format(r"MCPCA\(cellwise=True\)")),
    "cells-var": Figure(CELLS, None, fmt="{:.1f}", spread=True, pattern=_CELLS_ROW.format(GROUP + "%", NUM, NUM)),
    "cells-bad": Figure(CELLS, None, fmt="{:.3f}", spread=True, pattern=_CELLS_ROW.format(NUM + "%", GROUP, NUM)),
    "cells-clean": Figure(CELLS, None, fmt="{:.4f}", spread=True, pattern=_CELLS_ROW.format(NUM + "%", NUM, GROUP)),
    "cells-wide": Figure(CELLS, "wide", fmt="{:.2f}", spread=True, template="{1}° against {0}°",
                         pattern=r"\| [\d.]+% \| \d+% \| ([\d.]+) \| [\d.]+ \| ([\d.]+) \|"),
    "cells-default-breaks": Figure(CELLS, "breaks", (("MCPCA()",),), (1, 2, 3), join=", "),
    **{f"tier-{tier}-{what}": Figure("benchmarks/TIERS.md", tier, ((tier,),), (col,))
       for tier in ("dev", "ci") for what, col in (("time", 1), ("passed", 2), ("deselected", 3))},
    **DOCS_FIGURES,
}


def _section(fig: Figure) -> str:
    text = (ROOT / fig.path).read_text()
    if fig.section is None:
        return text
    begin, end = f"<!-- begin {fig.section} -->", f"<!-- end {fig.section} -->"
    if text.count(begin) != 1 or end not in text:
        raise KeyError(f"{fig.path}: no single section {fig.section!r}")
    return text.split(begin, 1)[1].split(end, 1)[0]


def _row(text: str, first: tuple[str, ...]) -> list[str]:
    found = []
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if tuple(cells[: len(first)]) == first:
                found.append(cells)
    if not found:
        raise KeyError(f"no table row starts with {first!r}")
    return found[0]


def _number(cell: str) -> float:
    match = re.match(r"[\d.]+", cell.replace(",", "").lstrip("*"))  # a bold cell, **29.9**, too
    if match is None:
        raise ValueError(f"no number at the start of {cell!r}")
    return float(match.group())


def _spread(fmt: str, nums: list[float]) -> str:
    low, high = fmt.format(min(nums)), fmt.format(max(nums))
    return low if low == high else f"{low}-{high}"


def _written(fig: Figure, cell: str) -> str:
    """``cell`` as the figure writes it: its leading number scaled and formatted, or as it is without ``fmt``."""
    return fig.fmt.format(_number(cell) * fig.scale) if fig.fmt else cell


def value(name: str) -> str:
    """The text of figure ``name`` as the results files give it now."""
    fig = FIGURES[name]
    text = _section(fig)
    if fig.pattern:
        hits = [h if isinstance(h, tuple) else (h,) for h in re.findall(fig.pattern, text)]
        if fig.divide:
            hits = [(repr(_number(h[fig.divide[0]]) / _number(h[fig.divide[1]])),) for h in hits]
        if not hits or (len(hits) > 1 and not fig.spread):
            raise KeyError(f"{name}: {len(hits)} matches of {fig.pattern!r} in {fig.path}")
        if fig.spread:
            groups = range(len(hits[0]))
            return fig.template.format(*(_spread(fig.fmt, [_number(h[g]) * fig.scale for h in hits]) for g in groups))
        return fig.template.format(*(_written(fig, g) for g in hits[0]))
    rows = [_row(text, first) for first in fig.rows]
    if fig.spread:
        return _spread(fig.fmt, [_number(r[c]) * fig.scale for r in rows for c in fig.cols])
    return fig.join.join(_written(fig, r[c]) for r in rows for c in fig.cols)


def spans(text: str) -> list[tuple[str, str]]:
    """The ``(name, written value)`` of every marked span in ``text``."""
    return _SPAN.findall(text)


def render(text: str) -> str:
    """``text`` with every marked span's value replaced by :func:`value`."""
    return _SPAN.sub(lambda m: f"<!-- figure:{m.group(1)} -->{value(m.group(1))}<!-- /figure -->", text)


def stale(text: str) -> list[str]:
    """Lines ``name: written != measured`` for each span that differs from the results files."""
    return [f"{n}: {w!r} != {value(n)!r}" for n, w in spans(text) if w != value(n)]


def main(argv: list[str] | None = None) -> int:
    """Rewrite the marked figures of :data:`FRONT_FILES`; with ``--check``, only report stale ones (exit 1)."""
    argv = sys.argv[1:] if argv is None else argv
    bad = []
    for path in FRONT_FILES:
        text = path.read_text()
        if "--check" in argv:
            bad += [f"{path.name}: {line}" for line in stale(text)]
        elif render(text) != text:
            path.write_text(render(text))
    if "--check" in argv:
        print("\n".join(bad) or "marked figures match the results files")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
