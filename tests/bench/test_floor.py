"""The decode floor: bytes a decode step reads (stored precision) over measured bandwidth."""

from __future__ import annotations

import json

import numpy as np


def _graph(path, weight: np.ndarray, table: np.ndarray):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Gather", ["table", "ids"], ["h"]),
             helper.make_node("MatMul", ["h", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, weight.shape[1]])],
                              [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(table, "table")])
    onnx.save(helper.make_model(graph), str(path))


def test_bandwidth_is_measured_once_per_device_identity(tmp_path, monkeypatch):
    from pipeline.bench import floor

    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path))
    calls = []
    real = floor.measure_bandwidth
    monkeypatch.setattr(floor, "measure_bandwidth", lambda: calls.append(1) or real(megabytes=8, repeats=2))
    first = floor.bandwidth()
    assert first.bytes_per_s > 1e8 and len(calls) == 1  # a real copy: over 0.1 GB/s anywhere
    assert floor.bandwidth() == first and len(calls) == 1  # cached: not measured again
    cached = json.loads((tmp_path / "bandwidth.json").read_text())
    (identity,) = cached
    assert json.loads(identity)["cpu"]  # keyed by the device identity
    monkeypatch.setenv("PIPELINE_DEVICE_OVERRIDE", json.dumps({"cpu": "another CPU"}))
    from pipeline.core import deps

    deps.identity.cache_clear()
    try:
        floor.bandwidth()
        assert len(calls) == 2  # another identity: measured for it
    finally:
        monkeypatch.delenv("PIPELINE_DEVICE_OVERRIDE")
        deps.identity.cache_clear()


def test_decode_bytes_count_weights_as_stored_and_one_embedding_row(tmp_path, monkeypatch):
    from pipeline.bench import floor

    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(floor, "bandwidth", lambda: floor.Bandwidth(bytes_per_s=1e9, method="test", measured="now"))
    _graph(tmp_path / "g.onnx", np.zeros((16, 8), np.float32), np.zeros((100, 16), np.float32))
    out = floor.decode_floor(tmp_path / "g.onnx", kv_bytes_per_token=64, contexts={"b1-p32": 40},
                             tpot_ms={"b1-p32": 0.01})
    # the MatMul weight whole (16 x 8 x 4 B), one row of the Gather table (16 x 4 B), 40 tokens of KV
    point = out.points["b1-p32"]
    assert out.weights_bytes == 16 * 8 * 4 + 16 * 4 and out.gather_table_bytes == 100 * 16 * 4
    assert point.bytes == out.weights_bytes + 64 * 40
    assert abs(point.floor_ms - point.bytes / 1e9 * 1e3) < 1e-12
    assert abs(point.tpot_over_floor - 0.01 / point.floor_ms) < 1e-9
