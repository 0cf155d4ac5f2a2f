"""Serving under load, end to end: `pipeline load --serve` against `pipeline serve`, each in
its own process, on this machine; the figures the issue asks for, into benchmarks/results/.

    capacity at a p99 target, Poisson arrivals, MLPerf's early-stopping rule:
      minilm-int8 with dynamic batching (its serve: section) and with max_batch_size 1
      minilm      likewise
    compare --load: minilm vs minilm-int8, and each recipe's batching vs batch size 1
    generation: lm-gen at two offered rates, TTFT / TPOT / goodput against targets

Needs the engines built (`pipeline run minilm-int8|minilm|lm-gen --target onnxruntime`).
Each step is a `pipeline` subprocess; their outputs (load-*.json/png, compare-load.md) are
copied to benchmarks/results/serving-<date>/ with a summary serving-<date>.md.

    HF_HUB_OFFLINE=1 PYTHONPATH=. nice python benchmarks/serving_capacity.py [--slo p99=200ms]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ENGINES = Path("engines")


def pipeline(*args: str) -> tuple[int, str]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    print(f"$ pipeline {' '.join(args)}  ({time.monotonic() - t0:.0f} s, exit {proc.returncode})\n"
          + "\n".join(text.splitlines()[-12:]), flush=True)
    return proc.returncode, text


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slo", default="p99=200ms")
    parser.add_argument("--gen-slo", default="ttft=1000ms,tpot=200ms")
    parser.add_argument("--gen-rates", default="0.5,2")
    parser.add_argument("--max-points", default="6")
    parser.add_argument("--duration", default="5")
    parser.add_argument("--only", default="minilm-int8,minilm,lm-gen")
    args = parser.parse_args()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    out = Path("benchmarks/results") / f"serving-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    log, only = [], args.only.split(",")
    common = ("--serve", "--duration", args.duration, "--max-points", args.max_points)
    for recipe in ("minilm-int8", "minilm"):
        if recipe not in only:
            continue
        log.append(pipeline("load", recipe, *common, "--slo", args.slo))
        log.append(pipeline("load", recipe, *common, "--slo", args.slo,
                            "--set", "serve.max_batch_size=1", "--name", "b1"))
        log.append(pipeline("compare", recipe, f"{recipe}:b1", "--load"))
    if "minilm" in only and "minilm-int8" in only:
        log.append(pipeline("compare", "minilm", "minilm-int8", "--load"))
    if "lm-gen" in only:
        log.append(pipeline("load", "lm-gen", "--serve", "--sweep", args.gen_rates, "--duration",
                            "20", "--min-requests", "20", "--slo", args.gen_slo))
    for folder in (ENGINES / r for r in only):
        for f in sorted(folder.glob("load-*")):
            shutil.copy(f, out / f"{folder.name}-{f.name}")
    for f in sorted((ENGINES / "compare").glob("*/compare-load.md")):
        shutil.copy(f, out / f"{f.parent.name}-compare-load.md")
    lines = [f"# Serving under load ({stamp})", "",
             f"`benchmarks/serving_capacity.py --slo {args.slo}` on this machine (load average "
             f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end); each step's last lines:",
             ""]
    for code, text in log:
        lines += ["```", *text.splitlines()[-14:], f"(exit {code})", "```", ""]
    for f in sorted(out.glob("*-compare-load.md")):
        lines += [f"## {f.stem}", "", f.read_text(), ""]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print(json.dumps({"written": str(out)}))


if __name__ == "__main__":
    main()
