"""SmoothQuant: move per-channel activation outliers into the weights before INT8.

Transformer activations carry a few input channels with magnitudes 10-100x the rest
(after LayerNorm, after GELU). One per-tensor activation scale (static Q/DQ, or dynamic
quantization at run time) then spends its 255 levels on those channels and rounds the
others to a handful of levels. For a MatMul Y = X @ W (X [..., K], W [K, N]):

    Y = (X / s) @ (s[:, None] * W)         exact in float, for any s > 0 of shape [K]
    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)

(Xiao et al., "SmoothQuant", 2023.) The weights are quantized per output channel, so a
scaled-up row j costs them little. X / s is one Mul node per smoothed activation (shared
by every quantized consumer of that tensor, which all get the same s); its cost is one
elementwise pass over X, small beside the MatMul it feeds ([B, S, K] vs [B, S, K] x N).

Consumers smoothed: MatMul and the fused Attention's QKV projection (input 0, weights
input 1) that read a normalization's output, whenever their weight is a 2-D initializer.
Like the paper (which smooths the inputs of QKV and FC1, the LayerNorm outputs), not the
FFN's second MatMul: measured on all-MiniLM-L6-v2, dynamic INT8 of the six FC1 MatMuls
alone went from worst row cosine 0.9972 to 0.9995 with alpha 0.5, but the six FC2 MatMuls
(GELU outputs, one-sided, their range set by a handful of tokens) from 0.9955 to 0.9894.
max|X_j| comes from the calibration feeds, with the activations read in ONNX Runtime
(optimization off, so names stay).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

Readers = dict[str, list]  # activation -> the nodes (to be smoothed) that read it
ChannelMaxima = dict[str, np.ndarray]  # tensor -> max |x| per channel (last axis)

SMOOTHABLE = {"MatMul", "Attention"}
NORMS = {"LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
         "SkipSimplifiedLayerNormalization", "RMSNormalization"}
_EPS = 1e-5


def targets(model, names: list[str]) -> Readers:
    """activation name -> the nodes in `names` that read it as input 0 with a 2-D constant
    weight, where a normalization produced it."""
    initializers = {i.name: i for i in model.graph.initializer}
    producer = {o: n.op_type for n in model.graph.node for o in n.output}
    wanted = set(names)
    out: dict[str, list] = {}
    for node in model.graph.node:
        if node.name not in wanted or node.op_type not in SMOOTHABLE or len(node.input) < 2:
            continue
        if producer.get(node.input[0]) not in NORMS:
            continue
        weight = initializers.get(node.input[1])
        if weight is not None and len(weight.dims) == 2:
            out.setdefault(node.input[0], []).append(node)
    return out


def activation_maxima(path: Path, tensors: list[str], feeds: list[dict]) -> ChannelMaxima:
    """Per-channel (last axis) max |x| of each tensor over all feeds."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path))
    present = {o.name for o in model.graph.output}
    for name in tensors:
        if name not in present:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    maxima: dict[str, np.ndarray] = {}
    for feed in feeds:
        for name, value in zip(tensors, session.run(tensors, feed)):
            m = np.abs(value.reshape(-1, value.shape[-1])).max(axis=0)
            maxima[name] = m if name not in maxima else np.maximum(maxima[name], m)
    return maxima


def scales(x_max: np.ndarray, w_max: np.ndarray, alpha: float) -> np.ndarray:
    """s_j = max|X_j|^alpha / max|W_j|^(1-alpha); channels that never fire keep s = 1."""
    x, w = np.maximum(x_max, _EPS), np.maximum(w_max, _EPS)
    s = x ** alpha / w ** (1 - alpha)
    s = np.where(x_max > 0, s, 1.0)
    return np.clip(s, _EPS, 1 / _EPS).astype(np.float32)


def apply(src: Path, names: list[str], feeds: list[dict], alpha: float, out: Path) -> tuple[Path, dict]:
    """Smooth the consumers among `names`; writes `out`. Returns (out, meta)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    groups = targets(model, names)
    if not groups:
        onnx.save(model, str(out))
        return out, {"alpha": alpha, "activations": 0, "nodes": 0}
    maxima = activation_maxima(src, list(groups), feeds)
    initializers = {i.name: i for i in model.graph.initializer}
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    spread = []
    new_nodes: dict[str, object] = {}  # activation -> its Mul node
    for activation, consumers in groups.items():
        weights = [numpy_helper.to_array(initializers[n.input[1]]) for n in consumers]
        w_max = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)  # [K]
        x_max = maxima[activation]
        s = scales(x_max, w_max, alpha)
        ratio = x_max.max() / max(float(np.median(x_max)), _EPS)
        spread.append(float(ratio))
        inverse = numpy_helper.from_array((1.0 / s).astype(np.float32), f"{activation}__smooth_inv")
        model.graph.initializer.append(inverse)
        smoothed = f"{activation}__smoothed"
        new_nodes[activation] = helper.make_node("Mul", [activation, inverse.name], [smoothed],
                                                 name=f"{activation}__smooth")
        for node, w in zip(consumers, weights):
            name = node.input[1]
            scaled = numpy_helper.from_array((w * s[:, None]).astype(w.dtype),
                                             name if readers[name] == 1 else f"{name}__{node.name}")
            if readers[name] == 1:
                initializers[name].CopyFrom(scaled)
            else:  # a weight shared with another node: give this one its own copy
                model.graph.initializer.append(scaled)
                node.input[1] = scaled.name
            node.input[0] = smoothed
    # Each Mul goes right before the first node that reads its output (topological order).
    ordered, placed = [], set()
    for node in model.graph.node:
        for name in node.input:
            mul = new_nodes.get(name.removesuffix("__smoothed")) if name.endswith("__smoothed") else None
            if mul is not None and mul.name not in placed:
                ordered.append(mul)
                placed.add(mul.name)
        ordered.append(node)
    del model.graph.node[:]
    model.graph.node.extend(ordered)
    onnx.save(model, str(out))
    return out, {"alpha": alpha, "activations": len(groups),
                 "nodes": sum(len(c) for c in groups.values()),
                 "outlier_ratio_max": round(max(spread), 2),
                 "what": "max/median of per-channel activation maxima before smoothing"}
