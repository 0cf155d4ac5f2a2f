"""Generation validation: the PyTorch static-cache baseline, then each engine against it.

`baseline` generates every request of the workload alone (tokens and figures) and saves the
teacher-forced accuracy feeds (a prefill with an empty cache, then a decode step on its
presents) with the PyTorch outputs. `validate` checks the engine's outputs on those feeds
(the usual accuracy metrics and gates), then times engine and baseline interleaved on every
request: onnxruntime-genai drives the engine where it can (single-turn points, the long
point), the IOBinding loop where it cannot (the task's turns; see runners.py).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline import backends, data
from pipeline.artifacts.generation import (
    Agreement,
    Answer,
    BaselineGeneration,
    BaselineSide,
    DecodeFloor,
    EngineScore,
    Generation,
    KvCacheAccuracy,
    Memory,
    PeakMemory,
    Point,
    Runners,
    TokenAgreement,
)
from pipeline.artifacts.recorded import dump
from pipeline.artifacts.report import Resources
from pipeline.bench import monitor
from pipeline.core import deps
from pipeline.generation import figures as gm
from pipeline.generation import genai_config, memory, runners, score
from pipeline.generation.decoder import (
    context_length,
    deployed_config,
    eos_token,
    workload_requests,
)
from pipeline.generation.timed_requests import can_run, measure
from pipeline.metrics import accuracy as accuracy_metrics
from pipeline.model import sources as models
from pipeline.precision.kv_cache import CacheCodec
from pipeline.recipe import Recipe
from pipeline.recipe.workload import decoder_shape
from pipeline.store.recipe_folder import Artifact
from pipeline.workloads import generation_accuracy
from pipeline.workloads.base import Measured, Measurement

Shipped = dict[str, Path]  # file name beside the engine -> where it was written

BASELINE = "torch-static-cache"


def _torch_runner(recipe: Recipe) -> runners.TorchStaticRunner:
    decoder = runners.torch_decoder(recipe, models.load(recipe), context_length(recipe))
    return runners.TorchStaticRunner(decoder, eos_token(recipe), recipe.validate_.threads)


def _headline(points: dict[str, Point]) -> str:
    """The batch-1 decode point (first prompt length): the figures a table shows."""
    return next(label for label, p in points.items() if p.batch == 1)


def baseline(recipe: Recipe, workdir: Path) -> tuple[dict[str, Path], dict]:
    spec = recipe.workload
    runner = _torch_runner(recipe)
    figures, tokens = {}, {}
    for request in workload_requests(recipe):
        traces = measure({BASELINE: runner}, request, spec, rounds=1)[BASELINE]  # alone; validate interleaves
        figures[request.label] = gm.summarize(request, traces)
        tokens[request.label] = traces[0].tokens
    feeds, outputs = generation_accuracy.accuracy_feeds(recipe)
    own = {}
    if spec.chat is not None:  # PyTorch's answers and losses: what every engine is scored against
        rows, nll = generation_accuracy.torch_score(recipe, models.load(recipe))
        tokens.update({f"answer/{i}": np.asarray(r["tokens"], np.int64) for i, r in enumerate(rows)})
        tokens["answer_correct"] = np.array([r["correct"] for r in rows])
        tokens["answer_seconds"] = np.array([r["seconds"] for r in rows])
        tokens["nll"] = nll
        own = {"score": score.summary(rows, nll, _answers(rows))}
    path = workdir / "baseline.npz"
    data.save_feeds(path, feeds, outputs, tokens=tokens)
    generation = BaselineGeneration(workload=spec.model_dump(mode="json"), points=figures, **own)
    return {"baseline.npz": path}, {
        "runner": BASELINE, "precision": "fp32", "device": "cpu",
        "threads": recipe.validate_.threads, "feeds": len(feeds),
        # the decode step at batch 1, as the engines' latency_ms (HEADLINE_TIMED), timed alone
        "latency_ms": dump(figures[_headline(figures)].tpot_ms),
        "latency_method": "time per output token (decode step) at batch 1, one generation alone "
                          "after the warm-up",
        "generation": dump(generation),  # the stage's meta: what the store records
    }


def _answers(rows: list[dict]) -> list[Answer]:
    return [Answer(id=r["id"], reply=r["reply"], correct=r["correct"]) for r in rows]


@dataclass
class _Runners:
    """The engine's runners (onnxruntime-genai where installed, the IOBinding loop always) and
    PyTorch's, and how to make each again in a process of its own (memory)."""

    torch: object
    genai: object | None
    loop: object
    makers: dict[str, tuple]
    warnings: list[str]

    def for_request(self, request):
        return self.genai if self.genai is not None and can_run(self.genai, request) else self.loop

    def close(self) -> None:
        for r in (self.genai, self.loop):
            if r is not None:
                r.close()


def _open_runners(recipe: Recipe, engine: Path, folder: Path, in_place: bool) -> _Runners:
    eos, threads = eos_token(recipe), recipe.validate_.threads
    warnings = []
    makers = {BASELINE: (_torch_runner, (recipe,))}  # memory: each in a process of its own
    if deps.has("onnxruntime_genai"):
        genai = runners.GenaiRunner(folder, context_length(recipe))
        makers["onnxruntime-genai"] = (runners.GenaiRunner, (folder, context_length(recipe)))
    else:
        genai = None
        warnings.append("onnxruntime-genai is not installed (pip install onnxruntime-genai): "
                        "every request ran on the IOBinding loop")
    loop = runners.OrtLoopRunner(engine, eos, threads, in_place)
    makers["onnxruntime-iobinding"] = (runners.OrtLoopRunner, (engine, eos, threads, in_place))
    return _Runners(_torch_runner(recipe), genai, loop, makers, warnings)


@dataclass
class _Timed:
    """Engine and PyTorch interleaved on every request of the workload."""

    points: dict[str, Point]           # the engine's, with its runner and speedups
    baseline_points: dict[str, Point]  # PyTorch's, from the same rounds
    agreement: dict[str, Agreement]    # the engine's greedy tokens against PyTorch's alone
    resources: monitor.ResourceSummary | None


def _time_requests(recipe: Recipe, target, opened: _Runners, base_tokens: dict) -> _Timed:
    spec, noise = recipe.workload, recipe.validate_.latency.noise_threshold
    timed = _Timed({}, {}, {}, None)
    with monitor.ResourceMonitor(gpu=False) as watch:  # other processes' load while timing
        for request in workload_requests(recipe):
            runner = opened.for_request(request)
            traces = measure({BASELINE: opened.torch, target.id: runner}, request, spec)
            mine, theirs = traces[target.id], traces[BASELINE]
            long = request.kind == "long"
            timed.points[request.label] = gm.summarize(request, mine).model_copy(update={
                "runner": runner.name, "speedup_vs_baseline": gm.speedups(theirs, mine, noise),
                **({"tpot_vs_context": gm.tpot_vs_context(request, mine, spec.long.bins)} if long else {})})
            timed.baseline_points[request.label] = gm.summarize(request, theirs).model_copy(update=(
                {"tpot_vs_context": gm.tpot_vs_context(request, theirs, spec.long.bins)} if long else {}))
            timed.agreement[request.label] = gm.agreement(base_tokens[request.label], mine[0].tokens)
    timed.resources = watch.summary()
    return timed


def _engine_score(recipe: Recipe, engine: Path, in_place: bool, base_tokens: dict) -> EngineScore:
    """The task score: the engine's answers and losses against PyTorch's."""
    rows, nll = generation_accuracy.engine_rows(recipe, engine, in_place)
    base_rows = [{"tokens": base_tokens[f"answer/{i}"].tolist(), "correct": bool(c), "seconds": float(t)}
                 for i, (c, t) in enumerate(zip(base_tokens["answer_correct"], base_tokens["answer_seconds"]))]
    return score.compare(base_rows, rows, base_tokens["nll"], nll, _answers(rows))


def _token_agreement(recipe: Recipe, agreement: dict[str, Agreement]) -> TokenAgreement:
    total_same = sum(a.share * a.tokens for a in agreement.values())
    total = sum(a.tokens for a in agreement.values())
    note = {"note": "greedy tokens of random weights flip on noise; a trained model makes this "
                    "figure meaningful"} if random_weights(recipe) else {}
    return TokenAgreement(share=total_same / total if total else None,
                          first_divergence=agreement["task"].first_divergence, per_point=agreement, **note)


def measure_engine(recipe: Recipe, target, engine: Artifact, base: Artifact, workdir: Path) -> Measured:
    """The engine's measurement (the validate stage builds the EngineResult and its gates
    from it) and the files beside it (genai_config.json, the tokenizer's)."""
    if not backends.get(target.kind).ENGINE_IS_ONNX:  # built (TensorRT: its KV-cache profiles), not driven
        return Measured(skipped=f"workload generation: no generation runner for {target.kind} engines "
                                "yet (the engine was built; only engines that are ONNX graphs are "
                                "driven token by token)")
    spec = recipe.workload
    feeds, references, _, _ = data.load_all(base.path)
    base_tokens = data.load_tokens(base.path)
    cfg, tokenizer = deployed_config(recipe, engine.path)
    folder = genai_config.write_folder(workdir / "genai", engine.path, cfg, tokenizer)
    in_place = cfg["search"]["past_present_share_buffer"]  # read from the graph once, above

    opened = _open_runners(recipe, engine.path, folder, in_place)
    outputs = [generation_accuracy.run_feed(opened.loop.session, f, recipe.outputs) for f in feeds]
    accuracy, kv_cache = generation_accuracy.split_cache_outputs(accuracy_metrics.compare(references, outputs, ["logits"]))
    timed = _time_requests(recipe, target, opened, base_tokens)
    warnings = opened.warnings + [w for w in (monitor.contention(timed.resources),) if w]
    engine_score = _engine_score(recipe, engine.path, in_place, base_tokens) if spec.chat else None
    memory_figures = _memory(recipe, opened.makers, decoder_shape(recipe.model), opened.loop.cache_dtype.itemsize)
    opened.close()

    head = _headline(timed.points)
    generation = _generation(recipe, engine.path, timed, head, memory_figures, kv_cache, engine_score)
    measurement = Measurement(
        accuracy=accuracy,
        # the decode step at batch 1 (HEADLINE_TIMED), engine and PyTorch interleaved
        latency_ms=timed.points[head].tpot_ms, baseline_latency_ms=timed.baseline_points[head].tpot_ms,
        speedup_vs_baseline=timed.points[head].speedup_vs_baseline.tpot,
        latency_method=f"time per output token (decode step), batch 1, prompt "
                       f"{timed.points[head].prompt_tokens[0]}: {spec.warmup} warm-up generation(s), "
                       f"then {spec.rounds} rounds, engine and PyTorch (static KV cache) taking turns "
                       "in one process, order alternating; speedup: median of per-round ratios with a "
                       "95% sign-test interval",
        threads=recipe.validate_.threads, device="cpu",
        warnings=warnings, generation=generation,
        resources=Resources.model_validate(timed.resources.dump()))
    return Measured(measurement=measurement, files=_ship(workdir, folder, tokenizer))


def _generation(recipe: Recipe, engine: Path, timed: _Timed, head: str, memory_figures: Memory,
                kv_cache: KvCacheAccuracy | None, engine_score: EngineScore | None) -> Generation:
    """The engine's generation section, from what was measured."""
    points, theirs = timed.points, timed.baseline_points
    used = {label: p.runner for label, p in points.items()}
    optional = {"score": engine_score} if engine_score else {}
    if engine.suffix == ".onnx":
        optional["floor"] = decode_floor(recipe, engine, points, theirs)
    return Generation(
        runners=Runners(engine=sorted(set(used.values())), baseline=BASELINE, per_point=used),
        genai_config="genai_config.json",
        ttft_ms=points[head].ttft_ms, tpot_ms=points[head].tpot_ms,
        tokens_per_s={label: p.tokens_per_s for label, p in points.items()},
        time_per_task_s=points["task"].time_per_task_s,
        memory=memory_figures,
        kv_cache_accuracy=kv_cache,
        token_agreement=_token_agreement(recipe, timed.agreement),
        points=points,
        baseline=BaselineSide(ttft_ms=theirs[head].ttft_ms, tpot_ms=theirs[head].tpot_ms,
                              time_per_task_s=theirs["task"].time_per_task_s, points=theirs),
        **optional)


def _ship(workdir: Path, folder: Path, tokenizer: list[Path]) -> Shipped:
    """genai_config.json and the tokenizer's files beside the engine (the folder runs under
    onnxruntime-genai as is); the working folder they were made in is removed."""
    config = workdir / "genai_config.json"
    config.write_text((folder / "genai_config.json").read_text())
    for leftover in folder.iterdir():
        leftover.unlink()
    folder.rmdir()
    shipped = {config.name: config}
    for source in tokenizer:
        shipped[source.name] = workdir / source.name
        shutil.copyfile(source, shipped[source.name])
    return shipped


def decode_floor(recipe: Recipe, engine: Path, points: dict[str, Point],
                 baseline_points: dict[str, Point]) -> DecodeFloor:
    """`generation.floor`: bytes per decode step over measured bandwidth (pipeline/bench/floor.py)
    at each batch-1 point's mean decode context, for the engine (its stored weights) and the
    PyTorch baseline (the exported FP32 graph's weights, beside the engine)."""
    from pipeline.bench import floor

    shape = decoder_shape(recipe.model)
    kv = CacheCodec.of_graph(engine).dtype.itemsize  # precision.kv_cache; PyTorch's is float32
    per_token = gm.kv_bytes_per_token(shape.layers, shape.kv_heads, shape.head_dim, kv)
    spec = recipe.workload
    contexts = {f"b1-p{p}": p + spec.new_tokens // 2 for p in spec.prompt_lengths}
    if spec.long is not None:
        contexts["long"] = spec.long.prompt + spec.long.new_tokens // 2
    contexts = {k: v for k, v in contexts.items() if k in points}
    out = floor.decode_floor(engine, per_token, contexts, {k: points[k].tpot_ms.p50 for k in contexts})
    exported = engine.parent / "model.onnx"
    if exported.is_file():
        out.baseline = floor.decode_floor(exported, per_token * 4 // kv, contexts, {
            k: baseline_points[k].tpot_ms.p50 for k in contexts if k in baseline_points})
    return out


def random_weights(recipe: Recipe) -> bool:
    """The model's weights are random draws (a transformers config, a zoo model without
    weights): greedy agreement then says little."""
    hf = recipe.model.transformers
    if hf is not None:
        return hf.config is not None
    return recipe.model.weights is None and recipe.model.zoo is not None


def _memory(recipe: Recipe, makers: dict, shape, kv_itemsize: int) -> Memory:
    """Each runner's memory in a process of its own (memory.isolated) while it generates the
    longest single-turn request, and the engine's KV cache's bytes per token (its elements of
    `kv_itemsize` bytes: precision.kv_cache)."""
    longest = max((r for r in workload_requests(recipe) if len(r.turns) == 1), key=lambda r: r.batch * (
        r.turns[0][0].shape[1] + r.new_tokens))
    per_token = gm.kv_bytes_per_token(shape.layers, shape.kv_heads, shape.head_dim, kv_itemsize)
    figures = memory.isolated(makers, memory.first_token(shape.vocab), longest)
    return Memory(
        peak={name: PeakMemory(peak_rss_bytes=f.peak_rss_bytes, growth_bytes=f.growth_bytes)
              for name, f in figures.items()},
        load_rss_bytes={name: f.load_rss_bytes for name, f in figures.items()},
        before_runner_bytes={name: f.before_runner_bytes for name, f in figures.items()},
        request=longest.label,
        method="each runner made in a fresh process of its own (spawned; it holds nothing "
               "else): loading = RSS growth from before the runner is made to after its "
               "first token; then RSS sampled every 2 ms while it generates the request: "
               "peak, and growth over where it began",
        kv_cache_bytes_per_token=per_token,
        kv_cache_bytes_at_peak=per_token * longest.batch * (longest.turns[0][0].shape[1] + longest.new_tokens))
