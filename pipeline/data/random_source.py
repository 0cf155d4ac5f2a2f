"""The random source: seeded values within the recipe's declared shapes and `range`.

`range` is a property of this generator only: real data (files, loaders, text) is checked
against names, dtypes, the profile and the vocabulary, never against it. Each split draws
from its own seed stream.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from pipeline.data.feeds import Feed, numpy_dtype
from pipeline.recipe import InputSpec, Recipe

Point = Literal["min", "opt", "max"]

# Stable ids for the seed streams; never reorder (it would change every cached artifact).
STREAM = {"validation": 1, "calibration": 2, "export": 3}
DEFAULT_SAMPLES = {"validation": 8, "calibration": 16, "export": 1}


def random_feed(inputs: list[InputSpec], point: Point, rng: np.random.Generator) -> Feed:
    feed = {}
    for spec in inputs:
        shape = spec.dims(point)
        dtype = numpy_dtype(spec.dtype)
        if spec.dtype in ("int64", "int32"):
            low, high = int(spec.range[0]), int(spec.range[1])
            feed[spec.name] = rng.integers(low, high, size=shape, dtype=dtype)
        elif spec.dtype == "bool":
            feed[spec.name] = rng.random(shape) < 0.5
        elif spec.range is not None:
            feed[spec.name] = rng.uniform(*spec.range, size=shape).astype(dtype)
        else:
            feed[spec.name] = rng.standard_normal(shape).astype(dtype)
    return feed


def random_feeds(recipe: Recipe, split: str, samples: int | None,
                 points: list[Point]) -> tuple[list[Feed], np.random.Generator]:
    """`samples` feeds cycling through the profile `points`; the generator, to draw more."""
    n = samples if samples is not None else DEFAULT_SAMPLES[split]
    rng = np.random.default_rng([recipe.data.seed, STREAM[split]])
    return [random_feed(recipe.inputs, points[i % len(points)], rng) for i in range(n)], rng
