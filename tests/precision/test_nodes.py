"""precision/nodes.py: which nodes the node selection keeps in float."""

from __future__ import annotations

import numpy as np


def test_too_small_keeps_gemms_with_a_dimension_under_16_float():
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.precision import nodes

    weights = {"angles": (1, 16), "narrow": (64, 8), "projection": (64, 64)}
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", w], [f"y_{w}"], name=w) for w in weights]
        + [helper.make_node("MatMul", ["x", "x"], ["y_act"], name="activations")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
        [helper.make_tensor_value_info(f"y_{w}", TensorProto.FLOAT, None) for w in weights],
        [numpy_helper.from_array(np.zeros(shape, np.float32), w) for w, shape in weights.items()])
    model = helper.make_model(graph)
    names = [n.name for n in model.graph.node]
    # activation x activation has no constant operand to judge: not this rule's to keep
    assert nodes.too_small(model, names) == ["angles", "narrow"]
    assert nodes.too_small(model, ["projection", "activations"]) == []
