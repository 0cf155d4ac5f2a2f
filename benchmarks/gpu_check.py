"""GPU check: every GPU-capable target of the base GLM recipes, and the PyTorch baselines
that matter on a GPU, measured with the project's protocol. `make gpu-check` runs it.

For `standard-base` and `flash-base` (~201M parameters):
  1. the pipeline itself (export, baseline, build, validate, report) restricted to the
     targets that run on CUDA here (AOTInductor; TensorRT and ORT's CUDA EP when installed);
  2. a shape study at batch x sequence = 1 x 16 (launch-bound) and 8 x 512 (compute-bound):
     eager fp16, the same eager model captured as CUDA Graphs, and the AOTInductor engine,
     timed interleaved in one process; accuracy of each against eager fp32 on that feed.

Results go to benchmarks/results/gpu-check-<gpu>.json, rewritten after every step so a run
stopped by its time limit still leaves what it measured. Needs no network.

    python benchmarks/gpu_check.py [--recipes standard-base flash-base] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from pipeline import backends, deps, models
from pipeline import recipe as recipe_mod
from pipeline.bench import stats, timing
from pipeline.metrics import compare
from pipeline.recipe import LatencySpec
from pipeline.run import Run
from pipeline.store import write_atomic

SHAPES = ((1, 16), (8, 512))
PROTOCOL = LatencySpec(warmup=50, iterations=300, min_seconds=1.0, block=25)


def gpu_targets(recipe) -> list:
    """The recipe's targets that can be built here and run on CUDA."""
    keep = []
    for target in recipe.targets:
        backend = backends.get(target.kind)
        if backend.unavailable(target) is None and backend.device(target) == "cuda":
            keep.append(target)
    return keep


def shape_study(recipe, engine_path: Path | None, aoti_target) -> list[dict]:
    import torch

    from pipeline.backends.torch import CudaGraphRunner, TorchRunner

    names = [i.name for i in recipe.inputs]
    vocab = int(recipe.inputs[0].range[1])
    rows = []
    for batch, seq in SHAPES:
        feed = {names[0]: np.random.default_rng(0).integers(0, vocab, (batch, seq), dtype=np.int64)}
        with TorchRunner(models.load(recipe), names, recipe.outputs, device="cuda") as fp32:
            reference = fp32.infer(feed, check_inputs=False)
        runners = [
            TorchRunner(models.load(recipe), names, recipe.outputs, device="cuda", dtype="fp16"),
            CudaGraphRunner(models.load(recipe), names, recipe.outputs, dtype="fp16"),
        ]
        if engine_path is not None:
            runners.append(backends.get("aotinductor").open(engine_path, aoti_target, recipe))
        for r in runners:
            r.activate()
        try:
            accuracy = {r.name: compare([reference], [r.infer(feed, check_inputs=False)], recipe.outputs)
                        for r in runners}
            blocks = timing.time_interleaved(runners, feed, PROTOCOL)
        finally:
            for r in runners:
                r.deactivate()
            torch.cuda.empty_cache()
        eager = blocks[0]
        row = {"batch": batch, "sequence": seq, "runners": {}}
        for r, b in zip(runners, blocks):
            row["runners"][r.name] = {
                "latency_ms": stats.summary(b),
                "speedup_vs_eager_fp16": stats.speedup(eager, b, noise=PROTOCOL.noise_threshold),
                "accuracy_vs_eager_fp32": accuracy[r.name],
            }
        rows.append(row)
        print(f"  {batch}x{seq}: " + ", ".join(
            f"{n} {v['latency_ms']['p50']:.3f} ms" for n, v in row["runners"].items()), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=["standard-base", "flash-base"])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--engines-dir", type=Path, default=Path("engines"))
    args = parser.parse_args()

    if not deps.gpus():
        print("Error: gpu-check needs an NVIDIA GPU (nvidia-smi found none)", file=sys.stderr)
        return 2
    gpu = deps.device()["gpu"]
    out = args.out or Path("benchmarks/results") / f"gpu-check-{gpu.replace(' ', '-')}.json"
    results = {"what": __doc__.split("\n\n")[0], "device": deps.device(), "versions": deps.versions(),
               "protocol": PROTOCOL.model_dump(), "recipes": {}}
    start = time.perf_counter()
    for name in args.recipes:
        recipe = recipe_mod.load(name)
        recipe.targets = gpu_targets(recipe)
        entry = results["recipes"][name] = {"targets": [t.id for t in recipe.targets]}
        print(f"{name}: targets on CUDA here: {entry['targets'] or 'none'}", flush=True)
        aoti = next((t for t in recipe.targets if t.kind == "aotinductor"), None)
        engine = None
        if recipe.targets:
            outcome = Run(recipe, args.engines_dir).execute("report")
            entry["engines"] = outcome.report["engines"]
            entry["baseline"] = outcome.report["baseline"]
            if aoti is not None:
                engine = outcome.store.dir / f"{aoti.id}.pt2"
        write_atomic(out, json.dumps(results, indent=2, default=str))
        entry["shapes"] = shape_study(recipe, engine, aoti)
        entry["seconds"] = round(time.perf_counter() - start, 1)
        write_atomic(out, json.dumps(results, indent=2, default=str))
    print(f"results: {out} ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
