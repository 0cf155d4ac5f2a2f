"""The shapes a recipe's workload runs at, as bindings of its graph's symbolic dims.

A generation recipe: each prompt's prefill at batch 1 (TTFT: the prompt in one forward, no
past), one decode step at batch 1 with a context in the cache (TPOT), the same step at larger
batches (the decode curve: one step serves `batch` sequences), and the task script's turns
(each turn's prompt appended to the context, then its reply token by token). A forward
recipe: one forward at each of the batch dim's min / opt / max with every other dim at opt.
Dim names are the export's: batch, sequence, past_sequence, total_sequence (a KV-cache
graph), or the recipe's own `name:` for each input dim.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class TaskTurn:
    """One turn: its prefill, and its reply's decode steps (the first new token comes from the
    prefill), costed once at their mean context: a decode step's FLOPs and bytes grow
    linearly with the context (S = 1: one query against past + 1 keys), so `steps` times the
    mean step is their sum."""

    prefill: Point
    decode: Point
    steps: int


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
        key = f"b1-p{prompt}"
        ctx = context if context is not None else prompt + spec.new_tokens // 2
        points.append(Point(f"prefill {prompt}", "prefill", prefill_dims(prompt), tokens=prompt, report_key=key))
        points.append(Point(f"decode @{ctx}", "decode", decode_dims(ctx), report_key=key))
    if spec.long is not None:  # the long generation: its prompt's prefill, a step at its middle
        long, ctx = spec.long, context if context is not None else spec.long.prompt + spec.long.new_tokens // 2
        points.append(Point(f"prefill {long.prompt}", "prefill", prefill_dims(long.prompt), tokens=long.prompt))
        points.append(Point(f"decode @{ctx}", "decode", decode_dims(ctx)))
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
    return [Point(f"batch {b}" if b else "forward", "forward", {**opt, **({"batch": b} if b else {})},
                  batch=b or 1, report_key="opt" if b == (batch.opt if batch else None) else None)
            for b in sizes]
