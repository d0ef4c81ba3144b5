"""Time the two test tiers and write ``benchmarks/TIERS.md``.

CONTRIBUTING.md quotes the tiers' times and test counts from this file
(``python benchmarks/_front.py`` writes them), so a session that re-times
the tiers runs this script instead of retyping figures.

``python benchmarks/tiers.py dev`` times the development tier
(``python -m pytest``) in this checkout; ``python benchmarks/tiers.py ci``
clones the checkout's HEAD into a temporary folder and times ``bash .ci/run``
there (the install, ``ruff`` and the full suite on two processes), as CI
does.  ``.ci/run`` installs the clone editable; the script installs this
checkout editable again afterwards (``--no-deps``), so the environment points
where it pointed before.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import cpu_line, update_section

__all__ = ["TIERS", "COMMANDS", "summary", "run_tier", "main"]

ROOT = Path(__file__).resolve().parent.parent
#: The results file CONTRIBUTING.md's tier figures come from.
TIERS = ROOT / "benchmarks" / "TIERS.md"
#: What each tier runs, and where (``clone``: a fresh clone of HEAD).
COMMANDS = {
    "dev": (["python", "-m", "pytest", "-q", "-p", "no:cacheprovider"], False),
    "ci": (["bash", ".ci/run"], True),
}
_SUMMARY = re.compile(r"^(?:=+ )?((?:\d+ \w+(?:, )?)+) in [\d.]+s", re.M)


def summary(log: str) -> dict[str, int]:
    """The counts of pytest's last summary line (``passed``, ``deselected``, ``failed``...)."""
    found = _SUMMARY.findall(log)
    if not found:
        raise ValueError("no pytest summary line in the log")
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", found[-1])}


def run_tier(tier: str) -> tuple[float, dict[str, int]]:
    """Run ``tier``'s command; its wall time in seconds and its summary's counts."""
    cmd, clone = COMMANDS[tier]
    with tempfile.TemporaryDirectory() as tmp:
        where = ROOT
        if clone:
            where = Path(tmp) / "clone"
            subprocess.run(["git", "clone", "-q", str(ROOT), str(where)], check=True)
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=where, capture_output=True, text=True, env=os.environ.copy())
        seconds = time.perf_counter() - start
    if clone:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", str(ROOT), "--no-deps"], check=True)
    counts = summary(proc.stdout)
    if proc.returncode != 0 or counts.get("failed") or counts.get("error"):
        raise SystemExit(f"{tier}: {' '.join(cmd)} exited {proc.returncode}: {counts}\n{proc.stdout[-3000:]}")
    if not clone and "deselected" not in counts:  # pytest-xdist's summary leaves them out: collect once more
        collected = subprocess.run([*cmd, "--collect-only", "-n", "0"], cwd=where, capture_output=True, text=True)
        found = re.search(r"\((\d+) deselected\)", collected.stdout)
        counts["deselected"] = int(found.group(1)) if found else 0
    return seconds, counts


def _minutes(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s:02d} s"


def main(argv: list[str] | None = None) -> int:
    """Time the named tiers and replace their sections of ``TIERS.md``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tiers", nargs="+", choices=sorted(COMMANDS))
    args = parser.parse_args(argv)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    for tier in args.tiers:
        seconds, counts = run_tier(tier)
        body = (f"## `{' '.join(COMMANDS[tier][0])}`{' on a fresh clone' if COMMANDS[tier][1] else ''}\n\n"
                f"HEAD {head.stdout.strip()}; {cpu_line()}; {time.strftime('%Y-%m-%d')}.\n\n"
                "| tier | wall time | passed | deselected |\n|---|---|---|---|\n"
                f"| {tier} | {_minutes(seconds)} | {counts.get('passed', 0):,} | {counts.get('deselected', 0):,} |\n")
        if not TIERS.exists():
            TIERS.write_text("# Test tiers (benchmarks/tiers.py)\n")
        update_section(tier, body, path=TIERS)
        print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
