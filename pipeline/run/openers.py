"""What the timing protocol (pipeline/bench) times, opened here: engines through their
backend, the PyTorch baseline, and the timing feed. The protocol itself imports no backend
and no stage; it takes these openers (callables returning an unentered Runner)."""

from __future__ import annotations

from pathlib import Path

from pipeline import backends
from pipeline.model import sources as models
from pipeline.recipe import Recipe


def engine_opener(recipe: Recipe, target, path: Path):
    spec = recipe.validation.latency
    return lambda: backends.get(target.kind).open(path, target, recipe, threads=recipe.validation.threads,
                                                  spin=spec.spin)


def baseline_opener(recipe: Recipe):
    from pipeline.stages.validate import baseline_device, baseline_runner

    return lambda: baseline_runner(recipe, models.load(recipe), baseline_device(recipe))


def timing_feed(recipe: Recipe):
    from pipeline.stages.validate import timing_feed as feed

    return feed(recipe)
