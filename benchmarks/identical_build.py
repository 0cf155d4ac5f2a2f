"""Two builds of the same recipes (before and after a restructuring) compared: every recorded
file by sha256, and report.json value by value, the measured timings and memory set apart.

usage: python benchmarks/identical_build.py BEFORE_ENGINES AFTER_ENGINES RECIPE [RECIPE ...]

Prints a Markdown section per recipe: the files (same bytes or not), then every report.json
value that differs, split into "measured" (time, rates, memory, dates: a rerun differs) and
"other" (accuracy, gates' verdicts, precision, answers, graph facts: must be equal). The
exit code is 1 when an engine or graph file, or an "other" value, differs.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# Files whose bytes carry measured timings (so they differ between any two runs).
TIMED_FILES = re.compile(r"^(report\.(json|md)|validate-.*\.json|versus-.*\.json|.*\.png)$")
# report.json paths of measured quantities: time, rates, ratios of times, memory, dates,
# and the gate details that quote them.
MEASURED = re.compile(
    r"(latency|_ms|_ns|_us|_s\b|_s\.|seconds|speedup|ratio|ci95|verdict|blocks|tokens_per_s|"
    r"time_per_task|ttft|tpot|rss|memory|resources|created|cold_start|harness|stop|"
    r"floor|bandwidth|cov|std|mean|p50|p90|p99|\bn\b|profile|plot|warnings|_pct|share_of_time|"
    r"detail|note)", re.I)


def flatten(value, prefix=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from flatten(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from flatten(v, f"{prefix}[{i}]")
    else:
        yield prefix, value


def compare(before: Path, after: Path) -> tuple[list[str], bool]:
    lines, same = [], True
    files_b = json.loads((before / "manifest.json").read_text())["files"]
    files_a = json.loads((after / "manifest.json").read_text())["files"]
    lines += ["| file | before sha256 | after sha256 | same |", "|---|---|---|---|"]
    for name in sorted(set(files_b) | set(files_a)):
        b, a = files_b.get(name, {}).get("sha256"), files_a.get(name, {}).get("sha256")
        equal = a == b
        if not equal and not TIMED_FILES.match(name):
            same = False
        lines.append(f"| {name} | {(b or '—')[:12]} | {(a or '—')[:12]} | "
                     f"{'yes' if equal else ('no (measured)' if TIMED_FILES.match(name) else '**NO**')} |")
    rb = dict(flatten(json.loads((before / "report.json").read_text())))
    ra = dict(flatten(json.loads((after / "report.json").read_text())))
    measured, other = [], []
    for key in sorted(set(rb) | set(ra)):
        if rb.get(key, "<absent>") != ra.get(key, "<absent>"):
            (measured if MEASURED.search(key) else other).append(key)
    lines += ["", f"report.json: {len(rb)} values before, {len(ra)} after; "
              f"{len(measured)} measured values differ (timings, memory, dates), "
              f"{len(other)} other values differ."]
    for key in other:
        same = False
        lines.append(f"- **{key}**: {rb.get(key, '<absent>')!r} -> {ra.get(key, '<absent>')!r}")
    return lines, same


def main(argv: list[str]) -> int:
    before, after, recipes = Path(argv[0]), Path(argv[1]), argv[2:]
    ok = True
    for recipe in recipes:
        lines, same = compare(before / recipe, after / recipe)
        ok &= same
        print(f"### {recipe}: {'identical' if same else 'DIFFERENT'}\n")
        print("\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
