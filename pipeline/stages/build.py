"""build: the final ONNX graph -> one engine per target, through the target's backend."""

from __future__ import annotations

from pathlib import Path

from pipeline import backends
from pipeline.recipe import Recipe
from pipeline.store import Artifact

NAME, VERSION = "build", 1


def engine_name(target) -> str:
    return f"{target.id}{backends.get(target.kind).EXTENSION}"


def build(recipe: Recipe, target, graph: Artifact, workdir: Path) -> tuple[dict[str, Path], dict]:
    backend = backends.get(target.kind)
    path, meta = backend.build(graph.path, target, recipe, workdir)
    extra = meta.pop("files", {})  # e.g. TensorRT's inspector JSON, committed beside the engine
    return ({engine_name(target): path, **extra},
            {"source": graph.name, "source_sha256": graph.sha256, **meta})
