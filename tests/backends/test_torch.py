"""PyTorch-native runners and the AOTInductor target (issue: PyTorch-native targets)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import FAST, ROOT, Project, built


@pytest.mark.slow
def test_aotinductor_builds_and_validates_the_tiny_glm(built_from_pytorch):
    report = json.loads((built_from_pytorch.built / "report.json").read_text())
    engines = {e["target"]: e for e in report["engines"]}
    aoti = engines["aotinductor"]
    assert aoti["status"] == "built" and aoti["path"].endswith(".pt2")
    assert aoti["device"] == "cpu" and aoti["speedup_vs_cudagraph"] is None  # CPU: no graphs
    assert aoti["accuracy"]["logits"]["cosine"] > 0.9999
    assert aoti["accuracy"]["logits"]["top1_agreement"] > 0.99
    assert all(g["passed"] for g in aoti["gates"])
    assert aoti["latency_ms"]["n"] >= 40


@pytest.mark.slow
def test_pt2_engine_runs_without_the_models_python_code(built_from_pytorch):
    """A fresh interpreter loads the package with torch alone, at a shape it was not
    traced with (dynamic dims), and never imports the pipeline or the zoo."""
    engine = built_from_pytorch.built / "aotinductor.pt2"
    code = (
        "import sys, torch\n"
        f"package = torch._inductor.aoti_load_package({str(engine)!r})\n"
        "ids = torch.randint(0, 512, (3, 100))\n"
        "with torch.inference_mode():\n    out = package(ids)\n"
        "out = out if isinstance(out, torch.Tensor) else out[0]\n"
        "print(tuple(out.shape), any(m.startswith('pipeline') for m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "(3, 100, 512) False"


def test_eager_runner_casts_to_the_requested_dtype():
    from pipeline.backends.torch import TorchRunner
    from pipeline.metrics.accuracy import cosine
    from pipeline.zoo.glm import build

    feed = {"input_ids": np.random.default_rng(0).integers(0, 512, (2, 16))}
    with TorchRunner(build(size="tiny"), ["input_ids"], ["logits"]) as fp32:
        ref = fp32.infer(feed, check_inputs=False)["logits"]
    with TorchRunner(build(size="tiny"), ["input_ids"], ["logits"], dtype="bf16") as bf16:
        assert next(bf16.model.parameters()).dtype.__str__() == "torch.bfloat16"
        low = bf16.infer(feed, check_inputs=False)["logits"]
    assert low.dtype == np.float32 and low.shape == ref.shape
    assert not np.array_equal(low, ref)  # it really ran in bf16
    assert cosine(ref, low) > 0.99


@pytest.mark.gpu
def test_cuda_graph_runner_matches_eager_and_recaptures_per_shape():
    from pipeline.backends.torch import CudaGraphRunner, TorchRunner
    from pipeline.zoo.glm import build

    rng = np.random.default_rng(0)
    feeds = [{"input_ids": rng.integers(0, 512, shape)} for shape in ((1, 16), (2, 32), (1, 16))]
    with TorchRunner(build(size="tiny"), ["input_ids"], ["logits"], device="cuda") as eager, \
            CudaGraphRunner(build(size="tiny"), ["input_ids"], ["logits"]) as graphs:
        for feed in feeds:
            a = eager.infer(feed, check_inputs=False)["logits"]
            b = graphs.infer(feed, check_inputs=False)["logits"]
            np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
        assert len(graphs.graphs) == 2  # one capture per distinct input shape


def test_gpu_check_refuses_cleanly_without_a_gpu(project):
    import os

    from pipeline.core import deps

    if deps.gpus():
        pytest.skip("this machine has a GPU: the refusal path does not apply")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")], cwd=project.path,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    assert proc.stderr.strip() == "Error: gpu-check needs an NVIDIA GPU (nvidia-smi found none)"


def test_runners_can_leave_outputs_on_the_device():
    """host_outputs=False: the tensors themselves (a GPU study times compute, not a 524 MB
    copy of logits); on the host the same values as the numpy outputs."""
    import torch

    from pipeline.backends.torch import TorchRunner, to_host
    from pipeline.zoo.glm import build

    feed = {"input_ids": np.random.default_rng(0).integers(0, 512, (2, 8))}
    with TorchRunner(build(size="tiny"), ["input_ids"], ["logits"]) as host, \
            TorchRunner(build(size="tiny"), ["input_ids"], ["logits"], host_outputs=False) as device:
        a, b = host.infer(feed, check_inputs=False), device.infer(feed, check_inputs=False)
    assert isinstance(a["logits"], np.ndarray) and isinstance(b["logits"], torch.Tensor)
    np.testing.assert_array_equal(a["logits"], to_host(b)["logits"])


@pytest.fixture(scope="module")
def built_from_pytorch(tmp_path_factory) -> Project:
    """`pipeline run standard-aoti` with the AOTInductor target alone (a ~30 s compile)."""
    return built(tmp_path_factory, "aoti-only", "standard-aoti", *FAST,
                 "--set", "targets=[{kind: aotinductor}]")


@pytest.mark.slow
def test_a_run_whose_targets_all_build_from_pytorch_skips_the_onnx_stages(built_from_pytorch):
    folder = built_from_pytorch.built
    assert not list(folder.glob("*.onnx"))  # no export, optimize or precision work
    report = json.loads((folder / "report.json").read_text())
    (engine,) = report["engines"]
    assert engine["target"] == "aotinductor" and engine["status"] == "built"
    assert engine["accuracy"]["logits"]["cosine"] > 0.9999 and all(g["passed"] for g in engine["gates"])
    build = json.loads((folder / "manifest.json").read_text())["stages"]["build:aotinductor"]
    assert build["meta"]["source"] is None  # built from the PyTorch model, no graph
    rerun = built_from_pytorch.run("run", "standard-aoti", *FAST, "--set", "targets=[{kind: aotinductor}]")
    assert rerun.code == 0, rerun.err
    assert "no target builds from ONNX" in rerun.err + rerun.out


def load_gpu_check():
    """benchmarks/gpu_check.py as a module (benchmarks/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_judges_accuracy_and_the_cuda_graph_bar():
    """The GPU check's own verdicts, from results shaped as its shape study writes them."""
    gpu_check = load_gpu_check()

    def runner(speedup, lo, gate_ok=True):
        return {"speedup_vs_eager_fp16": {"ratio": speedup, "ci95": [lo, speedup * 1.05]},
                "gates": [{"name": "logits.cosine", "passed": gate_ok, "detail": ""}]}

    rows = [{"batch": 1, "sequence": 16, "runners": {
                "torch-eager-fp16": runner(1.0, 0.98), "torch-cudagraph-fp16": runner(6.5, 6.1),
                "aotinductor": runner(5.0, 4.8, gate_ok=False)}},
            {"batch": 8, "sequence": 512, "runners": {
                "torch-eager-fp16": runner(1.0, 0.98), "torch-cudagraph-fp16": runner(1.05, 1.01)}}]
    verdicts = {c["name"]: c["passed"] for c in gpu_check.checks(rows)}
    assert verdicts == {
        "1x16.torch-eager-fp16.accuracy": True, "1x16.torch-cudagraph-fp16.accuracy": True,
        "1x16.aotinductor.accuracy": False, "1x16.cudagraph_speedup": True,
        "8x512.torch-eager-fp16.accuracy": True, "8x512.torch-cudagraph-fp16.accuracy": True}
    rows[0]["runners"]["torch-cudagraph-fp16"] = runner(5.2, 4.9)  # interval reaches below 5x
    assert not {c["name"]: c["passed"] for c in gpu_check.checks(rows)}["1x16.cudagraph_speedup"]


@pytest.mark.slow
def test_gpu_check_rehearses_on_cpu(built_from_pytorch, tmp_path):
    """The GPU check's steps for one recipe (pipeline, shape study, checks), end to end on
    the host with the tiny GLM: what a lent GPU's few minutes would otherwise exercise first.
    The engines are a copy of a finished run, so only validation and the study run here."""
    from pipeline import recipe as recipe_mod
    from pipeline.recipe import LatencySpec
    from pipeline.store.folder_names import folder_name

    gpu_check = load_gpu_check()
    engines = tmp_path / "engines"
    overrides = ("targets=[{kind: aotinductor}]",)
    # the folder of the check's own --set values, seeded with the built one (no new compile)
    shutil.copytree(built_from_pytorch.built, engines / folder_name(recipe_mod.load(
        str(ROOT / "recipes" / "standard-aoti.yaml"), [*gpu_check.VALIDATION, *overrides])))
    entry, saved = {}, []
    gpu_check.check_recipe(str(ROOT / "recipes" / "standard-aoti.yaml"), engines, entry,
                           lambda: saved.append(json.dumps(entry, default=str)), device="cpu",
                           shapes=((1, 16), (2, 64)), overrides=overrides,
                           protocol=LatencySpec(warmup=3, iterations=30, min_seconds=0, block=5))
    assert entry["targets"] == ["aotinductor"]
    (engine,) = entry["engines"]
    assert engine["status"] == "built" and all(g["passed"] for g in engine["gates"])
    assert engine["latency_ms"]["n"] >= 50  # the check's own validation settings took effect
    assert len(saved) == 3  # after the pipeline and after each shape

    rows = entry["shapes"]
    assert [(r["batch"], r["sequence"]) for r in rows] == [(1, 16), (2, 64)]
    for row in rows:
        assert list(row["runners"]) == ["torch-eager-fp16", "aotinductor"]  # no CUDA Graphs on CPU
        eager, aoti = row["runners"].values()
        assert eager["speedup_vs_eager_fp16"]["ratio"] == 1.0
        assert aoti["latency_ms"]["n"] >= 30
        assert aoti["accuracy_vs_eager_fp32"]["logits"]["cosine"] > 0.9999  # fp32 engine
        assert 0.99 < eager["accuracy_vs_eager_fp32"]["logits"]["cosine"] < 1.0  # fp16 rounds
    assert [c["name"] for c in entry["checks"]] == [
        f"{s}.{n}.accuracy" for s in ("1x16", "2x64") for n in ("torch-eager-fp16", "aotinductor")]
    assert all(c["passed"] for c in entry["checks"]), entry["checks"]
