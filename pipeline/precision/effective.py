"""Effective precision: which MatMul/Gemm FLOPs ONNX Runtime really runs in integer kernels.

A Q/DQ graph says what *may* run in int8; ONNX Runtime's graph optimizer decides what
does. Where it finds no integer kernel for a Q/DQ group, the float MatMul stays between
DequantizeLinear and QuantizeLinear ("fake quantized"): int8 accuracy, float speed, plus
the Q/DQ overhead. This runs the engine (the saved session-optimized graph) once with
ORT's profiler and attributes each MatMul-family kernel's FLOPs, from the shapes it
actually ran with, to one of: integer, fake-quantized float, float.

FLOPs of one kernel = 2 * numel(Y) * K, with K = numel(A) * N / numel(Y) (A the first input,
N the last dim of Y): right for MatMul, Gemm, FusedMatMul and the quantized variants,
transposed or not, as long as A is not broadcast.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

INTEGER = {"QLinearMatMul", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
           "MatMulNBits", "QGemm", "MatMulBnb4", "QAttention", "DynamicQuantizeLSTM"}
FLOAT = {"MatMul", "Gemm", "FusedMatMul", "FusedGemm", "MatMulFloat8"}


def _numel(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


def _shapes(entries: list[dict]) -> list[list[int]]:
    return [next(iter(e.values())) for e in entries]


def measure(engine: Path, feed: dict, workdir: Path, fp8: bool = False) -> dict:
    import onnx
    import onnxruntime as ort

    graph = onnx.load(str(engine), load_external_data=False).graph
    producer = {o: n for n in graph.node for o in n.output}
    fed_by_dq = {n.name: any(getattr(producer.get(i), "op_type", "") == "DequantizeLinear"
                             for i in n.input[:2]) for n in graph.node}
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # already optimized
    options.enable_profiling = True
    options.profile_file_prefix = str(workdir / "effective-profile")
    if fp8:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    session = ort.InferenceSession(str(engine), options, providers=["CPUExecutionProvider"])
    session.run(None, feed)
    profile = Path(session.end_profiling())
    events = json.loads(profile.read_text())
    profile.unlink()

    flops = {"integer": 0.0, "fake_quantized": 0.0, "float": 0.0}
    by_op: dict[str, float] = {}
    float_nodes: list[dict] = []
    seen = set()
    for event in events:
        args = event.get("args") or {}
        op = args.get("op_name")
        name = event.get("name", "").removesuffix("_kernel_time")
        if event.get("cat") != "Node" or op not in INTEGER | FLOAT or name in seen:
            continue
        if not event.get("name", "").endswith("_kernel_time"):
            continue
        seen.add(name)
        a, y = _shapes(args["input_type_shape"])[0], _shapes(args["output_type_shape"])[0]
        if not y or not a or _numel(y) == 0:
            continue
        k = _numel(a) * y[-1] / _numel(y)
        f = 2.0 * _numel(y) * k
        kind = "integer" if op in INTEGER else "fake_quantized" if fed_by_dq.get(name) else "float"
        flops[kind] += f
        by_op[op] = by_op.get(op, 0.0) + f
        if kind != "integer":
            float_nodes.append({"node": name, "op": op, "kind": kind, "mflops": round(f / 1e6, 3)})
    total = sum(flops.values())
    float_nodes.sort(key=lambda n: -n["mflops"])
    return {
        "integer_share": flops["integer"] / total if total else 0.0,
        "mflops": {k: round(v / 1e6, 3) for k, v in flops.items()},
        "by_op_mflops": {k: round(v / 1e6, 3) for k, v in sorted(by_op.items())},
        "largest_non_integer": float_nodes[:5],
        "non_integer_nodes": len(float_nodes),
        "feed_shapes": {k: list(v.shape) for k, v in feed.items()},
        "method": "ORT profiler on the engine (session-optimized graph), one request at the opt "
                  "shape; MatMul-family kernels only",
    }


def gate(result: dict, required: float) -> dict:
    share = result["integer_share"]
    detail = f"{share:.3f} of MatMul/Gemm FLOPs in integer kernels >= {required:g}"
    if share < required:
        worst = ", ".join(f"{n['node']} ({n['op']}, {n['kind'].replace('_', '-')}, {n['mflops']:g} MFLOP)"
                          for n in result["largest_non_integer"][:3])
        detail = (f"only {share:.3f} of MatMul/Gemm FLOPs run in integer kernels (< {required:g}); "
                  f"{result['non_integer_nodes']} MatMul kernels run in float, largest: {worst}. "
                  "fake-quantized = Q/DQ around a float kernel (ORT found no integer kernel for "
                  "the group); float = excluded or not quantized")
    return {"name": "effective_precision", "passed": share >= required, "detail": detail}
