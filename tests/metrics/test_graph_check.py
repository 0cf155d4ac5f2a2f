"""metrics/graph_check.py: what a check keeps of a session's outputs."""

from __future__ import annotations

import gc

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.metrics import graph_check


def _model() -> bytes:
    """y = x @ W, logits-shaped [B, S, 64]."""
    w = numpy_helper.from_array(np.eye(32, 64, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", 64])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_kept_outputs_own_their_memory_and_long_ones_keep_their_last_positions():
    """ONNX Runtime's numpy outputs are views of its session's buffers, and a kept view pinned
    the whole arena of its run (3.6 GB for a 5,120-token SmolLM2 prefill's presents): a
    check's outputs are copies; a trimmed output keeps its last LAST_POSITIONS positions."""
    feeds = [{"x": np.random.default_rng(0).standard_normal((1, 300, 32)).astype(np.float32)},
             {"x": np.ones((1, 8, 32), np.float32)}]
    for arena in (True, False):
        full = graph_check.run(_model(), feeds, ["logits"], arena=arena)
        cut = graph_check.run(_model(), feeds, ["logits"], trim=["logits"], arena=arena)
        gc.collect()
        for outputs in (*full, *cut):
            assert outputs["logits"].flags["OWNDATA"]
        assert full[0]["logits"].shape == (1, 300, 64)
        assert cut[0]["logits"].shape == (1, graph_check.LAST_POSITIONS, 64)
        np.testing.assert_array_equal(cut[0]["logits"], full[0]["logits"][:, -graph_check.LAST_POSITIONS:])
        assert cut[1]["logits"].shape == (1, 8, 64)  # short enough: whole


def test_judge_compares_trimmed_outputs_with_a_trimmed_reference():
    feeds = [{"x": np.random.default_rng(1).standard_normal((1, 300, 32)).astype(np.float32)}]
    reference = graph_check.run(_model(), feeds, ["logits"], trim=["logits"])
    model = onnx.load_from_string(_model())
    verdict = graph_check.judge(model, feeds, ["logits"], reference, 1e-6, 0.9999, trim=["logits"])
    assert verdict.accepted and verdict.outputs[0]["logits"].shape == (1, graph_check.LAST_POSITIONS, 64)
