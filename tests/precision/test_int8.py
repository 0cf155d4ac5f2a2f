"""INT8 on ONNX Runtime: convolutions in integer kernels, the dynamic scheme, SmoothQuant,
the weight range and the recipe checks. Tiny models built in code, real sessions, the CLI
as a subprocess."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import FAST, Project, set_folder

CNN = """\
description: tiny CNN, INT8 convolutions
model: {factory: "tests.tiny_models:tiny_cnn"}
inputs:
  - {name: input, dtype: float32, shape: [{name: batch, min: 1, opt: 2, max: 4}, 3, 16, 16], range: [0, 1]}
outputs: [logits]
data: {calibration: {samples: 4}}
export: {exporter: torchscript, opset: 20}
precision: {mode: int8, op_types: [Conv, Gemm, MatMul], require_effective_precision: 0.9}
targets: [{kind: onnxruntime}]
validate: {tolerance: {cosine_min: 0.99}}
"""

MLP = """\
description: LayerNorm MLP, dynamic INT8
model: {factory: "tests.tiny_models:tiny_mlp"}
inputs:
  - {name: input, dtype: float32, shape: [{name: batch, min: 1, opt: 2, max: 4}, {name: t, min: 1, opt: 16, max: 32}, 64]}
outputs: [y]
export: {exporter: torchscript, opset: 20}
precision: {mode: int8, scheme: dynamic, require_effective_precision: 0.9}
targets: [{kind: onnxruntime}]
validate: {tolerance: {cosine_min: 0.99}}
"""


def _report(proj: Project, name: str) -> dict:
    return json.loads((proj.engines / set_folder(name, *FAST) / "report.json").read_text())


@pytest.fixture(scope="module")
def int8_project(tmp_path_factory) -> Project:
    proj = Project(tmp_path_factory.mktemp("int8"))
    proj.write("recipes/cnn.yaml", CNN)
    proj.write("recipes/mlp.yaml", MLP)
    return proj


def test_int8_convolutions_run_integer_kernels_and_count(int8_project):
    result = int8_project.run("run", "cnn", *FAST)
    assert result.code == 0, result.err
    engine = _report(int8_project, "cnn")["engines"][0]
    eff = engine["ort_flop_shares"]
    assert "effective_precision" not in engine  # schema 3: named by the runtime that measured it
    # Both convolutions run as QLinearConv and their FLOPs count: 2 x 2*16*16*16*3*9 + 2 x
    # 2*32*16*16*16*9 at batch 2; the Gemm (10 outputs, too small to quantize) stays float.
    assert eff["by_op_mflops"]["QLinearConv"] == pytest.approx((2 * 2 * 256 * 16 * 27 + 2 * 2 * 256 * 32 * 144) / 1e6, rel=1e-3)
    assert eff["integer_share"] >= 0.99
    assert "quantized nodes: 2 of 3" in (int8_project.engines / set_folder("cnn", *FAST) / "report.md").read_text()
    gate = next(g for g in engine["gates"] if g["name"] == "effective_precision")
    assert gate["passed"], gate


def test_a_float_conv_between_qdq_fails_the_effective_precision_gate(int8_project, tmp_path):
    """The Q on a Conv's output is what lets ORT fuse QLinearConv: without it (the placement
    for MatMul) the engine runs FusedConv in float, and the gate, counting Conv FLOPs, fails."""
    import onnx
    from onnx import helper

    from pipeline.precision import effective

    folder = int8_project.engines / set_folder("cnn", *FAST)
    typed = onnx.load(str(folder / "typed.onnx"))
    # Drop each Conv's output Q/DQ pair (rewire its consumers to the Conv's float output).
    producer = {o: n for n in typed.graph.node for o in n.output}
    drop, rename = set(), {}
    for q in typed.graph.node:
        src = producer.get(q.input[0])
        if q.op_type == "QuantizeLinear" and src is not None and src.op_type == "Conv":
            dq = next(n for n in typed.graph.node if n.input and n.input[0] == q.output[0])
            drop |= {q.name, dq.name}
            rename[dq.output[0]] = q.input[0]
    assert len(drop) == 4, "both convolutions had a quantized output"
    kept = [n for n in typed.graph.node if n.name not in drop]
    for n in kept:
        n.input[:] = [rename.get(i, i) for i in n.input]
    del typed.graph.node[:]
    typed.graph.node.extend(kept)
    path = tmp_path / "no-output-q.onnx"
    onnx.save(typed, str(path))
    import onnxruntime as ort

    options = ort.SessionOptions()  # the onnxruntime target's default level: extended
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "engine.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {"input": np.random.default_rng(0).random((2, 3, 16, 16), np.float32)}
    eff = effective.measure(tmp_path / "engine.onnx", feed, tmp_path)
    kinds = {n["op"]: n["kind"] for n in eff.largest_non_integer}
    assert "fake_quantized" in kinds.values() and any("Conv" in op for op in kinds), kinds
    gate = effective.gate(eff, 0.9)
    assert not gate.passed and "Conv" in gate.detail, gate
    assert helper  # the graph above was edited with onnx's own protos


def test_dynamic_int8_needs_no_calibration_and_runs_integer(int8_project):
    result = int8_project.run("run", "mlp", *FAST)
    assert result.code == 0, result.err
    report = _report(int8_project, "mlp")
    engine = report["engines"][0]
    assert engine["ort_flop_shares"]["by_op_mflops"].get("DynamicQuantizeMatMul", 0) > 0
    assert engine["ort_flop_shares"]["integer_share"] >= 0.9
    precision = json.loads((int8_project.engines / set_folder("mlp", *FAST) / "manifest.json").read_text())
    meta = precision["stages"]["precision"]["meta"]
    assert meta["scheme"] == "dynamic" and meta["calibration"] is None and meta["quantized_nodes"] == 2
    assert "scheme: **dynamic**" in (int8_project.engines / set_folder("mlp", *FAST) / "report.md").read_text()


def test_smoothing_is_exact_in_float_and_moves_outliers_into_weights(int8_project, tmp_path):
    import onnx
    from onnx import numpy_helper

    from pipeline.metrics import graph_check as check
    from pipeline.precision import nodes, smooth

    graph = int8_project.engines / set_folder("mlp", *FAST) / "model.onnx"
    model = onnx.load(str(graph))
    names = nodes.quantizable(model, ["MatMul"])
    rng = np.random.default_rng(1)
    feeds = [{"input": (rng.standard_normal((2, 16, 64)) * np.r_[[30.0], np.ones(63)]).astype(np.float32)}]
    out, meta = smooth.apply(graph, names, feeds, 0.5, tmp_path / "smoothed.onnx")
    # Only the LayerNorm-fed MatMul is smoothed (the GELU-fed one is left: see smooth.py)
    assert meta["nodes"] == 1 and meta["activations"] == 1
    a = check.run(str(graph), feeds, ["y"], optimize=False)[0]["y"]
    b = check.run(str(out), feeds, ["y"], optimize=False)[0]["y"]
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)
    smoothed = onnx.load(str(out))
    assert sum(n.op_type == "Mul" and n.name.endswith("__smooth") for n in smoothed.graph.node) == 1
    before = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    after = {i.name: numpy_helper.to_array(i) for i in smoothed.graph.initializer}
    changed = [k for k in before if before[k].ndim == 2 and not np.array_equal(before[k], after[k])]
    assert len(changed) == 1


def test_weight_range_auto_follows_the_cpu_and_reduced_is_7_bit(int8_project, tmp_path, monkeypatch):
    import onnx
    from onnx import numpy_helper

    from pipeline import recipe as recipe_mod
    from pipeline.precision import isa, qdq

    assert isa.reduce_range("auto") == isa.needs_reduced_range()
    assert isa.reduce_range("reduced") and not isa.reduce_range("full")
    exported = int8_project.run("export", "mlp", *FAST)  # cached when another test ran mlp
    assert exported.code == 0, exported.err
    monkeypatch.chdir(int8_project.path)
    recipe = recipe_mod.load("mlp", ("precision.weight_range=reduced",))
    out, meta = qdq.apply(recipe, int8_project.engines / set_folder("mlp", *FAST) / "model.onnx", tmp_path)
    assert meta["weight_range"]["bits"] == 7
    weights = [numpy_helper.to_array(i) for i in onnx.load(str(out)).graph.initializer
               if i.data_type == onnx.TensorProto.INT8 and len(i.dims) == 2]
    assert weights and max(int(np.abs(w.astype(np.int32)).max()) for w in weights) <= 64


@pytest.mark.parametrize("overrides, expected", [
    (("precision.scheme=dynamic", "targets=[{kind: tensorrt}]"), "TensorRT builds static Q/DQ INT8 only"),
    (("precision.scheme=static", "precision.op_types=[Attention]"), "op_types Attention needs scheme dynamic"),
    (("precision.calibration=percentile",), "scheme dynamic takes no calibration method"),
    (("precision.mode=fp16", "precision.require_effective_precision=null"), "scheme and smoothing apply to int8"),
    (("precision.scheme=static", "precision.fallback=blockwise"), "fallback blockwise applies to int8 with scheme dynamic"),
])
def test_int8_recipe_cross_checks_fail_at_load(int8_project, overrides, expected):
    result = int8_project.run("quantize", "mlp", *[a for o in overrides for a in ("--set", o)])
    assert result.code == 2, result.err
    assert len(result.error_lines) == 1 and expected in result.err, result.err


def test_split_attention_keeps_the_float_graph_and_lets_the_projection_quantize(tmp_path):
    """A fused Attention with an additive attention bias (what the fusion writes for a
    padding mask) becomes MatMul + Split + MultiHeadAttention: same outputs, and dynamic
    quantization then runs the q/k/v projection as an integer kernel."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from pipeline.metrics import graph_check as check
    from pipeline.precision import dynamic

    rng = np.random.default_rng(0)
    d, heads = 32, 2
    inits = [numpy_helper.from_array(rng.standard_normal((d, d)).astype(np.float32), f"w{i}") for i in range(3)]
    inits.append(numpy_helper.from_array(rng.standard_normal(3 * d).astype(np.float32), "b"))
    nodes = [helper.make_node("Concat", ["w0", "w1", "w2"], ["w"], axis=1),  # as the fusion packs them
             helper.make_node("Attention", ["x", "w", "b", "", "", "bias"], ["y"], domain="com.microsoft",
                              num_heads=heads)]
    graph = helper.make_graph(nodes, "attn", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", d]),
        helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["B", 1, "S", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    src = tmp_path / "attn.onnx"
    onnx.save(model, str(src))
    out, names = dynamic.split_attention(src, tmp_path / "split.onnx")
    assert len(names) == 1
    mask = np.where(rng.random((2, 1, 8, 8)) < 0.2, -10000.0, 0.0).astype(np.float32)
    feeds = [{"x": rng.standard_normal((2, 8, d)).astype(np.float32), "bias": mask}]
    a = check.run(str(src), feeds, ["y"], optimize=True)[0]["y"]
    b = check.run(str(out), feeds, ["y"], optimize=True)[0]["y"]
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)
    quantize_dynamic(str(out), str(tmp_path / "q.onnx"), op_types_to_quantize=["MatMul"],
                     weight_type=QuantType.QInt8, extra_options={"DefaultTensorType": TensorProto.FLOAT})
    ops = [n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node]
    assert "MatMulInteger" in ops and "MultiHeadAttention" in ops and "Attention" not in ops


def test_excluded_matmuls_run_blockwise_int8_under_fallback_blockwise(int8_project, tmp_path, monkeypatch):
    """`fallback: blockwise`: an excluded MatMul runs as MatMulNBits (int8 weights per block,
    int8 activations per block of each row: accuracy_level 4) instead of float, close to it."""
    import onnx

    from pipeline import recipe as recipe_mod
    from pipeline.metrics import graph_check as check
    from pipeline.precision import qdq

    exported = int8_project.run("export", "mlp", *FAST)
    assert exported.code == 0, exported.err
    monkeypatch.chdir(int8_project.path)
    src = int8_project.engines / set_folder("mlp", *FAST) / "model.onnx"
    second = [n.name for n in onnx.load(str(src)).graph.node if n.op_type == "MatMul"][-1]  # GELU-fed
    runs = {}
    for fallback in ("float", "blockwise"):
        recipe = recipe_mod.load("mlp", (f"precision.fallback={fallback}", f"precision.exclude=[{second}]"))
        (tmp_path / fallback).mkdir()
        out, meta = qdq.apply(recipe, src, tmp_path / fallback)
        assert meta["fallback"] == fallback and meta["quantized_nodes"] == 1
        runs[fallback] = (out, meta["excluded"])
    out, excluded = runs["blockwise"]
    assert excluded == [{"node": second, "why": "recipe", "runs_as": "blockwise int8 (MatMulNBits)"}]
    assert runs["float"][1][0]["runs_as"] == "float"
    nbits = [n for n in onnx.load(str(out)).graph.node if n.op_type == "MatMulNBits"]
    assert [n.name for n in nbits] == [f"{second}_Q8"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in nbits[0].attribute}
    assert attrs["bits"] == 8 and attrs["accuracy_level"] == 4
    feeds = [{"input": np.random.default_rng(0).standard_normal((2, 16, 64)).astype(np.float32)}]
    reference = check.run(str(src), feeds, ["y"], optimize=True)[0]["y"]
    for fallback, (path, _) in runs.items():
        y = check.run(str(path), feeds, ["y"], optimize=True)[0]["y"]
        cosine = (y * reference).sum() / np.linalg.norm(y) / np.linalg.norm(reference)
        assert cosine > 0.999, (fallback, cosine)


def _padding_attention(tmp_path, masked: float = -1e9):
    """x [B, S, 32], attention_mask [B, S] int64 -> Attention with the additive bias a padding
    mask makes (0 kept, `masked` padding; [B, 1, S, S]), as the attention fusion writes it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    d = 32
    inits = [numpy_helper.from_array(rng.standard_normal((d, 3 * d)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(3 * d).astype(np.float32), "b"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([1, 2], np.int64), "axes"),
             numpy_helper.from_array(np.array(masked, np.float32), "masked"),
             numpy_helper.from_array(np.array(0.0, np.float32), "kept"),
             numpy_helper.from_array(np.array([1], np.int64), "one")]
    nodes = [helper.make_node("Equal", ["attention_mask", "zero"], ["pad"]),
             helper.make_node("Unsqueeze", ["pad", "axes"], ["pad4"]),
             helper.make_node("Where", ["pad4", "masked", "kept"], ["bias_row"]),
             helper.make_node("Shape", ["attention_mask"], ["batch"], start=0, end=1),
             helper.make_node("Shape", ["attention_mask"], ["length"], start=1, end=2),
             helper.make_node("Concat", ["batch", "one", "length", "length"], ["full"], axis=0),
             helper.make_node("Expand", ["bias_row", "full"], ["bias"]),
             helper.make_node("Attention", ["x", "w", "b", "", "", "bias"], ["y"], name="attn",
                              domain="com.microsoft", num_heads=2, qkv_hidden_sizes=[d, d, d])]
    graph = helper.make_graph(nodes, "attn", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", d]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    src = tmp_path / f"attn{masked:g}.onnx"
    onnx.save(model, str(src))
    return src


def test_key_mask_makes_a_padding_bias_attention_take_qattention(tmp_path):
    """An Attention whose bias is a key-padding mask takes the raw mask instead (mask_index):
    same outputs on padded rows, and ORT's quantizer then makes it one QAttention."""
    import onnx
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from pipeline.metrics import graph_check as check
    from pipeline.precision import key_mask

    src = _padding_attention(tmp_path)
    out, names = key_mask.to_key_mask(src, tmp_path / "masked.onnx")
    assert names == ["attn"]
    graph = onnx.load(str(out)).graph
    attn = next(n for n in graph.node if n.op_type == "Attention")
    assert list(attn.input) == ["x", "w", "b", "attention_mask__int32"]
    assert not any(a.name == "qkv_hidden_sizes" for a in attn.attribute)
    assert {n.op_type for n in graph.node} == {"Cast", "Attention"}  # the bias subgraph is gone
    rng = np.random.default_rng(1)
    mask = np.ones((3, 10), np.int64)
    mask[0, 6:] = mask[1, 3:] = 0  # right padding, as a tokenizer pads a batch
    feeds = [{"x": rng.standard_normal((3, 10, 32)).astype(np.float32), "attention_mask": mask}]
    a = check.run(str(src), feeds, ["y"], optimize=True)[0]["y"]
    b = check.run(str(out), feeds, ["y"], optimize=True)[0]["y"]
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)
    quantize_dynamic(str(out), str(tmp_path / "q.onnx"), op_types_to_quantize=["Attention"],
                     weight_type=QuantType.QInt8, extra_options={"DefaultTensorType": TensorProto.FLOAT})
    assert "QAttention" in [n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node]


def test_key_mask_leaves_a_bias_it_cannot_prove_is_padding(tmp_path):
    """A bias that is a float graph input, or masks with a value softmax would not zero out
    (-1 instead of <= -10000), keeps its Attention as it is."""
    from pipeline.precision import key_mask

    shallow = _padding_attention(tmp_path, masked=-1.0)
    assert key_mask.to_key_mask(shallow, tmp_path / "a.onnx")[1] == []
    import onnx

    model = onnx.load(str(shallow))
    model.graph.input[1].CopyFrom(onnx.helper.make_tensor_value_info(
        "bias", onnx.TensorProto.FLOAT, ["B", 1, "S", "S"]))
    del model.graph.node[:7]
    onnx.save(model, str(tmp_path / "input-bias.onnx"))
    assert key_mask.to_key_mask(tmp_path / "input-bias.onnx", tmp_path / "b.onnx")[1] == []
