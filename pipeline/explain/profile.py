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
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from pipeline.core.cache_io import PAST, PRESENT
from pipeline.core.json_object import JsonObject
from pipeline.generation.genai_config import in_place_cache, present_of
from pipeline.model import compact_storage
from pipeline.precision.kv_cache import CacheCodec

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

# "total_us" and each category that took time -> microseconds per request (compare's tables)
CategoryTimes = dict[str, float]


@dataclass(frozen=True)
class NodeTime:
    """One node's kernel time per request (median over the profiled requests)."""

    name: str
    op: str
    category: str
    us: float
    share: float  # of the request's total

    def dump(self) -> JsonObject:
        return asdict(self)


@dataclass(frozen=True)
class CategoryTime:
    us: float
    share: float
    nodes: int

    def dump(self) -> JsonObject:
        return asdict(self)


@dataclass(frozen=True)
class Profile:
    """One model's profile: per request, every node (slowest first) and every category
    (CATEGORY_ORDER), each a median over `runs` requests; how it was measured."""

    runs: int
    total_us: float
    nodes: list[NodeTime]
    categories: dict[str, CategoryTime]
    method: str
    cache_in_place: bool = False  # its KV cache written in place (GroupQueryAttention)

    def category_times(self) -> CategoryTimes:
        return {"total_us": self.total_us, **{c: v.us for c, v in self.categories.items() if v.us > 0}}


Profiles = dict[str, Profile]  # a model's name -> its profile


def category(op_type: str) -> str:
    return _OP_CATEGORY.get(op_type, "other")


def profile_sessions(models: dict[str, Path], feed: dict, runs: int = 30, warmup: int = 5,
                     threads: int | None = None,
                     session_config: dict[str, dict[str, str]] | None = None) -> Profiles:
    """Per-node and per-category time per request of each model (run as saved, unoptimized).

    The sessions take turns request by request (A, B, A, B, ...), so a busy machine slows
    them alike; each figure is the median over the profiled requests, robust to the odd
    preempted one. A decoder whose KV cache stays in place (GroupQueryAttention) runs as its
    runners run it: each present written into its past's buffer (`_in_place_binding`), not
    copied into a new one. Returns each model's Profile.
    """
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        sessions = {}
        for i, (name, path) in enumerate(models.items()):
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            options.log_severity_level = 3
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            for key, value in ((session_config or {}).get(name) or {}).items():
                options.add_session_config_entry(key, value)
            if threads:
                options.intra_op_num_threads = threads
            options.enable_profiling = True
            options.profile_file_prefix = os.path.join(tmp, f"profile-{i}")
            sessions[name] = ort.InferenceSession(compact_storage.session_source(path), options,
                                                  providers=["CPUExecutionProvider"])
        # a cache in float16/int8 (precision.kv_cache) takes the feed's caches in its type
        feeds = {name: CacheCodec.of_session(sessions[name]).feed(feed) for name in models}
        bound = {name: _in_place_binding(sessions[name], feeds[name]) for name, path in models.items()
                 if in_place_cache(path)}
        for _ in range(warmup + runs):
            for name, session in sessions.items():
                if name in bound:
                    session.run_with_iobinding(bound[name])
                else:
                    session.run(None, feeds[name])
        return {name: replace(summarize(json.loads(Path(session.end_profiling()).read_text()),
                                        skip_runs=warmup), cache_in_place=name in bound)
                for name, session in sessions.items()}


def _in_place_binding(session, feed: dict):
    """An IOBinding of `feed` in which each present.* is written into its past_key_values.*
    buffer, given room for the new tokens: [B, KV, past, hd] -> [B, KV, mask length, hd]."""
    import onnxruntime as ort

    binding = session.io_binding()
    total = feed["attention_mask"].shape[1]
    for name, value in feed.items():
        if name.startswith(PAST):
            room = np.zeros((*value.shape[:2], total, value.shape[3]), value.dtype)
            room[:, :, : value.shape[2]] = value
            buffer = ort.OrtValue.ortvalue_from_numpy(room)  # keeps `room` alive
            binding.bind_ortvalue_input(name, buffer)
            binding.bind_ortvalue_output(present_of(name), buffer)
        else:
            binding.bind_cpu_input(name, value)
    for output in session.get_outputs():
        if not output.name.startswith(PRESENT):
            binding.bind_output(output.name)
    return binding


def summarize(events: list[JsonObject], skip_runs: int = 0) -> Profile:
    """Fold ORT profile events into per-node and per-category microseconds per request:
    the median over requests (a request = one `model_run` event and the node events in it)."""
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[skip_runs:]
    if not runs:
        raise ValueError("the profile holds no model_run event")
    starts = np.array([r["ts"] for r in runs])
    per_run: list[dict[str, float]] = [defaultdict(float) for _ in runs]
    op_of: dict[str, str] = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time") or e["ts"] < starts[0]:
            continue
        name = e["name"][: -len("_kernel_time")]
        run = int(np.searchsorted(starts, e["ts"], side="right")) - 1
        per_run[run][name] += e["dur"]
        op_of[name] = e["args"].get("op_name", "?")
    node_us = {n: float(np.median([r.get(n, 0.0) for r in per_run])) for n in op_of}
    cat_us = {c: float(np.median([sum(v for n, v in r.items() if category(op_of[n]) == c) for r in per_run]))
              for c in CATEGORY_ORDER}
    total = float(np.median([sum(r.values()) for r in per_run]))
    nodes = sorted((NodeTime(n, op_of[n], category(op_of[n]), us, us / total if total else 0.0)
                    for n, us in node_us.items()), key=lambda x: -x.us)
    counts = defaultdict(int)
    for node in nodes:
        counts[node.category] += 1
    return Profile(
        runs=len(runs), total_us=total, nodes=nodes,
        categories={c: CategoryTime(cat_us[c], cat_us[c] / total if total else 0.0, counts[c])
                    for c in CATEGORY_ORDER},
        method=f"ONNX Runtime profiler (kernel time per node), sessions taking turns request by "
               f"request, median of {len(runs)} requests after {skip_runs} warm-up requests; "
               "no thread spinning")
