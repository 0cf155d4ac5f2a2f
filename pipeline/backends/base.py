"""The Backend contract: what every engine backend module provides, and what it declares.

A backend is a module (typing.Protocol over module attributes, which a module satisfies
structurally). Everything the pipeline does differently per target kind is asked of the
backend: no stage, nor deploy, compares `kind` against a name.

    TARGET        the recipe schema of its targets (pydantic, `kind: Literal["<kind>"]`)
    EXTENSION     file suffix of its engines (".onnx", ".plan", ".pt2")
    NEEDS_ONNX    True: builds from the final ONNX graph; False: from the PyTorch model
                  (a run whose targets all say False skips export, optimize, precision)
    PLAIN_ONNX    True: takes ONNX-domain ops only (no ONNX Runtime contrib ops/fusions):
                  the run gives it a graph made without ORT-only passes
    ENGINE_IS_ONNX  True: the engine file is an ONNX graph that ONNX Runtime runs as is:
                  validate measures a quantized engine's effective precision with ORT's
                  profiler, compare profiles it per node
    TRITON        how Triton serves its engines (TritonModel), or None: deploy refuses them
    unavailable(target) -> str | None      why it cannot build here (None: it can)
    device(target) -> "cpu" | "cuda"       where its engines run (the baseline runs there too)
    build(onnx_path, target, recipe, workdir) -> (engine_path, meta)
                  onnx_path is None when NEEDS_ONNX is False and no graph was made;
                  meta["files"] = {name: path}: extra files committed beside the engine
    open(engine_path, target, recipe, *, threads, spin) -> Runner (Polygraphy BaseRunner)
optionally:
    validation_extras(engine_path, target, recipe, runner) -> ValidationExtras
                  fields merged into validate-<target>.json; its "gates" join the engine's gates

This module imports nothing heavy: deploy and the registry read the constants without
loading onnxruntime, TensorRT or torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipeline.core.errors import DependencyError

# What a backend's validation_extras adds to its engine's EngineResult: field name -> value
# (e.g. `runtime`, `tensorrt_layer_shares`), and "gates" -> its list of Gate records.
ValidationExtras = dict[str, Any]


@dataclass(frozen=True)
class TritonModel:
    """How Triton Inference Server serves one kind of engine (model_config.proto)."""

    platform: str            # config.pbtxt `platform:` (onnxruntime_onnx, tensorrt_plan)
    model_file: str          # the file Triton loads from the version folder (model.onnx)
    # build meta -> does the engine run on a GPU (instance_group KIND_GPU)?
    gpu: Callable[[dict], bool]
    # (policy, max_batch, opt_batch, inputs): fills config.pbtxt's `optimization` block, a
    # ModelOptimizationPolicy message of Triton's schema (deploy writes the whole config with
    # protobuf's text_format); inputs are deploy's Tensors (name, data_type, dims, opt)
    optimization: Callable[[Any, int, int | None, list[Any]], None]


class Backend(Protocol):
    TARGET: type
    EXTENSION: str
    NEEDS_ONNX: bool
    PLAIN_ONNX: bool
    ENGINE_IS_ONNX: bool
    TRITON: TritonModel | None

    def unavailable(self, target) -> str | None: ...

    def device(self, target) -> str: ...

    def build(self, onnx_path: Path | None, target, recipe, workdir: Path) -> tuple[Path, dict]: ...

    def open(self, engine_path: Path, target, recipe, *, threads: int | None = None,
             spin: bool = True): ...


REQUIRED = ("TARGET", "EXTENSION", "NEEDS_ONNX", "PLAIN_ONNX", "ENGINE_IS_ONNX", "TRITON",
            "unavailable", "device", "build", "open")


def check(kind: str, module: Any) -> Backend:
    """`module` if it keeps the contract for `kind`, else one error naming what it lacks."""
    missing = [name for name in REQUIRED if not hasattr(module, name)]
    name = getattr(module, "__name__", repr(module))
    if missing:
        raise DependencyError(f"backend `{kind}` ({name}) lacks {', '.join(missing)} "
                              "(see the Backend contract in pipeline/backends/base.py)")
    schema_kind = getattr(module.TARGET, "model_fields", {}).get("kind")
    if schema_kind is None or schema_kind.default != kind:
        raise DependencyError(f"backend `{kind}` ({name}): its TARGET schema must declare "
                              f"`kind: Literal[{kind!r}] = {kind!r}`")
    return module
