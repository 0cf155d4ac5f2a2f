"""Why B is slower than A: category deltas of two profiles, and tags naming likely causes.

A tag is raised only with evidence from the measurements: a category whose time grew by a
meaningful share of A's total, fused attention that A has and B lost, an effective
precision below the one B asked for. Each tag carries the numbers that raised it. When A and
B are different models (parameter count or timed shape), that comes first and the other
tags are marked secondary: a bigger model's extra time says nothing about its precision.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pipeline.explain.profile import CATEGORY_ORDER, Profile
from pipeline.model import compact_storage
from pipeline.precision.effective import FLOAT_ZERO_POINTS_KEY, NbitsSummary

FUSED_ATTENTION = ("Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention",
                   "PackedMultiHeadAttention", "SparseAttention", "QAttention")
# a category delta counts when it is at least this share of A's total time per request
MEANINGFUL = 0.05


@dataclass(frozen=True)
class EffectiveBar:
    """B's integer share of `scope` (FLOPs) against the `required` share the "float
    fallback" tag judges it by, and which bar that is (`bar`, in words)."""

    share: float | None  # None: no such FLOPs measured
    required: float
    scope: str
    bar: str
    precision: str | None  # the engine's precision, as its report says


def op_histogram(onnx_path: Path) -> Counter:
    model = compact_storage.load(onnx_path)  # the fp16 storage's Casts are not the engine's ops
    return Counter(node.op_type for node in model.graph.node)


def category_deltas(a: Profile, b: Profile) -> list[dict]:
    """Rows per category: A and B microseconds per request, B - A, and that as % of A's total."""
    total_a = a.total_us or 1.0
    rows = []
    for cat in CATEGORY_ORDER:
        ua, ub = a.categories[cat].us, b.categories[cat].us
        rows.append({"category": cat, "a_us": ua, "b_us": ub, "delta_us": ub - ua,
                     "delta_share_of_a": (ub - ua) / total_a,
                     "a_nodes": a.categories[cat].nodes, "b_nodes": b.categories[cat].nodes})
    rows.append({"category": "total", "a_us": a.total_us, "b_us": b.total_us,
                 "delta_us": b.total_us - a.total_us,
                 "delta_share_of_a": (b.total_us - a.total_us) / total_a,
                 "a_nodes": sum(r["a_nodes"] for r in rows), "b_nodes": sum(r["b_nodes"] for r in rows)})
    return rows


def _nbits_words(nbits: NbitsSummary | None) -> str:
    """What B's MatMulNBits compute, from their accuracy_level (read from the engine graph)."""
    keys = set(nbits.accuracy_levels) if nbits else set()
    if FLOAT_ZERO_POINTS_KEY in keys:  # ORT runs these dequantized in fp32 whatever their level
        return f"low-bit weights dequantized inside every matrix multiply: {nbits.compute}"
    levels = {int(k) for k in keys}
    if not levels:
        return "low-bit weights dequantized inside every matrix multiply"
    if min(levels) >= 4:
        return ("4-bit weights dequantized and activations quantized to int8 per block inside "
                "every matrix multiply, accuracy_level 4")
    if max(levels) < 4:
        return ("low-bit weights dequantized inside every matrix multiply, products in float, "
                f"accuracy_level {'/'.join(str(x) for x in sorted(levels))}")
    return f"mixed accuracy levels: {nbits.compute}"


def size_tag(models_differ: str | None) -> list[dict]:
    """First tag when A and B are different models: then size, not precision, explains."""
    if not models_differ:
        return []
    return [{"tag": "different model (size or timed shape)", "evidence": models_differ}]


def tags(deltas: list[dict], ops_a: Counter, ops_b: Counter,
         effective_b: EffectiveBar | None = None, nbits_b: NbitsSummary | None = None,
         models_differ: str | None = None) -> list[dict]:
    """Likely causes of B's extra time, each with its evidence (empty when B is not slower).

    `nbits_b`: effective.nbits_summary of B's engine. `models_differ`: why A and B are not the
    same model (compare says so up front); the size tag then comes first and the rest are
    marked secondary, since a bigger model's extra time is no evidence about its precision.
    """
    by_cat = {r["category"]: r for r in deltas}
    out = []

    def grew(cat: str) -> bool:
        return by_cat[cat]["delta_share_of_a"] >= MEANINGFUL

    def evidence(cat: str) -> str:
        r = by_cat[cat]
        return (f"{cat}: {r['a_us']:.0f} -> {r['b_us']:.0f} us per request "
                f"(+{r['delta_share_of_a']:.0%} of A's total), nodes {r['a_nodes']} -> {r['b_nodes']}")

    if grew("quantize/dequantize"):
        out.append({"tag": "Q/DQ or dequantization overhead", "evidence": evidence("quantize/dequantize")})
    elif ops_b["MatMulNBits"] > ops_a["MatMulNBits"] and grew("matmul/conv"):
        # low-bit MatMuls dequantize their weights (and, at accuracy_level 4, quantize their
        # activations) inside the kernel: the cost shows up as matrix-multiply time, not as
        # separate DequantizeLinear nodes
        out.append({"tag": "Q/DQ or dequantization overhead",
                    "evidence": f"{ops_b['MatMulNBits']} MatMulNBits ({_nbits_words(nbits_b)}); "
                                + evidence("matmul/conv")})
    fused_a = sum(ops_a[o] for o in FUSED_ATTENTION)
    fused_b = sum(ops_b[o] for o in FUSED_ATTENTION)
    if fused_b < fused_a:
        out.append({"tag": "unfused attention",
                    "evidence": f"fused attention nodes {fused_a} in A, {fused_b} in B; "
                                + evidence("attention")})
    if grew("cast/reformat"):
        out.append({"tag": "casts and reformats", "evidence": evidence("cast/reformat")})
    if effective_b and effective_b.share is not None and effective_b.share < effective_b.required:
        out.append({"tag": "float fallback",
                    "evidence": f"{effective_b.share:.0%} of {effective_b.scope} in integer kernels "
                                f"(engine precision {effective_b.precision or '?'}), below "
                                f"the {effective_b.required:.0%} bar ({effective_b.bar})"})
    if grew("gather/scatter/where"):
        out.append({"tag": "sparse-attention index overhead", "evidence": evidence("gather/scatter/where")})
    if grew("matmul/conv"):
        out.append({"tag": "more matrix-multiply time", "evidence": evidence("matmul/conv")})
    if grew("elementwise"):
        out.append({"tag": "more elementwise work (unfused or added ops)", "evidence": evidence("elementwise")})
    if models_differ:
        for t in out:
            t["secondary"] = True
        return size_tag(models_differ) + out
    return out
