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
from pathlib import Path

import numpy as np

from pipeline import backends, data
from pipeline.bench import monitor
from pipeline.core import deps
from pipeline.generation import chat, genai_config, memory, runners, score
from pipeline.generation import figures as gm
from pipeline.generation.decoder import (
    context_length,
    deployed_config,
    eos_token,
    workload_requests,
)
from pipeline.generation.workload import can_run, measure
from pipeline.metrics import accuracy as accuracy_metrics
from pipeline.model import sources as models
from pipeline.recipe import Recipe
from pipeline.recipe.workload import decoder_shape, kv_names
from pipeline.store.recipe_folder import Artifact
from pipeline.workloads.base import Measured

BASELINE = "torch-static-cache"
ACCURACY_PREFILL = 24


def _torch_runner(recipe: Recipe) -> runners.TorchStaticRunner:
    decoder = runners.torch_decoder(recipe, models.load(recipe), context_length(recipe))
    return runners.TorchStaticRunner(decoder, eos_token(recipe), recipe.validate_.threads)


def accuracy_feeds(recipe: Recipe) -> tuple[list[dict], list[dict]]:
    """Teacher-forced feeds (prefill with an empty past, then one decode step on its presents)
    and the PyTorch KV-cache module's outputs on them."""
    import torch

    from pipeline.generation.export import kv_model

    shape = decoder_shape(recipe.model)
    module, _ = kv_model(recipe)
    if recipe.workload.chat is not None:  # held-out text, past the tokens perplexity scores
        spec = recipe.workload.chat
        text = chat.text_ids(chat.ChatTokenizer(recipe), spec.text,
                             spec.perplexity_tokens + ACCURACY_PREFILL + 1, shape.vocab)
        ids = text[None, -(ACCURACY_PREFILL + 1):]
    else:
        rng = np.random.default_rng([recipe.data.seed, 1])
        ids = rng.integers(0, shape.vocab, size=(1, ACCURACY_PREFILL + 1), dtype=np.int64)
    names, presents = kv_names(shape.layers)
    feeds, outputs = [], []
    past = {n: np.zeros((1, shape.kv_heads, 0, shape.head_dim), np.float32) for n in names}
    for lo, hi in ((0, ACCURACY_PREFILL), (ACCURACY_PREFILL, ACCURACY_PREFILL + 1)):
        feed = {"input_ids": ids[:, lo:hi], "attention_mask": np.ones((1, hi), np.int64), **past}
        with torch.no_grad():
            out = module(*(torch.from_numpy(feed[k]) for k in feed))
        result = dict(zip(recipe.outputs, (o.numpy() for o in out)))
        feeds.append(feed)
        outputs.append(result)
        past = {n: result[p] for n, p in zip(names, presents)}
    return feeds, outputs


def _empty_past(recipe: Recipe) -> dict[str, np.ndarray]:
    shape = decoder_shape(recipe.model)
    return {f"past_key_values.{i}.{kv}": np.zeros((1, shape.kv_heads, 0, shape.head_dim), np.float32)
            for i in range(shape.layers) for kv in ("key", "value")}


def _score(recipe: Recipe, runner, logits_of) -> tuple[list[dict], np.ndarray]:
    """Answers to the question scripts and per-token NLL of the held-out text, on one runner."""
    spec = recipe.workload.chat
    tok = chat.ChatTokenizer(recipe)
    scripts = chat.scripts(spec.tasks, chat.questions(spec.questions), spec.scripts)
    rows = score.answer(runner, tok, scripts, tok.stop_ids(eos_token(recipe)), spec.answer_tokens,
                        spec.max_context)
    text = chat.text_ids(tok, spec.text, spec.perplexity_tokens + 1, decoder_shape(recipe.model).vocab)
    return rows, score.token_losses(logits_of, text, spec.window)


def _torch_score(recipe: Recipe, model) -> tuple[list[dict], np.ndarray]:
    import torch

    from pipeline.generation.export import kv_model

    module, _ = kv_model(recipe)
    past = _empty_past(recipe)

    def logits_of(ids):
        feed = [ids, np.ones_like(ids), *past.values()]
        with torch.no_grad():
            return module(*(torch.from_numpy(x) for x in feed))[0].numpy()

    decoder = runners.torch_decoder(recipe, model, recipe.workload.chat.max_context + 1)
    return _score(recipe, runners.TorchStaticRunner(decoder, None, recipe.validate_.threads), logits_of)


def _engine_score(recipe: Recipe, engine_path: Path, in_place: bool) -> tuple[list[dict], np.ndarray]:
    runner = runners.OrtLoopRunner(engine_path, None, recipe.validate_.threads, in_place)
    past = _empty_past(recipe)

    def logits_of(ids):
        return runner.session.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids), **past})[0]

    try:
        return _score(recipe, runner, logits_of)
    finally:
        runner.close()


def _headline(figures: dict[str, dict]) -> dict:
    """The batch-1 decode point (first prompt length): the figures a table shows."""
    return next(f for f in figures.values() if f["batch"] == 1)


def baseline(recipe: Recipe, workdir: Path) -> tuple[dict[str, Path], dict]:
    spec = recipe.workload
    runner = _torch_runner(recipe)
    figures, tokens = {}, {}
    for request in workload_requests(recipe):
        traces = measure({BASELINE: runner}, request, spec, rounds=1)[BASELINE]  # alone; validate interleaves
        figures[request.label] = gm.summarize(request, traces)
        tokens[request.label] = traces[0].tokens
    feeds, outputs = accuracy_feeds(recipe)
    own = {}
    if spec.chat is not None:  # PyTorch's answers and losses: what every engine is scored against
        rows, nll = _torch_score(recipe, models.load(recipe))
        tokens.update({f"answer/{i}": np.asarray(r["tokens"], np.int64) for i, r in enumerate(rows)})
        tokens["answer_correct"] = np.array([r["correct"] for r in rows])
        tokens["answer_seconds"] = np.array([r["seconds"] for r in rows])
        tokens["nll"] = nll
        own = {"score": {**score.summary(rows, nll), "answers": [
            {k: r[k] for k in ("id", "reply", "correct")} for r in rows]}}
    path = workdir / "baseline.npz"
    data.save_feeds(path, feeds, outputs, tokens=tokens)
    head = _headline(figures)
    return {"baseline.npz": path}, {
        "runner": BASELINE, "precision": "fp32", "device": "cpu",
        "threads": recipe.validate_.threads, "feeds": len(feeds),
        "latency_ms": head["tpot_ms"],  # the decode step at batch 1: what `latency` means here
        "latency_method": "time per output token (decode step) at batch 1, one generation alone "
                          "after the warm-up",
        "generation": {"workload": spec.model_dump(mode="json"), "points": figures, **own},
    }


def measure_engine(recipe: Recipe, target, engine: Artifact, base: Artifact, workdir: Path) -> Measured:
    """The engine's measured fields (the validate stage builds the EngineResult and its
    gates from them) and the file beside it (genai_config.json)."""
    if not backends.get(target.kind).ENGINE_IS_ONNX:  # built (TensorRT: its KV-cache profiles), not driven
        return Measured(skipped=f"workload generation: no generation runner for {target.kind} engines "
                                "yet (the engine was built; only engines that are ONNX graphs are "
                                "driven token by token)")
    spec, shape = recipe.workload, decoder_shape(recipe.model)
    eos, noise = eos_token(recipe), recipe.validate_.latency.noise_threshold
    feeds, references, _, _ = data.load_all(base.path)
    base_tokens = data.load_tokens(base.path)
    cfg, tokenizer = deployed_config(recipe, engine.path)
    folder = genai_config.write_folder(workdir / "genai", engine.path, cfg, tokenizer)

    warnings = []
    torch_runner = _torch_runner(recipe)
    makers = {BASELINE: (_torch_runner, (recipe,))}  # memory: each in a process of its own
    if deps.has("onnxruntime_genai"):
        genai = runners.GenaiRunner(folder, context_length(recipe))
        makers["onnxruntime-genai"] = (runners.GenaiRunner, (folder, context_length(recipe)))
    else:
        genai = None
        warnings.append("onnxruntime-genai is not installed (pip install onnxruntime-genai): "
                        "every request ran on the IOBinding loop")
    in_place = cfg["search"]["past_present_share_buffer"]  # read from the graph once, above
    loop = runners.OrtLoopRunner(engine.path, eos, recipe.validate_.threads, in_place)
    makers["onnxruntime-iobinding"] = (runners.OrtLoopRunner, (engine.path, eos, recipe.validate_.threads, in_place))

    outputs = [_run_feed(loop.session, f, recipe.outputs) for f in feeds]
    accuracy, kv_cache = split_cache_outputs(accuracy_metrics.compare(references, outputs, ["logits"]))

    points, baseline_points, agreement, used = {}, {}, {}, {}
    with monitor.ResourceMonitor(gpu=False) as watch:  # other processes' load while timing
        for request in workload_requests(recipe):
            runner = genai if genai is not None and can_run(genai, request) else loop
            traces = measure({BASELINE: torch_runner, target.id: runner}, request, spec)
            mine, theirs = traces[target.id], traces[BASELINE]
            points[request.label] = {**gm.summarize(request, mine), "runner": runner.name,
                                     "speedup_vs_baseline": gm.speedups(theirs, mine, noise)}
            baseline_points[request.label] = gm.summarize(request, theirs)
            agreement[request.label] = gm.agreement(base_tokens[request.label], mine[0].tokens)
            used[request.label] = runner.name
            if request.kind == "long":
                points["long"]["tpot_vs_context"] = gm.tpot_vs_context(request, mine, spec.long.bins)
                baseline_points["long"]["tpot_vs_context"] = gm.tpot_vs_context(request, theirs, spec.long.bins)
    resources = watch.summary()
    if monitor.contention(resources):
        warnings.append(monitor.contention(resources))
    if spec.chat is not None:  # the task score: the engine's answers and losses against PyTorch's
        rows, nll = _engine_score(recipe, engine.path, in_place)
        base_rows = [{"tokens": base_tokens[f"answer/{i}"].tolist(), "correct": bool(c), "seconds": float(t)}
                     for i, (c, t) in enumerate(zip(base_tokens["answer_correct"], base_tokens["answer_seconds"]))]
        generation_score = {**score.compare(base_rows, rows, base_tokens["nll"], nll),
                            "answers": [{k: r[k] for k in ("id", "reply", "correct")} for r in rows]}
    else:
        generation_score = None
    memory_figures = _memory(recipe, makers, shape)
    for r in (genai, loop):
        if r is not None:
            r.close()

    head = next(label for label, p in points.items() if p["batch"] == 1)
    task = points["task"]
    total_same = sum(a["share"] * a["tokens"] for a in agreement.values())
    total = sum(a["tokens"] for a in agreement.values())
    generation = {
        "runners": {"engine": sorted(set(used.values())), "baseline": BASELINE, "per_point": used},
        "genai_config": "genai_config.json",
        "ttft_ms": points[head]["ttft_ms"], "tpot_ms": points[head]["tpot_ms"],
        "tokens_per_s": {label: p["tokens_per_s"] for label, p in points.items() if p.get("batch")},
        "time_per_task_s": task["time_per_task_s"],
        "memory": memory_figures,
        "kv_cache_accuracy": kv_cache,
        "token_agreement": {"share": total_same / total if total else None,
                            "first_divergence": agreement["task"]["first_divergence"],
                            "per_point": agreement,
                            **({"note": "greedy tokens of random weights flip on noise; a trained "
                                        "model makes this figure meaningful"} if random_weights(recipe) else {})},
        "points": points,
        **({"score": generation_score} if generation_score else {}),
        "baseline": {"ttft_ms": baseline_points[head]["ttft_ms"], "tpot_ms": baseline_points[head]["tpot_ms"],
                     "time_per_task_s": baseline_points["task"]["time_per_task_s"],
                     "points": baseline_points},
    }
    fields = {
        "accuracy": accuracy,
        "latency_ms": points[head]["tpot_ms"], "baseline_latency_ms": baseline_points[head]["tpot_ms"],
        "speedup_vs_baseline": points[head]["speedup_vs_baseline"]["tpot"],
        "latency_method": f"time per output token (decode step), batch 1, prompt {points[head]['prompt_tokens'][0]}: "
                          f"{spec.warmup} warm-up generation(s), then {spec.rounds} rounds, engine and "
                          "PyTorch (static KV cache) taking turns in one process, order alternating; "
                          "speedup: median of per-round ratios with a 95% sign-test interval",
        "threads": recipe.validate_.threads, "device": "cpu",
        "warnings": warnings, "generation": generation, "resources": resources,
    }
    config = workdir / "genai_config.json"
    config.write_text((folder / "genai_config.json").read_text())
    for leftover in folder.iterdir():
        leftover.unlink()
    folder.rmdir()
    shipped = {config.name: config}
    for source in tokenizer:  # beside the engine: the folder runs under onnxruntime-genai as is
        shipped[source.name] = workdir / source.name
        shutil.copyfile(source, shipped[source.name])
    return Measured(fields=fields, files=shipped)


def split_cache_outputs(accuracy: dict) -> tuple[dict, dict | None]:
    """(the gated outputs: logits; one summary of the KV-cache outputs). A cache's error shows
    in the logits of the next step, which are gated; 60 cache rows at the logits threshold
    would bury the one figure that matters."""
    caches = {k: v for k, v in accuracy.items() if k.startswith("present.")}
    gated = {k: v for k, v in accuracy.items() if k not in caches}
    if not caches:
        return gated, None
    worst = min(caches, key=lambda k: caches[k]["cosine"])
    return gated, {"outputs": len(caches), "worst": worst, "worst_cosine": caches[worst]["cosine"],
                   "mean_cosine": float(np.mean([m["cosine"] for m in caches.values()])),
                   "max_abs": max(m["max_abs"] for m in caches.values()),
                   "nonfinite": sum(m["nonfinite"] for m in caches.values()),
                   "gated": False}


def random_weights(recipe: Recipe) -> bool:
    """The model's weights are random draws (a transformers config, a zoo model without
    weights): greedy agreement then says little."""
    hf = recipe.model.transformers
    if hf is not None:
        return hf.config is not None
    return recipe.model.weights is None and recipe.model.zoo is not None


def _run_feed(session, feed: dict, names: list[str]) -> dict:
    return dict(zip(names, session.run(None, feed)))


def _memory(recipe: Recipe, makers: dict, shape) -> dict:
    """Each runner's memory in a process of its own (memory.isolated) while it generates the
    longest single-turn request, and the KV cache's bytes per token."""
    longest = max((r for r in workload_requests(recipe) if len(r.turns) == 1), key=lambda r: r.batch * (
        r.turns[0][0].shape[1] + r.new_tokens))
    per_token = gm.kv_bytes_per_token(shape.layers, shape.kv_heads, shape.head_dim)
    figures = memory.isolated(makers, memory.first_token(shape.vocab), longest)
    return {"peak": {name: {k: f[k] for k in ("peak_rss_bytes", "growth_bytes")} for name, f in figures.items()},
            "load_rss_bytes": {name: f["load_rss_bytes"] for name, f in figures.items()},
            "before_runner_bytes": {name: f["before_runner_bytes"] for name, f in figures.items()},
            "request": longest.label,
            "method": "each runner made in a fresh process of its own (spawned; it holds nothing "
                      "else): loading = RSS growth from before the runner is made to after its "
                      "first token; then RSS sampled every 2 ms while it generates the request: "
                      "peak, and growth over where it began",
            "kv_cache_bytes_per_token": per_token,
            "kv_cache_bytes_at_peak": per_token * longest.batch * (longest.turns[0][0].shape[1] + longest.new_tokens)}
