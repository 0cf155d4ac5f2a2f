"""Engine backends, by target kind.

A backend module provides:
    EXTENSION                                    file suffix of its engines
    unavailable(target) -> str | None            why it cannot build here (None: it can)
    device(target) -> "cpu" | "cuda"             where its engines run (the baseline runs there too)
    build(onnx_path, target, recipe, workdir) -> (engine_path, meta)
    open(engine_path, target, recipe, *, threads, spin) -> Runner (Polygraphy BaseRunner; enter before use)
optionally:
    NEEDS_ONNX = False                           builds from the PyTorch model, not the graph:
                                                 a run whose targets all say so skips the
                                                 graph stages (export, optimize, precision)
    build meta["files"] = {name: path}           extra files committed beside the engine
    validation_extras(engine_path, target, recipe, runner) -> dict
                                                 keys merged into validate-<target>.json;
                                                 its "gates" are added to the engine's gates

Adding a backend: a new module and one line here.
"""

from __future__ import annotations

import importlib
from types import ModuleType

BACKENDS = {
    "onnxruntime": "pipeline.backends.onnxruntime",
    "tensorrt": "pipeline.backends.tensorrt",
    "aotinductor": "pipeline.backends.aotinductor",
}


def get(kind: str) -> ModuleType:
    return importlib.import_module(BACKENDS[kind])
