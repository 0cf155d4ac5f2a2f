"""HQQ's blocks with integer zero points (pipeline/precision/integer_zero.py), checked by ONNX
Runtime itself: what its MatMulNBits multiplies with is the refit blocks' (q - z) * s."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.precision.integer_zero import integer_blocks, to_integer_zero_points

K, N = 80, 24  # K not a multiple of the block: the last block is padded


def _hqq_matmul(weight: np.ndarray) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        HQQWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    graph = helper.make_graph([helper.make_node("MatMul", ["A", "W"], ["Y"], name="mm")], "g",
                              [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, K])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weight, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    quantizer = MatMulNBitsQuantizer(model, block_size=32, is_symmetric=False,
                                     algo_config=HQQWeightOnlyQuantConfig(block_size=32, bits=4))
    quantizer.process()
    return quantizer.model.model


def _multiplies_with(model: onnx.ModelProto) -> np.ndarray:
    """The [K, N] weights ONNX Runtime multiplies with (the identity through the float path)."""
    float_path = onnx.ModelProto()
    float_path.CopyFrom(model)
    for node in float_path.graph.node:
        kept = [a for a in node.attribute if a.name != "accuracy_level"]
        del node.attribute[:]
        node.attribute.extend(kept)
    session = ort.InferenceSession(float_path.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"A": np.eye(K, dtype=np.float32)})[0]


@pytest.fixture(scope="module")
def weight() -> np.ndarray:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((K, N)) * 0.05).astype(np.float32)
    w[3, 5] = 0.9  # an outlier: its block's scale and zero point are far from the others'
    w[32:64, 7] = 0.0  # a block of zeros
    return w


def test_onnx_runtime_multiplies_with_the_refit_blocks_and_their_uint8_zero_points(weight):
    model = _hqq_matmul(weight)
    meta = to_integer_zero_points(model, {"W": weight})
    assert meta["integer_zero_nodes"] == 1 and meta["accuracy_level"] == 4
    (node,) = model.graph.node
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert inits[node.input[3]].dtype == np.uint8
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute}["accuracy_level"] == 4
    # unpack what was written and dequantize it by hand: (q - z) * s per block of 32
    nb = -(-K // 32)
    codes = inits[node.input[1]].reshape(N, nb, 16)
    q = np.stack([codes & 15, codes >> 4], -1).reshape(N, nb, 32).astype(np.float32)
    zbytes = inits[node.input[3]].reshape(N, -1)
    z = np.stack([zbytes & 15, zbytes >> 4], -1).reshape(N, -1)[:, :nb].astype(np.float32)
    s = inits[node.input[2]].reshape(N, nb)
    by_hand = ((q - z[..., None]) * s[..., None]).reshape(N, -1)[:, :K].T
    np.testing.assert_allclose(_multiplies_with(model), by_hand, rtol=1e-6, atol=1e-7)
    error = np.linalg.norm(by_hand - weight) / np.linalg.norm(weight)
    assert error == pytest.approx(meta["relative_l2_error"]["uint8_zero_points"], rel=1e-3)
    assert np.all(by_hand[32:64, 7] == 0)  # a block of zeros stays zeros


def test_refit_beats_rounding_hqqs_zero_points_alone(weight):
    """Rounding the zero point alone shifts a whole block by up to half a step; refitting the
    codes and scale to the fixed integer zero point takes most of that back."""
    model = _hqq_matmul(weight)
    (node,) = model.graph.node
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    scale, zero = inits[node.input[2]], inits[node.input[3]]
    assert zero.dtype == np.float32  # ORT's HQQ writes float zero points
    *_, before, after = integer_blocks(weight, scale, zero, 32)
    nb = -(-K // 32)
    w = np.zeros((N, nb * 32), np.float32)
    w[:, :K] = weight.T
    w = w.reshape(N, nb, 32)
    s, z = scale.reshape(N, nb, 1), np.clip(np.rint(zero.reshape(N, nb, 1)), 0, 15)
    rounded = (np.clip(np.rint(w / s + z), 0, 15) - z) * s
    rounded_only = np.linalg.norm(rounded - w) / np.linalg.norm(w)
    assert before <= after < rounded_only
