"""Precision in the graph: each mode turns an FP32 ONNX graph into a typed one.

    fp16, bf16   cast.py         casts, a block list of op types kept in FP32
    int8, fp8    qdq.py          calibrated Q/DQ (calibrate.py), optional sensitivity.py
    int4         int4.py         block-wise weight-only DequantizeLinear
    (all)        effective.py    which MatMul FLOPs ONNX Runtime really runs in integer kernels

`apply(recipe, src, workdir, verbose)` returns (typed graph path, meta). Adding a mode is a
module with `apply` and one line in MODES.
"""

from __future__ import annotations

import importlib
from pathlib import Path

MODES = {
    "fp16": "pipeline.precision.cast",
    "bf16": "pipeline.precision.cast",
    "int8": "pipeline.precision.qdq",
    "fp8": "pipeline.precision.qdq",
    "int4": "pipeline.precision.int4",
}

# Engine precisions whose CPU latency says nothing about the hardware they are meant for.
EMULATED_ON_CPU = {"fp8": "FP8 Q/DQ runs emulated on CPU (float kernels around Q/DQ): its CPU "
                          "latency is not meaningful, only its accuracy"}


def apply(recipe, src: Path, workdir: Path, verbose: bool = False) -> tuple[Path, dict]:
    module = importlib.import_module(MODES[recipe.precision.mode])
    return module.apply(recipe, src, workdir, verbose)
