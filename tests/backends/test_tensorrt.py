"""TensorRT target up to the TensorRT boundary: the recipe's Polygraphy loader chain built with
Polygraphy's real classes, the rebuild command lines (parsed back by Polygraphy's own CLI),
the compatibility refusal, layer truth from an inspector JSON, and the skipped / required paths.
Where TensorRT runs, tests/backends/test_tensorrt_gpu.py builds and runs real engines."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from polygraphy.backend.trt import CreateConfig, EngineFromNetwork, NetworkFromOnnxPath, SaveEngine

from pipeline import recipe as recipe_mod
from pipeline.backends import tensorrt as trt_backend
from pipeline.backends import tensorrt_layers
from pipeline.core.errors import InputError, RecipeError
from tests.conftest import STANDARD

H200 = {"tensorrt": "10.8.0.43", "gpu": "NVIDIA H200", "compute_capability": "9.0"}
TWO_PROFILES = ("targets.1.profiles=[{batch: {min: 1, opt: 1, max: 1}, "
                "sequence: {min: 1, opt: 16, max: 32}}]")


def symbolic(kind: str, name: str) -> str:
    """TensorRT enum members by name, spelt the way Polygraphy's CLI spells them."""
    return f"trt.{kind}.{name}"


@pytest.fixture
def trt_plan(project, monkeypatch, tmp_path):
    monkeypatch.chdir(project.path)
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "cache"))
    recipe = recipe_mod.load("standard", [
        TWO_PROFILES, "targets.1.optimization_level=4", "targets.1.workspace_mib=512",
        "targets.1.tactic_shared_memory_kib=48", "targets.1.hardware_compatibility=ampere_plus"])
    target = recipe.targets[1]
    assert target.kind == "tensorrt"
    return trt_backend.plan(tmp_path / "model.onnx", tmp_path / "tensorrt.plan", recipe, target, H200)


def test_loader_chain_is_polygraphy_with_the_recipe_settings(trt_plan, tmp_path):
    chain = trt_backend.loaders(trt_plan, enum=symbolic)
    assert isinstance(chain, SaveEngine) and chain.path == str(tmp_path / "tensorrt.plan")
    build = chain._engine
    assert isinstance(build, EngineFromNetwork)
    network, config = build._network, build._config
    assert isinstance(network, NetworkFromOnnxPath) and network.strongly_typed is True
    assert network.path == str(tmp_path / "model.onnx")
    assert network.flags == ["trt.OnnxParserFlag.NATIVE_INSTANCENORM"]  # hardware compatibility
    assert isinstance(config, CreateConfig)
    # Profile 0: the inputs' own min/opt/max; profile 1: batch 1, sequence up to 32.
    (p0, p1) = config.profiles
    assert tuple(map(list, p0["input_ids"])) == ([1, 1], [2, 64], [8, 128])
    assert tuple(map(list, p1["input_ids"])) == ([1, 1], [1, 16], [1, 32])
    assert config.builder_optimization_level == 4
    assert config.tf32 is False  # what the trtexec line's --noTF32 mirrors
    assert config.memory_pool_limits == {"trt.MemoryPoolType.WORKSPACE": 512 << 20,
                                         "trt.MemoryPoolType.TACTIC_SHARED_MEMORY": 48 << 10}
    assert config.hardware_compatibility_level == "trt.HardwareCompatibilityLevel.AMPERE_PLUS"
    assert config.profiling_verbosity == "trt.ProfilingVerbosity.DETAILED"
    # No precision flags: a strongly typed network takes its types from the ONNX graph.
    assert not (config.fp16 or config.int8 or config.fp8 or config.bf16 or config.tf32)
    # Timing cache loaded and saved at the same per-GPU, per-TensorRT-version file.
    cache = tmp_path / "cache" / "tensorrt" / "timing-nvidia-h200-sm9.0-trt10.8.0.43.cache"
    assert config.timing_cache_path == build.timing_cache_path == str(cache)


def test_timing_cache_is_kept_per_gpu_and_tensorrt_version(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path))
    paths = {trt_backend.timing_cache_path(v, g, cc)
             for v, g, cc in [("10.8.0", "NVIDIA H200", "9.0"), ("10.9.0", "NVIDIA H200", "9.0"),
                              ("10.8.0", "NVIDIA A100-SXM4-80GB", "8.0")]}
    assert len(paths) == 3 and all(p.parent == tmp_path / "tensorrt" for p in paths)


def test_defaults_one_profile_no_pools_no_compatibility(project, monkeypatch, tmp_path):
    monkeypatch.chdir(project.path)
    recipe = recipe_mod.load("standard", ["targets.1.timing_cache=false"])
    p = trt_backend.plan(tmp_path / "m.onnx", tmp_path / "e.plan", recipe, recipe.targets[1], H200)
    config = trt_backend.loaders(p, enum=symbolic)._engine._config
    assert len(config.profiles) == 1 and config.memory_pool_limits is None
    assert config.hardware_compatibility_level is None and config.timing_cache_path is None
    assert config.builder_optimization_level == 3


def test_polygraphy_command_parses_back_to_the_same_settings(trt_plan):
    """The recorded `polygraphy convert` line, read by Polygraphy's own argument parser."""
    from polygraphy.tools.args import TrtConfigArgs, TrtLoadEngineBytesArgs, TrtLoadNetworkArgs
    from polygraphy.tools.convert.convert import Convert

    cmd = trt_backend.polygraphy_command(trt_plan)
    assert cmd[:2] == ["polygraphy", "convert"]
    tool = Convert()
    tool.parse(tool.setup_parser().parse_args(cmd[2:]))
    cfg = tool.arg_groups[TrtConfigArgs]
    assert [{k: tuple(map(tuple, v)) for k, v in d.items()} for d in cfg.profile_dicts] == \
        trt_plan.profiles
    assert {str(k): v for k, v in cfg.memory_pool_limits.items()} == \
        {"trt.MemoryPoolType.WORKSPACE": 512 << 20, "trt.MemoryPoolType.TACTIC_SHARED_MEMORY": 48 << 10}
    assert cfg.builder_optimization_level == 4
    assert str(cfg.hardware_compatibility_level) == "trt.HardwareCompatibilityLevel.AMPERE_PLUS"
    assert str(cfg.profiling_verbosity) == "trt.ProfilingVerbosity.DETAILED"
    assert cfg.load_timing_cache == str(trt_plan.timing_cache)
    assert tool.arg_groups[TrtLoadNetworkArgs].strongly_typed is True
    assert tool.arg_groups[TrtLoadEngineBytesArgs].save_timing_cache == str(trt_plan.timing_cache)


def test_trtexec_command(trt_plan):
    cmd = trt_backend.trtexec_command(trt_plan)
    cache = trt_plan.timing_cache
    assert cmd == [
        "trtexec", f"--onnx={trt_plan.onnx}", f"--saveEngine={trt_plan.engine}", "--stronglyTyped",
        "--noTF32",
        "--profile=0",
        "--minShapes=input_ids:1x1", "--optShapes=input_ids:2x64", "--maxShapes=input_ids:8x128",
        "--profile=1",
        "--minShapes=input_ids:1x1", "--optShapes=input_ids:1x16", "--maxShapes=input_ids:1x32",
        "--builderOptimizationLevel=4", "--memPoolSize=workspace:512M,tacticSharedMem:48K",
        "--hardwareCompatibilityLevel=ampere+", f"--timingCacheFile={cache}",
        "--profilingVerbosity=detailed",
    ]
    lines = trt_backend.command_lines(trt_plan, "tensorrt.inspector.json")
    assert "--onnx=model.onnx --saveEngine=tensorrt.plan" in lines.trtexec
    assert lines.trtexec.endswith("--exportLayerInfo=tensorrt.inspector.json")
    assert lines.polygraphy.startswith("polygraphy convert model.onnx --convert-to trt -o tensorrt.plan")


def test_build_records_strong_typing_from_the_plan_that_builds(trt_plan):
    """One source of truth: the plan's strongly_typed drives the loaders, both command lines
    and the recorded meta (it was hard-coded True in the meta)."""
    import dataclasses

    for typed in (True, False):
        p = dataclasses.replace(trt_plan, strongly_typed=typed)
        meta = trt_backend.build_meta(p, recipe_mod.TensorRTTarget(), H200, 1.5, "t.inspector.json")
        assert meta["strongly_typed"] is typed
        assert trt_backend.loaders(p, enum=symbolic)._engine._network.strongly_typed is typed
        assert ("--stronglyTyped" in meta["commands"]["trtexec"]) is typed
        assert ("--strongly-typed" in meta["commands"]["polygraphy"]) is typed
    assert meta["profiles"][1] == {"input_ids": [[1, 1], [1, 16], [1, 32]]}
    assert meta["commands"]["trtexec"].endswith("--exportLayerInfo=t.inspector.json")


def test_trtexec_command_with_one_profile_has_no_profile_index(project, monkeypatch, tmp_path):
    monkeypatch.chdir(project.path)
    recipe = recipe_mod.load("standard")
    p = trt_backend.plan(tmp_path / "model.onnx", tmp_path / "tensorrt.plan", recipe, recipe.targets[1], H200)
    cmd = trt_backend.trtexec_command(p)
    assert not any(c.startswith("--profile=") for c in cmd)
    assert [c for c in cmd if "Shapes=" in c] == [
        "--minShapes=input_ids:1x1", "--optShapes=input_ids:2x64", "--maxShapes=input_ids:8x128"]


def test_trtexec_command_for_a_static_model_passes_no_shapes(project, monkeypatch, tmp_path):
    """trtexec refuses --minShapes/--optShapes/--maxShapes for a network without dynamic dims
    ("Static model does not take explicit shapes ..."); Polygraphy's build keeps its profile."""
    monkeypatch.chdir(project.path)
    recipe = recipe_mod.load("standard", ["inputs.0.shape=[2, 64]"])
    p = trt_backend.plan(tmp_path / "model.onnx", tmp_path / "tensorrt.plan", recipe, recipe.targets[1], H200)
    assert p.static_shapes and p.profiles == [{"input_ids": ((2, 64), (2, 64), (2, 64))}]
    cmd = trt_backend.trtexec_command(p)
    assert not [c for c in cmd if "Shapes=" in c or c.startswith("--profile=")]
    assert cmd[:5] == ["trtexec", f"--onnx={p.onnx}", f"--saveEngine={p.engine}", "--stronglyTyped",
                       "--noTF32"]
    (profile,) = trt_backend.loaders(p, enum=symbolic)._engine._config.profiles
    assert tuple(map(list, profile["input_ids"])) == ([2, 64], [2, 64], [2, 64])
    # one dynamic dim, even with min = opt = max, keeps the shapes: the export makes it dynamic
    recipe = recipe_mod.load("standard", ["inputs.0.shape=[2, {min: 64, opt: 64, max: 64}]"])
    p = trt_backend.plan(tmp_path / "model.onnx", tmp_path / "tensorrt.plan", recipe, recipe.targets[1], H200)
    assert not p.static_shapes
    assert "--optShapes=input_ids:2x64" in trt_backend.trtexec_command(p)


@pytest.mark.parametrize("current, hardware_compatible, refused", [
    (H200, False, False),
    ({**H200, "tensorrt": "10.9.0.34"}, False, True),
    ({**H200, "gpu": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}, False, True),
    ({**H200, "gpu": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}, True, False),
    ({**H200, "gpu": "Tesla T4", "compute_capability": "7.5"}, True, True),
    ({**H200, "gpu": "Orin", "compute_capability": "8.7"}, True, True),  # Jetson: no ampere_plus
    ({"tensorrt": None, "gpu": None, "compute_capability": None}, False, True),
])
def test_engine_from_another_gpu_or_tensorrt_is_refused(tmp_path, current, hardware_compatible, refused):
    engine = tmp_path / "tensorrt.plan"
    if not refused:
        trt_backend.check_compatible(engine, H200, current, hardware_compatible)
        return
    with pytest.raises(InputError) as err:
        trt_backend.check_compatible(engine, H200, current, hardware_compatible)
    message = str(err.value)
    assert "built with TensorRT 10.8.0.43 on NVIDIA H200 (sm 9.0)" in message
    assert f"this machine has TensorRT {current['tensorrt'] or 'not installed'}" in message
    assert (current["gpu"] or "no GPU") in message and "rebuild" in message


def test_open_refuses_before_touching_a_gpu(tmp_path, monkeypatch):
    """The sidecar written at build time names the builder; open() compares it with here()."""
    engine = tmp_path / "tensorrt.plan"
    engine.write_bytes(b"not read: refused first")
    _, info = trt_backend.sidecars(engine)
    info.write_text(json.dumps({"built_with": H200}))
    target = recipe_mod.TensorRTTarget()
    with pytest.raises(InputError, match="NVIDIA H200"):
        trt_backend.open(engine, target)


# ----------------------------------------------------------------------------- runner at the boundary
class EngineQueries:
    """Stands in for the part of trt.ICudaEngine the runner queries about profiles:
    num_optimization_profiles and get_tensor_profile_shape(name, index) -> [min, opt, max]."""

    def __init__(self, profiles: list[dict[str, tuple]]):
        self.profiles = profiles
        self.num_optimization_profiles = len(profiles)

    def get_tensor_profile_shape(self, name, index):
        return [list(s) for s in self.profiles[index][name]]


class ContextCalls:
    """Stands in for trt.IExecutionContext's profile and address calls, recording them."""

    def __init__(self, refuse: str | None = None):
        self.active_optimization_profile, self.switches, self.addresses = 0, [], {}
        self.refuse = refuse

    def set_optimization_profile_async(self, index, stream_handle):
        self.switches.append(index)
        self.active_optimization_profile = index
        return True

    def set_tensor_address(self, name, address):
        self.addresses[name] = address
        return name != self.refuse


# profile 0: the inputs' full range (batch 1..8, sequence 1..128, opt 2x64); 1: batch-1 decode
# up to 32 tokens (opt 1x16); 2: long prompts (opt 2x128)
FULL = {"input_ids": ((1, 1), (2, 64), (8, 128))}
DECODE = {"input_ids": ((1, 1), (1, 16), (1, 32))}
LONG = {"input_ids": ((1, 64), (2, 128), (8, 128))}


def test_runner_chooses_the_profile_tuned_nearest_the_shapes():
    from pipeline.backends.tensorrt_runner import choose_profile
    from pipeline.core.errors import StageFailed

    engine = EngineQueries([FULL, DECODE, LONG])
    shapes = lambda b, s: {"input_ids": (b, s)}  # noqa: E731
    assert choose_profile(engine, shapes(1, 20)) == 1  # both 0 and 1 hold it: 1 was tuned for it
    assert choose_profile(engine, shapes(1, 1)) == 1
    assert choose_profile(engine, shapes(2, 64)) == 0  # 0's own opt, though 2 holds it too
    assert choose_profile(engine, shapes(2, 120)) == 2
    assert choose_profile(engine, shapes(8, 40)) == 0  # only the full range holds batch 8
    # equal distance to opt: the narrower range wins; equal everything: the lower index
    assert choose_profile(EngineQueries([FULL, {"input_ids": ((1, 1), (2, 64), (4, 64))}]),
                          shapes(2, 64)) == 1
    assert choose_profile(EngineQueries([DECODE, DECODE]), shapes(1, 8)) == 0
    with pytest.raises(StageFailed, match=r"outside every optimization profile"):
        choose_profile(engine, shapes(9, 8))
    with pytest.raises(StageFailed, match=r"outside every optimization profile"):
        choose_profile(engine, {"input_ids": (1, 8, 1)})  # wrong rank


def test_runner_switches_profile_only_when_the_index_changes():
    """TensorRT schedules resource updates on the next enqueue after every
    set_optimization_profile_async, same index or not: the runner calls it on a change only."""
    from pipeline.backends.tensorrt_runner import choose_profile, switch_profile

    engine, context = EngineQueries([FULL, DECODE]), ContextCalls()
    switched = [switch_profile(context, choose_profile(engine, {"input_ids": s}), 7)
                for s in [(2, 64), (4, 100), (1, 16), (1, 17), (1, 1), (8, 8), (2, 64)]]
    assert switched == [False, False, True, False, False, True, False]
    assert context.switches == [1, 0]


def test_runner_refuses_an_address_tensorrt_refuses():
    from pipeline.backends.tensorrt_runner import set_address
    from pipeline.core.errors import StageFailed

    context = ContextCalls(refuse="logits")
    set_address(context, "input_ids", 0x7F0000000000)
    with pytest.raises(StageFailed, match=r"refused the device address of tensor `logits`"):
        set_address(context, "logits", 0x7F0000000100)


def test_cuda_graphs_are_captured_thread_local_as_trtexec_does():
    """trtexec captures with cudaStreamCaptureModeThreadLocal; torch.cuda.graph takes the mode
    by name (its default, global, fails a capture for unsafe calls from any other thread)."""
    import inspect

    import torch

    from pipeline.backends import tensorrt_runner

    assert tensorrt_runner.CAPTURE_MODE == "thread_local"
    assert "capture_error_mode" in inspect.signature(torch.cuda.graph).parameters
    assert '"thread_local"' in torch.cuda.graph.__doc__  # a mode this torch knows
    capture = inspect.getsource(tensorrt_runner.TensorRTRunner._capture)
    assert "capture_error_mode=CAPTURE_MODE" in capture


# ----------------------------------------------------------------------------- layer truth
def _tensor(name, dims, fmt):
    return {"Name": name, "Location": "Device", "Dimensions": dims, "Format/Datatype": fmt}


def inspector_sample(int8_gemm: bool) -> dict:
    """Layers as TensorRT 10's inspector writes them at ProfilingVerbosity.DETAILED."""
    gemm_in = "Row major linear Int8 format" if int8_gemm else "Row major linear FP32"
    layers = [
        {"Name": "/embed/Gather", "LayerType": "Gather",
         "Inputs": [_tensor("input_ids", [2, 64], "Row major linear Int64 format"),
                    _tensor("embed.weight", [512, 64], "Row major linear FP32")],
         "Outputs": [_tensor("/embed/Gather_output_0", [2, 64, 64], "Row major linear FP32")],
         "ParameterType": "Gather", "TacticValue": "0x0000000000000000"},
        {"Name": "/blocks.0/attn/q/input_quantizer/QuantizeLinear", "LayerType": "Scale",
         "Inputs": [_tensor("/embed/Gather_output_0", [2, 64, 64], "Row major linear FP32")],
         "Outputs": [_tensor("q_in", [2, 64, 64], "Row major linear Int8 format")],
         "ParameterType": "Scale"},
        {"Name": "Reformatting CopyNode for Input Tensor 0 to /blocks.0/attn/q/MatMul",
         "LayerType": "Reformat", "ParameterType": "Reformat", "Origin": "REFORMAT",
         "Inputs": [_tensor("q_in", [2, 64, 64], "Row major linear Int8 format")],
         "Outputs": [_tensor("q_in_r", [2, 64, 64], "Channel major INT8 format where channel % 16 == 0")]},
        {"Name": "/blocks.0/attn/q/MatMul", "LayerType": "CaskGemm",
         "Inputs": [_tensor("q_in_r", [2, 64, 64], gemm_in)],
         "Outputs": [_tensor("q", [2, 64, 64], "Row major linear FP32")],
         "ParameterType": "Gemm", "TacticName": "sm90_xmma_gemm_i8i8_i8i32_f32_tn_n_tilesize128x128x64"},
        {"Name": "/lm_head/MatMul", "LayerType": "CaskGemm",
         "Inputs": [_tensor("q", [2, 64, 64], "Row major linear FP32")],
         "Outputs": [_tensor("logits", [2, 64, 512], "Row major linear FP32")],
         "ParameterType": "Gemm"},
    ]
    return {"Layers": layers, "Bindings": ["input_ids", "logits"]}


TIMES = {"/embed/Gather": 0.002, "/blocks.0/attn/q/input_quantizer/QuantizeLinear": 0.003,
         "Reformatting CopyNode for Input Tensor 0 to /blocks.0/attn/q/MatMul": 0.004,
         "/blocks.0/attn/q/MatMul": 0.060, "/lm_head/MatMul": 0.011}


def test_effective_precision_shares_by_layers_and_time():
    s = tensorrt_layers.effective_precision(inspector_sample(int8_gemm=True), TIMES)
    assert s["layers"] == 5 and s["reformat_layers"] == 1 and s["untimed_layers"] == []
    assert s["layer_share"]["int8"] == pytest.approx(2 / 5)  # reformat + gemm (first input int8)
    assert s["layer_share"]["fp32"] == pytest.approx(3 / 5)  # gather (weights fp32), quantize, head
    assert s["time_share"]["int8"] == pytest.approx(0.064 / 0.080)
    by_name = {p["name"]: p["precision"] for p in s["per_layer"]}
    assert by_name["/embed/Gather"] == "fp32"  # first input is an index: the float tensor decides


def test_require_layer_precision_fails_an_int8_engine_that_runs_float():
    good = tensorrt_layers.effective_precision(inspector_sample(int8_gemm=True), TIMES)
    bad = tensorrt_layers.effective_precision(inspector_sample(int8_gemm=False), TIMES)
    ok = tensorrt_layers.check_required(good, "int8", 0.5)
    assert ok.passed and ok.detail.startswith("80% of time at int8")
    gate = tensorrt_layers.check_required(bad, "int8", 0.5)
    assert not gate.passed and gate.name == "effective_precision.int8"
    assert gate.detail.startswith("5% of time at int8") and "1 reformat layers" in gate.detail
    # fp16 counts int8 as narrower; untimed engines are judged by layer count.
    untimed = tensorrt_layers.effective_precision(inspector_sample(int8_gemm=True))
    assert untimed["time_share"] is None
    assert tensorrt_layers.check_required(untimed, "fp16", 0.4).detail.startswith("40% of layers")


def test_names_only_inspector_cannot_prove_a_precision():
    s = tensorrt_layers.effective_precision({"Layers": ["a + b", "c"], "Bindings": []})
    assert s["detailed"] is False
    gate = tensorrt_layers.check_required(s, "int8", 0.5)
    assert not gate.passed and "DETAILED" in gate.detail


def test_dtype_words():
    f = tensorrt_layers.dtype_of
    assert f("Row major linear FP32") == "fp32" and f("Half") == "fp16" and f("Float") == "fp32"
    assert f("Channel major FP16 format where channel % 8 == 0") == "fp16"
    assert f("Row major linear Int4 format") == "int4" and f("FP4") == "fp4"
    assert f("Row major linear BFloat16 format") == "bf16" and f("Row major linear FP8 format") == "fp8"
    assert f("Row major linear Int64 format") == "other" and f("Row major linear Int8 format") == "int8"


def _split_fields(tensor: dict) -> dict:
    """A tensor as TensorRT 11's inspector writes it: `Format` and `DataType` apart."""
    fmt = tensor.pop("Format/Datatype")
    word = tensorrt_layers.dtype_of(fmt)
    names = {"int8": "Int8", "fp32": "Float", "other": "Int64"}
    return {**tensor, "Format": fmt, "DataType": names[word]}


def test_tensorrt_11_split_fields_give_the_same_shares():
    sample = inspector_sample(int8_gemm=True)
    for layer in sample["Layers"]:
        layer["Inputs"] = [_split_fields(t) for t in layer["Inputs"]]
        layer["Outputs"] = [_split_fields(t) for t in layer["Outputs"]]
    sample["I/O Tensors"] = [{"Name": n} for n in sample.pop("Bindings")]
    assert tensorrt_layers.effective_precision(sample, TIMES)["layer_share"] == \
        tensorrt_layers.effective_precision(inspector_sample(int8_gemm=True), TIMES)["layer_share"]


def test_validation_extras_gate_from_the_target_only(project, monkeypatch, tmp_path):
    engine = tmp_path / "tensorrt.plan"
    _, info = trt_backend.sidecars(engine)
    summary = tensorrt_layers.effective_precision(inspector_sample(int8_gemm=False), TIMES)
    info.write_text(json.dumps({"built_with": H200, "tensorrt_layer_shares": summary}))
    runner = SimpleNamespace(details={"cuda_graphs": "on", "captures": 1})
    monkeypatch.chdir(project.path)
    recipe = recipe_mod.load("standard")
    target = recipe_mod.TensorRTTarget(require_layer_precision="int8")
    extras = trt_backend.validation_extras(engine, target, recipe, runner)
    assert extras["runtime"]["cuda_graphs"] == "on"
    assert [g.passed for g in extras["gates"]] == [False]
    assert "per_layer" not in extras["tensorrt_layer_shares"]
    # `precision.require_effective_precision` is a share of ONNX Runtime's integer FLOPs
    # (validate.py judges it on the onnxruntime target): no gate on a TensorRT engine.
    recipe = recipe_mod.load("standard", ["precision.mode=int8",
                                          "precision.require_effective_precision=0.9"])
    assert recipe.precision.require_effective_precision == 0.9
    plain = recipe_mod.TensorRTTarget()
    assert trt_backend.validation_extras(engine, plain, recipe, runner)["gates"] == []


# ----------------------------------------------------------------------------- recipe and CLI
def test_profile_naming_an_unknown_dim_is_a_recipe_error(project, monkeypatch):
    monkeypatch.chdir(project.path)
    with pytest.raises(RecipeError, match=r"profiles.0 names dims \['tokens'\].*'batch', 'sequence'"):
        recipe_mod.load("standard", ["targets.1.profiles=[{tokens: {min: 1, opt: 1, max: 2}}]"])
    with pytest.raises(RecipeError, match="targets.1.optimization_level"):
        recipe_mod.load("standard", ["targets.1.optimization_level=9"])


def test_old_layer_precision_keys_name_their_new_names(project, monkeypatch):
    """Renamed pre-1.0 (the `precision:` section's require_effective_precision is a share):
    the old target keys get one error naming the new key, not a bare `unknown key`."""
    monkeypatch.chdir(project.path)
    with pytest.raises(RecipeError) as e:
        recipe_mod.load("standard", ["targets.1.require_effective_precision=int8"])
    assert "targets.1.require_effective_precision: renamed to `require_layer_precision`: " \
           "write `require_layer_precision: int8`" in str(e.value)
    with pytest.raises(RecipeError, match="renamed to `layer_precision_min_share`"):
        recipe_mod.load("standard", ["targets.1.effective_precision_min_share=0.7"])
    assert recipe_mod.load("standard", ["targets.1.require_layer_precision=int8"]).targets[1] \
        .require_layer_precision == "int8"


def test_every_glm_recipe_lists_tensorrt(project, monkeypatch):
    monkeypatch.chdir(project.path)
    glm = [recipe_mod.load(p) for p in recipe_mod.list_recipes()]
    glm = [r for r in glm if r.model.zoo == "glm"]
    assert len(glm) >= 2
    for r in glm:
        assert "tensorrt" in [t.kind for t in r.targets], r.name


@pytest.mark.skipif(trt_backend.unavailable(recipe_mod.TensorRTTarget()) is None,
                    reason="TensorRT and a GPU are here: the target builds instead of skipping")
def test_without_tensorrt_the_target_is_skipped_and_the_rest_builds(built_standard):
    report = json.loads((built_standard.engines / STANDARD / "report.json").read_text())
    engines = {e["target"]: e for e in report["engines"]}
    assert engines["onnxruntime"]["status"] == "built"
    trt = engines["tensorrt"]
    assert trt["status"] == "skipped" and trt["path"] is None
    assert trt["reason"].startswith(("TensorRT is not installed", "TensorRT needs an NVIDIA GPU"))
    assert "pip install -e '.[gpu]'" in trt["reason"] or "nvidia-smi" in trt["reason"]
    assert not list((built_standard.engines / STANDARD).glob("tensorrt*"))


@pytest.mark.skipif(trt_backend.unavailable(recipe_mod.TensorRTTarget()) is None,
                    reason="TensorRT and a GPU are here: a required target builds")
def test_required_tensorrt_target_is_exit_2_and_changes_nothing(built_standard):
    before = built_standard.snapshot()
    result = built_standard.run("run", "standard", "--set", "targets.1.required=true")
    assert result.code == 2, result.err
    (line,) = result.error_lines
    assert line.startswith("Error: target `tensorrt` is required but cannot be built here: TensorRT")
    assert "Traceback" not in result.err
    assert built_standard.snapshot() == before


def test_report_markdown_shows_cuda_graphs_and_effective_precision(built_standard):
    """Rendered from the JSON alone: a TensorRT-like engine entry with runtime extras."""
    from pipeline.render import report_markdown

    report = json.loads((built_standard.engines / STANDARD / "report.json").read_text())
    engine = next(e for e in report["engines"] if e["status"] == "built")
    summary = tensorrt_layers.effective_precision(inspector_sample(int8_gemm=True), TIMES)
    engine.update(runtime={"cuda_graphs": "fallback to plain enqueue (capture failed)",
                           "capture_failure": "RuntimeError: operation not permitted when stream is capturing",
                           "captures": 0, "replays": 0, "enqueues": 41},
                  tensorrt_layer_shares={k: v for k, v in summary.items() if k != "per_layer"})
    md = report_markdown.markdown(report)
    assert "CUDA Graphs: fallback to plain enqueue (capture failed) (RuntimeError: operation not " \
           "permitted when stream is capturing); 0 captures, 0 replays, 41 plain enqueues." in md
    assert "Effective precision (share of time, 5 layers): int8 80%, fp32 20%; 1 reformat layers." in md


def test_a_graph_with_onnx_runtime_ops_is_refused_before_tensorrt_parses_it(built_standard):
    """ort_fusions writes com.microsoft ops that TensorRT's parser has no importer or plugin
    for; a build handed such a graph says so instead of failing inside the parser."""
    from pipeline.core.errors import StageFailed
    from pipeline.model import onnx_info

    folder = built_standard.engines / STANDARD
    assert onnx_info.foreign_ops(folder / "model.onnx") == {}  # the export is plain ONNX
    foreign = onnx_info.foreign_ops(folder / "optimized.onnx")
    assert foreign["com.microsoft.GroupQueryAttention"] == 2
    assert foreign["SimplifiedLayerNormalization"] == 1  # ORT's, in the default domain
    with pytest.raises(StageFailed) as error:
        trt_backend.check_parseable(folder / "optimized.onnx")
    message = str(error.value)
    assert message.startswith("TensorRT cannot parse ") and "com.microsoft.GroupQueryAttention x2" in message
    assert "in optimized.onnx" in message and "\n" not in message


def _norm_graph(op_type: str, opset: int, path, **attrs):
    """x [2, 8] -> op_type(x, scale) in the default domain, saved to path."""
    from onnx import TensorProto, helper, numpy_helper

    scale = numpy_helper.from_array(np.ones(8, np.float32), "scale")
    node = helper.make_node(op_type, ["x", "scale"], ["y"], name="norm", **attrs)  # domain ""
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_onnx_runtime_ops_in_the_default_domain_are_foreign_too(tmp_path):
    """ORT registers SimplifiedLayerNormalization in the default domain (its fusions write it
    there, no com.microsoft prefix); ONNX has no such op, TensorRT's parser neither."""
    import onnxruntime as ort

    from pipeline.core.errors import StageFailed
    from pipeline.model import onnx_info

    simplified = _norm_graph("SimplifiedLayerNormalization", 17, tmp_path / "simplified.onnx", axis=-1)
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    (y,) = ort.InferenceSession(str(simplified), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.allclose(y, x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-5), atol=1e-4)  # ORT runs it
    assert onnx_info.foreign_ops(simplified) == {"SimplifiedLayerNormalization": 1}
    with pytest.raises(StageFailed) as error:
        trt_backend.check_parseable(simplified)
    assert "SimplifiedLayerNormalization x1" in str(error.value)
    assert "ONNX Runtime contrib ops in the default domain" in str(error.value)
    # an ONNX op of the model's opset is not foreign: LayerNormalization (opset 17) ...
    standard = _norm_graph("LayerNormalization", 17, tmp_path / "layernorm.onnx", axis=-1)
    assert onnx_info.foreign_ops(standard) == {}
    trt_backend.check_parseable(standard)
    # ... but is before it exists (opset 16)
    assert onnx_info.foreign_ops(_norm_graph("LayerNormalization", 16, tmp_path / "old.onnx")) == \
        {"LayerNormalization": 1}


def test_tensorrt_builds_from_a_plain_onnx_chain_of_the_same_stages(project, monkeypatch):
    """The ONNX Runtime engine keeps the fused graph; the TensorRT target gets the same export,
    optimized without the ORT-only passes and quantized the same way, in files of its own."""
    from pipeline.model import onnx_info
    from pipeline.run.execute import Run
    from tests.conftest import FAST

    monkeypatch.chdir(project.path)
    overrides = [s for s in FAST if s != "--set"] + ["precision.mode=int8", "targets.1.required=false"]
    recipe = recipe_mod.load("standard", overrides)
    run = Run(recipe, project.engines)
    run.execute("precision")
    ort_target, trt_target = recipe.targets
    with run.store.lock():
        graph = run.store.artifact("typed.onnx")
        assert onnx_info.foreign_ops(graph.path)  # fused for ONNX Runtime
        assert run.chain.graph == graph
        assert run.chain.for_target(ort_target) == graph
        plain = run.chain.for_target(trt_target)
    assert plain.name == "typed-plain.onnx" and onnx_info.foreign_ops(plain.path) == {}
    ops = Counter(n.op_type for n in onnx.load(str(plain.path)).graph.node)
    assert ops["QuantizeLinear"] > 0 and ops["MatMul"] > 0  # INT8 Q/DQ, TensorRT's placement
    trt_backend.check_parseable(plain.path)  # what the build checks first: passes
    stages = run.store.manifest.stages
    assert {"optimize:plain", "precision:plain"} <= set(stages)
    meta = stages["optimize:plain"].meta  # the plain chain: no ORT-only pass ran
    assert meta["accepted"] == ["pack_matmuls"] and meta["no_match"] == ["fold_constants"]
    # a second run finds both chains cached
    again = Run(recipe, project.engines)
    again.execute("precision")
    with again.store.lock():
        assert again.chain.for_target(trt_target).sha256 == plain.sha256
    assert not again.cache.work_done
