"""`pipeline deploy --triton` on a real build: real files, real sha256s, config.pbtxt parsed with Triton's own model-config schema, the deployed engine
opened in a real ONNX Runtime session."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from tests.conftest import FAST, STANDARD, Project

model_config_pb2 = pytest.importorskip(
    "tritonclient.grpc.model_config_pb2",
    reason="Triton's model-config schema comes with tritonclient[grpc] (the `dev` extra)",
)
text_format = pytest.importorskip("google.protobuf.text_format")


def _copy(built: Project, tmp_path) -> Project:
    proj = Project(tmp_path / "copy")
    shutil.copytree(built.engines, proj.engines)
    return proj


def _flip_a_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _parse(path):
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_deploy_writes_a_triton_repository_matching_the_recipe(built_standard, tmp_path):
    from pipeline import recipe as recipe_mod

    out = tmp_path / "models"
    result = built_standard.run("deploy", "standard", "--triton", str(out), *FAST)
    assert result.code == 0, result.err
    model = out / "standard-onnxruntime"
    assert sorted(p.relative_to(model).as_posix() for p in model.rglob("*") if p.is_file()) == [
        "1/engine.json", "1/model.onnx", "config.pbtxt"]

    config = _parse(model / "config.pbtxt")
    recipe = recipe_mod.load(built_standard.path / "recipes" / "standard.yaml")
    (spec,) = recipe.inputs
    assert config.name == "standard-onnxruntime" and config.platform == "onnxruntime_onnx"
    # the recipe's first dim is the shared dynamic `batch` dim: Triton owns it
    assert config.max_batch_size == spec.shape[0].max == 8
    assert [i.name for i in config.input] == [i.name for i in recipe.inputs]
    DataType = model_config_pb2.DataType
    assert DataType.Name(config.input[0].data_type) == "TYPE_INT64" == f"TYPE_{spec.dtype.upper()}"
    assert list(config.input[0].dims) == [-1]  # dynamic sequence, batch left out
    assert [o.name for o in config.output] == recipe.outputs
    assert DataType.Name(config.output[0].data_type) == "TYPE_FP32"
    assert list(config.output[0].dims) == [-1, 512]  # sequence, vocabulary
    assert config.HasField("dynamic_batching") and 2 in config.dynamic_batching.preferred_batch_size
    (group,) = config.instance_group
    assert model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind) == "KIND_CPU" and group.count == 1
    assert config.optimization.graph.level == 2  # serve the validated graph as it is

    # the deployed file is the validated engine, and it really has the I/O the config says
    report = json.loads((built_standard.engines / STANDARD / "report.json").read_text())
    engine_sha = report["engines"][0]["sha256"]
    assert hashlib.sha256((model / "1" / "model.onnx").read_bytes()).hexdigest() == engine_sha
    assert json.loads((model / "1" / "engine.json").read_text())["sha256"] == engine_sha
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type) for i in session.get_inputs()] == [("input_ids", "tensor(int64)")]
    assert [(o.name, o.type) for o in session.get_outputs()] == [("logits", "tensor(float)")]
    batch = np.zeros((3, 5), dtype=np.int64)  # 3 requests of 5 tokens, batched by Triton
    (logits,) = session.run(None, {"input_ids": batch})
    assert logits.shape == (3, 5, *[d for d in config.output[0].dims if d != -1])


def test_deploy_refuses_a_changed_engine_and_writes_nothing(built_standard, tmp_path):
    proj = _copy(built_standard, tmp_path)
    _flip_a_byte(proj.engines / STANDARD / "onnxruntime.onnx")
    out = tmp_path / "models"
    result = proj.run("deploy", "standard", "--triton", str(out), *FAST)
    assert result.code == 5, result.err
    assert len(result.error_lines) == 1 and "onnxruntime.onnx: sha256" in result.error_lines[0]
    assert not out.exists()


def test_deploy_refuses_engines_of_another_recipe_version(built_standard, standard_copy, tmp_path):
    out = tmp_path / "models"
    # without FAST's --set: the plain recipe's folder, which was never built
    result = built_standard.run("deploy", "standard", "--triton", str(out))
    assert result.code == 2 and len(result.error_lines) == 1
    assert "engines/standard/report.json: not found" in result.error_lines[0]
    # the recipe file edited since the build: the folder holds another version of it
    recipe = standard_copy.path / "recipes" / "standard.yaml"
    recipe.write_text(recipe.read_text().replace("description: ", "description: edited, ", 1))
    result = standard_copy.run("deploy", "standard", "--triton", str(out), *FAST)
    assert result.code == 2 and len(result.error_lines) == 1
    assert "different version of recipe `standard`" in result.error_lines[0]
    assert not out.exists()
    unknown = built_standard.run("deploy", "standard", "--triton", str(out), *FAST, "--target", "trt")
    assert unknown.code == 2 and "--target trt: no such target" in unknown.error_lines[0]


def test_deploy_refuses_an_engine_that_failed_a_gate(built_standard, tmp_path):
    proj = _copy(built_standard, tmp_path)
    strict = (*FAST, "--set", "validate.tolerance.max_abs=1e-12")  # no fp32 engine meets this
    assert proj.run("run", "standard", *strict).code == 3
    out = tmp_path / "models"
    refused = proj.run("deploy", "standard", "--triton", str(out), *strict)
    assert refused.code == 3 and len(refused.error_lines) == 1, refused.err
    assert "failed their gates: onnxruntime: logits.max_abs" in refused.error_lines[0]
    assert not out.exists()
    allowed = proj.run("deploy", "standard", "--triton", str(out), *strict, "--allow-failed-gates")
    assert allowed.code == 0, allowed.err
    assert (out / "standard-onnxruntime" / "1" / "model.onnx").is_file()


def test_unbatched_recipe_gets_full_dims_and_no_batching(built_standard):
    from pipeline import recipe as recipe_mod
    from pipeline.commands import deploy

    # a fixed batch of 2: Triton must not batch, every dim is in the config
    recipe = recipe_mod.load(built_standard.path / "recipes" / "standard.yaml", ["inputs.0.shape.0=2"])
    max_batch, inputs, outputs = deploy.tensors(recipe, built_standard.engines / STANDARD / "model.onnx")
    assert max_batch == 0
    assert inputs[0].dims == [2, -1] and outputs[0].dims == [-1, -1, 512]
    config = _parse_text(deploy.config_pbtxt("m", "onnxruntime", False, max_batch, inputs, outputs))
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert list(config.input[0].dims) == [2, -1]


def test_tensorrt_config_uses_the_plan_platform_gpu_and_cuda_graphs(built_standard):
    # No TensorRT engine can be built here; the config a .plan gets is checked up to that
    # boundary against the real schema, with the real recipe and the real exported graph.
    from pipeline import backends
    from pipeline import recipe as recipe_mod
    from pipeline.commands import deploy

    recipe = recipe_mod.load(built_standard.path / "recipes" / "standard.yaml")
    max_batch, inputs, outputs = deploy.tensors(recipe, built_standard.engines / STANDARD / "model.onnx")
    config = _parse_text(deploy.config_pbtxt("standard-tensorrt", "tensorrt", True, max_batch, inputs,
                                             outputs, instances=2, opt_batch=2))
    assert config.platform == "tensorrt_plan" and config.max_batch_size == 8
    assert model_config_pb2.ModelInstanceGroup.Kind.Name(config.instance_group[0].kind) == "KIND_GPU"
    assert config.instance_group[0].count == 2
    assert config.optimization.cuda.graphs
    (spec,) = config.optimization.cuda.graph_spec
    assert spec.batch_size == 2 and list(spec.input["input_ids"].dim) == [64]  # the opt point
    assert backends.get("tensorrt").TRITON.model_file == "model.plan"
    assert deploy._kind(recipe, {"target": "tensorrt", "kind": "tensorrt"}) == "tensorrt"  # the recipe's


def _parse_text(text: str):
    return text_format.Parse(text, model_config_pb2.ModelConfig())
