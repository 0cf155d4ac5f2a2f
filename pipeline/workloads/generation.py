"""The generation workload: one request is a prefill and token-by-token decode with a KV
cache (pipeline/generation: the runners, requests, timing and metrics).

baseline: the PyTorch static-cache model generates every request of the workload alone,
and its outputs on the teacher-forced accuracy feeds are saved (baseline.npz). measure: the
engine's outputs on those feeds, then engine and baseline taking turns on every request
(TTFT, TPOT, tokens/s, time per task, memory, token agreement, the decode floor), typed as
pipeline/artifacts/generation.py's Generation.
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
    return generation_measure.measure_engine(recipe, target, engine, base, workdir)


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


def roofline_points(recipe: Recipe, context: int | None = None):
    """The roofline's points (roofline/points.py): prefill and a decode step at each prompt and
    the long point, the decode curve over batch sizes, the task script's turns."""
    from pipeline.roofline import points

    return points.generation(recipe, context)
