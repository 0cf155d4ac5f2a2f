"""A precision candidate priced before its build (roofline/candidates.py): the base graph's
quantizable nodes re-priced at int8, figures by hand; the rank correlation tune reports."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from scipy import stats

F32 = TensorProto.FLOAT
M, K, N = 6, 8, 10  # x [batch=2, 3, K] -> M = 6 rows


def _graph() -> onnx.ModelProto:
    """x @ w (a stored FP32 weight: quantizable), then y @ z (both activations: not)."""
    w = numpy_helper.from_array(np.ones((K, N), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj"),
             helper.make_node("MatMul", ["y", "z"], ["out"], name="act_by_act")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, ["batch", 3, K]),
                                           helper.make_tensor_value_info("z", F32, [N, 4])],
                              [helper.make_tensor_value_info("out", F32, ["batch", 3, 4])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def base():
    from pipeline.roofline import candidates, costs, shapes

    skel = shapes.skeleton(_graph())
    dims = candidates.feed_dims(skel, {"x": np.zeros((2, 3, K), np.float32), "z": np.zeros((N, 4), np.float32)})
    assert dims == {"batch": 2}
    return skel, costs.graph_cost(skel, dims)


@pytest.mark.parametrize("scheme, passes", [("dynamic", 2), ("static", 1)])
def test_a_weight_matmul_is_repriced_at_int8_and_an_activation_product_is_not(base, scheme, passes):
    from pipeline.roofline import candidates

    skel, cost = base
    priced, count = candidates.repriced(cost, skel, {"mode": "int8", "scheme": scheme, "op_types": ["MatMul"]})
    proj, other = priced.nodes
    assert count == 1 and proj.dtype == "int8" and proj.flops == 2 * M * K * N == cost.nodes[0].flops
    activation, weight = M * K * 4, K * N * 4
    # the FP32 activation read once per pass, its int8 copy written and read, the weight at 1 byte
    assert proj.bytes_read == passes * activation + M * K + K * N
    assert proj.bytes_written == M * N * 4 + M * K
    assert cost.nodes[0].bytes_read == activation + weight  # the base as built, for contrast
    assert other == cost.nodes[1] and other.dtype == "fp32"


def test_an_excluded_node_and_another_op_type_stay_as_built(base):
    from pipeline.roofline import candidates

    skel, cost = base
    for precision in ({"scheme": "dynamic", "op_types": ["MatMul"], "exclude": ["proj"]},
                      {"scheme": "dynamic", "op_types": ["Conv"]}):
        priced, count = candidates.repriced(cost, skel, precision)
        assert count == 0 and priced.nodes == cost.nodes


def test_the_prediction_uses_the_int8_peak_and_says_what_it_cannot_see(base):
    from pipeline.hardware import specified
    from pipeline.roofline import candidates, model

    skel, cost = base
    entry = specified.lookup("xeon-8480")  # has an int8 peak (AMX / VNNI): no fallback
    plain = candidates.predict(cost, skel, {}, entry, None)
    assert plain.floor_ms == pytest.approx(model.roofline(cost, entry).time_s * 1e3)
    auto = candidates.predict(cost, skel, {"mode": "int8", "scheme": "static", "op_types": ["MatMul"],
                                           "sensitivity": {"auto_exclude": True}}, entry, None)
    priced, _ = candidates.repriced(cost, skel, {"scheme": "static", "op_types": ["MatMul"]})
    assert auto.floor_ms == pytest.approx(model.roofline(priced, entry).time_s * 1e3)
    assert not model.roofline(priced, entry).fallbacks and "upper bound" in auto.method
    assert candidates.predict(cost, skel, {"mode": "int4"}, entry, None).floor_ms is None


@pytest.mark.parametrize("predicted, measured", [
    ([1.0, 2.0, 3.0, 4.0], [1.1, 1.9, 3.5, 3.6]),
    ([1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]),
    ([1.0, 1.0, 2.0, 2.0, 3.0], [1.0, 1.3, 1.2, 2.5, 2.4]),  # ties share their mean rank
])
def test_rank_correlation_is_spearmans_rho(predicted, measured):
    from pipeline.roofline import candidates

    assert candidates.rank_correlation(predicted, measured) == pytest.approx(stats.spearmanr(predicted, measured)[0])


def test_rank_correlation_is_undefined_without_a_ranking():
    from pipeline.roofline import candidates

    assert candidates.rank_correlation([1.0, 2.0], [1.0, 2.0]) is None  # too few
    assert candidates.rank_correlation([1.5, 1.5, 1.5], [1.0, 2.0, 3.0]) is None  # all tied
