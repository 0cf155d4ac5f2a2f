"""Every value's element type and shape in an ONNX graph once its symbolic dims are bound.

The graph is read once into a Skeleton: its initializers' stored sizes are taken, and the
large ones (weights) are turned into graph inputs of the same type and shape, so that shape
inference, run once per point (prefill at 5,120 tokens, decode at a context ...), neither
copies nor parses hundreds of MB of weights; the small ones (shape constants, axes) stay,
since inference reads their values. Shapes come from ONNX Runtime's symbolic shape inference,
which knows the com.microsoft ops (GroupQueryAttention, MatMulNBits, SkipSimplifiedLayer-
Normalization ...), with ONNX's own inference as the fallback.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from pipeline.model import compact_storage

KEEP_ELEMENTS = 4096  # initializers up to this size keep their values (shape arithmetic reads them)

# bits per element of each ONNX element type a graph may store
_BITS = {TensorProto.FLOAT: 32, TensorProto.DOUBLE: 64, TensorProto.FLOAT16: 16, TensorProto.BFLOAT16: 16,
         TensorProto.INT64: 64, TensorProto.UINT64: 64, TensorProto.INT32: 32, TensorProto.UINT32: 32,
         TensorProto.INT16: 16, TensorProto.UINT16: 16, TensorProto.INT8: 8, TensorProto.UINT8: 8,
         TensorProto.BOOL: 8, TensorProto.FLOAT8E4M3FN: 8, TensorProto.FLOAT8E4M3FNUZ: 8,
         TensorProto.FLOAT8E5M2: 8, TensorProto.FLOAT8E5M2FNUZ: 8, TensorProto.INT4: 4, TensorProto.UINT4: 4}


def bits(elem_type: int) -> int:
    return _BITS.get(elem_type, 32)


def type_name(elem_type: int) -> str:
    """'float', 'int8', 'uint4' ... (TensorProto's name, lower case)."""
    return helper.tensor_dtype_to_string(elem_type).removeprefix("TensorProto.").lower()


@dataclass(frozen=True)
class Value:
    """A tensor: its element type and its dims ([] a scalar; None where inference left a dim
    unknown)."""

    elem_type: int
    dims: tuple[int, ...] | None

    @property
    def numel(self) -> int | None:
        if self.dims is None:
            return None
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def nbytes(self) -> int | None:
        n = self.numel
        return None if n is None else (n * bits(self.elem_type) + 7) // 8


@dataclass(frozen=True)
class Skeleton:
    """A graph read once: the model without its large weights (inputs in their place), each
    initializer as stored (type, dims, bytes), and the symbolic dims its inputs name."""

    model: onnx.ModelProto
    initializers: dict[str, Value]  # name -> its type and dims; bytes = Value.nbytes as stored
    symbols: tuple[str, ...]  # dim_param names of the graph inputs, first seen first
    path: Path | None = None


def skeleton(source: Path | onnx.ModelProto) -> Skeleton:
    # a file as a session holds it: fp16-stored initializers folded to float32 (model/compact_storage.py)
    model = compact_storage.load(source) if isinstance(source, Path) else copy.deepcopy(source)
    graph = model.graph
    initializers, kept = {}, []
    for init in graph.initializer:
        value = Value(init.data_type, tuple(init.dims))
        initializers[init.name] = value
        if (value.numel or 0) <= KEEP_ELEMENTS and init.data_location != TensorProto.EXTERNAL:
            kept.append(init)
        else:  # a weight: an input of its type and shape, no data
            graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    del graph.initializer[:]
    graph.initializer.extend(kept)
    symbols = []
    for inp in graph.input:
        for d in inp.type.tensor_type.shape.dim:
            if d.dim_param and d.dim_param not in symbols:
                symbols.append(d.dim_param)
    return Skeleton(model, initializers, tuple(symbols), source if isinstance(source, Path) else None)


def _bound(skel: Skeleton, dims: dict[str, int]) -> onnx.ModelProto:
    missing = [s for s in skel.symbols if s not in dims]
    if missing:
        raise ValueError(f"unbound symbolic dims: {', '.join(missing)}")
    model = copy.deepcopy(skel.model)
    for inp in [*model.graph.input, *model.graph.output]:  # outputs too: a present's total_sequence
        for d in inp.type.tensor_type.shape.dim:
            if d.dim_param in dims:
                value = dims[d.dim_param]
                d.Clear()
                d.dim_value = value
    return model


def _infer(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """(the model with value_info filled, the method that did it)."""
    from pipeline.roofline import inference

    del model.graph.value_info[:]  # the export's own, with unbound symbolic dims: inferred anew
    try:
        inferred, complete = inference.infer(model)
        return inferred, "ONNX Runtime symbolic shape inference" + ("" if complete else " (incomplete)")
    except Exception as e:  # noqa: BLE001 -- its failures are many kinds; ONNX's own inference is the fallback
        from pipeline.core.text import first_line

        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        return inferred, f"ONNX shape inference (ONNX Runtime's failed: {first_line(e, 120)})"


def values(skel: Skeleton, dims: dict[str, int]) -> tuple[dict[str, Value], str]:
    """Every value's type and shape at `dims` (each symbolic dim of the inputs bound to an
    int), initializers as stored; and how the shapes were inferred."""
    inferred, method = _infer(_bound(skel, dims))
    graph = inferred.graph
    table: dict[str, Value] = {}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        t = info.type.tensor_type
        if not t.elem_type:
            continue
        shape = None
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            shape = tuple(int(d.dim_value) for d in t.shape.dim)
        table[info.name] = Value(t.elem_type, shape)
    for init in graph.initializer:
        table[init.name] = Value(init.data_type, tuple(init.dims))
    table.update(skel.initializers)
    return table, method
