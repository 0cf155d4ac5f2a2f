"""INT4 from the checkpoint's own blocks: a GGUF's Q4_1 (and Q8_0) tensors as MatMulNBits.

A GGUF checkpoint quantized to Q4_1 stores each row of a weight in blocks of 32 along the
input dimension: 32 4-bit values q, one fp16 scale d and one fp16 minimum m, w = d*q + m.
transformers de-quantizes them to float32 (the baseline's weights), and the requantize route
(int4.py) quantizes those floats a second time, symmetric, losing up to half a step again.
ONNX Runtime's MatMulNBits stores the same layout (block 32 along K per output column, one
scale and one zero point per block: w = (q - zp) * scale), so the checkpoint's blocks can be
carried over as they are, the 4-bit values repacked from ggml's nibble order (byte j: q[j] |
q[j+16] << 4) to MatMulNBits' (byte j: q[2j] | q[2j+1] << 4). Q4_1's minimum is not an
integer zero point (-m/d), and ONNX Runtime 1.32's CPU kernels take float zero points only on
a slow path (20-200x slower per MatMul, measured 2026-12-02), so a Q4_1 MatMul becomes
MatMulNBits with scale d and zero point 0 plus the minimum's own term:

    x @ W = x @ (d*q) + blocksum(x) @ M      blocksum(x) [.., K/32]: x summed per block of 32
                                             M [K/32, N]: the blocks' minimums m

one small float MatMul (1/32 of the FLOPs) whose block sums are shared by every MatMul reading
the same x (Reshape [.., K/32, 32] + ReduceSum). Q8_0 blocks (int8 q, scale d: the token
embedding, which the tied LM head reads) become 8-bit MatMulNBits with zero point 128.

Which checkpoint tensor a MatMul's weight is: the exported graph names weights anonymously
(transposed, and `pack_matmuls` concatenates q|k|v), and the GGUF permutes q/k rows for its
rotary layout, so every output column of every MatMul weight is looked up by content among
the checkpoint's de-quantized rows (the baseline's floats, byte for byte). A MatMul whose
columns are not all found (a pruned FFN, a weight the checkpoint stores in float) stays float
and is listed. The result is checked by ONNX Runtime itself: each new MatMulNBits run on the
identity matrix returns the weights it computes with, compared with the graph's floats.

The token embedding's Gather reads the same Q8_0 rows as the tied LM head: it becomes
GatherBlockQuantized (8 bits, zero point 128) over the head's own 8-bit initializer, so the
engine file carries the table once, in its stored precision (SmolLM2: 113 MB of float32 rows
become the head's 28 MB), checked the same way: every row gathered against the graph's floats.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from pipeline.core.json_object import JsonObject

Ranks = dict[str, int]  # tensor -> its rank, where ONNX shape inference knows it

BLOCK = 32


def _blocks(tensor) -> tuple[str, np.ndarray, np.ndarray, np.ndarray] | None:
    """(kind, q [rows, nb, 32] uint8, scale [rows, nb] f32, Q4_1's minimum [rows, nb] f32 or
    Q8_0's zero point [rows, nb] uint8)."""
    from gguf import GGMLQuantizationType as Q

    raw = np.asarray(tensor.data)
    rows = raw.shape[0]
    if tensor.tensor_type == Q.Q4_1:  # 20 bytes a block: d f16, m f16, 16 bytes of nibbles
        b = raw.reshape(rows, -1, 20)
        d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        q = np.concatenate([b[..., 4:] & 0x0F, b[..., 4:] >> 4], axis=-1)
        return "q4_1", q.astype(np.uint8), d, m
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


class BlockSums:
    """blocksum(x) [.., K/32] for each MatMul input x: built once, read by every Q4_1 MatMul
    of that input (unpacked q, k and v read one x). On a packed graph each MatMul reads its
    own x, so the route adds Reshape, ReduceSum, MatMul and Add per MatMul: SmolLM2's int4
    graph has 789 nodes where the requantize route's has ~340, cheap ops at decode size."""

    def __init__(self, ranks: dict[str, int]):
        self.ranks, self.made, self.nodes, self.inits = ranks, {}, [], []

    def __call__(self, x: str, k: int) -> str | None:
        """The name of x's block sums, or None when x's rank is unknown."""
        from onnx import helper, numpy_helper

        if x in self.made:
            return self.made[x]
        rank = self.ranks.get(x)
        if rank is None:
            return None
        shape = numpy_helper.from_array(np.array([0] * (rank - 1) + [k // BLOCK, BLOCK], np.int64), f"{x}/blocks_shape")
        axis = numpy_helper.from_array(np.array([-1], np.int64), f"{x}/blocks_axis")
        self.nodes += [helper.make_node("Reshape", [x, shape.name], [f"{x}/blocks"], name=f"{x}/blocks"),
                       helper.make_node("ReduceSum", [f"{x}/blocks", axis.name], [f"{x}/block_sums"],
                                        name=f"{x}/block_sums", keepdims=0)]
        self.inits += [shape, axis]
        self.made[x] = f"{x}/block_sums"
        return self.made[x]


def _matmul_nbits(node, kind: str, q, scale, extra, k: int, n: int, accuracy_level: int, sums: str | None):
    """The nodes and initializers that replace one MatMul (A @ W, W [K, N]): MatMulNBits, and
    for Q4_1 the minimum's term (`sums`: A's block sums) added to it."""
    from onnx import helper, numpy_helper

    from pipeline.precision.nibbles import pack_nibbles

    bits = 4 if kind == "q4_1" else 8
    base = node.output[0]
    if bits == 4:
        packed = pack_nibbles(q)  # [N, K/32, 16]
        zero = np.zeros((n, (k // BLOCK + 1) // 2), np.uint8)  # 4-bit zero points 0, two a byte
    else:
        packed, zero = q, extra  # [N, K/32, 32], zero point 128
    inits = [numpy_helper.from_array(packed, f"{base}/B_nbits"),
             numpy_helper.from_array(scale.reshape(-1).astype(np.float32), f"{base}/scales"),
             numpy_helper.from_array(zero.reshape(n, -1), f"{base}/zero_points")]
    out = f"{base}/scaled" if bits == 4 else base
    nodes = [helper.make_node("MatMulNBits", [node.input[0], *(i.name for i in inits)], [out],
                              name=f"{node.name or base}_Q{bits}", domain="com.microsoft", K=k, N=n,
                              bits=bits, block_size=BLOCK, accuracy_level=accuracy_level)]
    if bits == 4:  # + blocksum(A) [.., K/32] @ M [K/32, N]
        inits.append(numpy_helper.from_array(np.ascontiguousarray(extra.T.astype(np.float32)), f"{base}/minimums"))
        nodes += [helper.make_node("MatMul", [sums, f"{base}/minimums"], [f"{base}/offset"], name=f"{base}/offset"),
                  helper.make_node("Add", [out, f"{base}/offset"], [base], name=f"{base}/add_offset")]
    return nodes, inits


def _dequantized(nodes, inits, k: int) -> np.ndarray:
    """What ONNX Runtime multiplies with: the replacement run on the identity [K, K] -> [K, N]."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    sums = BlockSums({"A": 3})
    renamed = {nodes[0].input[0]: "A", nodes[-1].output[0]: "Y"}
    probe = []
    for node in nodes:
        node = helper.make_node(node.op_type, [renamed.get(i, i) for i in node.input],
                                [renamed.get(o, o) for o in node.output], domain=node.domain,
                                **{a.name: helper.get_attribute_value(a) for a in node.attribute
                                   if a.name != "accuracy_level"})  # the float path
        if node.op_type == "MatMul":
            node.input[0] = sums("A", k)
        probe.append(node)
    graph = helper.make_graph([*sums.nodes, *probe], "probe",
                              [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, k, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], [*inits, *sums.inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"A": np.eye(k, dtype=np.float32)[None]})[0][0]


def _gather_nbits(node, q, scale, zero, k: int, rank: int, shared: dict[str, str]):
    """The nodes and initializers that replace one embedding Gather (table [V, K], Q8_0 rows):
    GatherBlockQuantized over q [V, K/32, 32] (the head's MatMulNBits initializer when its
    bytes are the same, `shared`: content -> name) -> [.., K/32, 32], then Reshape -> [.., K]."""
    from onnx import helper, numpy_helper

    base = node.output[0]
    data = shared.get(hashlib.sha1(q.tobytes()).hexdigest())
    inits = [] if data else [numpy_helper.from_array(q, f"{base}/blocks")]
    inits += [numpy_helper.from_array(scale[..., None].astype(np.float32), f"{base}/scales"),
              numpy_helper.from_array(zero[..., None], f"{base}/zero_points"),
              numpy_helper.from_array(np.array([0] * rank + [k], np.int64), f"{base}/shape")]
    names = [data or f"{base}/blocks", node.input[1], f"{base}/scales", f"{base}/zero_points"]
    nodes = [helper.make_node("GatherBlockQuantized", names, [f"{base}/blocks_out"], name=f"{node.name or base}_Q8",
                              domain="com.microsoft", gather_axis=0, quantize_axis=2, block_size=BLOCK, bits=8),
             helper.make_node("Reshape", [f"{base}/blocks_out", f"{base}/shape"], [base], name=f"{base}/rows")]
    return nodes, inits


def _gathered(nodes, inits, extra: list, rows: int) -> np.ndarray:
    """What ONNX Runtime gathers: every row of the replacement's table, [V, K]."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    ids = nodes[0].input[1]
    graph = helper.make_graph(nodes, "probe", [helper.make_tensor_value_info(ids, TensorProto.INT64, [1, rows])],
                              [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
                              [*inits, *extra])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {ids: np.arange(rows, dtype=np.int64)[None]})[0][0]


def _embeddings(kept: list, new_inits: list, inits: dict, rows: CheckpointRows, ranks: Ranks) -> list[dict]:
    """Replace, in `kept`, each Gather of a Q8_0 table [V, K] by GatherBlockQuantized (in
    place); returns what each became."""
    from onnx import numpy_helper

    shared = {hashlib.sha1(numpy_helper.to_array(i).tobytes()).hexdigest(): i.name
              for i in new_inits if i.name.endswith("/B_nbits") and len(i.dims) == 3 and i.dims[2] == BLOCK}  # 8-bit
    done = []
    for node in list(kept):
        table = inits.get(node.input[0]) if node.op_type == "Gather" else None
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if table is None or len(table.dims) != 2 or table.dims[1] % BLOCK or axis != 0 or node.input[1] not in ranks:
            continue
        w = numpy_helper.to_array(table).astype(np.float32)
        found = rows.columns(w.T)  # the table's rows are the checkpoint's rows
        if found is None or found[0] != "q8_0":  # a Q4_1 table stays float (its minimum per block)
            continue
        _, q, scale, zero = found
        new, parts = _gather_nbits(node, q, scale, zero, w.shape[1], ranks[node.input[1]], shared)
        head = [i for i in new_inits if i.name == new[0].input[0]]
        got = _gathered(new, parts, head, w.shape[0])
        at = kept.index(node)
        kept[at:at + 1] = new
        new_inits += parts
        done.append({"node": node.name or node.output[0], "blocks": "q8_0", "rows": int(w.shape[0]),
                     "shares_head": bool(head), "max_abs": float(np.abs(got - w).max()),
                     "bit_exact_share": float((got == w).mean())})
    return done


def _ranks(model) -> Ranks:
    """The rank of every tensor whose shape ONNX's inference knows."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model, data_prop=False)
    g = inferred.graph
    return {v.name: len(v.type.tensor_type.shape.dim) for v in [*g.input, *g.value_info, *g.output]
            if v.type.tensor_type.HasField("shape")}


def from_checkpoint(model, gguf_path: Path, accuracy_level: int = 4) -> JsonObject:
    """Rewrite `model` (onnx.ModelProto, FP32) in place; returns the part of the precision
    stage's meta (JSON) that says what came from the checkpoint."""
    from onnx import numpy_helper

    rows = CheckpointRows(gguf_path)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    sums = BlockSums(_ranks(model))
    kept, new_inits, done, left, worst, exact, total = [], [], [], [], 0.0, 0, 0
    for node in graph.node:
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if weight is None or len(weight.dims) != 2 or weight.dims[0] % BLOCK:
            kept.append(node)
            continue
        w = numpy_helper.to_array(weight).astype(np.float32)
        found = rows.columns(w)
        k, n = w.shape
        made = len(sums.nodes)
        block_sums = sums(node.input[0], k) if found is not None and found[0] == "q4_1" else None
        if found is None or (found[0] == "q4_1" and block_sums is None):
            left.append(node.name or node.output[0])  # not the checkpoint's, or x's rank unknown
            kept.append(node)
            continue
        new, parts = _matmul_nbits(node, *found, k, n, accuracy_level, block_sums)
        got = _dequantized(new, parts, k)
        worst = max(worst, float(np.abs(got - w).max()))
        exact, total = exact + int((got == w).sum()), total + w.size
        kept += [*sums.nodes[made:], *new]  # x's block sums first: the graph stays in order
        new_inits += parts
        done.append({"node": node.name or node.output[0], "blocks": found[0], "k": k, "n": n})
    new_inits += sums.inits
    embeddings = _embeddings(kept, new_inits, inits, rows, sums.ranks)
    replace_nodes(model, kept, new_inits, contrib=bool(done or embeddings))
    return {"source": "checkpoint", "checkpoint": str(gguf_path), "quantized_nodes": len(done),
            "embeddings": embeddings,
            "by_block_type": {t: sum(d["blocks"] == t for d in done) for t in ("q4_1", "q8_0")},
            "left_float": left,
            "weights_vs_baseline": {"max_abs": worst, "bit_exact_share": exact / total if total else None},
            "accuracy_level": accuracy_level}


def replace_nodes(model, kept: list, new_inits: list, contrib: bool = True) -> None:
    """The graph's nodes of `model` (an onnx.ModelProto) become `kept` (in order); initializers
    no kept node reads are dropped and `new_inits` appended; `contrib`: the com.microsoft opset
    (MatMulNBits) is imported."""
    from onnx import helper

    graph = model.graph
    readers = {name for node in kept for name in node.input}
    live = [i for i in graph.initializer if i.name in readers]
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend([*live, *new_inits])
    if contrib and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
