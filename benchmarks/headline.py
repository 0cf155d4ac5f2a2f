"""Reproduce the project's headline figures and write them to benchmarks/results/.

    python benchmarks/headline.py            # the documented protocol (a few minutes)
    python benchmarks/headline.py --quick    # a smaller protocol, for a smoke check

Headline question: is the "flash" variant (block-sparse attention, 50% FFN pruning) faster
than the standard one, as PyTorch eager and as an ONNX Runtime engine, and how much does
each engine gain over PyTorch? Everything is timed interleaved in one process by
`pipeline bench flash --vs standard` (which builds what is missing first), at the opt shape
and a batch sweep. The result file names the machine, the load on it and the versions:
compare figures only from the same machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The documented protocol (recipe.py LatencySpec defaults), stated explicitly because the
# tiny recipes' base file keeps smaller settings for quick runs.
FULL = {"warmup": 100, "iterations": 1000, "min_seconds": 1.0, "block": 50}
QUICK = {"warmup": 20, "iterations": 200, "min_seconds": 0, "block": 20}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller protocol (smoke check)")
    parser.add_argument("--engines-dir", default=str(ROOT / "engines"))
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads per runtime (1: steadiest on a shared machine)")
    args = parser.parse_args()
    protocol = QUICK if args.quick else FULL
    sets = [f"validate.latency.{k}={v}" for k, v in protocol.items()]
    sets += [f"validate.threads={args.threads}", "validate.latency.sweep={batch: [1, 8]}"]
    cmd = [sys.executable, "-m", "pipeline", "bench", "flash", "--vs", "standard",
           "--engines-dir", args.engines_dir] + [x for s in sets for x in ("--set", s)]
    load_before = os.getloadavg()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True)
    load_after = os.getloadavg()
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        return proc.returncode
    bench = json.loads((Path(args.engines_dir) / "flash" / "bench-vs-standard.json").read_text())
    write_results(bench, cmd, protocol, load_before, load_after, Path(args.engines_dir), args.quick)
    return 0


def write_results(bench, cmd, protocol, load_before, load_after, engines: Path, quick: bool) -> None:
    from pipeline.core import deps

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H%M")
    name = f"{stamp}-{'quick-' if quick else ''}flash-vs-standard"
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(engines / "flash" / bench["plot"], out / f"{name}.png")
    machine = {"cpu": deps.cpu_name(), "cores": len(os.sched_getaffinity(0)),
               "gpu": deps.identity().gpu, "load_average_before": load_before[0],
               "load_average_after": load_after[0]}
    record = {"machine": machine, "versions": deps.versions(), "command": cmd[1:],
              "protocol": protocol, "bench": bench}
    (out / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    res = bench["resources"]
    lines = [
        f"# flash vs standard ({stamp} UTC{', quick protocol' if quick else ''})", "",
        f"- machine: {machine['cpu']}, {machine['cores']} cores, GPU: {machine['gpu'] or 'none'}",
        f"- load average (1 min) before/after: {load_before[0]:.1f} / {load_after[0]:.1f}; machine busy "
        f"while timing: {res['system_busy_pct']['mean']:.0f}% (mean of samples)",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in record["versions"].items() if v),
        f"- protocol: {protocol}, threads per runtime from the command; harness overhead "
        f"{bench['harness_overhead_us']['p50']:.2f} us/request",
        "- command: `" + " ".join(cmd[1:]) + "`", "",
        "Noisy machine: the CPU was shared with other jobs while this ran, so absolute times "
        "move between runs; the interleaved ratios and their intervals are the figures to read.",
        "", "| shape | runner | p50 ms | p99 ms | CoV | n |", "|---|---|---|---|---|---|",
    ]
    for s in bench["shapes"]:
        for runner, lat in s["latency_ms"].items():
            lines.append(f"| {s['shape']} | {runner} | {lat['p50']:.3f} | {lat['p99']:.3f} | "
                         f"{lat['cov']:.2f} | {lat['n']} |")
    lines += ["", "| shape | A | B | B time / A time [95% CI] | verdict (B) |", "|---|---|---|---|---|"]
    for s in bench["shapes"]:
        for c in s["comparisons"]:
            lines.append(f"| {s['shape']} | {c['a']} | {c['b']} | {c['time_ratio']:.3f} "
                         f"[{c['ci95'][0]:.3f}, {c['ci95'][1]:.3f}] | {c['verdict']} |")
    cold = bench["cold_start_ms"]
    lines += ["", "Cold start (load + first request, ms): "
              + "; ".join(f"{k} {v['load']:.1f} + {v['first_request']:.1f}" for k, v in cold.items()),
              "", f"![latency distributions]({name}.png)", ""]
    (out / f"{name}.md").write_text("\n".join(lines))
    print(f"results: {out / name}.md")


if __name__ == "__main__":
    sys.exit(main())
