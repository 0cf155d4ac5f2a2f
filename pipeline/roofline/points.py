"""The shapes a recipe's workload runs at, as bindings of its graph's symbolic dims.

A generation recipe: each prompt's prefill at batch 1 (TTFT: the prompt in one forward, no
past), one decode step at batch 1 with a context in the cache (TPOT), the same step at larger
batches (the decode curve: one step serves `batch` sequences), and the task script's turns
(each turn's prompt appended to the context, then its reply token by token). A forward
recipe: one forward at each of the batch dim's min / opt / max with every other dim at opt.
Dim names are the export's: batch, sequence, past_sequence, total_sequence (a KV-cache
graph), or the recipe's own `name:` for each input dim.

Which of the two a recipe gets is its workload's to say: each workload module names its
`roofline_points` (the Workload contract, workloads/base.py; the PointSource protocol here),
one of `generation` and `forward` below, so the roofline's users (predict.py, the report
section) take a workload and never test its kind. The points a build profiles are marked
`profiled`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from pipeline.recipe import Recipe

DECODE_BATCHES = (1, 4, 16, 64)


@dataclass(frozen=True)
class Point:
    label: str  # "prefill 128", "decode @136", "batch 8"
    phase: str  # prefill | decode | forward
    dims: dict[str, int]
    batch: int = 1
    tokens: int = 1  # tokens a step produces per sequence (decode), or processes (prefill)
    report_key: str | None = None  # the report's workload point it corresponds to (b1-p128)
    profiled: bool = False  # each build profiles it (the report's roofline section)


@dataclass(frozen=True)
class TaskTurn:
    """One turn: its prefill, and its reply's decode steps (the first new token comes from the
    prefill), costed once at their mean context: a decode step's FLOPs and bytes grow
    linearly with the context (S = 1: one query against past + 1 keys), so `steps` times the
    mean step is their sum."""

    prefill: Point
    decode: Point
    steps: int


@dataclass(frozen=True)
class Points:
    """A workload's roofline points: each one `pipeline predict` floors, in order; the task
    script's turns (none for a forward workload)."""

    points: list[Point]
    task: list[TaskTurn] = field(default_factory=list)

    def profiled(self) -> list[Point]:
        """What each build profiles: the first prompt's prefill and its decode step, or the
        forward request at the dims' opt."""
        return [p for p in self.points if p.profiled]

    def longest_prefill(self) -> Point | None:
        """The longest prompt the workload times (the long point's on a tie); None without a prefill."""
        prefills = [p for p in self.points if p.phase == "prefill"]
        return max(prefills, key=lambda p: (p.tokens, p.report_key == "long")) if prefills else None


class PointSource(Protocol):
    """What a workload provides the roofline (workloads/base.py's Workload has it)."""

    def roofline_points(self, recipe: Recipe, context: int | None = None) -> Points: ...


def generation(recipe: Recipe, context: int | None = None) -> Points:
    """A generation workload's points and task turns (its `roofline_points`)."""
    return Points(generation_points(recipe, context), task_turns(recipe))


def forward(recipe: Recipe, context: int | None = None) -> Points:
    """A forward workload's points (its `roofline_points`; no KV cache: `context` is unused)."""
    return Points(forward_points(recipe))


def decode_dims(context: int, batch: int = 1) -> dict[str, int]:
    """One new token per sequence with `context` tokens already in the cache."""
    return {"batch": batch, "sequence": 1, "past_sequence": context, "total_sequence": context + 1}


def prefill_dims(prompt: int, past: int = 0) -> dict[str, int]:
    return {"batch": 1, "sequence": prompt, "past_sequence": past, "total_sequence": past + prompt}


def generation_points(recipe: Recipe, context: int | None = None,
                      batches: tuple[int, ...] = DECODE_BATCHES) -> list[Point]:
    """Prefill and decode at each prompt length and the long generation's (decode's context:
    `context`, else the middle of the point's generation, prompt + new_tokens / 2, the mean
    context its TPOT covers), then the decode curve over `batches` at the first prompt's."""
    spec, points = recipe.workload, []
    for prompt in spec.prompt_lengths:
        key, first = f"b1-p{prompt}", prompt == spec.prompt_lengths[0]
        ctx = context if context is not None else prompt + spec.new_tokens // 2
        points.append(Point(f"prefill {prompt}", "prefill", prefill_dims(prompt), tokens=prompt, report_key=key,
                            profiled=first))
        points.append(Point(f"decode @{ctx}", "decode", decode_dims(ctx), report_key=key, profiled=first))
    if spec.long is not None:  # the long generation: its prompt's prefill, a step at its middle
        long, ctx = spec.long, context if context is not None else spec.long.prompt + spec.long.new_tokens // 2
        points.append(Point(f"prefill {long.prompt}", "prefill", prefill_dims(long.prompt), tokens=long.prompt,
                            report_key="long"))
        points.append(Point(f"decode @{ctx}", "decode", decode_dims(ctx), report_key="long"))
    ctx = context if context is not None else spec.prompt_lengths[0] + spec.new_tokens // 2
    points += [Point(f"decode @{ctx} x{b}", "decode", decode_dims(ctx, b), batch=b) for b in batches if b > 1]
    return points


def task_turns(recipe: Recipe) -> list[TaskTurn]:
    """The task script at batch 1: each turn's prefill over the context so far, then its reply."""
    turns, context = [], 0
    for turn in recipe.workload.task:
        prefill = Point(f"task prefill {turn.prompt} @{context}", "prefill", prefill_dims(turn.prompt, context),
                        tokens=turn.prompt)
        context += turn.prompt
        steps = turn.new_tokens - 1
        mean = context + (steps - 1) // 2 if steps else context
        turns.append(TaskTurn(prefill, Point(f"task decode @{mean}", "decode", decode_dims(mean)), steps))
        context += turn.new_tokens
    return turns


def forward_points(recipe: Recipe) -> list[Point]:
    """One forward at the batch dim's min, opt and max (every other dim at its opt); a dim
    without a name is fixed by the graph."""
    from pipeline.recipe.base import Dim

    dims: dict[str, Dim] = {}
    for spec in recipe.inputs:
        for d in spec.shape:
            if isinstance(d, Dim) and d.name:
                dims.setdefault(d.name, d)
    opt = {name: d.opt for name, d in dims.items()}
    batch = dims.get("batch")
    sizes = sorted({batch.min, batch.opt, batch.max}) if batch else [None]
    opt_batch = batch.opt if batch else None  # the request shape the report times (no batch dim: the one point)
    return [Point(f"batch {b}" if b else "forward", "forward", {**opt, **({"batch": b} if b else {})},
                  batch=b or 1, report_key="opt" if b == opt_batch else None, profiled=b == opt_batch)
            for b in sizes]
