"""`pipeline predict --serve` (roofline/serve_suggestion.py): the decode curve's knee and the KV
budget on a hand-built graph whose step floor is computed by hand, and on the suite's built
tiny decoder through the real CLI."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import Project
from tests.roofline.test_predict import _cached_here

F32 = TensorProto.FLOAT
HIDDEN, KV_HEADS, HEAD_DIM, CONTEXT = 64, 2, 8, 7
BANDWIDTH, PEAK = 1e9, 1e10  # bytes/s, FLOP/s: round figures for the hand computation


def _decoder() -> onnx.ModelProto:
    """One decode step in miniature: x @ W (the weights, read once per step for every
    sequence) and a read of each sequence's cache (ReduceMax over past_key's positions)."""
    w = numpy_helper.from_array(np.ones((HIDDEN, HIDDEN), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("ReduceMax", ["past_key"], ["m"], axes=[2], keepdims=1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F32, ["batch", "sequence", HIDDEN]),
                     helper.make_tensor_value_info("past_key", F32, ["batch", KV_HEADS, "past_sequence", HEAD_DIM])],
        [helper.make_tensor_value_info("y", F32, ["batch", "sequence", HIDDEN]),
         helper.make_tensor_value_info("m", F32, ["batch", KV_HEADS, 1, HEAD_DIM])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _entry():
    from pipeline.hardware.entry import Bandwidth, HardwareEntry, Peak, Source

    return HardwareEntry(name="round", title="round figures", kind="cpu", provenance="specified",
                         source=Source(document="test", date="2026-12-05"),
                         bandwidth=[Bandwidth(level="DRAM", bytes_per_s=BANDWIDTH)],
                         peaks=[Peak(dtype="fp32", ops_per_s=PEAK, isa="test")], runtimes=["CPUExecutionProvider"])


def _step_s(b: int) -> float:
    """The step's floor by hand: the MatMul max(2·b·H·H FLOPs, (H·H + 2·b·H) x 4 bytes), then
    the cache read (b·kv_heads·(context + 1)·head_dim x 4 bytes, memory-bound)."""
    matmul = max(2 * b * HIDDEN * HIDDEN / PEAK, (HIDDEN * HIDDEN + 2 * b * HIDDEN) * 4 / BANDWIDTH)
    return matmul + b * KV_HEADS * (CONTEXT + 1) * HEAD_DIM * 4 / BANDWIDTH


def test_the_suggestion_is_the_last_batch_whose_doubling_still_pays(tmp_path):
    from pipeline.roofline import serve_suggestion, shapes

    skel = shapes.skeleton(_decoder())
    per_token, weights = KV_HEADS * HEAD_DIM * 4, HIDDEN * HIDDEN * 4  # 64 B, 16 KiB
    got = serve_suggestion.suggest(skel, _entry(), None, CONTEXT, weights + 2 * per_token * 1000, "test")
    for p in got.curve:
        assert p.step_ms == pytest.approx(_step_s(p.batch) * 1e3)
    # by hand: tokens/s gains 1.89, 1.80, 1.67, 1.50, 1.33 up to 32 sequences, then 1.15x
    # (the product turns compute-bound at b > 16.384 / 0.3072 = 53, and every sequence's cache is read)
    gains = {b: 2 * _step_s(b // 2) / _step_s(b) for b in (2, 4, 8, 16, 32, 64)}
    assert all(g >= serve_suggestion.GAIN_PER_DOUBLING for b, g in gains.items() if b <= 32)
    assert gains[64] < serve_suggestion.GAIN_PER_DOUBLING
    assert got.max_running_sequences == 32 and "64 sequences" in got.why
    assert got.kv_bytes_per_token == per_token and got.weights_bytes == weights and got.kv_cache_tokens == 1000
    assert got.curve[6].compute_bound_share > 0.5 > got.curve[5].compute_bound_share  # 64 vs 32 sequences


def test_a_small_kv_budget_binds_before_the_knee():
    from pipeline.roofline import serve_suggestion, shapes

    skel = shapes.skeleton(_decoder())
    memory = HIDDEN * HIDDEN * 4 + 2 * 64 * CONTEXT * 10  # the KV budget: 70 tokens, 10 sequences at full context
    got = serve_suggestion.suggest(skel, _entry(), None, CONTEXT, memory, "test")
    assert got.kv_cache_tokens == 70 and got.max_running_sequences == 10 and "KV budget holds 10" in got.why
    lines = serve_suggestion.yaml_lines(got, "onnxruntime")
    assert "a model's suggestion" in lines[0] and lines[1] == "serve:"
    assert lines[2].startswith("  max_running_sequences: 10  #") and lines[3].startswith("  kv_cache_tokens: 70  #")


def test_predict_serve_on_the_built_decoder_and_a_clear_refusal_for_a_forward_recipe(built_gen: Project,
                                                                                     built_standard: Project,
                                                                                     tmp_path):
    env = _cached_here(tmp_path)
    name = built_gen.built.name
    result = built_gen.run("predict", name, "--serve", env=env)
    assert result.code == 0, result.err
    assert "serve:" in result.out and "max_running_sequences:" in result.out and "a model's suggestion" in result.out
    data = json.loads(built_gen.run("predict", name, "--serve", "--json", env=env).out)
    (got,) = data.values()
    report = json.loads((built_gen.engines / name / "report.json").read_text())
    (engine,) = [e for e in report["engines"] if e["status"] == "built"]
    # the graph's cache inputs give what the generation workload measured from the model's shape
    assert got["kv_bytes_per_token"] == engine["generation"]["memory"]["kv_cache_bytes_per_token"]
    batches = [p["batch"] for p in got["curve"]]
    assert batches == [2**i for i in range(11)] and got["max_running_sequences"] in batches + [
        got["kv_cache_tokens"] // got["context"]]
    forward = built_standard.run("predict", built_standard.built.name, "--serve", env=_cached_here(tmp_path))
    assert forward.code != 0 and "no KV-cache inputs" in forward.err and "Traceback" not in forward.err
