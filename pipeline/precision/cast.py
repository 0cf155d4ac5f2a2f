"""FP16 / BF16 by casting the graph, keeping a block list of op types in FP32.

ONNX Runtime's float16 converter does the casting: float initializers and tensors become
float16, Cast nodes are inserted around the op types in the block list (norm statistics,
softmax, reductions and trigonometry by default: their FP16 ranges overflow or lose the
small differences they work on) and around graph inputs/outputs with `keep_io_types`.
BF16 is the same graph retyped to bfloat16 (same exponent range as FP32, so no overflow,
fewer mantissa bits); ONNX Runtime's CPU provider lacks most BF16 kernels, so a BF16
graph is built for TensorRT and may fail to load in ONNX Runtime on CPU.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from pipeline.precision import nodes

_FLOAT16, _BFLOAT16 = onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16


def apply(recipe, src: Path, workdir: Path, verbose: bool = False) -> tuple[Path, dict]:
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    spec = recipe.precision
    model = onnx.load(str(src))
    names = [n.name for n in model.graph.node]
    excluded = nodes.excluded(names, spec.exclude)
    typed = convert_float_to_float16(
        model, keep_io_types=spec.keep_io_types,
        op_block_list=sorted(set(DEFAULT_OP_BLOCK_LIST) | set(spec.block_list)),
        node_block_list=excluded,
    )
    _topological_sort(typed.graph)  # the converter appends its Casts at the end
    if spec.mode == "bf16":
        _to_bfloat16(typed)
    out = workdir / "typed.onnx"
    onnx.save(typed, str(out))
    kept = [n.name for n in typed.graph.node if n.op_type in spec.block_list] + excluded
    return out, {
        "keep_io_types": spec.keep_io_types,
        "block_list": list(spec.block_list),
        "fp32_nodes": len(kept),
        "cast_nodes": sum(n.op_type == "Cast" for n in typed.graph.node) -
                      sum(n.op_type == "Cast" for n in model.graph.node),
        "excluded": [{"node": n, "why": "recipe"} for n in excluded],
    }


def _topological_sort(graph) -> None:
    """Reorder nodes so each comes after the producers of its inputs (ONNX requires it)."""
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        ready = [n for n in pending if all(i in available for i in n.input)]
        if not ready:  # a cycle or a dangling input: leave the rest as they were
            ordered += pending
            break
        for n in ready:
            available.update(n.output)
        ordered += ready
        pending = [n for n in pending if n not in ready]
    del graph.node[:]
    graph.node.extend(ordered)


def _to_bfloat16(model) -> None:
    """Retype every float16 tensor, initializer, constant and Cast target as bfloat16."""
    import ml_dtypes
    import numpy as np
    from onnx import numpy_helper

    graph = model.graph
    for i, init in enumerate(graph.initializer):
        if init.data_type == _FLOAT16:
            array = numpy_helper.to_array(init).astype(np.float32).astype(ml_dtypes.bfloat16)
            graph.initializer[i].CopyFrom(_bf16_tensor(array, init.name))
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.tensor_type.elem_type == _FLOAT16:
            value.type.tensor_type.elem_type = _BFLOAT16
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == _FLOAT16:
                attr.i = _BFLOAT16
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == _FLOAT16:
                array = numpy_helper.to_array(attr.t).astype(np.float32).astype(ml_dtypes.bfloat16)
                attr.t.CopyFrom(_bf16_tensor(array, attr.t.name))


def _bf16_tensor(array, name: str):
    import numpy as np

    tensor = onnx.TensorProto()
    tensor.name, tensor.data_type = name, _BFLOAT16
    tensor.dims.extend(array.shape)
    tensor.raw_data = np.ascontiguousarray(array).view(np.uint16).tobytes()
    return tensor
