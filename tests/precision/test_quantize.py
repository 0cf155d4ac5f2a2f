"""Precision in the graph: real quantization of the tiny GLM with ONNX Runtime's tools, real
sessions, and the CLI as a subprocess. One quantized run is shared (session fixture)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tests.conftest import FAST, Project, built

# The bar counts attention's float QK^T / PV products (measured 0.85 for the tiny flash model)
INT8 = ("--set", "precision.mode=int8", "--set", "precision.require_effective_precision=0.8",
        "--set", "validate.tolerance.cosine_min=0.99", "--set", "validate.tolerance.top1_min=0.8")


@pytest.fixture(scope="session")
def int8_flash(tmp_path_factory, built_flash) -> Project:
    """`pipeline run flash` with INT8 Q/DQ and an effective-precision gate (beside the fp32
    flash build, whose export it reuses)."""
    return built(tmp_path_factory, "int8", "flash", *INT8, *FAST, beside=built_flash)


def _report(proj: Project) -> dict:
    return json.loads((proj.built / "report.json").read_text())


def test_int8_run_reports_precision_calibration_and_effective_share(int8_flash):
    report = _report(int8_flash)
    p = report["precision"]
    assert p["mode"] == "int8" and p["symmetric"] and p["per_channel"]
    # all but the rotary fusion's angle table (positions [P, 1] @ inv_freq [1, d/2]): too small
    small = [e["node"] for e in p["excluded"] if e["why"].startswith("small")]
    assert len(small) == 1 and p["excluded"] == [{"node": small[0], "why": "small (a dimension < 16)", "runs_as": "float"}]
    assert p["quantized_nodes"] == p["quantizable_nodes"] - 1 > 0
    assert p["calibration"]["method"] == "minmax" and p["calibration"]["samples"] == 16
    assert p["calibration"]["seconds"] < 30  # tiny model: calibration + quantization
    assert p["parity_vs_fp32_graph"]["cosine"] > 0.99
    engine = next(e for e in report["engines"] if e["target"] == "onnxruntime")
    assert engine["precision"] == "int8"
    eff = engine["ort_flop_shares"]
    m = eff["mflops"]
    # every quantized MatMul runs as an integer kernel with a float output (inputs quantized,
    # outputs not: no requantization), cpu_pairs.py makes ORT fuse them all
    assert m["integer"] / (m["integer"] + m["fake_quantized"] + m["float"]) >= 0.999
    assert set(eff["by_op_mflops"]) <= {"MatMulIntegerToFloat", "MatMul", "MultiHeadAttention (QK^T, PV)"}
    assert eff["by_op_mflops"].get("MatMul", 0) < 0.001 * m["integer"]  # the angle table
    # attention's QK^T and PV run in float inside MultiHeadAttention and are in the share's
    # denominator: 2 layers x 4 * numel(out [2, 64, 64]) * key length 64 at the opt shape
    assert eff["feed_shapes"] == {"input_ids": [2, 64]}
    assert m["attention"] == pytest.approx(2 * 4 * (2 * 64 * 64) * 64 / 1e6, rel=1e-3)
    assert eff["integer_share"] == pytest.approx(m["integer"] / sum(m.values()), rel=1e-3)
    assert 0.8 < eff["integer_share"] < 0.9
    gate = next(g for g in engine["gates"] if g["name"] == "effective_precision")
    assert gate["passed"] and ">= 0.8" in gate["detail"] and "attention products included" in gate["detail"]
    md = (int8_flash.built / "report.md").read_text()
    assert "## Precision" in md and "Effective precision" in md
    assert "of matrix-multiply FLOPs in integer kernels, attention's QK^T and PV products included" in md


def test_int8_graph_is_symmetric_qdq_for_tensorrt(int8_flash):
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(int8_flash.built / "typed.onnx"))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert qdq
    for node in qdq:
        zero_point = inits[node.input[2]]
        assert zero_point.dtype == np.int8 and not zero_point.any(), node.name
    # TensorRT's placement: Q/DQ on the inputs of each quantized MatMul, none on its output
    consumers = {i: n for n in model.graph.node for i in n.input}
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    assert all(consumers.get(m.output[0]) is None or consumers[m.output[0]].op_type != "QuantizeLinear"
               for m in matmuls)


def test_auto_exclude_meets_a_tight_budget(int8_flash, tmp_path, monkeypatch):
    from pipeline import recipe as recipe_mod
    from pipeline.precision import qdq

    monkeypatch.chdir(int8_flash.path)
    tight = ("precision.mode=int8", "precision.sensitivity.enabled=true",
             "precision.sensitivity.auto_exclude=true", "precision.sensitivity.samples=2",
             "precision.sensitivity.budget.cosine_min=0.9999")
    recipe = recipe_mod.load("flash", tight)
    out, meta = qdq.apply(recipe, int8_flash.built / "model.onnx", tmp_path)
    sens = meta["sensitivity"]
    # every quantizable node is ranked, most harmful (lowest cosine) first
    cosines = [r["cosine"] for r in sens["ranking"]]
    assert len(cosines) == meta["quantizable_nodes"] and cosines == sorted(cosines) and cosines[0] < 1
    assert sens["fully_quantized"]["cosine"] < 0.9999  # the budget is tight: full INT8 misses it
    assert sens["auto_excluded"] and sens["met"] and sens["reached"]["cosine"] >= 0.9999
    # the most sensitive nodes are the ones kept in float, in ranking order
    ranked = [r["node"] for r in sens["ranking"]]
    assert sens["auto_excluded"] == ranked[: len(sens["auto_excluded"])]
    assert {e["node"] for e in meta["excluded"]} == set(sens["auto_excluded"])
    assert meta["quantized_nodes"] == meta["quantizable_nodes"] - len(sens["auto_excluded"])
    from pipeline.precision.report import markdown

    md = "\n".join(markdown({"mode": "int8", **meta}))
    assert "### Sensitivity" in md and "meets the budget" in md and sens["auto_excluded"][0] in md


def test_fp8_is_e4m3_qdq_and_runs_emulated(int8_flash, tmp_path, monkeypatch):
    import onnx

    from pipeline import recipe as recipe_mod
    from pipeline.precision import evaluate, qdq

    monkeypatch.chdir(int8_flash.path)
    recipe = recipe_mod.load("flash-fp8")
    assert recipe.precision.method == "distribution"
    src = int8_flash.built / "model.onnx"
    out, meta = qdq.apply(recipe, src, tmp_path)
    model = onnx.load(str(out))
    inits = {i.name: i for i in model.graph.initializer}
    zero_points = [inits[n.input[2]] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert zero_points and all(z.data_type == onnx.TensorProto.FLOAT8E4M3FN for z in zero_points)
    feed = [{"input_ids": np.arange(128, dtype=np.int64).reshape(2, 64)}]
    result = evaluate.compare(evaluate.run(src, feed, ["logits"]),
                              evaluate.run(out, feed, ["logits"], fp8=True), ["logits"])
    assert result.nonfinite == 0 and 0.9 < result.cosine < 1.0


def test_effective_precision_gate_fails_with_an_explanation(int8_flash):
    # Keep the FFN and head MatMuls in float: most FLOPs then run in float kernels.
    result = int8_flash.run("run", "flash", *INT8, *FAST, "--set",
                            "precision.exclude=['node_linear_([4-9]|1[1-4])']")
    assert result.code == 3, result.err
    assert "effective_precision" in result.err and "run in float, largest: node_linear" in result.err


def test_cast_fp16_keeps_io_and_block_list_and_bf16_retypes(int8_flash, tmp_path, monkeypatch):
    import onnx

    from pipeline import recipe as recipe_mod
    from pipeline.precision import cast, evaluate

    monkeypatch.chdir(int8_flash.path)
    src = int8_flash.built / "model.onnx"
    recipe = recipe_mod.load("flash", ("precision.mode=fp16",))
    out, meta = cast.apply(recipe, src, tmp_path)
    model = onnx.load(str(out))
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer)
    assert meta["fp32_nodes"] > 0 and meta["cast_nodes"] > 0
    feed = [{"input_ids": np.arange(64, dtype=np.int64).reshape(1, 64)}]
    ref, got = evaluate.run(src, feed, ["logits"]), evaluate.run(out, feed, ["logits"])
    assert evaluate.compare(ref, got, ["logits"]).cosine > 0.9999

    recipe = recipe_mod.load("flash", ("precision.mode=bf16",))
    bf16_dir = tmp_path / "bf16"
    bf16_dir.mkdir()
    out, _ = cast.apply(recipe, src, bf16_dir)
    model = onnx.load(str(out))
    onnx.checker.check_model(model)
    types = {i.data_type for i in model.graph.initializer}
    assert onnx.TensorProto.BFLOAT16 in types and onnx.TensorProto.FLOAT16 not in types


def _nbits_at(engine, level: int, out):
    """The engine with every MatMulNBits set to `accuracy_level` = level, saved to `out`."""
    import onnx

    model = onnx.load(str(engine))
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            (attr,) = [a for a in node.attribute if a.name == "accuracy_level"]
            attr.i = level
    onnx.save(model, str(out))
    return out


@pytest.fixture(scope="module")
def int4_engine(int8_flash, tmp_path_factory):
    """(typed graph, meta, ONNX Runtime engine) of the tiny flash model in INT4, built once."""
    import os

    from pipeline import recipe as recipe_mod
    from pipeline.backends.onnxruntime import build
    from pipeline.precision import int4

    folder, cwd = tmp_path_factory.mktemp("int4"), os.getcwd()
    os.chdir(int8_flash.path)
    try:
        recipe = recipe_mod.load("flash", ("precision.mode=int4", "precision.block_size=32"))
    finally:
        os.chdir(cwd)
    out, meta = int4.apply(recipe, int8_flash.built / "model.onnx", folder)
    engine, _ = build(out, recipe.targets[0], recipe, folder)
    return out, meta, engine


INT4_FEED = {"input_ids": np.arange(128, dtype=np.int64).reshape(2, 64) % 512}


def test_int4_is_blockwise_dq_that_ort_runs_as_matmulnbits(int4_engine, tmp_path):
    import onnx

    from pipeline.metrics import graph_check as check
    from pipeline.precision import effective
    from pipeline.precision.report import effective_markdown

    out, meta, engine = int4_engine
    model = onnx.load(str(out))
    dqs = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    assert len(dqs) == meta["quantized_nodes"] == meta["quantizable_nodes"] > 0
    inits = {i.name: i for i in model.graph.initializer}
    for dq in dqs:
        assert inits[dq.input[0]].data_type == onnx.TensorProto.INT4
        assert {a.name: a.i for a in dq.attribute}["block_size"] == 32
    eff = effective.measure(engine, INT4_FEED, tmp_path).dump()  # as the engine entry holds it
    # ORT's DQ -> MatMulNBits fusion writes accuracy_level 4: int8 activations, integer products
    nbits = eff["matmulnbits"]
    assert nbits["accuracy_levels"] == {"4": len(dqs)} and nbits["activations"] == ["int8"]
    assert "MatMulNBits (accuracy_level 4)" in eff["by_op_mflops"] and eff["mflops"]["integer"] > 0
    # attention's activation x activation MatMuls stay float in weight-only INT4
    assert 0.5 < eff["integer_share"] < 1.0
    md = "\n".join(effective_markdown(eff))
    assert "accuracy_level 4: activations quantized to int8 per block at run time" in md

    # What level 4 means, measured: level 0 computes exactly what the DequantizeLinear graph
    # says (fp32 products of dequantized weights); the shipped level 4 does not.
    level0 = _nbits_at(engine, 0, tmp_path / "level0.onnx")
    ref, got4, got0 = (check.run(str(p), [INT4_FEED], ["logits"], optimize=False)[0]["logits"]
                       for p in (out, engine, level0))  # as saved: the typed graph unfused
    assert np.abs(got0 - ref).max() < 1e-4 < 1e-2 < np.abs(got4 - ref).max()


def test_int4_at_accuracy_level_0_counts_as_float_and_fails_the_gate(int4_engine, tmp_path):
    """MatMulNBits computes in fp32 below accuracy_level 4: the op name alone proves nothing."""
    from pipeline.precision import effective
    from pipeline.precision.report import effective_markdown

    level0 = _nbits_at(int4_engine[2], 0, tmp_path / "level0.onnx")
    shares = effective.measure(level0, INT4_FEED, tmp_path)
    eff = shares.dump()  # as the engine entry holds it
    assert eff["matmulnbits"]["accuracy_levels"] == {"0": eff["matmulnbits"]["nodes"]}
    assert eff["mflops"]["integer"] == 0 and eff["integer_share"] == 0.0
    assert eff["mflops"]["float"] > 0 and "MatMulNBits (accuracy_level 0)" in eff["by_op_mflops"]
    assert {n["kind"] for n in eff["largest_non_integer"] if n["op"].startswith("MatMulNBits")} == {"float"}
    gate = effective.gate(shares, 0.5)
    assert not gate.passed and "MatMulNBits below accuracy_level 4" in gate.detail
    assert "accuracy_level 0: weights dequantized, products in fp32" in "\n".join(effective_markdown(eff))


# ------------------------------------------------------------------ bad input: exit 2, nothing written
def _calibration_file(proj: Project, arrays: dict) -> str:
    path = proj.path / "cal.npz"
    np.savez(path, **arrays)
    return "data.calibration.file=cal.npz"


BAD_CALIBRATION = [
    ({"tokens": np.zeros((4, 2, 64), np.int64)}, "has inputs ['tokens'], the recipe declares ['input_ids']"),
    ({"input_ids": np.zeros((4, 2, 999), np.int64)}, "has shape [2, 999], outside the recipe's [1..8, 1..128]"),
    ({"input_ids": np.zeros((4, 2, 64), np.float32)}, "is float32, the recipe declares int64"),
]


@pytest.mark.parametrize("arrays, expected", BAD_CALIBRATION)
def test_bad_calibration_file_is_exit_2_and_nothing_written(project, arrays, expected):
    setting = _calibration_file(project, arrays)
    result = project.run("quantize", "flash", "--set", "precision.mode=int8", "--set", setting)
    assert result.code == 2, result.err
    assert len(result.error_lines) == 1 and "Traceback" not in result.err
    assert "data.calibration.file cal.npz: feed 0" in result.err and expected in result.err
    assert project.snapshot() == {}


def test_int8_without_calibration_data_is_exit_2(project):
    result = project.run("quantize", "flash", "--set", "precision.mode=int8",
                         "--set", "data.calibration=null")
    assert result.code == 2, result.err
    assert "precision.mode int8 needs calibration data" in result.error_lines[0]
    assert project.snapshot() == {}


def test_exclusion_matching_nothing_is_exit_2_and_changes_nothing(int8_flash):
    before = int8_flash.snapshot()
    result = int8_flash.run("quantize", "flash", *INT8, *FAST, "--set", "precision.exclude=['no_such_node.*']")
    assert result.code == 2, result.err
    assert len(result.error_lines) == 1 and "Traceback" not in result.err
    assert "precision.exclude: `no_such_node.*` matches no quantizable node" in result.err
    assert "node_linear" in result.err  # it shows what node names look like
    after = int8_flash.snapshot()  # (the --set values' own folder holds its export and passes)
    assert {k: after[k] for k in before} == before  # earlier artifacts untouched
    assert not [k for k in set(after) - set(before) if "typed" in k]  # no precision output


def test_calibration_from_a_loader_and_a_good_npz(project, monkeypatch):
    from pipeline import data
    from pipeline import recipe as recipe_mod

    project.write("calib_data.py", "import numpy as np\n"
                  "def feeds():\n    return [{'input_ids': np.full((1, 16), i, np.int64)} for i in range(3)]\n")
    monkeypatch.chdir(project.path)
    monkeypatch.syspath_prepend(str(project.path))
    recipe = recipe_mod.load("flash", ("precision.mode=int8", "data.calibration.loader=calib_data:feeds"))
    got = data.calibration_feeds(recipe)
    assert len(got) == 3 and got[2]["input_ids"][0, 0] == 2
    np.savez(project.path / "good.npz", input_ids=np.ones((5, 2, 32), np.int64))
    recipe = recipe_mod.load("flash", ("precision.mode=int8", "data.calibration.file=good.npz",
                                        "data.calibration.samples=4"))
    got = data.calibration_feeds(recipe)
    assert len(got) == 4 and got[0]["input_ids"].shape == (2, 32)
    # validation feeds never equal a calibration feed, whatever the source
    taken = {f["input_ids"].tobytes() for f in got}
    assert all(f["input_ids"].tobytes() not in taken for f in data.feeds(recipe, "validation"))


@pytest.mark.parametrize("overrides, expected", [
    (("precision.mode=fp8", "precision.calibration=minmax"), "fp8 needs calibration: distribution"),
    (("precision.mode=fp16", "precision.require_effective_precision=0.9"), "integer modes"),
    (("precision.mode=int8", "precision.exclude=['(']"), "not a valid regex"),
    (("precision.mode=int4", "precision.block_size=48"), "power of two"),
    (("precision.mode=int4", "precision.int4_method=gptq", "data.calibration=null"),
     "int4_method gptq needs calibration data"),
])
def test_precision_cross_checks_fail_at_load(project, overrides, expected):
    args = [a for o in overrides for a in ("--set", o)]
    result = project.run("quantize", "flash", *args)
    assert result.code == 2 and expected in result.err and project.snapshot() == {}


def test_precision_command_is_listed_and_quantize_is_its_alias():
    """One name in --help (`precision`); `quantize`, the old name, still runs it."""
    import subprocess

    from tests.conftest import ROOT

    listed = subprocess.run([sys.executable, "-m", "pipeline", "--help"], capture_output=True,
                            text=True, cwd=ROOT)
    alias = subprocess.run([sys.executable, "-m", "pipeline", "quantize", "--help"],
                           capture_output=True, text=True, cwd=ROOT)
    assert "precision" in listed.stdout and " quantize " not in listed.stdout
    assert alias.returncode == 0 and "Usage: pipeline quantize" in alias.stdout


def test_int4_hqq_writes_asymmetric_matmulnbits_closer_to_the_weights_than_rtn(int8_flash, int4_engine, tmp_path):
    """precision.int4_method: hqq (ONNX Runtime's Half-Quadratic quantizer, no calibration data):
    every quantizable MatMul becomes MatMulNBits with zero points, and the logits move less from
    the FP32 graph's than under symmetric RTN (the int4_engine fixture) on the same feed."""
    import os

    import onnx

    from pipeline import recipe as recipe_mod
    from pipeline.metrics import graph_check as check
    from pipeline.precision import effective, int4

    cwd = os.getcwd()
    os.chdir(int8_flash.path)
    try:
        recipe = recipe_mod.load("flash", ("precision.mode=int4", "precision.block_size=32", "precision.int4_method=hqq"))
    finally:
        os.chdir(cwd)
    out, meta = int4.apply(recipe, int8_flash.built / "model.onnx", tmp_path)
    assert meta["method"] == "hqq" and meta["symmetric"] is False
    nbits = [n for n in onnx.load(str(out)).graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == meta["quantized_nodes"] == meta["quantizable_nodes"] > 0
    assert all(len(n.input) >= 4 and n.input[3] for n in nbits)  # zero points: asymmetric blocks
    # its zero points are float: ONNX Runtime runs such nodes dequantized in fp32 whatever their
    # accuracy_level, and the effective-precision report says so (not "integer")
    summary = effective.accuracy_levels(out)
    assert summary.accuracy_levels == {"float_zero_points": len(nbits)} and summary.activations == ["fp32"]
    assert "whatever the node's accuracy_level" in summary.compute
    fp32 = int8_flash.built / "model.onnx"
    ref, hqq, rtn = (check.run(str(p), [INT4_FEED], ["logits"], optimize=False)[0]["logits"]
                     for p in (fp32, out, int4_engine[0]))
    assert np.abs(hqq - ref).mean() < np.abs(rtn - ref).mean()


def test_int4_hqq_uint8_keeps_hqqs_blocks_with_integer_zero_points_on_the_fast_path(int8_flash, int4_engine, tmp_path):
    """precision.int4_method: hqq_uint8: the same MatMulNBits as hqq, but with uint8 zero points
    and accuracy_level 4, so ONNX Runtime runs them on MLAS' integer path (the effective precision
    says int8 activations); the logits still move less than under symmetric RTN."""
    import os

    import onnx
    from onnx import TensorProto

    from pipeline import recipe as recipe_mod
    from pipeline.metrics import graph_check as check
    from pipeline.precision import effective, int4

    cwd = os.getcwd()
    os.chdir(int8_flash.path)
    try:
        recipe = recipe_mod.load("flash", ("precision.mode=int4", "precision.block_size=32",
                                           "precision.int4_method=hqq_uint8"))
    finally:
        os.chdir(cwd)
    out, meta = int4.apply(recipe, int8_flash.built / "model.onnx", tmp_path)
    assert meta["method"] == "hqq_uint8" and meta["integer_zero_nodes"] == meta["quantized_nodes"] > 0
    errors = meta["relative_l2_error"]
    assert 0 < errors["float_zero_points"] <= errors["uint8_zero_points"] < 1.1 * errors["float_zero_points"]
    model = onnx.load(str(out))
    inits = {i.name: i for i in model.graph.initializer}
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert all(inits[n.input[3]].data_type == TensorProto.UINT8 for n in nbits)
    summary = effective.accuracy_levels(out)
    assert summary.accuracy_levels == {"4": len(nbits)} and summary.activations == ["int8"]
    fp32 = int8_flash.built / "model.onnx"
    ref, ours, rtn = (check.run(str(p), [INT4_FEED], ["logits"], optimize=False)[0]["logits"]
                      for p in (fp32, out, int4_engine[0]))
    assert np.abs(ours - ref).mean() < np.abs(rtn - ref).mean()
