"""explain.layers: where a changed graph's error starts, on graphs built in code; and the
reasons its docstring gives for not using ONNX Runtime's qdq_loss_debug, checked against the
installed ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.explain import layers

RNG = np.random.default_rng(0)
W1, W2, W3 = (RNG.standard_normal((8, 8)).astype(np.float32) for _ in range(3))


def _chain(path, w2: np.ndarray):
    """x -> MatMul(w1) -> Relu -> MatMul(w2) -> Relu -> MatMul(w3) -> y, saved to path."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
             helper.make_node("Relu", ["a"], ["ra"], name="relu1"),
             helper.make_node("MatMul", ["ra", "w2"], ["b"], name="mm2"),
             helper.make_node("Relu", ["b"], ["rb"], name="relu2"),
             helper.make_node("MatMul", ["rb", "w3"], ["y"], name="mm3")]
    inits = [numpy_helper.from_array(w, n) for w, n in ((W1, "w1"), (w2, "w2"), (W3, "w3"))]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_the_first_jump_is_the_node_whose_weights_changed(tmp_path):
    float_path = _chain(tmp_path / "float.onnx", W2)
    changed = _chain(tmp_path / "changed.onnx", W2 + 0.05 * RNG.standard_normal(W2.shape).astype(np.float32))
    feeds = [{"x": RNG.standard_normal((4, 8)).astype(np.float32)} for _ in range(2)]
    result = layers.layer_errors(float_path, changed, feeds)
    errors = {r.tensor: r.rel_error for r in result.tensors}
    assert errors["a"] == errors["ra"] == 0.0  # before the change: identical
    assert errors["b"] > 1e-3 and errors["y"] > 1e-3
    assert [j.node for j in result.jumps] == ["mm2"]  # later nodes only carry it on


def test_relative_error_skips_mask_sentinels_where_ort_sqnr_is_nan():
    from onnxruntime.quantization.qdq_loss_debug import compute_signal_to_quantization_noice_ratio

    ref = np.array([[1.0, 2.0, -np.inf, -3.4e38]], np.float32)  # scores with masked slots
    act = np.array([[1.1, 2.0, -np.inf, -3.4e38]], np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        assert np.isnan(compute_signal_to_quantization_noice_ratio([ref], [act]))
    assert layers._relative_error([ref], [act]) == pytest.approx(0.1 / 5**0.5, rel=1e-5)


def test_ort_pairs_only_its_own_qdq_names_and_selects_no_bf16(tmp_path):
    from onnxruntime.quantization.calibrate import CalibraterBase
    from onnxruntime.quantization.qdq_loss_debug import create_activation_matching

    # A cast graph (fp16/bf16 modes) has no Q/DQ names: nothing to pair.
    acts = {"a": [np.ones(4, np.float32)], "b": [np.ones(4, np.float32)]}
    assert create_activation_matching(acts, acts) == {}
    # x (fp32) -> Cast(bf16) -> h -> Relu -> r (bf16) -> Cast(fp32) -> y
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.BFLOAT16),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "bf16", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "bf16.onnx"))
    saver = CalibraterBase(str(tmp_path / "bf16.onnx"))
    tensors, _ = saver.select_tensors_to_calibrate(saver.model)
    assert tensors == {"x", "y"}  # the bf16 intermediates h and r are not selected
