"""Input feeds: seeded random values within the recipe's declared shapes and ranges.

Each split (validation, calibration, ...) draws from its own seed stream, and no
validation feed may equal a calibration feed, so accuracy is always measured on inputs
the engine was not calibrated on.
"""

from __future__ import annotations

import hashlib
from typing import Literal

import numpy as np

from pipeline.recipe import InputSpec, Recipe

Feed = dict[str, np.ndarray]
Split = Literal["validation", "calibration", "export"]
Point = Literal["min", "opt", "max"]

# Stable ids for the seed streams; never reorder (it would change every cached artifact).
_STREAM = {"validation": 1, "calibration": 2, "export": 3}


def numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # shipped with onnx

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


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


def feeds(recipe: Recipe, split: Split, samples: int | None = None) -> list[Feed]:
    """`samples` feeds of `split`, cycling through the split's profile points."""
    spec = getattr(recipe.data, split) if split != "export" else None
    points: list[Point] = spec.shapes if spec else ["opt"]
    n = samples if samples is not None else (spec.samples if spec else 1)
    rng = np.random.default_rng([recipe.data.seed, _STREAM[split]])
    out = [random_feed(recipe.inputs, points[i % len(points)], rng) for i in range(n)]
    if split == "validation":
        _drop_overlap(recipe, out, rng, points)
    return out


def _fingerprint(feed: Feed) -> str:
    h = hashlib.sha256()
    for name in sorted(feed):
        h.update(name.encode())
        h.update(str(feed[name].shape).encode())
        h.update(np.ascontiguousarray(feed[name]).tobytes())
    return h.hexdigest()


def _drop_overlap(recipe: Recipe, validation: list[Feed], rng, points) -> None:
    """Redraw any validation feed that also occurs among the calibration feeds."""
    taken = {_fingerprint(f) for f in feeds(recipe, "calibration")}
    for i, feed in enumerate(validation):
        while _fingerprint(feed) in taken:
            feed = random_feed(recipe.inputs, points[i % len(points)], rng)
        validation[i] = feed


def save_feeds(path, feeds_: list[Feed], outputs: list[Feed] | None = None) -> None:
    """Feeds (and optionally reference outputs) as one .npz: `in/<i>/<name>`, `out/<i>/<name>`."""
    arrays = {f"in/{i}/{k}": v for i, f in enumerate(feeds_) for k, v in f.items()}
    for i, o in enumerate(outputs or []):
        arrays.update({f"out/{i}/{k}": v for k, v in o.items()})
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load_feeds(path) -> tuple[list[Feed], list[Feed]]:
    """Inverse of save_feeds: (feeds, outputs); outputs is [] when none were saved."""
    groups: dict[str, dict[int, Feed]] = {"in": {}, "out": {}}
    with np.load(path, allow_pickle=False) as z:
        for key in z.files:
            part, index, name = key.split("/", 2)
            groups[part].setdefault(int(index), {})[name] = z[key]
    return ([groups["in"][i] for i in sorted(groups["in"])],
            [groups["out"][i] for i in sorted(groups["out"])])
