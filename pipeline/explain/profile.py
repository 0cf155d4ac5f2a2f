"""Where the time went: ONNX Runtime's per-node profile, grouped into categories.

ORT's profiler (SessionOptions.enable_profiling) records one `Node` event per kernel run,
named `<node>_kernel_time`, with the op type and the duration in microseconds. Summed per
node and divided by the number of profiled requests, that is the node's time per request.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

CATEGORIES: dict[str, set[str]] = {
    "matmul/conv": {
        "MatMul", "Gemm", "Conv", "FusedMatMul", "FusedGemm", "FusedConv", "Einsum", "QLinearMatMul",
        "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "MatMulNBits", "QGemm",
        "QLinearConv", "ConvInteger", "MatMulBnb4", "GatherBlockQuantized",
    },
    "attention": {
        "Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention",
        "PackedMultiHeadAttention", "Softmax", "RotaryEmbedding", "SparseAttention", "QAttention",
    },
    "normalization": {
        "LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization", "RMSNormalization", "BatchNormalization",
        "GroupNormalization", "ReduceMean",
    },
    "quantize/dequantize": {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"},
    "cast/reformat": {
        "Cast", "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand", "Tile",
        "Identity", "Concat", "Split", "Slice", "Shape", "Size", "ConstantOfShape", "Pad",
    },
    # index and mask work: what sparse attention patterns add
    "gather/scatter/where": {
        "Gather", "GatherElements", "GatherND", "ScatterND", "ScatterElements", "Where", "NonZero",
        "TopK", "Range", "Trilu", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
        "And", "Or", "Not", "Xor", "Mod",
    },
    "elementwise": {
        "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Exp", "Log", "Tanh", "Sigmoid",
        "Relu", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Erf", "Neg", "Abs", "Sin", "Cos",
        "Max", "Min", "Clip", "BiasAdd", "BiasSplitGelu", "Softplus", "Floor", "Ceil", "Round",
    },
}
CATEGORY_ORDER = [*CATEGORIES, "other"]
_OP_CATEGORY = {op: cat for cat, ops in CATEGORIES.items() for op in ops}


def category(op_type: str) -> str:
    return _OP_CATEGORY.get(op_type, "other")


def profile_session(model_path: Path, feed: dict, runs: int = 20, threads: int | None = None,
                    session_config: dict[str, str] | None = None) -> dict:
    """Per-node and per-category time per request of `model_path` (run as it is saved).

    Returns {"runs", "total_us", "nodes": [{name, op, category, us, share}],
             "categories": {category: {"us", "share", "nodes"}}, "method"}.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    for key, value in (session_config or {}).items():
        options.add_session_config_entry(key, value)
    if threads:
        options.intra_op_num_threads = threads
    with tempfile.TemporaryDirectory() as tmp:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tmp, "profile")
        session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        for _ in range(3):  # warm-up runs are profiled too; they are dropped below
            session.run(None, feed)
        for _ in range(runs):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    return summarize(events, runs=runs, skip_runs=3)


def summarize(events: list[dict], runs: int, skip_runs: int = 0) -> dict:
    """Fold ORT profile events into per-node and per-category microseconds per request."""
    # Each request is one `model_run` event; node events fall inside its [ts, ts + dur].
    model_runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    kept = model_runs[skip_runs:]
    if not kept:
        raise ValueError("the profile holds no model_run event")
    start = kept[0]["ts"]
    per_node: dict[str, float] = defaultdict(float)
    op_of: dict[str, str] = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time") or e["ts"] < start:
            continue
        name = e["name"][: -len("_kernel_time")]
        per_node[name] += e["dur"]
        op_of[name] = e["args"].get("op_name", "?")
    n = len(kept)
    total = sum(per_node.values()) / n
    nodes = sorted(
        ({"name": k, "op": op_of[k], "category": category(op_of[k]), "us": v / n,
          "share": (v / n) / total if total else 0.0} for k, v in per_node.items()),
        key=lambda x: -x["us"],
    )
    cats = {c: {"us": 0.0, "share": 0.0, "nodes": 0} for c in CATEGORY_ORDER}
    for node in nodes:
        c = cats[node["category"]]
        c["us"] += node["us"]
        c["share"] += node["share"]
        c["nodes"] += 1
    return {
        "runs": n, "total_us": total, "nodes": nodes, "categories": cats,
        "method": f"ONNX Runtime profiler, kernel time per node summed over {n} requests after "
                  f"{skip_runs} warm-up requests, divided by {n}; one thread pool, no spinning",
    }
