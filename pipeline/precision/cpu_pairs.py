"""Rewire INT8 Q/DQ pairs so ONNX Runtime's x86 CPU provider fuses every quantized MatMul.

The graph stays what TensorRT wants (symmetric int8, zero point 0); only the wiring of
Q/DQ pairs changes. Why it is needed, as measured with ORT 1.32 on x86:
- On x86, ORT fuses a DQ -> MatMul group into an integer kernel (MatMulIntegerToFloat; with
  a Q on the output, QLinearMatMul) only after converting its int8 activations to uint8
  (QDQS8ToU8Transformer), and that conversion needs a Q with exactly one DQ consumer.
- ORT first gives every DQ a single consumer by duplicating shared DQs
  (EnsureUniqueDQForNodeUnit), and merges identical Q nodes again (common subexpression
  elimination). A tensor that feeds several quantized MatMuls (q/k/v projections read one
  normalized input, unless the optimize stage packed them) thus ends with one Q and several
  DQs: no conversion, no fusion, and the MatMul runs in float between Q and DQ ("fake
  quantized").
So: (1) a quantized tensor read by several consumers gets one private Q -> DQ chain per
consumer, with private copies of its scale and zero point so nothing merges them back;
(2) a quantized output of a MatMul read by several float ops keeps one Q -> DQ and fans out
behind a shape-preserving Reshape, which ORT neither removes nor duplicates the DQ for (the
precision stage no longer quantizes MatMul outputs, but a recipe's other op types may).
Measured on the small GLM, before packing: 17 of 37 MatMuls fused before, 37 of 37 after.
"""

from __future__ import annotations

import numpy as np

_QUANTIZED_OPS = {"MatMul", "Gemm", "Conv"}


def rewire(model) -> int:
    """Rewrite `model` (onnx.ModelProto) in place; returns the number of fan-outs rewired."""
    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    ranks = {v.name: len(v.type.tensor_type.shape.dim)
             for v in (*graph.value_info, *graph.output) if v.type.tensor_type.HasField("shape")}
    graph_outputs = {o.name for o in graph.output}
    after: dict[str, list] = {}  # node name -> nodes to insert right after it (keeps topo order)
    rewired = 0
    for q in list(graph.node):
        if q.op_type != "QuantizeLinear" or q.input[0] in initializers:
            continue
        dqs = consumers.get(q.output[0], [])
        if len(dqs) != 1 or dqs[0].op_type != "DequantizeLinear" or dqs[0].output[0] in graph_outputs:
            continue
        dq = dqs[0]
        uses = consumers.get(dq.output[0], [])
        if len(uses) < 2:
            continue
        source = producer.get(q.input[0])
        if source is not None and source.op_type in _QUANTIZED_OPS:
            rank = ranks.get(q.input[0])
            if rank is None:
                continue
            after.setdefault(dq.name, []).append(_fan_out_behind_reshape(graph, dq, rank, uses))
        else:
            after.setdefault(dq.name, []).extend(_private_chains(graph, initializers, q, dq, uses))
        rewired += 1
    nodes = []
    for n in graph.node:
        nodes.append(n)
        nodes.extend(after.get(n.name, []))
    del graph.node[:]
    graph.node.extend(nodes)
    return rewired


def _fan_out_behind_reshape(graph, dq, rank: int, uses: list):
    """(2) above: `uses` read `dq`'s output through a new shape-preserving Reshape (returned,
    for the caller to insert after `dq`); its shape initializer is added to `graph`."""
    from onnx import helper, numpy_helper

    # Reshape to [0, 0, ..., -1] with allowzero=0 keeps the shape (a view, no copy).
    shape = numpy_helper.from_array(np.array([0] * (rank - 1) + [-1], np.int64),
                                    f"{dq.output[0]}__fanout_shape")
    graph.initializer.append(shape)
    fan = helper.make_node("Reshape", [dq.output[0], shape.name], [f"{dq.output[0]}__fanout"],
                           name=f"{dq.name}__fanout")
    for use in uses:
        _redirect(use, dq.output[0], fan.output[0])
    return fan


def _private_chains(graph, initializers: dict, q, dq, uses: list) -> list:
    """(1) above: every use after the first reads its own copy of `q` -> `dq`; returns the
    copies in order (Q, DQ, Q, DQ, ...) for the caller to insert after `dq`, and adds their
    private scale and zero point initializers to `graph`."""
    import onnx

    chains = []
    for j, use in enumerate(uses[1:], 1):
        qj, dqj = onnx.NodeProto(), onnx.NodeProto()
        qj.CopyFrom(q)
        dqj.CopyFrom(dq)
        qj.name, dqj.name = f"{q.name}__{j}", f"{dq.name}__{j}"
        qj.output[0], dqj.output[0] = f"{q.output[0]}__{j}", f"{dq.output[0]}__{j}"
        dqj.input[0] = qj.output[0]
        for k in (1, 2):  # private scale / zero point: CSE must not merge the copies
            if len(q.input) > k and q.input[k] in initializers:
                copy = onnx.TensorProto()
                copy.CopyFrom(initializers[q.input[k]])
                copy.name = f"{q.input[k]}__{qj.name}"
                graph.initializer.append(copy)
                qj.input[k] = dqj.input[k] = copy.name
        _redirect(use, dq.output[0], dqj.output[0])
        chains.extend([qj, dqj])
    return chains


def _redirect(node, old: str, new: str) -> None:
    """`node` reads `new` wherever it read `old`."""
    for k, name in enumerate(node.input):
        if name == old:
            node.input[k] = new
