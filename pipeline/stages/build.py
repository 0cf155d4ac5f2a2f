"""build: the final ONNX graph (or, for a backend with NEEDS_ONNX False, the PyTorch model)
-> one engine per target, through the target's backend."""

from __future__ import annotations

from pathlib import Path

from pipeline import backends
from pipeline.recipe import Recipe
from pipeline.stages import Produced
from pipeline.store.recipe_folder import Artifact

NAME = "build"


def build(recipe: Recipe, target, graph: Artifact | None, workdir: Path) -> Produced:
    """`graph` is None when the target builds from the PyTorch model and no graph was made."""
    backend = backends.get(target.kind)
    path, meta = backend.build(graph.path if graph else None, target, recipe, workdir)
    extra = meta.pop("files", {})  # e.g. TensorRT's inspector JSON, committed beside the engine
    source = ({"source": graph.name, "source_sha256": graph.sha256} if graph
              else {"source": None, "source_sha256": None})  # built from the PyTorch model
    return Produced({backends.engine_name(target): path, **extra}, {**source, **meta})
