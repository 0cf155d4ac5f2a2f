"""Shapes to time: the profile's opt point, then every combination of the recipe's sweep.

    validate.latency.sweep: {batch: [1, 8], sequence: [16, 128]}
    -> opt (batch=2, sequence=64), batch=1 sequence=16, batch=1 sequence=128, batch=8 ...

A sweep names dim symbols (the `name:` of a dynamic dim); every input dim with that symbol
takes the size, the other dims stay at opt. Feeds are seeded like every other feed.
"""

from __future__ import annotations

import itertools

import numpy as np

from pipeline import data
from pipeline.recipe import Dim, Recipe

Dims = dict[str, int]  # dim name -> its size

_STREAM = 4  # seed stream of sweep feeds (data.py uses 1-3)


def opt_dims(recipe: Recipe) -> Dims:
    return {d.name: d.opt for i in recipe.inputs for d in i.shape if isinstance(d, Dim) and d.name}


def feed_for(recipe: Recipe, dims: dict[str, int], seed: int = 0) -> data.Feed:
    """A random feed with each named dim at `dims[symbol]` (others at opt)."""
    inputs = []
    for spec in recipe.inputs:
        shape = [dims.get(d.name, d.opt) if isinstance(d, Dim) else d for d in spec.shape]
        inputs.append(spec.model_copy(update={"shape": shape}))
    rng = np.random.default_rng([recipe.data.seed, _STREAM, seed])
    return data.random_feed(inputs, "opt", rng)


def label(dims: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in dims.items()) or "fixed"


def shapes(recipe: Recipe, opt_feed: data.Feed) -> list[tuple[str, dict, data.Feed]]:
    """(label, dims, feed) per shape; the first is the opt point with `opt_feed`."""
    opt = opt_dims(recipe)
    out = [(f"opt ({label(opt)})", opt, opt_feed)]
    sweep = recipe.validate_.latency.sweep
    if not sweep:
        return out
    for i, sizes in enumerate(itertools.product(*sweep.values())):
        dims = {**opt, **dict(zip(sweep, sizes))}
        out.append((label(dims), dims, feed_for(recipe, dims, seed=i)))
    return out
