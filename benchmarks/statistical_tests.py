"""How often do the statistical tests fail? Runs the planted-slowdown and A/A tests N times in a
row on an idle machine, then N times beside one process spinning on a core, and writes the
tally to benchmarks/results/statistical-tests-<date>.md.

    python benchmarks/statistical_tests.py [N]      (default 20; ~20 s a run on 2 cores)

Each run is a fresh pytest process (as CI runs them), so the engine build is shared through
the session fixture once per run.
"""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/test_bench.py::test_planted_20_percent_slowdown_is_slower_with_ci_containing_the_truth",
         "tests/test_bench.py::test_a_a_same_engine_is_indistinguishable"]


def one_run() -> dict[str, str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *TESTS],
                          cwd=ROOT, capture_output=True, text=True)
    outcome = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"(PASSED|FAILED|SKIPPED|ERROR) (?:\[\d+\] )?(\S+)", line)
        if m:
            outcome[m.group(2).split("::")[-1]] = m.group(1)
    return outcome


def series(n: int, label: str) -> list[dict[str, str]]:
    runs = []
    for i in range(n):
        runs.append(one_run())
        print(f"{label} {i + 1}/{n}: {runs[-1]}", flush=True)
    return runs


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    idle = series(n, "idle")
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = series(n, "one spinning process")
    finally:
        spinner.kill()
    cpu = re.findall(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())
    flags = set(re.search(r"flags\s*:\s*(.*)", Path("/proc/cpuinfo").read_text()).group(1).split())
    lines = [f"# Statistical tests, {n} runs in a row idle and {n} beside one spinning process",
             "", f"{dt.date.today()}, {cpu[0] if cpu else '?'}, {len(cpu)} cores, "
             f"ISA: {', '.join(f for f in ('avx2', 'avx512f', 'avx512_vnni') if f in flags)}; "
             "each run a fresh `pytest` process (`python benchmarks/statistical_tests.py`).", "",
             "| test | idle: passed / failed / skipped | one spinner: passed / failed / skipped |",
             "|---|---|---|"]
    for test in TESTS:
        name = test.split("::")[-1]
        cells = []
        for runs in (idle, busy):
            got = [r.get(name, "MISSING") for r in runs]
            cells.append(f"{got.count('PASSED')} / {got.count('FAILED') + got.count('ERROR')} / {got.count('SKIPPED')}")
        lines.append(f"| `{name}` | {cells[0]} | {cells[1]} |")
    out = ROOT / "benchmarks" / "results" / f"statistical-tests-{dt.date.today()}.md"
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
