"""A precision candidate's floor before it is built: the base (FP32) engine's node costs
re-priced at the candidate's precision, for `pipeline tune` to rank candidates by predicted
gain and to say afterwards how the prediction fared against the A/B timing.

The candidate's graph does not exist before its build, so the prediction works on the one
that does: each node the candidate quantizes (an op of its `op_types` whose weight, input
1, is a stored FP32 initializer, and not in its `exclude` list) keeps its FLOPs, which now
run at the int8 peak, and its bytes change as the integer kernels move them:

    weight      stored int8: a quarter of its FP32 bytes (scales and zero points ignored)
    dynamic     the FP32 activation read twice (its range, then quantizing it), its int8
                copy written once and read by the product (ONNX Runtime's
                DynamicQuantizeMatMul: the quantizing is inside the node)
    static      the FP32 activation read once and its int8 copy written and read
                (QuantizeLinear with a calibrated scale, then the integer product)

Nothing else of the graph changes. What the model cannot see before a build, and so does not
rank: per-channel against per-tensor scales, the calibration method and SmoothQuant's alpha
(the same FLOPs and bytes), and which nodes sensitivity analysis will keep in float (an
`auto_exclude` candidate is predicted as if it kept none: its predicted gain is an upper
bound). Ties in the prediction are ties in its ranking.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.hardware.entry import HardwareEntry
from pipeline.roofline import model
from pipeline.roofline.costs import GraphCost, NodeCost
from pipeline.roofline.shapes import Skeleton

# the precision section's op_types -> the ops of an ONNX Runtime-optimized graph they become
QUANTIZED_AS = {"MatMul": ("MatMul", "FusedMatMul", "Gemm"), "Attention": ("com.microsoft.Attention",)}
FP32_BITS, INT8_BITS = 32, 8


@dataclass(frozen=True)
class CandidateFloor:
    floor_ms: float | None  # None: no prediction (the reason in `method`)
    repriced_nodes: int
    method: str


def feed_dims(skel: Skeleton, feed: dict) -> dict[str, int]:
    """The graph's symbolic dims bound by a feed's arrays' shapes (input name -> array)."""
    dims: dict[str, int] = {}
    for inp in skel.model.graph.input:
        if inp.name not in feed:
            continue
        for d, size in zip(inp.type.tensor_type.shape.dim, feed[inp.name].shape):
            if d.dim_param:
                dims.setdefault(d.dim_param, int(size))
    return dims


def _quantizable(node_ops: dict[str, str], weights: dict[str, int], op_types: list[str],
                 exclude: set[str]) -> set[str]:
    """The names of the nodes the candidate's quantizer would turn into integer kernels."""
    ops = {op for t in op_types for op in QUANTIZED_AS.get(t, (t,))}
    return {name for name, op in node_ops.items() if op in ops and name in weights and name not in exclude}


def _repriced(c: NodeCost, weight_bytes: int, scheme: str) -> NodeCost:
    """One node as an int8 kernel: same FLOPs at int8, the weight a quarter of its bytes,
    the activation moved as the scheme moves it (module doc). Shapes per node: activation A
    [rows, K] in FP32 is `activation` bytes (what the node read besides its weight)."""
    activation = max(c.bytes_read - weight_bytes, 0)
    int8_copy = activation * INT8_BITS // FP32_BITS
    passes = 2 if scheme == "dynamic" else 1  # dynamic: its range, then quantizing it
    read = passes * activation + int8_copy + weight_bytes * INT8_BITS // FP32_BITS
    return replace(c, dtype="int8", bytes_read=read, bytes_written=c.bytes_written + int8_copy,
                   formula=c.formula + f" (re-priced: {scheme} int8)")


def repriced(cost: GraphCost, skel: Skeleton, precision: dict) -> tuple[GraphCost, int]:
    """(the base graph's costs at the candidate's precision, how many nodes were re-priced)."""
    node_ops, weights = {}, {}
    for node in skel.model.graph.node:
        name = node.name or node.output[0]
        node_ops[name] = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        weight = skel.initializers.get(node.input[1]) if len(node.input) > 1 else None
        if weight is not None and weight.elem_type == 1 and weight.nbytes:  # a stored FP32 weight
            weights[name] = weight.nbytes
    chosen = _quantizable(node_ops, weights, list(precision.get("op_types") or ["MatMul"]),
                          set(precision.get("exclude") or ()))
    scheme = precision.get("scheme", "static")
    nodes = [_repriced(c, weights[c.name], scheme) if c.name in chosen else c for c in cost.nodes]
    return GraphCost(cost.dims, nodes, cost.shape_method), len(chosen)


def predict(cost: GraphCost, skel: Skeleton, precision: dict, entry: HardwareEntry,
            threads: int | None) -> CandidateFloor:
    """The candidate's floor on `entry`: the base cost as is (FP32: no precision section),
    re-priced (int8), or no prediction (another mode)."""
    if not precision:
        return CandidateFloor(model.roofline(cost, entry, threads).time_s * 1e3, 0, "the base graph as built")
    if precision.get("mode", "int8") != "int8":
        return CandidateFloor(None, 0, f"no prediction for mode {precision.get('mode')}: int8 only")
    priced, count = repriced(cost, skel, precision)
    method = f"base graph re-priced at {precision.get('scheme', 'static')} int8 ({count} nodes)"
    if (precision.get("sensitivity") or {}).get("auto_exclude"):
        method += "; nodes sensitivity will keep in float unknown before the build: an upper bound on the gain"
    return CandidateFloor(model.roofline(priced, entry, threads).time_s * 1e3, count, method)


def _ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def rank_correlation(predicted: list[float], measured: list[float]) -> float | None:
    """Spearman's rho (Pearson's r of the tie-averaged ranks); None with fewer than 3 pairs
    or when either side is all ties (no ranking to agree with)."""
    if len(predicted) != len(measured) or len(predicted) < 3:
        return None
    a, b = _ranks(predicted), _ranks(measured)
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    cov = sum((x - mean_a) * (y - mean_b) for x, y in zip(a, b))
    var_a, var_b = sum((x - mean_a) ** 2 for x in a), sum((y - mean_b) ** 2 for y in b)
    return cov / (var_a * var_b) ** 0.5 if var_a and var_b else None
