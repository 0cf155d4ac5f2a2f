"""INT8 engine vs the FP32 ONNX Runtime engine of the same variant, in one process.

    PYTHONPATH=. python benchmarks/int8_vs_fp32.py [RECIPE] [--rounds N] [--threads T]

Builds (or reuses) the recipe's engines with the pipeline (`pipeline build RECIPE`), builds
the FP32 ONNX Runtime engine of the same variant from its FP32 graph (optimized.onnx, or
model.onnx when the recipe skips the optimize stage) with the same
target settings, then times both on the recipe's timing feed (the profile's opt point),
interleaved in blocks in this one process (bench.timing), `--rounds` times. Each round
gives the INT8 speedup over FP32 with a 95% interval (core.stats.paired_ratio).
Results (machine, versions, per-round figures) go to benchmarks/results/<recipe>.json/.md.
A benchmark, not a test: CPU timings on a shared machine are noisy; read the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from pathlib import Path

import numpy as np

from pipeline import backends
from pipeline import recipe as recipe_mod
from pipeline.backends.openers import timing_feed
from pipeline.bench import timing
from pipeline.core import deps, stats
from pipeline.recipe import LatencySpec
from pipeline.run.execute import Run
from pipeline.store.recipe_folder import now

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default="flash-int8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--engines-dir", default="engines")
    args = parser.parse_args()

    recipe = recipe_mod.load(args.recipe)
    outcome = Run(recipe, Path(args.engines_dir)).execute("build")
    folder = outcome.store.dir
    target = recipe.targets[0]
    backend = backends.get(target.kind)
    quantized = folder / f"{target.id}{backend.EXTENSION}"
    feed = timing_feed(recipe)
    spec = LatencySpec(warmup=20, iterations=args.iterations, min_seconds=1.0, block=20)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        # the FP32 graph the precision stage started from: same fusions, no Q/DQ
        fp32_graph = folder / "optimized.onnx" if (folder / "optimized.onnx").is_file() else folder / "model.onnx"
        fp32, _ = backend.build(fp32_graph, target, recipe, Path(tmp))
        with backend.open(fp32, target, recipe, threads=args.threads, spin=False) as a, \
                backend.open(quantized, target, recipe, threads=args.threads, spin=False) as b:
            out_a, out_b = a.infer(feed, check_inputs=False), b.infer(feed, check_inputs=False)
            for i in range(args.rounds):
                fp32_blocks, int8_blocks = timing.time_interleaved([a, b], feed, spec)
                ratio, lo, hi = stats.paired_ratio(fp32_blocks, int8_blocks)
                rounds.append({
                    "round": i + 1, "speedup": ratio, "ci95": [lo, hi],
                    "fp32_p50_ms": stats.summary(fp32_blocks).p50,
                    "int8_p50_ms": stats.summary(int8_blocks).p50,
                })
                print(f"round {i + 1}: fp32 p50 {rounds[-1]['fp32_p50_ms']:.2f} ms, "
                      f"{recipe.precision.mode} p50 {rounds[-1]['int8_p50_ms']:.2f} ms, "
                      f"speedup {ratio:.2f}x [{lo:.2f}, {hi:.2f}]")
    name = next(iter(out_a))
    ref, got = out_a[name].astype(np.float64), out_b[name].astype(np.float64)
    speedups = [r["speedup"] for r in rounds]
    result = {
        "recipe": recipe.name, "created": now(), "precision": recipe.precision.mode,
        "engines": {"fp32": f"{fp32_graph.name} built by the same target (session-optimized)",
                    recipe.precision.mode: str(quantized)},
        "feed_shapes": {k: list(v.shape) for k, v in feed.items()},
        "protocol": "one process, the two engines interleaved in blocks of 20 (order alternating), "
                    f">= {args.iterations} requests and >= 1 s each per round, ORT threads not "
                    "spinning; speedup of quantized over fp32: " + stats.PAIRED_RATIO_METHOD,
        "machine": {"cpu": deps.cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "load_average": os.getloadavg()},
        "versions": deps.versions(),
        "threads": args.threads,
        "rounds": rounds,
        "speedup_median": float(np.median(speedups)),
        "speedup_min": float(min(speedups)),
        "speedup_max": float(max(speedups)),
        "cosine_quantized_vs_fp32_engine": float((ref * got).sum() / np.linalg.norm(ref) / np.linalg.norm(got)),
    }
    RESULTS.mkdir(exist_ok=True)
    stem = recipe.name + (f"-threads{args.threads}" if args.threads else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    threads = f"{args.threads} intra-op thread(s)" if args.threads else "ORT's default intra-op threads (one per core)"
    lines = [f"# {recipe.name}: {recipe.precision.mode} vs fp32 ONNX Runtime engine, {threads}", "",
             f"- created {result['created']} on {result['machine']['cpu']} ({result['machine']['cores']} cores, "
             f"load average at the end {', '.join(f'{x:.1f}' for x in result['machine']['load_average'])})",
             "- versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items() if v),
             f"- feed: {result['feed_shapes']}; {result['protocol']}", "",
             "| round | fp32 p50 ms | quantized p50 ms | speedup [95% CI] |", "|---|---|---|---|"]
    lines += [f"| {r['round']} | {r['fp32_p50_ms']:.2f} | {r['int8_p50_ms']:.2f} | "
              f"{r['speedup']:.2f}x [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] |" for r in rounds]
    lines += ["", f"Median speedup over rounds: **{result['speedup_median']:.2f}x** "
              f"(min {result['speedup_min']:.2f}x, max {result['speedup_max']:.2f}x)."]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print(f"median speedup {result['speedup_median']:.2f}x; results in {RESULTS}")


if __name__ == "__main__":
    main()
