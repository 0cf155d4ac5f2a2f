"""The generation workload: one request is a prefill and token-by-token decode with a KV
cache (pipeline/generation: the runners, requests, timing and metrics).

baseline: the PyTorch static-cache model generates every request of the workload alone,
and its outputs on the teacher-forced accuracy feeds are saved (baseline.npz). measure: the
engine's outputs on those feeds, then engine and baseline taking turns on every request
(TTFT, TPOT, tokens/s, time per task, memory, token agreement).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.recipe import Recipe
from pipeline.workloads import generation_measure
from pipeline.workloads.base import Measured

KIND = "generation"
BASELINE = generation_measure.BASELINE


def baseline(recipe: Recipe, workdir: Path) -> tuple[dict[str, Path], dict]:
    return generation_measure.baseline(recipe, workdir)


def measure(recipe: Recipe, target, engine, base, workdir: Path) -> Measured:
    measured = generation_measure.measure_engine(recipe, target, engine, base, workdir)
    generation = measured.fields.get("generation") if measured.skipped is None else None
    if generation and Path(engine.path).suffix == ".onnx":
        generation["floor"] = decode_floor(recipe, Path(engine.path), generation)
    return measured


def decode_floor(recipe: Recipe, engine: Path, generation: dict) -> dict:
    """`generation.floor`: bytes per decode step over measured bandwidth (pipeline/bench/floor.py)
    at each batch-1 point's mean decode context, for the engine (its stored weights) and the
    PyTorch baseline (the exported FP32 graph's weights, beside the engine)."""
    from pipeline.bench import floor
    from pipeline.generation.figures import kv_bytes_per_token
    from pipeline.recipe.workload import decoder_shape

    layers, kv_heads, head_dim = decoder_shape(recipe.model)[:3]
    per_token = kv_bytes_per_token(layers, kv_heads, head_dim)
    spec = recipe.workload
    contexts = {f"b1-p{p}": p + spec.new_tokens // 2 for p in spec.prompt_lengths}
    if spec.long is not None:
        contexts["long"] = spec.long.prompt + spec.long.new_tokens // 2
    points = generation.get("points", {})
    contexts = {k: v for k, v in contexts.items() if k in points}
    out = floor.decode_floor(engine, per_token, contexts, {k: points[k]["tpot_ms"]["p50"] for k in contexts})
    exported = engine.parent / "model.onnx"
    if exported.is_file():
        theirs = generation.get("baseline", {}).get("points", {})
        out["baseline"] = floor.decode_floor(exported, per_token, contexts,
                                             {k: theirs[k]["tpot_ms"]["p50"] for k in contexts if k in theirs})
    return out


def headlines(report: dict) -> list[str]:
    """One line per built engine: the task score, TTFT/TPOT, the task and the long point."""
    from pipeline.workloads.generation_markdown import headline

    return [headline(e) for e in report["engines"] if e["status"] == "built" and e.get("generation")]


def engine_markdown(entry: dict) -> list[str]:
    """The task score, TTFT/TPOT/tokens/s per point and time per task against PyTorch's
    (interleaved), the long point along its context, memory and the KV-cache outputs."""
    from pipeline.workloads.generation_markdown import markdown

    g = entry.get("generation")
    if not g:
        return []
    return markdown(entry, BASELINE) + ["", f"Runners: {', '.join(g['runners']['engine'])} (engine), "
                                        f"{g['runners']['baseline']} (baseline)."]
