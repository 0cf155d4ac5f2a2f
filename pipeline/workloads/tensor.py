"""The forward workload: one request is one forward pass at the inputs' shapes.

baseline: the eager PyTorch model on the held-out validation feeds (their outputs saved in
baseline.npz, which every engine is judged on), timed alone at the opt shape. measure: one
engine on the same feeds, then engine and baseline timed interleaved in one process at the
opt shape and every sweep shape (bench.protocol): the speed-up with a 95% interval, cold
start, resources, the harness's own overhead and a latency plot (PNG).
"""

from __future__ import annotations

import contextlib
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import backends, data
from pipeline.artifacts.latency import ColdStart, LatencySummary
from pipeline.artifacts.recorded import dump
from pipeline.artifacts.report import CudaGraphSpeedup, Resources, SweepPoint, TaskMetric
from pipeline.backends.openers import baseline_device, baseline_runner, timing_feed
from pipeline.core.errors import StageFailed
from pipeline.recipe import Recipe
from pipeline.workloads.base import FieldValues, Measured, Measurement

if TYPE_CHECKING:
    from pipeline.bench.protocol import Timings

KIND = "forward"
BASELINE = "torch-eager"

PROTOCOL = (
    "{timer} around each request (host arrays in and out), after {warmup} warm-up "
    "requests; at least {iterations} requests and {min_seconds:g} s per runner{early}; engine and "
    "baseline interleaved in blocks of {block} in one process (order alternating each "
    "round; {threads}; runtime threads {spinning}); speedup of the engine over the baseline: "
    "{method}"
)


def baseline(recipe: Recipe, workdir: Path) -> tuple[dict[str, Path], dict]:
    from pipeline.bench import protocol, timing
    from pipeline.core import stats
    from pipeline.model import sources as models

    validation = data.split(recipe, "validation")
    device = baseline_device(recipe)
    protocol.import_runtimes()
    with contextlib.ExitStack() as stack:
        runner, cold = protocol.cold_start(
            stack, lambda: baseline_runner(recipe, models.load(recipe), device), timing_feed(recipe))
        outputs = [runner.infer(f, check_inputs=False) for f in validation.feeds]
        samples = timing.time_runner(runner, timing_feed(recipe), recipe.validate_.latency)
    path = workdir / "baseline.npz"
    data.save_feeds(path, validation.feeds, outputs, validation.labels, validation.masks)
    return {"baseline.npz": path}, {
        "data": dump(data.provenance(recipe)),
        "runner": BASELINE,
        "precision": "fp32",
        "device": device,
        "threads": recipe.validate_.threads,
        "feeds": len(validation.feeds),
        "latency_ms": stats.summary(samples).dump(),
        "cold_start_ms": dump(cold),
        "latency_method": f"perf_counter_ns per request after {recipe.validate_.latency.warmup} "
                          "warm-up requests, alone",
    }


def measure(recipe: Recipe, target, engine, base, workdir: Path) -> Measured:
    """The engine on the baseline's feeds (accuracy, task), then timed interleaved with the
    baseline at the opt shape and every sweep shape."""
    from pipeline.bench import plots, protocol, sweep
    from pipeline.metrics import accuracy as metrics
    from pipeline.model import sources as models

    try:
        feeds, references, labels, masks = data.load_all(base.path)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:  # pickled arrays: ValueError
        raise StageFailed(f"{base.name}: cannot read the baseline feeds ({type(e).__name__}: {e})",
                          "rerun with --force to rebuild it") from e
    backend = backends.get(target.kind)
    spec = recipe.validate_.latency
    feed = timing_feed(recipe)
    device = backend.device(target)  # the baseline runs where the engine runs
    openers = {
        BASELINE: lambda: baseline_runner(recipe, models.load(recipe), device),
        target.id: lambda: backend.open(engine.path, target, recipe, threads=recipe.validate_.threads,
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
        extras_of = getattr(backend, "validation_extras", None)  # optional (backends/base.py)
        extras = dict(extras_of(engine.path, target, recipe, runner)) if extras_of else {}
        vs_graphs = _vs_cudagraph(recipe, target, runner, spec) if device == "cuda" else None
    plot = plots.latency_png(workdir / f"latency-{target.id}.png", samples,
                             f"{recipe.name}: {target.id} vs {BASELINE}, {bench.shapes[0].shape}, interleaved")
    gates = extras.pop("gates", [])
    measurement = Measurement(
        accuracy=accuracy,
        task=task,
        **_timed_figures(recipe, target.id, bench, cold),
        plot=plot.name,
        device=device,
        speedup_vs_cudagraph=vs_graphs,
        **extras)
    return Measured(measurement=measurement, gates=gates, files={plot.name: plot})


def _timed_figures(recipe: Recipe, engine: str, bench: Timings,
                   cold: dict[str, ColdStart]) -> FieldValues:
    """The Measurement's timing fields, by name, from the protocol's result: one request at
    the opt shape, engine and baseline interleaved, then every sweep shape."""
    from pipeline.bench import protocol
    from pipeline.core import stats

    spec = recipe.validate_.latency
    opt = bench.shapes[0]
    return {
        "latency_ms": opt.latency_ms[engine],
        "baseline_latency_ms": opt.latency_ms[BASELINE],
        "speedup_vs_baseline": protocol.as_speedup(opt.comparisons[0]),
        "cold_start_ms": cold[engine],
        "baseline_cold_start_ms": cold[BASELINE],
        "sweep": [SweepPoint(shape=s.shape, dims=s.dims,
                             latency_ms=s.latency_ms[engine],
                             baseline_latency_ms=s.latency_ms[BASELINE],
                             speedup_vs_baseline=protocol.as_speedup(s.comparisons[0]))
                  for s in bench.shapes[1:]],
        "timer": bench.timers[engine],
        "threads": recipe.validate_.threads,
        "stop": opt.stop,
        "resources": Resources.model_validate(bench.resources.dump()),
        "warnings": bench.warnings,
        "harness_overhead_us": bench.harness_overhead_us,
        "latency_method": PROTOCOL.format(
            **spec.model_dump(), timer=bench.timers[engine],
            early=f" (early stop at +-{spec.target_ci:g} median CI)" if spec.target_ci else "",
            spinning="spin-wait" if spec.spin else "do not spin-wait",
            threads=threads_used(recipe.validate_.threads),
            method=stats.ratio_method(spec.noise_threshold)),
    }


def _vs_cudagraph(recipe: Recipe, target, runner, spec) -> CudaGraphSpeedup:
    """On GPU the fair baseline is the eager model replayed as CUDA Graphs (no launch cost),
    in the engine's own float type where the target declares one (AOTInductor's fp16), so
    the ratio measures compilation, not precision."""
    from pipeline.backends.torch import CudaGraphRunner
    from pipeline.bench import timing
    from pipeline.core import stats
    from pipeline.model import sources as models

    dtype = getattr(target, "dtype", "fp32")
    with baseline_runner(recipe, models.load(recipe), "cuda", CudaGraphRunner, dtype) as graphs:
        graph_blocks, engine_blocks = timing.time_interleaved([graphs, runner], timing_feed(recipe), spec)
    return CudaGraphSpeedup(**stats.speedup(graph_blocks, engine_blocks, noise=spec.noise_threshold).dump(),
                            baseline=graphs.name,
                            baseline_latency_ms=LatencySummary(**stats.summary(graph_blocks).dump()))


def threads_used(threads: int | None) -> str:
    """The intra-op thread setting the timings ran under, in words (it moves speedups: the
    INT8 engine of flash-int8 was 1.87x its FP32 one at 2 threads, 2.25x at 1)."""
    if threads:
        return f"{threads} intra-op thread{'s' if threads > 1 else ''} per runtime"
    import torch

    return (f"each runtime's default intra-op threads (torch {torch.get_num_threads()}, "
            "ONNX Runtime one per physical core)")


def _task(recipe: Recipe, feeds, references, outputs, labels, masks) -> TaskMetric | None:
    """validate.task: PyTorch and the engine scored on the same validation samples."""
    if recipe.validate_.task is None:
        return None
    from pipeline.metrics import task as task_metrics

    try:
        return task_metrics.score(recipe.validate_.task, feeds, references, outputs,
                                  recipe.outputs[0], labels, masks)
    except ValueError as e:  # data without what the metric needs (labels, pairs)
        raise StageFailed(f"validate.task {recipe.validate_.task}: {e}",
                          "check data.validation against the task") from None


def headlines(report: dict) -> list[str]:
    """None: the engines table is the forward pass's headline."""
    return []


def engine_markdown(entry: dict) -> list[str]:
    """Cold start and the sweep of one engine against PyTorch eager."""
    from pipeline.core.text import speedup

    lines = []
    cold, bcold = entry.get("cold_start_ms"), entry.get("baseline_cold_start_ms")
    if cold and bcold:
        lines += ["", f"Cold start (load + first request, one sample each, runtimes already "
                  f"imported): {entry['target']} {cold['load']:.1f} + {cold['first_request']:.1f} ms; "
                  f"{BASELINE} {bcold['load']:.1f} + {bcold['first_request']:.1f} ms (warm p50 above)."]
    if entry.get("sweep"):
        lines += ["", "| shape | engine p50 / p99 ms | torch p50 / p99 ms | engine vs torch [95% CI] |",
                  "|---|---|---|---|"]
        for s in entry["sweep"]:
            el, bl, sp = s["latency_ms"], s["baseline_latency_ms"], s["speedup_vs_baseline"]
            lines.append(f"| {s['shape']} | {el['p50']:.3f} / {el['p99']:.3f} | {bl['p50']:.3f} / "
                         f"{bl['p99']:.3f} | {speedup(sp['ratio'], sp['ci95'])} |")
    return lines


def roofline_points(recipe: Recipe, context: int | None = None):
    """The roofline's points (roofline/points.py): one forward at the batch dim's min, opt and
    max, every other dim at its opt (`context`: no KV cache here, unused)."""
    from pipeline.roofline import points

    return points.forward(recipe, context)
