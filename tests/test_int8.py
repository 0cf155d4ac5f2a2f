"""INT8 on ONNX Runtime: convolutions in integer kernels, the dynamic scheme, SmoothQuant,
the weight range and the recipe checks. Tiny models built in code, real sessions, the CLI
as a subprocess."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import FAST, Project, set_folder


def tiny_cnn(seed: int = 0):
    """x [B, 3, 16, 16] -> logits [B, 10]: Conv 3->16, Conv 16->32 (ReLU), mean pool, Linear."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).eval()


def tiny_mlp(seed: int = 0):
    """x [B, T, 64] -> y [B, T, 64]: LayerNorm, Linear 64->128, GELU, Linear 128->64."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).eval()


CNN = """\
description: tiny CNN, INT8 convolutions
model: {factory: "tests.test_int8:tiny_cnn"}
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
model: {factory: "tests.test_int8:tiny_mlp"}
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
    eff = engine["effective_precision"]
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
    kinds = {n["op"]: n["kind"] for n in eff["largest_non_integer"]}
    assert "fake_quantized" in kinds.values() and any("Conv" in op for op in kinds), kinds
    gate = effective.gate(eff, 0.9)
    assert not gate["passed"] and "Conv" in gate["detail"], gate
    assert helper  # the graph above was edited with onnx's own protos


def test_dynamic_int8_needs_no_calibration_and_runs_integer(int8_project):
    result = int8_project.run("run", "mlp", *FAST)
    assert result.code == 0, result.err
    report = _report(int8_project, "mlp")
    engine = report["engines"][0]
    assert engine["effective_precision"]["by_op_mflops"].get("DynamicQuantizeMatMul", 0) > 0
    assert engine["effective_precision"]["integer_share"] >= 0.9
    precision = json.loads((int8_project.engines / set_folder("mlp", *FAST) / "manifest.json").read_text())
    meta = precision["stages"]["precision"]["meta"]
    assert meta["scheme"] == "dynamic" and meta["calibration"] is None and meta["quantized_nodes"] == 2
    assert "scheme: **dynamic**" in (int8_project.engines / set_folder("mlp", *FAST) / "report.md").read_text()


def test_smoothing_is_exact_in_float_and_moves_outliers_into_weights(int8_project, tmp_path):
    import onnx
    from onnx import numpy_helper

    from pipeline.passes import check
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

    from pipeline.passes import check
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
