"""validate: each engine against the PyTorch baseline, for accuracy and for latency.

`baseline` runs the eager PyTorch model on the held-out validation feeds and saves feeds
and outputs (baseline.npz): every engine is judged on exactly those. `validate` runs one
engine on the same feeds, then times engine and baseline interleaved in one process
(bench.timing) and reports the speedup with a bootstrap interval (bench.stats).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from pipeline import backends, data, metrics, models
from pipeline.backends.torch import TorchRunner
from pipeline.bench import stats, timing
from pipeline.errors import StageFailed
from pipeline.recipe import Recipe
from pipeline.store import Artifact

VERSION = 1

PROTOCOL = (
    "perf_counter_ns around each request (host arrays in and out), after {warmup} warm-up "
    "requests; at least {iterations} requests and {min_seconds:g} s per runner; engine and "
    "baseline interleaved in blocks of {block} in one process (order alternating each "
    "round; runtime threads {spinning}); speedup = median(baseline) / median(engine), 95% CI "
    "by paired block bootstrap"
)


def _baseline_runner(recipe: Recipe, model) -> TorchRunner:
    return TorchRunner(model, [i.name for i in recipe.inputs], recipe.outputs,
                       threads=recipe.validation.threads)


def timing_feed(recipe: Recipe) -> data.Feed:
    """The feed every runner is timed on: the profile's opt point."""
    return data.feeds(recipe, "export")[0]


def baseline(recipe: Recipe, workdir: Path) -> tuple[dict[str, Path], dict]:
    model = models.load(recipe)
    feeds = data.feeds(recipe, "validation")
    with _baseline_runner(recipe, model) as runner:
        outputs = [runner.infer(f, check_inputs=False) for f in feeds]
        samples = timing.time_runner(runner, timing_feed(recipe), recipe.validation.latency)
    path = workdir / "baseline.npz"
    data.save_feeds(path, feeds, outputs)
    return {"baseline.npz": path}, {
        "runner": "torch-eager",
        "precision": "fp32",
        "device": "cpu",
        "threads": recipe.validation.threads,
        "feeds": len(feeds),
        "latency_ms": stats.summary(samples),
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
        if tol.top1_min is not None and m["top1_agreement"] is not None:
            out.append(_gate(f"{name}.top1_agreement", m["top1_agreement"] >= tol.top1_min,
                             f"{m['top1_agreement']:.4f} >= {tol.top1_min:g}"))
        out.append(_gate(f"{name}.finite", m["nonfinite"] == 0, f"{m['nonfinite']} NaN/Inf elements"))
    return out


def _gate(name: str, passed: bool, detail: str) -> dict:
    return {"name": name, "passed": bool(passed), "detail": detail}


def validate(recipe: Recipe, target, engine: Artifact, base: Artifact,
             workdir: Path) -> tuple[dict[str, Path], dict]:
    try:
        feeds, references = data.load_feeds(base.path)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:  # pickled arrays: ValueError
        raise StageFailed(f"{base.name}: cannot read the baseline feeds ({type(e).__name__}: {e})",
                          "rerun with --force to rebuild it") from e
    backend = backends.get(target.kind)
    spec = recipe.validation.latency
    with backend.open(engine.path, target, recipe.validation.threads, spin=spec.spin) as runner, \
            _baseline_runner(recipe, models.load(recipe)) as torch_runner:
        outputs = [runner.infer(f, check_inputs=False) for f in feeds]
        accuracy = metrics.compare(references, outputs, recipe.top1_outputs())
        base_blocks, engine_blocks = timing.time_interleaved(
            [torch_runner, runner], timing_feed(recipe), spec)
    ratio, lo, hi = stats.ratio_of_medians(base_blocks, engine_blocks)
    result = {
        "target": target.id,
        "kind": target.kind,
        "status": "built",
        "reason": None,
        "path": str(engine.path),
        "sha256": engine.sha256,
        "bytes": engine.bytes,
        "precision": "fp32",
        "accuracy": accuracy,
        "latency_ms": stats.summary(engine_blocks),
        "baseline_latency_ms": stats.summary(base_blocks),
        "speedup_vs_baseline": {
            "ratio": ratio, "ci95": [lo, hi], "verdict": stats.verdict(lo, hi),
            "blocks": int(engine_blocks.shape[0]),
        },
        "latency_method": PROTOCOL.format(
            **spec.model_dump(), spinning="spin-wait" if spec.spin else "do not spin-wait"),
        "gates": gates(recipe, accuracy),
    }
    path = workdir / f"validate-{target.id}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return {path.name: path}, {"passed": all(g["passed"] for g in result["gates"])}
