"""passes/pack.py: pack_matmuls merges the projections of one input into one GEMM and a
Split, every output as before to rounding (real ONNX Runtime sessions)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx


def _shared_input_matmuls(widths=(48, 16, 16), k=32):
    """x [2, 5, k] read by one MatMul per width (constant weights [k, width]), plus a MatMul
    on another input that must stay alone."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((k, w)).astype(np.float32), f"w{i}")
               for i, w in enumerate(widths)]
    alone = numpy_helper.from_array(rng.standard_normal((k, 8)).astype(np.float32), "w_alone")
    nodes = [helper.make_node("MatMul", ["x", w.name], [f"y{i}"], name=f"mm{i}") for i, w in enumerate(weights)]
    nodes.append(helper.make_node("MatMul", ["z", "w_alone"], ["y_alone"], name="mm_alone"))
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 5, k]) for n in ("x", "z")],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [2, 5, w]) for i, w in enumerate(widths)]
        + [helper.make_tensor_value_info("y_alone", TensorProto.FLOAT, [2, 5, 8])],
        [*weights, alone])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_pack_matmuls_merges_projections_of_one_input_and_keeps_every_output():
    from pipeline.metrics import graph_check as check
    from pipeline.passes.pack import pack_matmuls

    model = _shared_input_matmuls()
    onnx.checker.check_model(model)
    feed = {n: np.random.default_rng(1).standard_normal((2, 5, 32)).astype(np.float32) for n in ("x", "z")}
    outputs = [o.name for o in model.graph.output]
    before = check.run(model.SerializeToString(), [feed], outputs)[0]
    packed, info = pack_matmuls(_shared_input_matmuls())
    onnx.checker.check_model(packed)
    assert info == {"packed_groups": 1, "matmuls_merged": 3}
    assert Counter(n.op_type for n in packed.graph.node) == {"MatMul": 2, "Split": 1}
    assert {i.name for i in packed.graph.initializer} >= {"w_alone", "mm0__packed_weight"}
    assert not {"w0", "w1", "w2"} & {i.name for i in packed.graph.initializer}  # copied, then dropped
    after = check.run(packed.SerializeToString(), [feed], outputs)[0]
    for name in outputs:  # a packed GEMM computes every column as before: equal to rounding
        np.testing.assert_allclose(after[name], before[name], rtol=1e-5, atol=1e-5)
