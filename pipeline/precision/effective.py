"""Effective precision: which matrix-multiply FLOPs ONNX Runtime really runs in integer kernels.

A Q/DQ graph says what *may* run in int8; ONNX Runtime's graph optimizer decides what
does. Where it finds no integer kernel for a Q/DQ group, the float MatMul stays between
DequantizeLinear and QuantizeLinear ("fake quantized"): int8 accuracy, float speed, plus
the Q/DQ overhead. This runs the engine (the saved session-optimized graph) once with
ORT's profiler and attributes each kernel's FLOPs, from the shapes it actually ran with, to
one of: integer, fake-quantized float, float, attention (float).

- MatMul family: FLOPs of one kernel = 2 * numel(Y) * K, with K = numel(A) * N / numel(Y)
  (A the first input, N the last dim of Y): right for MatMul, Gemm, FusedMatMul and the
  quantized variants, transposed or not, as long as A is not broadcast.
- MatMulNBits (low-bit weights) is integer compute only at `accuracy_level` 4: ORT's
  documented levels are 0 unset (fp32), 1 fp32, 2 fp16, 3 bf16, 4 int8 -- the level at
  which the activation A is quantized (per block, at run time) or down-cast. Below 4 the
  weights are dequantized and the product runs in float. ORT's DQ -> MatMulNBits fusion
  writes level 4 by default (session config `session.qdq_matmulnbits_accuracy_level`), so
  the level is read from the engine's graph, never assumed from the op name.
- Convolutions: 2 * numel(Y) * (C_in / group) * prod(kernel), C_in from the input's shape,
  group and kernel from the engine's graph (the profiler leaves constant weights out of a
  kernel's shapes). QLinearConv and ConvInteger run integer kernels; Conv, FusedConv and
  NhwcFusedConv float (fake-quantized behind a DQ); ConvTranspose 2 * numel(X) * (M / group)
  * prod(kernel).
- Fused attention (MultiHeadAttention, GroupQueryAttention, ...): QK^T and probabilities x V
  are activation x activation products that run in float. Per node: 4 * numel(Y) * L (Y the
  attention output [B, S, heads * head_size], L the key length: 2 * B*S*L*D for each
  product), dense (the CPU kernels compute the full S x L scores and mask them). Attention
  and QAttention also hold their input projection (counted like a MatMul: float, integer).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pipeline.artifacts.report import Gate
from pipeline.core.json_object import JsonObject
from pipeline.model import compact_storage

AccuracyLevels = dict[str, int]  # MatMulNBits node -> its accuracy_level
ConvParams = dict[str, tuple[int, int, int]]  # Conv-family node -> (group, prod(kernel), weight dim 1)

INTEGER = {"QLinearMatMul", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
           "QGemm", "MatMulBnb4", "QAttention", "DynamicQuantizeLSTM", "QLinearConv", "ConvInteger"}
FLOAT = {"MatMul", "Gemm", "FusedMatMul", "FusedGemm", "MatMulFloat8", "Conv", "FusedConv",
         "NhwcFusedConv", "ConvTranspose"}
CONV = {"QLinearConv": 3, "ConvInteger": 1, "Conv": 1, "FusedConv": 1, "NhwcFusedConv": 1,
        "ConvTranspose": 1}  # op -> index of the weight input
NBITS = "MatMulNBits"  # integer or float by its accuracy_level attribute
ATTENTION = {"Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention",
             "PackedMultiHeadAttention", "SparseAttention", "QAttention"}
# ORT's documented accuracy_level of MatMulNBits: the type input A is computed in
ACCURACY_LEVELS = {0: "fp32", 1: "fp32", 2: "fp16", 3: "bf16", 4: "int8"}
INT8_LEVEL = 4
# Not an ORT level: a MatMulNBits whose zero points are float (ORT's HQQ quantizer writes them).
# MLAS' integer kernels take uint8 zero points only, so ORT dequantizes such a node's weights
# and multiplies in fp32 whatever its accuracy_level (measured, ORT 1.32, one 576x576 node:
# outputs identical at levels 0 and 4, 434 us a call against 38 us with uint8 zero points).
FLOAT_ZERO_POINTS = -1
FLOAT_ZERO_POINTS_KEY = "float_zero_points"  # its key in NbitsSummary.accuracy_levels
KINDS = ("integer", "fake_quantized", "float", "attention")
SCOPE = ("matrix-multiply FLOPs (MatMul/Gemm family, convolutions, and attention's QK^T and "
         "PV products)")


def _numel(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


def _shapes(entries: list[dict]) -> list[list[int]]:
    return [next(iter(e.values())) for e in entries]


def _attr(node, name: str, default=None):
    return next((a.i for a in node.attribute if a.name == name), default)


def nbits_levels(graph) -> AccuracyLevels:
    """MatMulNBits node name -> accuracy_level (0 when the attribute is absent: ORT's default),
    FLOAT_ZERO_POINTS for a node whose zero points are float (its level is not honoured)."""
    from onnx import TensorProto

    dtypes = {i.name: i.data_type for i in graph.initializer}
    return {n.name: (FLOAT_ZERO_POINTS if len(n.input) > 3 and n.input[3]
                     and dtypes.get(n.input[3], TensorProto.UINT8) != TensorProto.UINT8
                     else int(_attr(n, "accuracy_level", 0)))
            for n in graph.node if n.op_type == NBITS}


def _nbits_label(level: int) -> str:
    return "float zero points" if level == FLOAT_ZERO_POINTS else f"accuracy_level {level}"


def _nbits_compute(level: int) -> str:
    """What MatMulNBits nodes at `level` compute in, in words."""
    if level >= INT8_LEVEL:
        return "activations quantized to int8 per block at run time, integer products"
    if level == FLOAT_ZERO_POINTS:
        return ("weights dequantized every call, products in fp32, whatever the node's accuracy_level "
                "(MLAS' integer kernels take uint8 zero points only)")
    return f"weights dequantized, products in {ACCURACY_LEVELS.get(level, f'level {level}')}"


@dataclass(frozen=True)
class NbitsSummary:
    """What an engine's MatMulNBits nodes compute in: how many there are, how many at each
    accuracy_level (str(level) -> count), the activation types, in words."""

    nodes: int
    accuracy_levels: dict[str, int]
    activations: list[str]
    compute: str

    def dump(self) -> JsonObject:
        return {"nodes": self.nodes, "accuracy_levels": self.accuracy_levels,
                "activations": self.activations, "compute": self.compute}


@dataclass(frozen=True)
class FlopShares:
    """One request's matrix-multiply FLOPs by kind (MFLOP: integer, fake_quantized, float,
    attention) and by op, the integer share, the largest non-integer kernels, how measured."""

    integer_share: float
    scope: str
    mflops: dict[str, float]
    by_op_mflops: dict[str, float]
    largest_non_integer: list[JsonObject]  # {node, op, kind, mflops}, largest first
    non_integer_nodes: int
    matmulnbits: NbitsSummary | None
    feed_shapes: dict[str, list[int]]
    method: str

    def dump(self) -> JsonObject:
        """The engine entry's `ort_flop_shares`."""
        return {"integer_share": self.integer_share, "scope": self.scope, "mflops": self.mflops,
                "by_op_mflops": self.by_op_mflops, "largest_non_integer": self.largest_non_integer,
                "non_integer_nodes": self.non_integer_nodes,
                "matmulnbits": self.matmulnbits.dump() if self.matmulnbits else None,
                "feed_shapes": self.feed_shapes, "method": self.method}


def nbits_summary(levels: AccuracyLevels) -> NbitsSummary | None:
    """What the engine's MatMulNBits nodes compute in, from their accuracy_level."""
    if not levels:
        return None
    counts = Counter(levels.values())
    parts = []
    for level, n in sorted(counts.items()):
        parts.append(f"{n} {'with' if level == FLOAT_ZERO_POINTS else 'at'} {_nbits_label(level)}: "
                     f"{_nbits_compute(level)}")
    return NbitsSummary(nodes=len(levels),
                        accuracy_levels={(FLOAT_ZERO_POINTS_KEY if k == FLOAT_ZERO_POINTS else str(k)): v
                                         for k, v in sorted(counts.items())},
                        activations=sorted({ACCURACY_LEVELS.get(k, "fp32") for k in counts}),
                        compute="; ".join(parts))


def accuracy_levels(onnx_path: Path) -> NbitsSummary | None:
    """nbits_summary of one ONNX file (None when it has no MatMulNBits)."""
    return nbits_summary(nbits_levels(compact_storage.load(onnx_path).graph))


def _key_length(inputs: list[list[int]], outputs: list[list[int]], y: list[int]) -> int:
    """L of a fused attention kernel: present_key [B, N, L, H] (or Attention's present
    [2, B, N, L, H]), else the key input ([B, N, L, H] or [B, L, D]), else S."""
    for shape in outputs[1:]:
        if len(shape) == 4:
            return shape[2]
        if len(shape) == 5:
            return shape[3]
    if len(inputs) > 1 and len(inputs[1]) in (3, 4):
        return inputs[1][2] if len(inputs[1]) == 4 else inputs[1][1]
    return y[1] if len(y) >= 2 else 1


def conv_params(graph) -> ConvParams:
    """Conv-family node name -> (group, prod(kernel), weight dim 1) from the graph."""
    dims = {i.name: list(i.dims) for i in graph.initializer}
    for n in graph.node:  # a fake-quantized Conv reads its weight through a DequantizeLinear
        if n.op_type == "DequantizeLinear" and n.input[0] in dims:
            dims[n.output[0]] = dims[n.input[0]]
    out = {}
    for n in graph.node:
        if n.op_type in CONV and len(n.input) > CONV[n.op_type]:
            w = dims.get(n.input[CONV[n.op_type]])
            if w is not None and len(w) >= 3:
                out[n.name] = (int(_attr(n, "group", 1)), _numel(w[2:]), w[1])
    return out


def _kernel_flops(op: str, inputs: list[list[int]], outputs: list[list[int]],
                  conv: tuple[int, int, int] | None = None) -> list[tuple[str, float]]:
    """(part, FLOPs) of one kernel run: part "matmul" or "attention"."""
    a, y = inputs[0] if inputs else [], outputs[0] if outputs else []
    if not y or not a or _numel(y) == 0:
        return []
    out = []
    if op in CONV:
        if conv is None:
            return []
        group, kernel, per_group_out = conv
        if op == "ConvTranspose":  # each input value meets (M / group) * prod(kernel) weights
            return [("matmul", 2.0 * _numel(a) * per_group_out * kernel)]
        return [("matmul", 2.0 * _numel(y) * (a[1] / group) * kernel)]
    if op in ATTENTION:
        out.append(("attention", 4.0 * _numel(y) * _key_length(inputs, outputs, y)))
        if op in ("Attention", "QAttention") and len(inputs) > 1 and len(inputs[1]) == 2:
            out.append(("matmul", 2.0 * _numel(a) * inputs[1][-1]))  # the fused QKV projection
        return out
    k = _numel(a) * y[-1] / _numel(y)
    return [("matmul", 2.0 * _numel(y) * k)]


def node_flops(args: dict, conv: tuple[int, int, int] | None = None) -> list[tuple[str, float]]:
    """(part, FLOPs) of one profiled kernel event's args (op_name, input/output shapes)."""
    if args.get("op_name") not in INTEGER | FLOAT | ATTENTION | {NBITS}:
        return []
    return _kernel_flops(args["op_name"], _shapes(args.get("input_type_shape", [])),
                         _shapes(args.get("output_type_shape", [])), conv)


def measure(engine: Path, feed: dict, workdir: Path, fp8: bool = False) -> FlopShares:
    import onnxruntime as ort

    model, source = compact_storage.opened(engine)  # as a serving session holds it
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    fed_by_dq = {n.name: any(getattr(producer.get(i), "op_type", "") == "DequantizeLinear"
                             for i in n.input[:2]) for n in graph.node}
    levels = nbits_levels(graph)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # already optimized
    options.enable_profiling = True
    options.profile_file_prefix = str(workdir / "effective-profile")
    if fp8:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    session.run(None, feed)
    profile = Path(session.end_profiling())
    events = json.loads(profile.read_text())
    profile.unlink()
    return summarize(events, fed_by_dq, levels, {k: list(v.shape) for k, v in feed.items()},
                     conv_params(graph))


def summarize(events: list[dict], fed_by_dq: dict[str, bool], levels: dict[str, int],
              feed_shapes: dict, convs: dict | None = None) -> FlopShares:
    """Fold one request's profile events into FLOPs by kind (measure(), without a session)."""
    flops = dict.fromkeys(KINDS, 0.0)
    by_op: dict[str, float] = {}
    float_nodes: list[dict] = []
    seen = set()
    for event in events:
        args = event.get("args") or {}
        op = args.get("op_name")
        name = event.get("name", "").removesuffix("_kernel_time")
        if event.get("cat") != "Node" or op not in INTEGER | FLOAT | ATTENTION | {NBITS} or name in seen:
            continue
        if not event.get("name", "").endswith("_kernel_time"):
            continue
        seen.add(name)
        parts = _kernel_flops(op, _shapes(args["input_type_shape"]), _shapes(args["output_type_shape"]),
                              (convs or {}).get(name))
        for part, f in parts:
            if part == "attention":
                kind, label = "attention", f"{op} (QK^T, PV)"
            elif op == NBITS:
                level = levels.get(name, 0)
                kind = "integer" if level >= INT8_LEVEL else "float"
                label = f"{op} ({_nbits_label(level)})"
            else:
                kind = ("integer" if op in INTEGER else
                        "fake_quantized" if fed_by_dq.get(name) else "float")
                label = op
            flops[kind] += f
            by_op[label] = by_op.get(label, 0.0) + f
            if kind != "integer":
                float_nodes.append({"node": name, "op": label, "kind": kind, "mflops": round(f / 1e6, 3)})
    total = sum(flops.values())
    float_nodes.sort(key=lambda n: -n["mflops"])
    return FlopShares(
        integer_share=flops["integer"] / total if total else 0.0, scope=SCOPE,
        mflops={k: round(v / 1e6, 3) for k, v in flops.items()},
        by_op_mflops={k: round(v / 1e6, 3) for k, v in sorted(by_op.items())},
        largest_non_integer=float_nodes[:5], non_integer_nodes=len(float_nodes),
        matmulnbits=nbits_summary(levels), feed_shapes=feed_shapes,
        method="ORT profiler on the engine (session-optimized graph), one request at the opt "
               "shape; FLOPs from the shapes each kernel ran with: MatMul family 2*M*N*K, "
               "fused attention 4*numel(output)*key length (QK^T and PV, dense, float); "
               "MatMulNBits counts as integer only at accuracy_level 4 (int8 activations)")


def gate(result: FlopShares, required: float) -> Gate:
    share = result.integer_share
    scope = "matrix-multiply FLOPs (convolutions and attention products included)"
    detail = f"{share:.3f} of {scope} in integer kernels >= {required:g}"
    if share < required:
        worst = ", ".join(f"{n['node']} ({n['op']}, {n['kind'].replace('_', '-')}, {n['mflops']:g} MFLOP)"
                          for n in result.largest_non_integer[:3])
        detail = (f"only {share:.3f} of {scope} run in integer kernels (< {required:g}); "
                  f"{result.non_integer_nodes} kernels run in float, largest: {worst}. "
                  "fake-quantized = Q/DQ around a float kernel (ORT found no integer kernel for "
                  "the group); float = excluded, not quantized, or MatMulNBits below "
                  "accuracy_level 4; attention = QK^T and PV inside fused attention")
    return Gate(name="effective_precision", passed=bool(share >= required), detail=detail)
