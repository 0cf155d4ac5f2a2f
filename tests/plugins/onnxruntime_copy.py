"""A third-party backend, as a plugin package would ship it: kind `onnxruntime-copy`.

The engine is a byte copy of the final ONNX graph, run by Polygraphy's own ONNX Runtime
runner over a plain InferenceSession on the CPU. It keeps the whole Backend contract
(pipeline/backends/base.py) and brings its own target schema; nothing in pipeline/ names it.
Imports at module level stay light: the CLI imports plugins before every command.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Literal

from pydantic import Field

from pipeline.backends import TritonModel
from pipeline.recipe import TargetBase


class OnnxRuntimeCopyTarget(TargetBase):
    kind: Literal["onnxruntime-copy"] = "onnxruntime-copy"
    graph_optimization: Literal["disable", "all"] = Field(
        "all", description="ORT optimization the session applies when it loads the copy.")


TARGET = OnnxRuntimeCopyTarget
EXTENSION = ".onnx"
NEEDS_ONNX = True
PLAIN_ONNX = False
ENGINE_IS_ONNX = True
# A plain ONNX graph is what Triton's ONNX Runtime backend serves; CPU only, its defaults.
TRITON = TritonModel("onnxruntime_onnx", "model.onnx", gpu=lambda build_meta: False,
                     optimization=lambda policy, max_batch, opt_batch, inputs: None)


def unavailable(target: OnnxRuntimeCopyTarget) -> str | None:
    import importlib.util

    return None if importlib.util.find_spec("onnxruntime") else "onnxruntime is not installed"


def device(target: OnnxRuntimeCopyTarget) -> str:
    return "cpu"


def build(onnx_path: Path, target: OnnxRuntimeCopyTarget, recipe, workdir: Path):
    engine = workdir / f"{target.id}{EXTENSION}"
    t0 = time.perf_counter()
    shutil.copyfile(onnx_path, engine)
    return engine, {"copied_from": Path(onnx_path).name, "build_seconds": time.perf_counter() - t0}


def open(engine_path: Path, target: OnnxRuntimeCopyTarget, recipe, *,  # noqa: A001
         threads: int | None = None, spin: bool = True):
    import onnxruntime as ort
    from polygraphy.backend.onnxrt import OnnxrtRunner

    levels = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}

    def session():
        options = ort.SessionOptions()
        options.graph_optimization_level = levels[target.graph_optimization]
        if threads:
            options.intra_op_num_threads = threads
        return ort.InferenceSession(str(engine_path), options, providers=["CPUExecutionProvider"])

    return OnnxrtRunner(session, name=target.id)
