"""validate: each engine against the PyTorch baseline, for accuracy and for latency.

`baseline` runs the eager PyTorch model on the held-out validation feeds and saves feeds
and outputs (baseline.npz): every engine is judged on exactly those. `validate` runs one
engine on the same feeds, then times engine and baseline interleaved in one process at the
opt shape and every sweep shape (bench.protocol), and reports the speedup with a 95%
interval, cold start, resources, the harness's own overhead and a latency plot (PNG).
"""

from __future__ import annotations

import contextlib
import json
import zipfile
from pathlib import Path

from pipeline import backends, data
from pipeline.artifacts import EngineResult, dump
from pipeline.backends.torch import TorchRunner
from pipeline.bench import plots, protocol, stats, sweep, timing
from pipeline.errors import StageFailed
from pipeline.metrics import accuracy as metrics
from pipeline.model import sources as models
from pipeline.recipe import Recipe
from pipeline.store.recipe_folder import Artifact

BASELINE = "torch-eager"

PROTOCOL = (
    "{timer} around each request (host arrays in and out), after {warmup} warm-up "
    "requests; at least {iterations} requests and {min_seconds:g} s per runner{early}; engine and "
    "baseline interleaved in blocks of {block} in one process (order alternating each "
    "round; {threads}; runtime threads {spinning}); speedup of the engine over the baseline: "
    "{method}"
)


def baseline_runner(recipe: Recipe, model, device: str = "cpu", cls=TorchRunner,
                    dtype: str = "fp32") -> TorchRunner:
    return cls(model, [i.name for i in recipe.inputs], recipe.outputs,
               threads=recipe.validation.threads, device=device, dtype=dtype)


def _vs_cudagraph(recipe: Recipe, target, runner, spec) -> dict:
    """On GPU the fair baseline is the eager model replayed as CUDA Graphs (no launch cost),
    in the engine's own float type where the target declares one (AOTInductor's fp16), so
    the ratio measures compilation, not precision."""
    from pipeline.backends.torch import CudaGraphRunner

    dtype = getattr(target, "dtype", "fp32")
    with baseline_runner(recipe, models.load(recipe), "cuda", CudaGraphRunner, dtype) as graphs:
        graph_blocks, engine_blocks = timing.time_interleaved([graphs, runner], timing_feed(recipe), spec)
    return {**stats.speedup(graph_blocks, engine_blocks, noise=spec.noise_threshold),
            "baseline": graphs.name, "baseline_latency_ms": stats.summary(graph_blocks)}


def threads_used(threads: int | None) -> str:
    """The intra-op thread setting the timings ran under, in words (it moves speedups: the
    INT8 engine of flash-int8 was 1.87x its FP32 one at 2 threads, 2.25x at 1)."""
    if threads:
        return f"{threads} intra-op thread{'s' if threads > 1 else ''} per runtime"
    import torch

    return (f"each runtime's default intra-op threads (torch {torch.get_num_threads()}, "
            "ONNX Runtime one per physical core)")


def timing_feed(recipe: Recipe) -> data.Feed:
    """The feed every runner is timed on: the profile's opt point."""
    return data.feeds(recipe, "export")[0]


def baseline_device(recipe: Recipe) -> str:
    from pipeline import deps

    choice = recipe.validation.device
    return ("cuda" if deps.gpus() else "cpu") if choice == "auto" else choice


def baseline(recipe: Recipe, workdir: Path) -> tuple[dict[str, Path], dict]:
    if recipe.workload.kind == "generation":
        from pipeline.generation import validate as generation

        return generation.baseline(recipe, workdir)
    validation = data.split(recipe, "validation")
    feeds = validation.feeds
    device = baseline_device(recipe)
    protocol.import_runtimes()
    with contextlib.ExitStack() as stack:
        runner, cold = protocol.cold_start(
            stack, lambda: baseline_runner(recipe, models.load(recipe), device), timing_feed(recipe))
        outputs = [runner.infer(f, check_inputs=False) for f in feeds]
        samples = timing.time_runner(runner, timing_feed(recipe), recipe.validation.latency)
    path = workdir / "baseline.npz"
    data.save_feeds(path, feeds, outputs, validation.labels, validation.masks)
    return {"baseline.npz": path}, {
        "data": data.provenance(recipe),
        "runner": "torch-eager",
        "precision": "fp32",
        "device": device,
        "threads": recipe.validation.threads,
        "feeds": len(feeds),
        "latency_ms": stats.summary(samples),
        "cold_start_ms": cold,
        "latency_method": f"perf_counter_ns per request after {recipe.validation.latency.warmup} warm-up requests, alone",
    }


def gates(recipe: Recipe, accuracy: dict) -> list[dict]:
    tol = recipe.validation.tolerance
    out = []
    for name, m in accuracy.items():
        out.append(_gate(f"{name}.cosine", m["cosine"] >= tol.cosine_min,
                         f"{m['cosine']:.6f} >= {tol.cosine_min:g}"))
        if tol.max_abs is not None:
            out.append(_gate(f"{name}.max_abs", m["max_abs"] <= tol.max_abs,
                             f"{m['max_abs']:.3g} <= {tol.max_abs:g}"))
        if tol.top1_min is not None and name in recipe.top1_outputs():
            agree = m["top1_agreement"]  # None: no class axis to take an argmax over
            out.append(_gate(f"{name}.top1_agreement", agree is not None and agree >= tol.top1_min,
                             f"{agree:.4f} >= {tol.top1_min:g}" if agree is not None else
                             f"not measurable: `{name}` has no class axis (last dim > 1)"))
        out.append(_gate(f"{name}.finite", m["nonfinite"] == 0, f"{m['nonfinite']} NaN/Inf elements"))
    return out


def precision_checks(recipe: Recipe, target, engine: Artifact, workdir: Path,
                     gate_list: list[dict]) -> dict:
    """Effective precision of a quantized engine that is an ONNX graph (ENGINE_IS_ONNX: ONNX
    Runtime's profiler times its kernels) and its gate; CPU caveats."""
    from pipeline.precision import EMULATED_ON_CPU

    spec, extra = recipe.precision, {}
    if spec.mode in EMULATED_ON_CPU:
        extra["latency_note"] = EMULATED_ON_CPU[spec.mode]
    if backends.get(target.kind).ENGINE_IS_ONNX and spec.mode in ("int8", "int4", "fp8"):
        from pipeline.precision import effective

        result = effective.measure(engine.path, timing_feed(recipe), workdir, fp8=spec.mode == "fp8")
        extra["effective_precision"] = result
        if spec.require_effective_precision is not None:
            gate_list.append(effective.gate(result, spec.require_effective_precision))
    return extra


def _task(recipe: Recipe, feeds, references, outputs, labels, masks) -> dict | None:
    """validate.task: PyTorch and the engine scored on the same validation samples."""
    if recipe.validation.task is None:
        return None
    from pipeline.metrics import task as task_metrics

    try:
        return task_metrics.score(recipe.validation.task, feeds, references, outputs,
                                  recipe.outputs[0], labels, masks)
    except ValueError as e:  # data without what the metric needs (labels, pairs)
        raise StageFailed(f"validate.task {recipe.validation.task}: {e}",
                          "check data.validation against the task") from None


def decode_floor(recipe: Recipe, engine: Path, generation: dict) -> dict:
    """`generation.floor`: bytes per decode step over measured bandwidth (pipeline/bench/floor.py)
    at each batch-1 point's mean decode context, for the engine (its stored weights) and the
    PyTorch baseline (the exported FP32 graph's weights, beside the engine)."""
    from pipeline.bench import floor
    from pipeline.metrics.generation import kv_bytes_per_token
    from pipeline.recipe.workload import decoder_shape

    layers, kv_heads, head_dim = decoder_shape(recipe.model)[:3]
    per_token = kv_bytes_per_token(layers, kv_heads, head_dim)
    spec = recipe.workload
    contexts = {f"b1-p{p}": p + spec.new_tokens // 2 for p in spec.prompt_lengths}
    if spec.long is not None:
        contexts["long"] = spec.long.prompt + spec.long.new_tokens // 2
    points = generation.get("points", {})
    contexts = {k: v for k, v in contexts.items() if k in points}
    tpot = {k: points[k]["tpot_ms"]["p50"] for k in contexts}
    out = floor.decode_floor(engine, per_token, contexts, tpot)
    exported = engine.parent / "model.onnx"
    if exported.is_file():
        theirs = generation.get("baseline", {}).get("points", {})
        base_tpot = {k: theirs[k]["tpot_ms"]["p50"] for k in contexts if k in theirs}
        out["baseline"] = floor.decode_floor(exported, per_token, contexts, base_tpot)
    return out


def _gate(name: str, passed: bool, detail: str) -> dict:
    return {"name": name, "passed": bool(passed), "detail": detail}


def validate(recipe: Recipe, target, engine: Artifact, base: Artifact,
             workdir: Path) -> tuple[dict[str, Path], dict]:
    if recipe.workload.kind == "generation":  # TTFT, TPOT, time per task (pipeline/generation)
        from pipeline.generation import validate as generation

        result, files = generation.validate(recipe, target, engine, base, workdir)
        if result["status"] == "built" and engine.path.suffix == ".onnx":
            result["generation"]["floor"] = decode_floor(recipe, engine.path, result["generation"])
        if result["status"] == "built":
            result["gates"] = gates(recipe, result["accuracy"])
            result.update(precision_checks(recipe, target, engine, workdir, result["gates"]))
        path = workdir / f"validate-{target.id}.json"
        path.write_text(json.dumps(dump(EngineResult.model_validate(result)), indent=2) + "\n")
        return {path.name: path, **files}, {"passed": all(g["passed"] for g in result.get("gates", []))}
    try:
        feeds, references, labels, masks = data.load_all(base.path)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:  # pickled arrays: ValueError
        raise StageFailed(f"{base.name}: cannot read the baseline feeds ({type(e).__name__}: {e})",
                          "rerun with --force to rebuild it") from e
    backend = backends.get(target.kind)
    spec = recipe.validation.latency
    feed = timing_feed(recipe)
    device = backend.device(target)  # the baseline runs where the engine runs
    openers = {
        BASELINE: lambda: baseline_runner(recipe, models.load(recipe), device),
        target.id: lambda: backend.open(engine.path, target, recipe, threads=recipe.validation.threads,
                                        spin=spec.spin),
    }
    with contextlib.ExitStack() as stack:
        runners, cold = protocol.open_all(stack, openers, feed)
        runner = runners[target.id]
        outputs = [runner.infer(f, check_inputs=False) for f in feeds]
        accuracy = metrics.compare(references, outputs, recipe.top1_outputs())
        task = _task(recipe, feeds, references, outputs, labels, masks)
        bench, samples = protocol.measure(runners, sweep.shapes(recipe, feed), spec,
                                          pairs=[(BASELINE, target.id)])
        extras_of = getattr(backend, "validation_extras", None)
        extras = extras_of(engine.path, target, recipe, runner) if extras_of else {}
        vs_graphs = _vs_cudagraph(recipe, target, runner, spec) if device == "cuda" else None
    opt = bench["shapes"][0]
    plot = plots.latency_png(workdir / f"latency-{target.id}.png", samples,
                             f"{recipe.name}: {target.id} vs {BASELINE}, {opt['shape']}, interleaved")
    result = {
        "target": target.id,
        "kind": target.kind,
        "status": "built",
        "reason": None,
        "path": str(engine.path),
        "sha256": engine.sha256,
        "bytes": engine.bytes,
        "precision": recipe.precision.mode,
        "accuracy": accuracy,
        "task": task,
        "latency_ms": opt["latency_ms"][target.id],
        "baseline_latency_ms": opt["latency_ms"][BASELINE],
        "speedup_vs_baseline": protocol.as_speedup(opt["comparisons"][0]),
        "cold_start_ms": cold[target.id],
        "baseline_cold_start_ms": cold[BASELINE],
        "sweep": [{"shape": s["shape"], "dims": s["dims"],
                   "latency_ms": s["latency_ms"][target.id],
                   "baseline_latency_ms": s["latency_ms"][BASELINE],
                   "speedup_vs_baseline": protocol.as_speedup(s["comparisons"][0])}
                  for s in bench["shapes"][1:]],
        "timer": bench["timers"][target.id],
        "threads": recipe.validation.threads,
        "stop": opt["stop"],
        "resources": bench["resources"],
        "warnings": bench["warnings"],
        "harness_overhead_us": bench["harness_overhead_us"],
        "plot": plot.name,
        "latency_method": PROTOCOL.format(
            **spec.model_dump(), timer=bench["timers"][target.id],
            early=f" (early stop at +-{spec.target_ci:g} median CI)" if spec.target_ci else "",
            spinning="spin-wait" if spec.spin else "do not spin-wait",
            threads=threads_used(recipe.validation.threads),
            method=stats.ratio_method(spec.noise_threshold)),
        "device": device,
        "speedup_vs_cudagraph": vs_graphs,
        **{k: v for k, v in extras.items() if k != "gates"},
        "gates": gates(recipe, accuracy) + extras.get("gates", []),
    }
    result.update(precision_checks(recipe, target, engine, workdir, result["gates"]))
    path = workdir / f"validate-{target.id}.json"
    path.write_text(json.dumps(dump(EngineResult.model_validate(result)), indent=2) + "\n")
    return {path.name: path, plot.name: plot}, {"passed": all(g["passed"] for g in result["gates"])}
