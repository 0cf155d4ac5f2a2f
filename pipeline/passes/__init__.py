"""Graph passes of the optimize stage: small functions, registered by name.

A pass takes an onnx.ModelProto and its options (keyword arguments from the recipe's
`optimize.options.<name>`) and returns the rewritten ModelProto, or (ModelProto, info) where
info is a dict for the report (e.g. the fusions a rewriter counted). A pass may edit its
input in place: the stage hands it a copy and keeps the last good graph.

The registry maps a name to "module:function" so that the recipe schema can list the names
without importing onnx; a new pass is a new function plus one line here.
"""

from __future__ import annotations

import importlib
from collections import Counter
from typing import NamedTuple

OpCounts = dict[str, int]  # op type -> how many nodes


class Pass(NamedTuple):
    target: str  # "module:function"
    summary: str
    options: tuple[str, ...] = ()  # option names the function accepts
    ort_only: bool = False  # writes ONNX Runtime contrib ops (com.microsoft) other runtimes lack
    # "module:function" checking the options before any work, for what the schema cannot
    # know without the pass's library (e.g. which fusions onnxscript has)
    options_check: str | None = None


PASSES: dict[str, Pass] = {
    "shape_inference": Pass(
        "pipeline.passes.onnx_passes:shape_inference",
        "ONNX shape inference (with data propagation): annotates value shapes for later passes"),
    "fold_constants": Pass(
        "pipeline.passes.onnx_passes:fold_constants",
        "onnxscript optimizer: constant folding, dead-node elimination, common cleanups",
        ("input_size_limit",)),
    "rewrite": Pass(
        "pipeline.passes.onnx_passes:rewrite",
        "onnxscript rewriter, default rules (generic algebraic simplifications)"),
    "ort_fusions": Pass(
        "pipeline.passes.onnx_passes:ort_fusions",
        "onnxscript ORT fusions: (multi-head) attention, (skip) layer/RMS norm, GELU, rotary",
        ("skip",), ort_only=True, options_check="pipeline.passes.onnx_passes:check_ort_fusions"),
    "attention_with_past": Pass(
        "pipeline.passes.attention:attention_with_past",
        "KV cache: Concat(past, new) -> Attention folded into ONNX Attention's past/present (opset 23)"),
    "group_query_attention": Pass(
        "pipeline.passes.gqa:group_query_attention",
        "Attention with past + rotary (opset 23) -> ORT GroupQueryAttention (rotary inside, packed q|k|v)",
        ("max_positions", "local_window"), ort_only=True),
    "pack_matmuls": Pass(
        "pipeline.passes.pack:pack_matmuls",
        "pack MatMuls that read one activation (q/k/v, gate/up) into one MatMul + Split",
        ("min_group",)),
    "ort_transformers": Pass(
        "pipeline.passes.ort_transformers:optimize",
        "onnxruntime.transformers optimize_model (fits TorchScript BERT-style exports)",
        ("model_type", "num_heads", "hidden_size"), ort_only=True),
    "onnxslim": Pass(
        "pipeline.passes.slim:onnxslim",
        "onnxslim: constant folding, dead code and redundant-node elimination",
        ("skip_fusion_patterns",)),
}

# Op types that only appear when a fusion happened (contrib ops of ONNX Runtime and fused
# ONNX-domain ops); counted before and after every pass to report "Attention x6".
FUSED_OPS = frozenset({
    "Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention",
    "LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
    "SkipSimplifiedLayerNormalization", "EmbedLayerNormalization", "RMSNormalization",
    "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "BiasSplitGelu", "BiasAdd",
    "RotaryEmbedding", "FusedMatMul", "FusedConv", "FusedGemm", "MatMulNBits",
})


def names() -> tuple[str, ...]:
    return tuple(PASSES)


def load(name: str):
    """The pass function registered under `name` (imports its module)."""
    return _function(PASSES[name].target)


def check_options(name: str, options: dict) -> None:
    """The pass's own check of its options (RecipeError), where it has one."""
    if PASSES[name].options_check:
        _function(PASSES[name].options_check)(**options)


def _function(target: str):
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def histogram(model) -> OpCounts:
    """Node count by op type of the main graph, most common first."""
    return dict(Counter(node.op_type for node in model.graph.node).most_common())


def fusions(before: OpCounts, after: OpCounts) -> OpCounts:
    """Fused op types the pass added: {"Attention": 6, ...}."""
    return {op: after[op] - before.get(op, 0) for op in sorted(after)
            if op in FUSED_OPS and after[op] > before.get(op, 0)}
