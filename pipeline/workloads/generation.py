"""The generation workload: one request is a prefill and token-by-token decode with a KV
cache (pipeline/generation: the runners, requests, timing and metrics).

baseline: the PyTorch static-cache model generates every request of the workload alone,
and its outputs on the teacher-forced accuracy feeds are saved (baseline.npz). measure: the
engine's outputs on those feeds, then engine and baseline taking turns on every request
(TTFT, TPOT, tokens/s, time per task, memory, token agreement).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.generation import validate
from pipeline.recipe import Recipe
from pipeline.workloads.base import Measured

KIND = "generation"
BASELINE = validate.BASELINE


def baseline(recipe: Recipe, workdir: Path) -> tuple[dict[str, Path], dict]:
    return validate.baseline(recipe, workdir)


def measure(recipe: Recipe, target, engine, base, workdir: Path) -> Measured:
    return validate.measure_engine(recipe, target, engine, base, workdir)


def engine_markdown(entry: dict) -> list[str]:
    """TTFT, TPOT, time per task and memory of one engine, against PyTorch's."""
    g = entry.get("generation")
    if not g:
        return []
    base = g["baseline"]
    lines = ["", "| generation | engine | PyTorch (static cache) |", "|---|---|---|",
             f"| TTFT p50 ms | {g['ttft_ms']['p50']:.3f} | {base['ttft_ms']['p50']:.3f} |",
             f"| TPOT p50 ms | {g['tpot_ms']['p50']:.3f} | {base['tpot_ms']['p50']:.3f} |",
             f"| time per task s | {g['time_per_task_s']:.4f} | {base['time_per_task_s']:.4f} |"]
    share = g["token_agreement"]["share"]
    lines += ["", f"Runners: {', '.join(g['runners']['engine'])} (engine), {g['runners']['baseline']}; "
              f"greedy tokens agreeing with PyTorch's: {'—' if share is None else f'{share:.2%}'}."]
    return lines
