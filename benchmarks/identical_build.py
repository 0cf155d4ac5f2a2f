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
    r"detail|note|finished|updated)", re.I)


# manifest.json: a stage's cache key digests the code that runs it, so moved code changes it
CACHE_KEY = re.compile(r"^stages\.[^.]+\.key$")


def flatten(value, prefix=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from flatten(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from flatten(v, f"{prefix}[{i}]")
    else:
        yield prefix, value


def npz_arrays_differing(before: Path, after: Path) -> list[str]:
    """The arrays of two .npz files that differ (or are in one only), by name."""
    import numpy as np

    with np.load(before) as b, np.load(after) as a:
        names = sorted(set(b.files) | set(a.files))
        return [n for n in names if n not in b.files or n not in a.files
                or not (b[n].shape == a[n].shape and np.array_equal(b[n], a[n]))]


def file_verdict(name: str, before: Path, after: Path) -> tuple[str, bool]:
    """A differing file's verdict and whether it may differ: files of timings may; an .npz
    may when only arrays of measured quantities differ (e.g. the baseline's answer seconds)."""
    if TIMED_FILES.match(name):
        return "no (measured)", True
    if name.endswith(".npz"):
        arrays = npz_arrays_differing(before / name, after / name)
        if arrays and all(MEASURED.search(a) for a in arrays):
            return f"no (measured arrays only: {', '.join(arrays)})", True
        return f"**NO** (arrays: {', '.join(arrays)})", False
    return "**NO**", False


def json_values(name: str, before: Path, after: Path) -> tuple[list[str], bool]:
    """A JSON file of both builds compared value by value: measured values and the stage
    cache keys (they digest the code, which the restructuring changed) may differ."""
    vb = dict(flatten(json.loads((before / name).read_text())))
    va = dict(flatten(json.loads((after / name).read_text())))
    measured, keys, other = [], [], []
    for key in sorted(set(vb) | set(va)):
        if name == "manifest.json" and key.startswith("files."):
            continue  # the file table above judged every recorded file
        if vb.get(key, "<absent>") != va.get(key, "<absent>"):
            (keys if CACHE_KEY.search(key) else measured if MEASURED.search(key) else other).append(key)
    lines = ["", f"{name}: {len(vb)} values before, {len(va)} after; {len(measured)} measured values "
             f"differ (timings, memory, dates), {len(keys)} stage cache keys differ, "
             f"{len(other)} other values differ."]
    lines += [f"- **{key}**: {vb.get(key, '<absent>')!r} -> {va.get(key, '<absent>')!r}" for key in other]
    return lines, not other


def compare(before: Path, after: Path) -> tuple[list[str], bool]:
    lines, same = [], True
    files_b = json.loads((before / "manifest.json").read_text())["files"]
    files_a = json.loads((after / "manifest.json").read_text())["files"]
    lines += ["| file | before sha256 | after sha256 | same |", "|---|---|---|---|"]
    for name in sorted(set(files_b) | set(files_a)):
        b, a = files_b.get(name, {}).get("sha256"), files_a.get(name, {}).get("sha256")
        verdict, allowed = ("yes", True) if a == b else (
            ("**NO** (in one build only)", False) if None in (a, b) else file_verdict(name, before, after))
        same &= allowed
        lines.append(f"| {name} | {(b or '—')[:12]} | {(a or '—')[:12]} | {verdict} |")
    for name in ("report.json", "manifest.json"):
        value_lines, values_same = json_values(name, before, after)
        lines += value_lines
        same &= values_same
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
