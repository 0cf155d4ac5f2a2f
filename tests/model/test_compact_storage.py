"""Compact storage of an engine's constants: smaller files, the same numbers, folded at load."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from pipeline.bench.floor import weight_bytes
from pipeline.model import compact_storage

K, N = 64, 128  # 8,192 values per weight: above MIN_ELEMENTS


def _model(tmp_path):
    """y = x @ exact + x @ inexact + x @ twin + x @ zeros: a weight whose values are all fp16
    (signed zeros among them), one that is not, a copy of the first in another shape
    (read through a Reshape of the graph's own), and one of zeros only."""
    rng = np.random.default_rng(0)
    exact = rng.standard_normal((K, N)).astype(np.float16).astype(np.float32)
    exact[0, :4] = [0.0, -0.0, 0.0, -0.0]
    inexact = exact.copy()
    inexact[1, 1] += np.float32(1e-6)  # one value between two fp16s
    twin = exact.reshape(-1)  # the same bytes, flat
    inits = [numpy_helper.from_array(exact, "exact"), numpy_helper.from_array(inexact, "inexact"),
             numpy_helper.from_array(twin, "twin"), numpy_helper.from_array(np.zeros((K, N), np.float32), "zeros"),
             numpy_helper.from_array(np.array([K, N], np.int64), "kn")]
    nodes = [helper.make_node("MatMul", ["x", "exact"], ["a"]),
             helper.make_node("MatMul", ["x", "inexact"], ["b"]),
             helper.make_node("Reshape", ["twin", "kn"], ["twin_kn"]),
             helper.make_node("MatMul", ["x", "twin_kn"], ["c"]),
             helper.make_node("MatMul", ["x", "zeros"], ["d"]),
             helper.make_node("Sum", ["a", "b", "c", "d"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, N])], inits)
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path, {"exact": exact, "inexact": inexact, "twin": twin}


def _run(source, level, feed):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def test_compact_stores_each_form_and_answers_bit_for_bit(tmp_path):
    path, arrays = _model(tmp_path)
    feed = {"x": np.random.default_rng(1).standard_normal((2, K)).astype(np.float32)}
    before_bytes = path.stat().st_size
    before = _run(str(path), ort.GraphOptimizationLevel.ORT_DISABLE_ALL, feed)

    stored = compact_storage.compact_file(path)

    assert (stored.uniform, stored.duplicate, stored.fp16) == (1, 1, 1)
    assert stored.saved_bytes >= 4 * K * N + 4 * K * N + 2 * K * N - 256
    assert before_bytes - path.stat().st_size >= stored.saved_bytes - 2048  # the new nodes
    model = onnx.load(str(path))
    types = {i.name: i.data_type for i in model.graph.initializer if i.data_type != TensorProto.INT64}
    assert types == {"exact/fp16": TensorProto.FLOAT16, "inexact": TensorProto.FLOAT}
    # a serving session (ORT's default level) and an unoptimized one fed the expanded bytes
    # both compute exactly what the plain file computed
    np.testing.assert_array_equal(_run(str(path), ort.GraphOptimizationLevel.ORT_ENABLE_ALL, feed), before)
    np.testing.assert_array_equal(
        _run(compact_storage.session_source(path), ort.GraphOptimizationLevel.ORT_DISABLE_ALL, feed), before)
    # expand gives back every initializer bit for bit, signed zeros included
    expanded = compact_storage.load(path)
    back = {i.name: numpy_helper.to_array(i) for i in expanded.graph.initializer}
    for name, array in arrays.items():
        assert back[name].shape == array.shape
        assert back[name].view(np.uint32).tolist() == array.view(np.uint32).tolist(), name
    assert back["zeros"].shape == (K, N) and not back["zeros"].any()
    assert [n.op_type for n in expanded.graph.node] == ["MatMul", "MatMul", "Reshape", "MatMul", "MatMul", "Sum"]
    assert not compact_storage.is_compact(expanded)


def test_a_session_at_the_basic_level_folds_every_form_at_load(tmp_path):
    """The claim the storage rests on: ONNX Runtime's constant folding turns each node compact
    wrote back into an initializer when the session loads, so no step runs one (ORT's
    optimized graph, saved, has none of them)."""
    path, _ = _model(tmp_path)
    compact_storage.compact_file(path)
    written = {n.op_type for n in onnx.load(str(path)).graph.node if n.name.endswith(compact_storage.SUFFIX)}
    assert written == {"Cast", "Reshape", "ConstantOfShape"}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(tmp_path / "as-loaded.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    loaded = onnx.load(str(tmp_path / "as-loaded.onnx"))
    assert {n.op_type for n in loaded.graph.node} == {"MatMul", "Sum"}
    assert {i.data_type for i in loaded.graph.initializer} == {TensorProto.FLOAT}


def test_the_floor_counts_the_bytes_a_step_reads_not_the_bytes_stored(tmp_path):
    path, _ = _model(tmp_path)
    before = weight_bytes(path)
    compact_storage.compact_file(path)
    assert weight_bytes(path) == before  # float32 after the load-time fold, the shapes gone


def test_a_file_with_nothing_to_compact_is_left_untouched(tmp_path):
    path, _ = _model(tmp_path)
    model = onnx.load(str(path))
    rng = np.random.default_rng(2)
    for init in model.graph.initializer:  # distinct values, none of them fp16
        if init.data_type == TensorProto.FLOAT:
            values = rng.standard_normal(tuple(init.dims)).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(values, init.name))
    onnx.save(model, str(path))
    content = path.read_bytes()
    assert compact_storage.compact_file(path).initializers == 0
    assert path.read_bytes() == content
    assert compact_storage.session_source(path) == str(path)


def test_a_file_with_external_data_is_left_untouched(tmp_path):
    """A model past protobuf's 2 GB keeps its weights in a side file; the build leaves such an
    engine as ONNX Runtime saved it rather than load it whole and fail to write it back."""
    path, _ = _model(tmp_path)
    model = onnx.load(str(path))
    onnx.save(model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    content = path.read_bytes()
    assert compact_storage.compact_file(path).initializers == 0
    assert path.read_bytes() == content
