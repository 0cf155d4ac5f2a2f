"""What each node of a graph costs at one shape: the arithmetic it must do and the bytes it
must move.

FLOPs (a multiply and an add count two) by formula for the ops that multiply matrices:
MatMul and its integer, fused and 4-bit forms (2·M·K·N, batch dims included), Gemm,
convolutions (2·out·Cin/group·kernel), and the attention ops' two products QKᵀ and PV
(4·heads·head_dim per query-key pair; a causal op counts only the pairs a query may see, the
work the result needs). Every other op does no arithmetic a roofline counts: it is bounded
by its bytes. Bytes are what the node reads plus what it writes: activations at their type,
initializers as stored (MatMulNBits' 4-bit blocks at 4 bits, their scales and zero points at
theirs), except where the op touches only part of a tensor: a Gather reads the rows it
gathers, an attention op reads the past KV cache and writes only the new tokens' rows (the
cache stays in place), the view ops (Reshape, Squeeze, ...) alias their input in ONNX Runtime
and move nothing, and Shape reads no data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import onnx
from onnx import TensorProto, helper

from pipeline.explain.profile import category
from pipeline.roofline.shapes import Skeleton, Value, type_name, values

MATMULS = {"MatMul", "FusedMatMul", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
           "QLinearMatMul", "MatMulNBits", "MatMulBnb4", "TransposeMatMul"}
GEMMS = {"Gemm", "FusedGemm", "QGemm"}
CONVS = {"Conv": 1, "FusedConv": 1, "NhwcConv": 1, "ConvInteger": 1, "QLinearConv": 3}  # weight's input index
INTEGER = {"MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QLinearMatMul", "QGemm",
           "ConvInteger", "QLinearConv", "QAttention"}
VIEWS = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}
NO_DATA = {"Shape", "Size"}
_FLOAT_NAMES = {TensorProto.FLOAT: "fp32", TensorProto.FLOAT16: "fp16", TensorProto.BFLOAT16: "bf16",
                TensorProto.DOUBLE: "fp64", TensorProto.FLOAT8E4M3FN: "fp8", TensorProto.FLOAT8E5M2: "fp8"}


@dataclass(frozen=True)
class NodeCost:
    name: str
    op: str  # op type; `domain.op` outside ai.onnx
    category: str  # explain.profile's op category
    flops: float
    bytes_read: int
    bytes_written: int
    dtype: str  # the arithmetic's type: fp32, int8, ... ("-" for a node without FLOPs)
    formula: str  # how the FLOPs were counted, or "bytes only"
    unknown: int = 0  # inputs/outputs whose shape inference left unknown (counted as 0 bytes)
    activation_dtype: str = "-"  # the float type of its activations (MatMulNBits: what a GPU computes in)

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written


@dataclass(frozen=True)
class GraphCost:
    dims: dict[str, int]
    nodes: list[NodeCost]
    shape_method: str

    @property
    def flops(self) -> float:
        return sum(n.flops for n in self.nodes)

    @property
    def bytes(self) -> int:
        return sum(n.bytes for n in self.nodes)

    @property
    def unknown(self) -> int:
        return sum(n.unknown for n in self.nodes)


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:  # attribute name -> its value
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _float_dtype(value: Value | None) -> str:
    return _FLOAT_NAMES.get(value.elem_type, type_name(value.elem_type)) if value else "-"


class _Node:
    """One node's inputs and outputs looked up in the value table."""

    def __init__(self, node: onnx.NodeProto, table: dict[str, Value], used: set[str] | None = None):
        self.node, self.attrs = node, _attrs(node)
        self.ins = [table.get(n) if n else None for n in node.input]
        self.outs = [table.get(n) if n else None for n in node.output]
        # a named output nobody reads (SkipSimplifiedLayerNormalization's mean) is not "unknown"
        names = [*node.input, *(o for o in node.output if used is None or o in used)]
        self.unknown = sum(1 for name in names if name and (table.get(name) is None or table[name].dims is None))

    def dims(self, i: int) -> tuple[int, ...] | None:
        v = self.ins[i] if i < len(self.ins) else None
        return v.dims if v is not None else None

    def out_numel(self, i: int = 0) -> int:
        v = self.outs[i] if i < len(self.outs) else None
        return (v.numel or 0) if v is not None else 0

    def read(self) -> int:
        return sum((v.nbytes or 0) for v in self.ins if v is not None)

    def written(self) -> int:
        return sum((v.nbytes or 0) for v in self.outs if v is not None)


def _matmul(n: _Node) -> tuple[float, str]:
    """2 x output elements x K. K: MatMulNBits' attribute, else A's last dim (second last
    when transposed)."""
    op, a = n.node.op_type, n.dims(0)
    if op in ("MatMulNBits", "MatMulBnb4"):
        k = int(n.attrs["K"])
    elif a:
        k = a[-2] if (n.attrs.get("transA") and len(a) >= 2) else a[-1]
    else:
        return 0.0, "unknown shape"
    return 2.0 * n.out_numel() * k, "2*M*K*N"


def _gemm(n: _Node) -> tuple[float, str]:
    a = n.dims(0)
    if not a:
        return 0.0, "unknown shape"
    k = a[0] if n.attrs.get("transA") else a[-1]
    return 2.0 * n.out_numel() * k, "2*M*K*N"


def _conv(n: _Node) -> tuple[float, str]:
    w = n.dims(CONVS[n.node.op_type])
    if not w:
        return 0.0, "unknown shape"
    per_output = 1
    for d in w[1:]:  # W: [Cout, Cin/group, *kernel]
        per_output *= d
    return 2.0 * n.out_numel() * per_output, "2*out*Cin/group*kernel"


def _pairs(queries: int, past: int, causal: bool) -> int:
    """Query-key pairs the products need: every query sees every key, or (causal) query i
    of `queries` new tokens sees the past and the new tokens up to itself."""
    total = past + queries
    return queries * past + queries * (queries + 1) // 2 if causal else queries * total


def _gqa(n: _Node) -> tuple[float, str, int, int]:
    """GroupQueryAttention: query [B, S, D] (q|k|v packed when key is absent), past_key and
    past_value [B, kv_heads, P, hd] (P: the context), causal always. Reads q/k/v, the past
    and the rotary rows of the S new positions; writes the output and the S new KV rows (the
    cache is written in place, as the engines' runners bind it)."""
    q, past = n.dims(0), n.dims(3)
    if not q or len(q) != 3:
        return 0.0, "unknown shape", n.read(), n.written()
    heads, kv_heads = int(n.attrs["num_heads"]), int(n.attrs["kv_num_heads"])
    packed = len(n.node.input) < 2 or not n.node.input[1]
    hd = q[2] // (heads + 2 * kv_heads) if packed else q[2] // heads
    batch, new, prior = q[0], q[1], (past[2] if past and len(past) == 4 else 0)
    flops = 4.0 * batch * heads * hd * _pairs(new, prior, causal=True)
    item = lambda i: (n.ins[i].nbytes or 0) if i < len(n.ins) and n.ins[i] is not None else 0  # noqa: E731
    read = sum(item(i) for i in (0, 1, 2, 3, 4, 5, 6))
    for i in (7, 8):  # cos/sin caches [max_positions, hd/2]: the S new positions' rows
        cache = n.ins[i] if i < len(n.ins) else None
        if cache is not None and cache.dims and cache.numel:
            read += (cache.nbytes or 0) * min(new, cache.dims[0]) // cache.dims[0]
    kv_item = (n.ins[3].nbytes or 0) // max(n.ins[3].numel or 1, 1) if len(n.ins) > 3 and n.ins[3] else 4
    written = (n.outs[0].nbytes or 0) if n.outs and n.outs[0] else 0
    written += 2 * batch * kv_heads * new * hd * kv_item
    return flops, "4*B*heads*hd*causal pairs (QK^T, PV)", read, written


def _mha(n: _Node) -> tuple[float, str]:
    """MultiHeadAttention: query [B, S, D]; key [B, L, D] (+ past [B, heads, P, hd]) or a
    cached [B, heads, L, hd]; causal when `unidirectional`."""
    q, k = n.dims(0), n.dims(1)
    if not q or not k:
        return 0.0, "unknown shape"
    past = n.dims(6) if len(n.node.input) > 6 and n.node.input[6] else None
    d = q[2] if len(q) == 3 else q[2] * q[-1]  # [B, S, D] or packed [B, S, heads, 3, hd]
    keys = (k[1] + (past[2] if past else 0)) if len(k) == 3 else k[2]
    causal = bool(n.attrs.get("unidirectional", 0))
    return 4.0 * q[0] * d * _pairs(q[1], keys - q[1], causal) if causal else 4.0 * q[0] * d * q[1] * keys, \
        "4*B*D*pairs (QK^T, PV)"


def _attention(n: _Node, past_input: int = 4) -> tuple[float, str]:
    """com.microsoft Attention (and QAttention, its past at input 8): input [B, S, H] x weights
    [H, Dq+Dk+Dv] (the QKV projection inside), past [2, B, heads, P, hd]; causal when
    `unidirectional`."""
    x, w = n.dims(0), n.dims(1)
    if not x or not w:
        return 0.0, "unknown shape"
    sizes = n.attrs.get("qkv_hidden_sizes") or [w[1] // 3] * 3
    past = n.dims(past_input) if len(n.node.input) > past_input and n.node.input[past_input] else None
    prior = past[3] if past and len(past) == 5 else 0
    pairs = _pairs(x[1], prior, bool(n.attrs.get("unidirectional", 0)))
    projection = 2.0 * x[0] * x[1] * x[2] * w[1]
    return projection + 2.0 * x[0] * pairs * (sizes[0] + sizes[2]), "QKV projection + 2*B*pairs*(Dq+Dv)"


def _onnx_attention(n: _Node) -> tuple[float, str]:
    """ONNX's Attention (opset 23): Q [B, heads, S, hd] or [B, S, heads*hd], K [B, kv, L, hd]
    or [B, L, kv*hd], past_key [B, kv, P, hd]; QK^T over hd and PV over V's head size per
    pair; causal when `is_causal`."""
    q, k, v = n.dims(0), n.dims(1), n.dims(2)
    if not q or not k or not v:
        return 0.0, "unknown shape"
    past = n.dims(4) if len(n.node.input) > 4 and n.node.input[4] else None
    if len(q) == 4:
        batch, heads, new, hd, keys, v_hd = q[0], q[1], q[2], q[3], k[2], v[3]
    else:
        heads, kv = int(n.attrs["q_num_heads"]), int(n.attrs["kv_num_heads"])
        batch, new, hd, keys, v_hd = q[0], q[1], q[2] // heads, k[1], v[2] // kv
    prior = past[2] if past and len(past) == 4 else 0
    pairs = _pairs(new, prior + keys - new, bool(n.attrs.get("is_causal", 0)))
    return 2.0 * batch * heads * pairs * (hd + v_hd), "2*B*heads*pairs*(hd + v_hd) (QK^T, PV)"


def _partial_read(n: _Node) -> int:
    """Gather*/Slice: the output's bytes from the data input (the rows it takes) plus the
    index inputs whole."""
    small = sum((v.nbytes or 0) for v in n.ins[1:] if v is not None)
    return sum((v.nbytes or 0) for v in n.outs if v is not None) + small


def node_cost(node: onnx.NodeProto, table: dict[str, Value], used: set[str] | None = None) -> NodeCost:
    """One node's cost; `used`: the names some node or the graph's outputs read."""
    n, op = _Node(node, table, used), node.op_type
    flops, formula, read, written = 0.0, "bytes only", n.read(), n.written()
    if op in MATMULS:
        flops, formula = _matmul(n)
    elif op in GEMMS:
        flops, formula = _gemm(n)
    elif op in CONVS:
        flops, formula = _conv(n)
    elif op == "GroupQueryAttention":
        flops, formula, read, written = _gqa(n)
    elif op == "MultiHeadAttention":
        flops, formula = _mha(n)
    elif op == "Attention":
        flops, formula = _attention(n) if node.domain == "com.microsoft" else _onnx_attention(n)
    elif op == "QAttention":
        flops, formula = _attention(n, past_input=8)
    elif op.startswith("Gather") or op == "Slice":
        read = _partial_read(n)
    elif op in VIEWS or op in NO_DATA:
        read, written, formula = 0, 0, "no data moved (a view or metadata)"
    activation = _float_dtype(n.outs[0] if n.outs else None)
    if not flops:
        dtype = "-"
    elif op in INTEGER or (op == "MatMulNBits" and int(n.attrs.get("accuracy_level", 0)) == 4):
        dtype = "int8"  # MatMulNBits level 4: activations quantized to int8 per block (CPU kernels)
    else:
        dtype = _float_dtype(n.ins[0])
    name = op if node.domain in ("", "ai.onnx") else f"{node.domain}.{op}"
    return NodeCost(node.name or node.output[0], name, category(op), flops, read, written, dtype, formula,
                    n.unknown, activation)


def graph_cost(skel: Skeleton, dims: dict[str, int]) -> GraphCost:
    """Every node's cost with the graph's symbolic dims bound to `dims` (nodes of subgraphs,
    If/Loop bodies, are not costed: the enclosing node counts its inputs and outputs)."""
    table, method = values(skel, dims)
    graph = skel.model.graph
    used = {i for node in graph.node for i in node.input} | {o.name for o in graph.output}
    return GraphCost(dict(dims), [node_cost(node, table, used) for node in graph.node], method)
