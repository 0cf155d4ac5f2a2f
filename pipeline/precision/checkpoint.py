"""INT4 from the checkpoint's own blocks: a GGUF's Q4_1 (and Q8_0) tensors as MatMulNBits.

A GGUF checkpoint quantized to Q4_1 stores each row of a weight in blocks of 32 along the
input dimension: 32 4-bit values q, one fp16 scale d and one fp16 minimum m, w = d*q + m.
transformers de-quantizes them to float32 (the baseline's weights), and the requantize route
(int4.py) quantizes those floats a second time, symmetric, losing up to half a step again.
ONNX Runtime's MatMulNBits stores the same layout (block 32 along K per output column, one
scale and one zero point per block: w = (q - zp) * scale), so the checkpoint's blocks can be
carried over as they are: scale = d, zero point = -m/d (a float zero point, which MatMulNBits
takes), the 4-bit values repacked from ggml's nibble order (byte j: q[j] | q[j+16] << 4) to
MatMulNBits' (byte j: q[2j] | q[2j+1] << 4). Q8_0 blocks (int8 q, scale d: the token
embedding, which the tied LM head reads) become 8-bit MatMulNBits with zero point 128.

Which checkpoint tensor a MatMul's weight is: the exported graph names weights anonymously
(transposed, and `pack_matmuls` concatenates q|k|v), and the GGUF permutes q/k rows for its
rotary layout, so every output column of every MatMul weight is looked up by content among
the checkpoint's de-quantized rows (the baseline's floats, byte for byte). A MatMul whose
columns are not all found (a pruned FFN, a weight the checkpoint stores in float) stays float
and is listed. The result is checked by ONNX Runtime itself: each new MatMulNBits run on the
identity matrix returns the weights it computes with, compared with the graph's floats.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

BLOCK = 32


def _blocks(tensor) -> tuple[str, np.ndarray, np.ndarray, np.ndarray] | None:
    """(kind, q [rows, nb, 32] uint8, scale [rows, nb] f32, zero point [rows, nb] f32 or uint8)."""
    from gguf import GGMLQuantizationType as Q

    raw = np.asarray(tensor.data)
    rows = raw.shape[0]
    if tensor.tensor_type == Q.Q4_1:  # 20 bytes a block: d f16, m f16, 16 bytes of nibbles
        b = raw.reshape(rows, -1, 20)
        d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        q = np.concatenate([b[..., 4:] & 0x0F, b[..., 4:] >> 4], axis=-1)
        # a block of equal weights (d = 0) is w = m: scale 1, zero point -m, q 0
        scale = np.where(d != 0, d, 1).astype(np.float32)
        zero = np.where(d != 0, -m / scale, -m).astype(np.float32)
        return "q4_1", q.astype(np.uint8), scale, zero
    if tensor.tensor_type == Q.Q8_0:  # 34 bytes a block: d f16, 32 int8
        b = raw.reshape(rows, -1, 34)
        d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        q = (b[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return "q8_0", q, d, np.full(d.shape, 128, np.uint8)
    return None


class CheckpointRows:
    """Every de-quantized row of the checkpoint's block-quantized tensors, by content."""

    def __init__(self, gguf_path: Path):
        from gguf import GGUFReader, quants

        self.tensors: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = []
        self.index: dict[bytes, tuple[int, int]] = {}
        for tensor in GGUFReader(str(gguf_path)).tensors:
            parts = _blocks(tensor)
            if parts is None:
                continue
            rows = quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)  # what transformers loads
            for r, row in enumerate(rows.reshape(rows.shape[0], -1).astype(np.float32)):
                self.index.setdefault(hashlib.sha1(row.tobytes()).digest(), (len(self.tensors), r))
            self.tensors.append(parts)

    def columns(self, weight: np.ndarray):
        """The blocks of each output column of `weight` [K, N], or None if one is not found."""
        found = [self.index.get(hashlib.sha1(np.ascontiguousarray(weight[:, n]).tobytes()).digest())
                 for n in range(weight.shape[1])]
        if any(f is None for f in found) or len({self.tensors[t][0] for t, _ in found}) != 1:
            return None
        kind = self.tensors[found[0][0]][0]
        q, scale, zero = (np.stack([self.tensors[t][i][r] for t, r in found]) for i in (1, 2, 3))
        return kind, q, scale, zero


def _matmul_nbits(node, kind: str, q, scale, zero, k: int, n: int, accuracy_level: int):
    """The MatMulNBits node and its initializers for one MatMul (A @ W, W [K, N])."""
    from onnx import helper, numpy_helper

    bits = 4 if kind == "q4_1" else 8
    if bits == 4:
        packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)  # [N, K/32, 16]
    else:
        packed = q  # [N, K/32, 32]
    base = node.output[0]
    inits = [numpy_helper.from_array(packed, f"{base}/B_nbits"),
             numpy_helper.from_array(scale.reshape(-1).astype(np.float32), f"{base}/scales"),
             numpy_helper.from_array(zero.reshape(-1), f"{base}/zero_points")]
    new = helper.make_node("MatMulNBits", [node.input[0], *(i.name for i in inits)], list(node.output),
                           name=f"{node.name or base}_Q{bits}", domain="com.microsoft", K=k, N=n,
                           bits=bits, block_size=BLOCK, accuracy_level=accuracy_level)
    return new, inits


def _dequantized(new, inits, k: int) -> np.ndarray:
    """What ONNX Runtime multiplies with: the node run on the identity [K, K] -> [K, N]."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    probe = helper.make_node(new.op_type, ["A", *new.input[1:]], ["Y"], domain=new.domain)
    probe.attribute.extend(a for a in new.attribute if a.name != "accuracy_level")  # float path
    graph = helper.make_graph([probe], "probe", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [k, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"A": np.eye(k, dtype=np.float32)})[0]


def from_checkpoint(model, gguf_path: Path, accuracy_level: int = 4) -> dict:
    """Rewrite `model` (onnx.ModelProto, FP32) in place; returns the precision meta's part."""
    from onnx import helper, numpy_helper

    rows = CheckpointRows(gguf_path)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    kept, new_inits, done, left, worst, exact, total = [], [], [], [], 0.0, 0, 0
    for node in graph.node:
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if weight is None or len(weight.dims) != 2 or weight.dims[0] % BLOCK:
            kept.append(node)
            continue
        w = numpy_helper.to_array(weight).astype(np.float32)
        found = rows.columns(w)
        if found is None:
            left.append(node.name or node.output[0])
            kept.append(node)
            continue
        k, n = w.shape
        new, parts = _matmul_nbits(node, *found, k, n, accuracy_level)
        got = _dequantized(new, parts, k)
        worst = max(worst, float(np.abs(got - w).max()))
        exact, total = exact + int((got == w).sum()), total + w.size
        kept.append(new)
        new_inits += parts
        done.append({"node": node.name or node.output[0], "blocks": found[0], "k": k, "n": n})
    readers = {name for node in kept for name in node.input}
    live = [i for i in graph.initializer if i.name in readers]
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend([*live, *new_inits])
    if done and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return {"source": "checkpoint", "checkpoint": str(gguf_path), "quantized_nodes": len(done),
            "by_block_type": {t: sum(d["blocks"] == t for d in done) for t in ("q4_1", "q8_0")},
            "left_float": left,
            "weights_vs_baseline": {"max_abs": worst, "bit_exact_share": exact / total if total else None},
            "accuracy_level": accuracy_level}
