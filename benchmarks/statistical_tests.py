"""How often do the statistical tests fail? The planted-slowdown and A/A experiments of
tests/bench/test_measurement.py, judged exactly as the tests judge them, N times in a row on an idle
machine and N times beside one process spinning on a core; the tally goes to
benchmarks/results/statistical-tests-<date>.md.

    python benchmarks/statistical_tests.py [N]      (default 20; ~12 s a repetition on 2 cores)

One build of `standard` (in a temporary folder) serves every repetition: the build is not
what the tests judge, the timing is.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline import recipe as recipe_mod  # noqa: E402
from pipeline.core import deps  # noqa: E402
from tests.bench.test_measurement import CpuShare, _ab, judge_planted, planted_experiment  # noqa: E402
from tests.conftest import FAST, STANDARD  # noqa: E402


def build(folder: Path) -> Path:
    shutil.copytree(ROOT / "recipes", folder / "recipes")
    subprocess.run([sys.executable, "-m", "pipeline", "run", "standard", *FAST], cwd=folder, check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True)
    return folder


def repetition(pair) -> dict[str, str]:
    """One run of each test: 'passed', 'failed: why' or 'skipped: why' (as the test would)."""
    with CpuShare() as cpu:
        problems = judge_planted(planted_experiment(pair, 0.2), 1.2)
    planted = ("passed" if not problems else
               f"skipped: {cpu.share:.0%} of a core" if cpu.share < 0.9 else f"failed: {problems}")
    verdicts = [_ab(*pair)["verdict"] for _ in range(10)]
    a_a = "passed" if verdicts.count("indistinguishable") >= 9 else f"failed: {verdicts}"
    return {"planted 20%": planted, "A/A": a_a}


def series(pair, n: int, label: str) -> list[dict[str, str]]:
    runs = []
    for i in range(n):
        runs.append(repetition(pair))
        print(f"{label} {i + 1}/{n}: {runs[-1]}", flush=True)
    return runs


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    from pipeline.backends import onnxruntime as ort_backend
    from pipeline.backends.openers import timing_feed

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        folder = build(Path(tmp))
        os.chdir(folder)
        recipe = recipe_mod.load("standard", [FAST[i + 1] for i in range(0, len(FAST), 2)])
        engine = folder / "engines" / STANDARD / "onnxruntime.onnx"
        target = recipe.targets[0]
        a = stack.enter_context(ort_backend.open(engine, target, recipe, threads=1, spin=False))
        b = stack.enter_context(ort_backend.open(engine, target, recipe, threads=1, spin=False))
        pair = (a, b, timing_feed(recipe))
        t0 = time.perf_counter()
        idle = series(pair, n, "idle")
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            busy = series(pair, n, "one spinning process")
        finally:
            spinner.kill()
        minutes = (time.perf_counter() - t0) / 60
    device = deps.device()
    lines = [f"# Statistical tests: {n} repetitions idle, {n} beside one spinning process", "",
             f"{dt.date.today()}, {deps.device_line(device)}; `python benchmarks/statistical_tests.py "
             f"{n}` ({minutes:.0f} min), the experiments and judges of tests/bench/test_measurement.py on one "
             "build of `standard` (one ONNX Runtime thread per session, no spinning).", "",
             "| test | idle: passed / failed / skipped | one spinner: passed / failed / skipped |",
             "|---|---|---|"]
    for test in ("planted 20%", "A/A"):
        cells = []
        for runs in (idle, busy):
            got = [r[test].split(":")[0] for r in runs]
            cells.append(f"{got.count('passed')} / {got.count('failed')} / {got.count('skipped')}")
        lines.append(f"| {test} | {cells[0]} | {cells[1]} |")
    failures = [f"- {label} {i + 1}: {test}: {why}" for label, runs in (("idle", idle), ("spinner", busy))
                for i, r in enumerate(runs) for test, why in r.items() if why != "passed"]
    lines += ["", *(failures or ["Every repetition passed."])]
    out = ROOT / "benchmarks" / "results" / f"statistical-tests-{dt.date.today()}.md"
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())
    if any(re.match(r"- .*: failed", f) for f in failures):
        sys.exit(1)


if __name__ == "__main__":
    main()
