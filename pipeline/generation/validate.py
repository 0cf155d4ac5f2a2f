"""Generation validation: the PyTorch static-cache baseline, then each engine against it.

`baseline` generates every request of the workload alone (tokens and figures) and saves the
teacher-forced accuracy feeds (a prefill with an empty cache, then a decode step on its
presents) with the PyTorch outputs. `validate` checks the engine's outputs on those feeds
(the usual accuracy metrics and gates), then times engine and baseline interleaved on every
request: onnxruntime-genai drives the engine where it can (single-turn points, the long
point), the IOBinding loop where it cannot (the task's turns; see runners.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline import backends, data, deps
from pipeline.bench import monitor
from pipeline.generation import genai_config, runners
from pipeline.generation.workload import can_run, generate, measure, requests
from pipeline.metrics import accuracy as accuracy_metrics
from pipeline.metrics import generation as gm
from pipeline.model import sources as models
from pipeline.recipe import Recipe
from pipeline.recipe.workload import decoder_shape, kv_names
from pipeline.store.recipe_folder import Artifact
from pipeline.workloads.base import Measured

BASELINE = "torch-static-cache"
ACCURACY_PREFILL = 24


def eos_token(recipe: Recipe) -> int:
    return recipe.workload.eos_token_id if recipe.workload.eos_token_id is not None \
        else decoder_shape(recipe.model).vocab - 1


def prompt_vocab(recipe: Recipe) -> int:
    """Prompt tokens are drawn below the input_ids range's end (a byte-level LM: 256), within
    the model's vocabulary."""
    high = recipe.inputs[0].range[1] if recipe.inputs[0].range else decoder_shape(recipe.model).vocab
    return min(int(high), decoder_shape(recipe.model).vocab)


def workload_requests(recipe: Recipe):
    return requests(recipe.workload, prompt_vocab(recipe), eos_token(recipe))


def _context(recipe: Recipe) -> int:
    return recipe.workload.context_max() + 1  # + the token a turn carries over


def _torch_runner(recipe: Recipe) -> runners.TorchStaticRunner:
    decoder = runners.torch_decoder(recipe, models.load(recipe), _context(recipe))
    return runners.TorchStaticRunner(decoder, eos_token(recipe), recipe.validate_.threads)


def accuracy_feeds(recipe: Recipe) -> tuple[list[dict], list[dict]]:
    """Teacher-forced feeds (prefill with an empty past, then one decode step on its presents)
    and the PyTorch KV-cache module's outputs on them."""
    import torch

    from pipeline.generation.export import kv_model

    shape = decoder_shape(recipe.model)
    module, _ = kv_model(recipe)
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
    path = workdir / "baseline.npz"
    data.save_feeds(path, feeds, outputs, tokens=tokens)
    head = _headline(figures)
    return {"baseline.npz": path}, {
        "runner": BASELINE, "precision": "fp32", "device": "cpu",
        "threads": recipe.validate_.threads, "feeds": len(feeds),
        "latency_ms": head["tpot_ms"],  # the decode step at batch 1: what `latency` means here
        "latency_method": "time per output token (decode step) at batch 1, one generation alone "
                          "after the warm-up",
        "generation": {"workload": spec.model_dump(mode="json"), "points": figures},
    }


def _rss() -> int:
    return monitor._rss_bytes() or 0


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
    cfg = genai_config.config(layers=shape.layers, kv_heads=shape.kv_heads, heads=shape.heads,
                              head_dim=shape.head_dim, hidden=shape.hidden, vocab=shape.vocab,
                              eos_token_id=eos, context_length=_context(recipe),
                              threads=recipe.validate_.threads)
    folder = genai_config.write_folder(workdir / "genai", engine.path, cfg)

    loads = {}
    before = _rss()
    torch_runner = _torch_runner(recipe)
    loads[BASELINE], before = _rss() - before, _rss()
    warnings = []
    if deps.has("onnxruntime_genai"):
        genai = runners.GenaiRunner(folder, _context(recipe))
        loads["onnxruntime-genai"], before = _rss() - before, _rss()
    else:
        genai = None
        warnings.append("onnxruntime-genai is not installed (pip install onnxruntime-genai): "
                        "every request ran on the IOBinding loop")
    loop = runners.OrtLoopRunner(engine.path, eos, recipe.validate_.threads)
    loads["onnxruntime-iobinding"] = _rss() - before

    outputs = [_run_feed(loop.session, f, recipe.outputs) for f in feeds]
    accuracy = accuracy_metrics.compare(references, outputs, ["logits"])

    points, baseline_points, agreement, used = {}, {}, {}, {}
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
    memory = _peak_memory(recipe, {BASELINE: torch_runner, target.id: genai or loop}, spec, shape, eos)
    memory["load_rss_bytes"] = loads
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
        "memory": memory,
        "token_agreement": {"share": total_same / total if total else None,
                            "first_divergence": agreement["task"]["first_divergence"],
                            "per_point": agreement,
                            "note": "greedy tokens of random weights flip on noise; a trained "
                                    "model makes this figure meaningful"},
        "points": points,
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
        "warnings": warnings, "generation": generation,
    }
    config = workdir / "genai_config.json"
    config.write_text((folder / "genai_config.json").read_text())
    for leftover in folder.iterdir():
        leftover.unlink()
    folder.rmdir()
    return Measured(fields=fields, files={config.name: config})


def _run_feed(session, feed: dict, names: list[str]) -> dict:
    return dict(zip(names, session.run(None, feed)))


def _peak_memory(recipe: Recipe, runners_: dict, spec, shape, eos: int) -> dict:
    """Peak RSS while each runner generates the longest request alone (the peak is reset
    before each), and the KV cache's bytes per token."""
    reqs = workload_requests(recipe)
    longest = max((r for r in reqs if len(r.turns) == 1), key=lambda r: r.batch * (
        r.turns[0][0].shape[1] + r.new_tokens))
    peaks = {}
    for name, runner in runners_.items():
        before = _rss()
        reset = gm.reset_peak_rss()
        generate(runner, longest)
        peak = monitor.peak_rss_bytes()
        peaks[name] = {"peak_rss_bytes": peak, "growth_bytes": (peak - before) if reset and peak else None}
    per_token = gm.kv_bytes_per_token(shape.layers, shape.kv_heads, shape.head_dim)
    return {"peak": peaks, "request": longest.label,
            "kv_cache_bytes_per_token": per_token,
            "kv_cache_bytes_at_peak": per_token * longest.batch * (
                longest.turns[0][0].shape[1] + longest.new_tokens)}
