"""Input feeds for every split, from one DataSource interface (data/sources.py):

    random   seeded values within the declared shapes and `range` (the default)
    file     an .npz of feeds           loader   `module:function` returning feeds
    text     .txt / .jsonl + tokenizer  arrays   .npy / .npz samples (images), with labels

Each split (validation, calibration) loads once per process and content: the cache is keyed
by the recipe's digest, its file and the data files' sha256, and holds frozen copies (tuples);
every caller gets its own lists, so nothing one run does to its feeds is seen by the next
(the arrays are shared: nothing writes into them, and torch warns on read-only ones). Real data is checked
(data/checks.py) before any stage runs; no validation feed may equal a calibration feed, so
accuracy is measured on inputs the engine was not calibrated on (random validation feeds are
redrawn; real ones are refused). Every split carries its provenance {source, sha256,
samples} into the report.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from pipeline.artifacts.report import DataProvenance
from pipeline.artifacts.report import Split as SplitProvenance
from pipeline.core.errors import InputError
from pipeline.core.json_object import JsonObject
from pipeline.data.checks import check_feeds
from pipeline.data.feeds import (
    Feed,
    SplitData,
    fingerprint,
    load_all,
    load_feeds,
    load_tokens,
    numpy_dtype,
    padded_to_longest,
    save_feeds,
)
from pipeline.data.random_source import Point, random_feed, random_feeds
from pipeline.data.sources import DataSource, RandomSource, source_for
from pipeline.recipe import Recipe

DataKeys = dict[str, JsonObject]  # split (validation, calibration) -> what identifies its data

Split = Literal["validation", "calibration", "export"]

__all__ = ["Feed", "SplitData", "Point", "Split", "DataSource", "check_feeds", "numpy_dtype",
           "random_feed", "save_feeds", "load_feeds", "load_all", "load_tokens", "feeds", "split",
           "calibration_feeds", "padded_to_longest", "provenance", "key", "source_for"]

_LOADED: dict[tuple, SplitData] = {}  # key -> the split as loaded, its lists frozen as tuples


def split(recipe: Recipe, name: str) -> SplitData | None:
    """The split's data, checked; None for a recipe without calibration data."""
    if getattr(recipe.data, name) is None:
        return None
    # the files' contents too: a file rewritten between two loads in one process is reread
    cache_key = (recipe.digest, str(recipe.source), name, str(key(recipe, "validation", "calibration")))
    if cache_key not in _LOADED:
        loaded = _load(recipe, name)
        _LOADED[cache_key] = dataclasses.replace(  # the provenance is frozen already
            loaded, feeds=tuple(loaded.feeds), masks=None if loaded.masks is None else tuple(loaded.masks))
    frozen = _LOADED[cache_key]
    return dataclasses.replace(frozen, feeds=list(frozen.feeds),
                               masks=None if frozen.masks is None else list(frozen.masks))


def _load(recipe: Recipe, name: str) -> SplitData:
    from pipeline.model import sources as models

    source = source_for(recipe, name)
    loaded = source.load()
    where = getattr(source, "where", f"data.{name}")  # e.g. `data.calibration.file cal.npz`
    if not loaded.feeds:
        raise InputError(f"{where}: holds no samples", f"{name} needs at least one feed")
    if not isinstance(source, RandomSource):
        check_feeds(recipe.inputs, loaded.feeds, where, models.vocab_size(recipe))
    if name == "validation":
        _held_out(recipe, source, loaded)
    return loaded


def _held_out(recipe: Recipe, source: DataSource, validation: SplitData) -> None:
    """No validation feed equals a calibration feed: random ones are redrawn, real ones refused."""
    calibration = split(recipe, "calibration")
    if calibration is None:
        return
    taken = {fingerprint(f) for f in calibration.feeds}
    if not isinstance(source, RandomSource):
        same = [i for i, f in enumerate(validation.feeds) if fingerprint(f) in taken]
        if validation.provenance.sha256 == calibration.provenance.sha256:
            what = "is the calibration data"
        elif same:
            what = f"feeds {same[:5]} are also calibration feeds"
        else:
            return
        raise InputError(f"data.validation {validation.provenance.source}: {what}",
                         "validate on held-out data: give the splits disjoint files")
    _, rng = random_feeds(recipe, "validation", len(validation.feeds), source.spec.shapes)
    points = source.spec.shapes
    for i, feed in enumerate(validation.feeds):
        while fingerprint(feed) in taken:
            feed = random_feed(recipe.inputs, points[i % len(points)], rng)
        validation.feeds[i] = feed


def feeds(recipe: Recipe, name: Split, samples: int | None = None) -> list[Feed]:
    """The split's feeds (the first `samples`); `export`: one random feed at the opt point."""
    if name == "export":
        return random_feeds(recipe, "export", samples or 1, ["opt"])[0]
    return split(recipe, name).feeds[:samples]


def calibration_feeds(recipe: Recipe) -> list[Feed]:
    """The recipe's calibration feeds, checked; [] when it has none."""
    found = split(recipe, "calibration")
    return found.feeds if found else []


def provenance(recipe: Recipe) -> DataProvenance:
    """report.json `data`: where the validation and calibration feeds came from (None: no
    calibration data)."""
    out = {}
    for name in ("validation", "calibration"):
        found = split(recipe, name)
        p = found.provenance if found else None
        out[name] = SplitProvenance(source=p.source, sha256=p.sha256, samples=p.samples) if p else None
    return DataProvenance(**out)


def key(recipe: Recipe, *names: str) -> DataKeys:
    """The data files' contents (sha256) of the named splits, for stage cache keys: the
    recipe's data section names a file, this says what is in it."""
    return {n: source_for(recipe, n).key() for n in names if getattr(recipe.data, n) is not None}


# What each task metric needs of the validation rows (SplitData.kind).
TASK_ROWS = {"perplexity": ("text",), "accuracy": ("labeled",), "embedding_similarity": ("pair",)}
TASK_HINT = {"perplexity": 'a .txt or a .jsonl of {"text": ...}',
             "accuracy": 'labels: an arrays .npz with `labels`, or a .jsonl of {"text", "label"}',
             "embedding_similarity": 'a .jsonl of {"sentence1", "sentence2", "score"}'}


def preflight(recipe: Recipe) -> None:
    """Before any stage runs: the validation data loads, passes its checks, and holds what
    validate.task scores."""
    validation = split(recipe, "validation")
    task = recipe.validate_.task
    if task is not None and validation.kind not in TASK_ROWS[task]:
        raise InputError(f"data.validation {validation.provenance.source}: validate.task "
                         f"{task} needs {TASK_HINT[task]}")
