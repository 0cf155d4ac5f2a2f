"""Lossless compact storage of an engine's constants, undone by ONNX Runtime at load.

A GGUF checkpoint keeps its blocks' scales and minimums in fp16 (Q4_1's d and m, Q8_0's d).
Carried into MatMulNBits and the block-sum branch they become float32 initializers (those ops
take their scales in the activations' type); the exact route's zero points are all 0 (4-bit)
or all 128 (the 8-bit head); the tied embedding's Gather and the LM head read the same Q8_0
scales in two shapes. ONNX Runtime's saved optimized graph folds any such expression back
into plain initializers, so the INT4 engine file held all of it as stored values (issue 37's
"lean engine files": 121 MB against the checkpoint's ~96).

`compact` rewrites a saved engine's initializers of at least MIN_ELEMENTS values, in three
forms, each exact bit for bit:
- a tensor whose values are all one value -> ConstantOfShape(its shape) with that value;
- a tensor with the same type and bytes as an earlier one -> Reshape of the earlier one;
- a float32 tensor whose values are all fp16 (signed zeros included) -> fp16 + Cast.
Every new node writes the original name, so no consumer changes. A session at ONNX Runtime's
default optimization level (basic and above) folds these nodes once, at load (constant
folding): each step reads the very values it read before, MatMulNBits prepacks the same
scales and zero points, and only the file is smaller. `expand` is that fold done here, for
what reads an engine as a session holds it: the bandwidth floor and the roofline (the bytes a
step reads), the effective-precision and profile sessions (which load engines unoptimized and
would otherwise run these nodes every request).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core import safe_files

MARK = "pipeline.compact_storage"  # metadata_props key: what compact stored, as JSON
SUFFIX = "/compact_storage"  # the names of the nodes compact writes (expand folds only these)
MIN_ELEMENTS = 1024  # 4 KB: a smaller tensor saves less than its node costs in the file
# (a Q4_1 projection's scales are 10,368-27,648 values in SmolLM2-135M)


@dataclass(frozen=True)
class Stored:
    """What `compact` rewrote, per form: how many initializers, and the bytes the file saves."""

    uniform: int = 0
    duplicate: int = 0
    fp16: int = 0
    saved_bytes: int = 0

    @property
    def initializers(self) -> int:
        return self.uniform + self.duplicate + self.fp16

    def as_dict(self) -> dict[str, int]:
        return {"uniform": self.uniform, "duplicate": self.duplicate, "fp16": self.fp16,
                "saved_bytes": self.saved_bytes}


def _exact_fp16(values: np.ndarray) -> np.ndarray | None:
    """values (float32) as fp16, or None if any value is not an fp16 bit for bit."""
    half = values.astype(np.float16)
    same = half.astype(np.float32).view(np.uint32) == values.view(np.uint32)
    return half if bool(same.all()) else None


def _uniform(values: np.ndarray) -> bool:
    flat = values.reshape(-1).view(np.uint8).reshape(values.size, -1)  # bitwise, per element
    return bool((flat == flat[0]).all())


def compact(model, min_elements: int = MIN_ELEMENTS) -> Stored:
    """Rewrite, in place, the main graph's initializers of at least `min_elements` values
    into the module's three exact forms; marks the model (MARK) when anything changed."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    io = {v.name for v in (*graph.input, *graph.output)}
    plain = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.UINT8, TensorProto.INT8,
             TensorProto.INT32, TensorProto.INT64}  # what ConstantOfShape and Reshape take
    kept, nodes, seen = [], [], {}
    counts = {"uniform": 0, "duplicate": 0, "fp16": 0}
    saved = 0
    for init in graph.initializer:
        if int(np.prod(init.dims)) < min_elements or init.name in io \
                or init.data_type not in plain or init.data_location == TensorProto.EXTERNAL:
            kept.append(init)
            continue
        values = numpy_helper.to_array(init)
        name = init.name
        if _uniform(values):
            value = numpy_helper.from_array(values.reshape(-1)[:1], "")
            shape = numpy_helper.from_array(np.array(values.shape, np.int64), f"{name}/shape")
            kept.append(shape)
            nodes.append(helper.make_node("ConstantOfShape", [shape.name], [name],
                                          name=name + SUFFIX, value=value))
            counts["uniform"] += 1
            saved += values.nbytes - shape.ByteSize()
            continue
        digest = (init.data_type, hashlib.sha256(values.tobytes()).hexdigest())
        if digest in seen:
            shape = numpy_helper.from_array(np.array(values.shape, np.int64), f"{name}/shape")
            kept.append(shape)
            nodes.append(helper.make_node("Reshape", [seen[digest], shape.name], [name],
                                          name=name + SUFFIX))
            counts["duplicate"] += 1
            saved += values.nbytes - shape.ByteSize()
            continue
        seen[digest] = name
        half = _exact_fp16(values) if values.dtype == np.float32 else None
        if half is None:
            kept.append(init)
            continue
        stored = f"{name}/fp16"
        kept.append(numpy_helper.from_array(half, stored))
        nodes.append(helper.make_node("Cast", [stored], [name], name=name + SUFFIX, to=TensorProto.FLOAT))
        counts["fp16"] += 1
        saved += half.nbytes
    stored = Stored(**counts, saved_bytes=max(saved, 0))
    if not stored.initializers:
        return stored
    del graph.initializer[:]
    graph.initializer.extend(kept)
    # first in the graph: a Reshape reads the name a Cast writes, and every reader follows
    nodes.sort(key=lambda n: n.op_type == "Reshape")
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + rest)
    entry = next((p for p in model.metadata_props if p.key == MARK), None) \
        or model.metadata_props.add()
    entry.key, entry.value = MARK, json.dumps(stored.as_dict())
    return stored


def is_compact(model) -> bool:
    return any(p.key == MARK for p in model.metadata_props)


def expand(model) -> int:
    """Fold, in place, the nodes `compact` wrote (as a session does at load), dropping the
    stored forms no other node reads; returns how many. A model `compact` did not mark is
    left as it is."""
    from onnx import helper, numpy_helper

    if not is_compact(model):
        return 0
    graph = model.graph
    values = {i.name: i for i in graph.initializer}
    folded, kept_nodes = {}, []
    for node in graph.node:
        if not node.name.endswith(SUFFIX):
            kept_nodes.append(node)
            continue
        source = numpy_helper.to_array(values[node.input[0]])
        if node.op_type == "ConstantOfShape":
            fill = numpy_helper.to_array(helper.get_attribute_value(node.attribute[0]))
            array = np.full(tuple(source), fill.reshape(-1)[0], dtype=fill.dtype)
        elif node.op_type == "Reshape":
            array = source.reshape(tuple(numpy_helper.to_array(values[node.input[1]])))
        else:  # Cast to float32
            array = source.astype(np.float32)
        values[node.output[0]] = folded[node.output[0]] = numpy_helper.from_array(array, node.output[0])
    read = {name for node in kept_nodes for name in node.input}
    kept = [i for i in graph.initializer if i.name in read]
    del graph.node[:]
    graph.node.extend(kept_nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + [v for k, v in folded.items() if k in read])
    marks = [p for p in model.metadata_props if p.key != MARK]
    del model.metadata_props[:]
    model.metadata_props.extend(marks)
    return len(folded)


def load(path: Path):
    """The ONNX file as a session holds it: compact's nodes folded (no external data loaded)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    expand(model)
    return model


def opened(path: Path):
    """(the file as a session holds it, what to hand onnxruntime.InferenceSession for a session
    that loads it unoptimized yet must run what a serving session runs: the path itself, or, for
    a compacted file, its expanded bytes), from one read of the file."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    if not expand(model):
        return model, str(path)
    return model, model.SerializeToString()


def session_source(path: Path) -> str | bytes:
    """opened()'s session source alone."""
    return opened(path)[1]


def compact_file(path: Path, min_elements: int = MIN_ELEMENTS) -> Stored:
    """compact() an ONNX file whose data is inline, rewriting it only if anything changed. A
    file with external data (a model past protobuf's 2 GB) is left as it is."""
    import onnx
    from onnx import TensorProto

    model = onnx.load(str(path), load_external_data=False)
    if any(i.data_location == TensorProto.EXTERNAL for i in model.graph.initializer):
        return Stored()
    stored = compact(model, min_elements)
    if stored.initializers:
        safe_files.write_atomic(path, model.SerializeToString())
    return stored
