"""GPU check: every GPU-capable target of the base GLM recipes, and the PyTorch baselines
that matter on a GPU, measured with the project's protocol. `make gpu-check` runs it.

For `standard-base` and `flash-base` (~201M parameters):
  1. the pipeline itself (baseline, build, validate, report) restricted to the targets that
     run on CUDA here (AOTInductor; TensorRT and ORT's CUDA EP when installed). With only
     PyTorch-native targets the run skips the ONNX stages; its validation timing is
     shortened (VALIDATION below), since step 2 is the measurement that counts;
  2. a shape study at batch x sequence = 1 x 16 (launch-bound) and 8 x 512 (compute-bound):
     eager fp16, the same eager model captured as CUDA Graphs, and the AOTInductor engine,
     timed interleaved in one process with outputs left on the device (copying [8, 512,
     32000] fp32 logits to the host would cost more than the model); accuracy of each
     against eager fp32 on that feed, judged by the recipe's tolerance.
  3. checks: every runner within tolerance; the CUDA Graph baseline at least 5x faster than
     eager at 1 x 16 (the whole 95% interval). Exit 3 when one fails, 0 when all hold.

Results go to benchmarks/results/gpu-check-<gpu>.json, rewritten after every step so a run
stopped by its time limit still leaves what it measured. Needs no network; on a machine
without pydantic or polygraphy, carry them as wheels (benchmarks/device_wheels.sh).

    python benchmarks/gpu_check.py [--recipes standard-base flash-base] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from pipeline import backends
from pipeline import recipe as recipe_mod
from pipeline.artifacts import dump
from pipeline.backends import engine_name
from pipeline.bench import timing
from pipeline.core import deps, stats
from pipeline.metrics.accuracy import compare
from pipeline.model import sources as models
from pipeline.recipe import LatencySpec
from pipeline.run.execute import Run
from pipeline.stages.validate import gates
from pipeline.store.recipe_folder import write_atomic

SHAPES = ((1, 16), (8, 512))
PROTOCOL = LatencySpec(warmup=50, iterations=300, min_seconds=1.0, block=25)
# The pipeline's own validation (host arrays in and out, at the opt shape 8 x 512): kept
# short, two feeds, so both recipes fit the check's time budget.
VALIDATION = ["validate.latency={warmup: 10, iterations: 50, min_seconds: 0.25, block: 10}",
              "data.validation.samples=2"]
MIN_GRAPH_SPEEDUP = 5.0  # CUDA Graphs over eager fp16 at 1 x 16, lower end of the interval


def targets_on(recipe, device: str = "cuda") -> list:
    """The recipe's targets that can be built here and run on `device`."""
    keep = []
    for target in recipe.targets:
        backend = backends.get(target.kind)
        if backend.unavailable(target) is None and backend.device(target) == device:
            keep.append(target)
    return keep


def shape_study(recipe, engine_path: Path | None, aoti_target, *, device: str = "cuda",
                shapes=SHAPES, protocol: LatencySpec = PROTOCOL):
    """Yield one row per shape: each runner's latency, speedup over eager fp16 and accuracy
    against eager fp32. `device="cpu"` (no CUDA Graphs there) is the rehearsal a test runs."""
    import torch

    from pipeline.backends.torch import CudaGraphRunner, TorchRunner, to_host

    names = [i.name for i in recipe.inputs]
    vocab = int(recipe.inputs[0].range[1])
    model = models.load(recipe)  # on the host; each runner moves its own copy
    for batch, seq in shapes:
        feed = {names[0]: np.random.default_rng(0).integers(0, vocab, (batch, seq), dtype=np.int64)}
        with TorchRunner(copy.deepcopy(model), names, recipe.outputs, device=device) as fp32:
            reference = fp32.infer(feed, check_inputs=False)
        runners = [TorchRunner(copy.deepcopy(model), names, recipe.outputs, device=device, dtype="fp16",
                               host_outputs=False)]
        if device == "cuda":
            runners.append(CudaGraphRunner(copy.deepcopy(model), names, recipe.outputs, dtype="fp16",
                                           host_outputs=False))
        if engine_path is not None:
            runners.append(backends.get("aotinductor").open(engine_path, aoti_target, recipe,
                                                            host_outputs=False))
        for r in runners:
            r.activate()
        try:
            # one OutputAccuracy per output, the type the validate stage's gates read
            accuracy = {r.name: compare([reference], [to_host(r.infer(feed, check_inputs=False))],
                                        recipe.outputs)
                        for r in runners}
            blocks = timing.time_interleaved(runners, feed, protocol).blocks
        finally:
            for r in runners:
                r.deactivate()
            if device == "cuda":
                torch.cuda.empty_cache()
        eager = blocks[0]
        row = {"batch": batch, "sequence": seq, "runners": {}}
        for r, b in zip(runners, blocks):
            row["runners"][r.name] = {
                "latency_ms": stats.summary(b).dump(),
                "speedup_vs_eager_fp16": stats.speedup(eager, b, noise=protocol.noise_threshold).dump(),
                "accuracy_vs_eager_fp32": {k: m.model_dump() for k, m in accuracy[r.name].items()},
                "gates": [g.model_dump() for g in gates(recipe, accuracy[r.name])],
            }
        print(f"  {batch}x{seq}: " + ", ".join(
            f"{n} {v['latency_ms']['p50']:.3f} ms" for n, v in row["runners"].items()), flush=True)
        yield row


def checks(rows: list[dict]) -> list[dict]:
    """The issue's bars, judged from the shape study."""
    out = []
    for row in rows:
        shape = f"{row['batch']}x{row['sequence']}"
        for name, r in row["runners"].items():
            failed = [g["name"] for g in r["gates"] if not g["passed"]]
            out.append({"name": f"{shape}.{name}.accuracy", "passed": not failed,
                        "detail": "within the recipe's tolerance vs eager fp32" if not failed
                        else f"failed: {', '.join(failed)}"})
        graphs = next((r for n, r in row["runners"].items() if n.startswith("torch-cudagraph")), None)
        if (row["batch"], row["sequence"]) == SHAPES[0] and graphs is not None:
            s = graphs["speedup_vs_eager_fp16"]
            out.append({"name": f"{shape}.cudagraph_speedup", "passed": s["ci95"][0] >= MIN_GRAPH_SPEEDUP,
                        "detail": f"{s['ratio']:.2f}x [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}] over "
                                  f"eager fp16; needs the whole interval >= {MIN_GRAPH_SPEEDUP:g}x"})
    return out


def check_recipe(name: str, engines_dir: Path, entry: dict, save, *, device: str = "cuda",
                 shapes=SHAPES, protocol: LatencySpec = PROTOCOL, overrides: tuple = ()) -> None:
    """Fill `entry` with one recipe's results, calling `save()` after every step."""
    recipe = recipe_mod.load(name, [*VALIDATION, *overrides])
    recipe.targets = targets_on(recipe, device)
    entry["targets"] = [t.id for t in recipe.targets]
    print(f"{name}: targets on {device} here: {entry['targets'] or 'none'}", flush=True)
    aoti = next((t for t in recipe.targets if t.kind == "aotinductor"), None)
    engine = None
    if recipe.targets:
        outcome = Run(recipe, engines_dir).execute("report")
        report = dump(outcome.report)  # the Report model as report.json holds it
        entry["engines"] = report["engines"]
        entry["baseline"] = report["baseline"]
        if aoti is not None:
            engine = outcome.store.dir / engine_name(aoti)
        save()
    entry["shapes"] = []
    for row in shape_study(recipe, engine, aoti, device=device, shapes=shapes, protocol=protocol):
        entry["shapes"].append(row)
        save()
    entry["checks"] = checks(entry["shapes"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=["standard-base", "flash-base"])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--engines-dir", type=Path, default=Path("engines"))
    args = parser.parse_args()

    if not deps.gpus():
        print("Error: gpu-check needs an NVIDIA GPU (nvidia-smi found none)", file=sys.stderr)
        return 2
    gpu = deps.identity().gpu
    out = args.out or Path("benchmarks/results") / f"gpu-check-{gpu.replace(' ', '-')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    results = {"what": __doc__.split("\n\n")[0], "device": deps.device(), "versions": deps.versions(),
               "protocol": PROTOCOL.model_dump(), "pipeline_settings": VALIDATION, "recipes": {}}

    def save():
        write_atomic(out, json.dumps(results, indent=2, default=str))

    save()
    start = time.perf_counter()
    for name in args.recipes:
        entry = results["recipes"][name] = {}
        began = time.perf_counter()
        try:
            check_recipe(name, args.engines_dir, entry, save)
        except Exception as e:  # noqa: BLE001 -- on a lent GPU, one failure must not lose the rest
            entry["error"] = f"{type(e).__name__}: {e}"
            entry["traceback"] = traceback.format_exc()
            print(f"{name}: FAILED: {entry['error']}", file=sys.stderr, flush=True)
        entry["seconds"] = round(time.perf_counter() - began, 1)
        save()
    failed = [f"{n}: {c['name']} ({c['detail']})" for n, e in results["recipes"].items()
              for c in e.get("checks", []) if not c["passed"]]
    failed += [f"{n}: {e['error']}" for n, e in results["recipes"].items() if "error" in e]
    for line in failed:
        print(f"check failed: {line}", file=sys.stderr)
    print(f"results: {out} ({time.perf_counter() - start:.0f} s)")
    return 3 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
