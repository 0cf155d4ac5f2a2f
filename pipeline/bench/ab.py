"""A/B of engines from different recipes, interleaved in one process.

- `versus`: the `expect.faster_than` stage: this recipe's engine against another recipe's
  engine of the same target (run/versus.py builds the other recipe and opens both).
- `bench`: `pipeline bench RECIPE [--vs OTHER]`: every built engine of RECIPE and its
  PyTorch baseline (and OTHER's, with --vs) timed together at every shape; comparisons
  engine vs baseline, and RECIPE vs OTHER runner by runner (commands/bench.py opens them).

Runners come in as openers (callables returning an unentered Runner, backends/openers.py), so
the timing protocol imports no backend and no stage.

A comparison (A, B) is B's time over A's with a 95% interval over the interleaved rounds
(core.stats.compare): 0.8 = B takes 20% less time than A; its verdict is B's.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path

from pipeline.artifacts.recorded import dump
from pipeline.artifacts.report import Resources, Versus
from pipeline.bench import plots, protocol, sweep
from pipeline.core.errors import RecipeError
from pipeline.recipe import Recipe
from pipeline.store.recipe_folder import Artifact

BASELINE = "torch-eager"
Opener = Callable[[], object]  # returns a Runner, not yet entered


def _fmt_range(r) -> str:
    return f"[{r[0]:g}, {r[1]:g})" if r is not None else "unbounded (standard normal)"


def check_compatible(recipe: Recipe, other: Recipe, dims: list[dict[str, int]] | None = None) -> None:
    """`recipe`'s feeds are timed on `other`'s engines too: RecipeError (exit 2) unless every
    input has the same name and dtype, its values lie within `other`'s declared range (a
    token id past the other's vocabulary would index out of its embedding), and its shape at
    each timed point (`dims`: dim symbol -> size, default the opt point) lies within
    `other`'s min..max."""
    mine = [(i.name, i.dtype) for i in recipe.inputs]
    theirs = [(i.name, i.dtype) for i in other.inputs]
    if mine != theirs:
        raise RecipeError(f"`{recipe.name}` and `{other.name}` have different inputs "
                          f"({mine} vs {theirs}); their engines cannot be timed on one feed")
    problems = []
    for a, b in zip(recipe.inputs, other.inputs):
        if b.range is not None and a.dtype != "bool" and (
                a.range is None or a.range[0] < b.range[0] or a.range[1] > b.range[1]):
            problems.append(f"`{a.name}` values {_fmt_range(a.range)}, {other.name} takes "
                            f"{_fmt_range(b.range)}")
        for point in dims or [sweep.opt_dims(recipe)]:
            shape = [d if isinstance(d, int) else point.get(d.name, d.opt) for d in a.shape]
            limits = [(d, d) if isinstance(d, int) else (d.min, d.max) for d in b.shape]
            if len(shape) != len(limits) or any(not lo <= n <= hi for n, (lo, hi) in zip(shape, limits)):
                allowed = "[" + ", ".join(f"{lo}" if lo == hi else f"{lo}..{hi}" for lo, hi in limits) + "]"
                problems.append(f"`{a.name}` shape {shape}, {other.name} takes {allowed}")
                break
    if problems:
        raise RecipeError(
            f"`{recipe.name}`'s timing feed, which `{other.name}`'s engines are timed on too, does "
            f"not fit `{other.name}`'s inputs: " + "; ".join(problems),
            f"put the recipe with the narrower inputs first (e.g. `{other.name}` before "
            f"`{recipe.name}`), or give both recipes the same inputs")


def versus(recipe: Recipe, target, engine: Artifact, ref: str, other: Recipe, other_target,
           other_engine: Artifact, feed, open_this: Opener,
           open_other: Opener) -> Versus:
    """This recipe's `target` engine (B) against `other`'s (A), at the opt shape, on `feed`."""
    check_compatible(recipe, other)
    a, b = f"{other.name}/{other_target.id}", f"{recipe.name}/{target.id}"
    openers = {a: open_other, b: open_this}
    with contextlib.ExitStack() as stack:
        runners, cold = protocol.open_all(stack, openers, feed)
        result, _ = protocol.measure(runners, sweep.shapes(recipe, feed)[:1],
                                     recipe.validate_.latency, pairs=[(a, b)])
    shape = result.shapes[0]
    return Versus(
        other=ref, other_recipe=other.name, target=target.id,
        file=f"versus-{target.id}-{other.name}.json",
        this_sha256=engine.sha256, other_sha256=other_engine.sha256,
        shape=shape.shape, this_ms=shape.latency_ms[b], other_ms=shape.latency_ms[a],
        comparison=shape.comparisons[0], cold_start_ms=cold, timer=result.timers[b],
        resources=Resources.model_validate(result.resources.dump()), warnings=result.warnings,
        harness_overhead_us=result.harness_overhead_us)


def bench(recipe: Recipe, feed, engines: dict[str, Opener], baseline: Opener,
          other: Recipe | None = None, other_engines: dict[str, Opener] | None = None,
          other_baseline: Opener | None = None) -> tuple[dict, dict]:
    """engines: target id -> opener of its verified engine; `baseline` opens the PyTorch
    model. Returns (result JSON, samples at opt)."""
    openers = {f"{recipe.name}/{BASELINE}": baseline}
    pairs = []
    for tid, opener in engines.items():
        openers[f"{recipe.name}/{tid}"] = opener
        pairs.append((f"{recipe.name}/{BASELINE}", f"{recipe.name}/{tid}"))
    if other is not None:
        check_compatible(recipe, other, [dims for _, dims, _ in sweep.shapes(recipe, feed)])
        openers[f"{other.name}/{BASELINE}"] = other_baseline
        pairs.append((f"{other.name}/{BASELINE}", f"{recipe.name}/{BASELINE}"))
        for tid, opener in (other_engines or {}).items():
            openers[f"{other.name}/{tid}"] = opener
            if tid in engines:
                pairs.append((f"{other.name}/{tid}", f"{recipe.name}/{tid}"))
    with contextlib.ExitStack() as stack:
        runners, cold = protocol.open_all(stack, openers, feed)
        timings, samples = protocol.measure(runners, sweep.shapes(recipe, feed),
                                            recipe.validate_.latency, pairs=pairs)
    result = {"recipe": recipe.name, "vs": other.name if other else None,
              "protocol": recipe.validate_.latency.model_dump(mode="json"),
              "cold_start_ms": {n: dump(c) for n, c in cold.items()}, **timings.dump()}
    return result, samples


def write(result: dict, samples: dict, folder: Path) -> tuple[Path, Path]:
    """bench.json (or bench-vs-OTHER.json) and its latency PNG, into the recipe's folder."""
    from pipeline.core.safe_files import write_atomic

    stem = "bench" + (f"-vs-{result['vs']}" if result["vs"] else "")
    png = folder / f"{stem}.png"
    result["plot"] = png.name
    plots.latency_png(png, samples, f"pipeline bench {result['recipe']}"  # atomic, exclusive temp
                      + (f" --vs {result['vs']}" if result["vs"] else "")
                      + f", {result['shapes'][0]['shape']}, interleaved")
    path = folder / f"{stem}.json"
    write_atomic(path, json.dumps(result, indent=2) + "\n")
    return path, png
