"""TensorRT engines for real: build, run with and without CUDA Graphs, accuracy against the
PyTorch baseline, inspector JSON and effective precision. Collected everywhere; skipped, with
the reason, where TensorRT (or a GPU) is missing (tests/conftest.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import FAST, Project, set_folder

pytestmark = [pytest.mark.tensorrt, pytest.mark.gpu, pytest.mark.slow]

REQUIRED = ("--set", "targets.1.required=true")
TRT = set_folder("standard", *FAST, *REQUIRED)  # where built_trt's run writes


@pytest.fixture(scope="session")
def built_trt(tmp_path_factory) -> Project:
    proj = Project(tmp_path_factory.mktemp("trt"))
    result = proj.run("run", "standard", *FAST, *REQUIRED,
                      env={"PIPELINE_CACHE_DIR": str(proj.path / "cache")})
    assert result.code == 0, result.err
    return proj


def _engine(proj: Project, target: str = "tensorrt", folder: str = TRT) -> dict:
    report = json.loads((proj.engines / folder / "report.json").read_text())
    return next(e for e in report["engines"] if e["target"] == target)


def test_build_writes_engine_inspector_and_manifest_entries(built_trt):
    folder = built_trt.engines / TRT
    manifest = json.loads((folder / "manifest.json").read_text())
    for name in ("tensorrt.plan", "tensorrt.inspector.json", "tensorrt.build.json"):
        assert manifest["files"][name]["sha256"], name
    meta = manifest["stages"]["build:tensorrt"]["meta"]
    assert meta["built_with"]["tensorrt"] and meta["built_with"]["gpu"]
    assert meta["built_with"]["compute_capability"] and meta["build_seconds"] > 0
    assert meta["strongly_typed"] is True
    assert meta["commands"]["trtexec"].startswith("trtexec --onnx=model.onnx --saveEngine=tensorrt.plan")
    assert meta["commands"]["polygraphy"].startswith("polygraphy convert model.onnx")
    inspector = json.loads((folder / "tensorrt.inspector.json").read_text())
    assert inspector["Layers"] and all(isinstance(layer, dict) for layer in inspector["Layers"])
    assert all("Format/Datatype" in t for layer in inspector["Layers"] for t in layer["Inputs"])


def test_timing_cache_is_saved_per_gpu_and_version(built_trt):
    from pipeline.backends.tensorrt import timing_cache_path

    meta = json.loads((built_trt.engines / TRT / "manifest.json").read_text())
    build = meta["stages"]["build:tensorrt"]["meta"]
    w = build["built_with"]
    expected = timing_cache_path(w["tensorrt"], w["gpu"], w["compute_capability"]).name
    cache = built_trt.path / "cache" / "tensorrt" / expected
    assert build["timing_cache"] == str(cache) and cache.stat().st_size > 0


def test_fp32_graph_runs_fp32_and_matches_pytorch(built_trt):
    e = _engine(built_trt)
    assert e["status"] == "built" and all(g["passed"] for g in e["gates"]), e["gates"]
    assert e["accuracy"]["logits"]["cosine"] > 0.9999
    assert e["runtime"]["cuda_graphs"] == "on" and e["runtime"]["captures"] >= 1
    assert e["runtime"]["replays"] > 0
    eff = e["effective_precision"]
    assert eff["detailed"] and eff["time_share"] is not None
    compute = {k: v for k, v in eff["time_share"].items() if k != "other"}
    assert max(compute, key=compute.get) == "fp32"  # strongly typed fp32 graph, TF32 off


def test_without_cuda_graphs_same_accuracy(built_trt):
    result = built_trt.run("run", "standard", *FAST, *REQUIRED, "--set", "targets.1.cuda_graphs=false",
                           env={"PIPELINE_CACHE_DIR": str(built_trt.path / "cache")})
    assert result.code == 0, result.err
    e = _engine(built_trt, folder=result.folder.removeprefix("engines/"))
    assert e["runtime"]["cuda_graphs"].startswith("off") and e["runtime"]["replays"] == 0
    assert e["accuracy"]["logits"]["cosine"] > 0.9999


def test_runner_recaptures_when_shapes_change(built_trt):
    from pipeline import data
    from pipeline import recipe as recipe_mod
    from pipeline.backends import tensorrt as backend

    folder = built_trt.engines / TRT
    feeds, refs = data.load_feeds(folder / "baseline.npz")
    target = recipe_mod.TensorRTTarget()
    with backend.open(folder / "tensorrt.plan", target) as runner:
        outs = [runner.infer(f, check_inputs=False) for f in feeds + feeds[:1]]
        again = runner.infer(feeds[0], check_inputs=False)
    shapes = [f["input_ids"].shape for f in feeds + feeds[:1]]
    changes = sum(a != b for a, b in zip(shapes, shapes[1:])) + 1
    assert runner.details["captures"] == changes  # one capture per new shape, none when unchanged
    assert runner.details["profile_switches"] == 0  # one profile: never switched, never re-set
    for out, ref in zip(outs, refs + refs[:1]):
        np.testing.assert_allclose(out["logits"], ref["logits"], atol=1e-3)
    np.testing.assert_array_equal(again["logits"], outs[-1]["logits"])


def test_int8_requirement_fails_an_fp32_engine(built_trt):
    result = built_trt.run("run", "standard", *FAST, *REQUIRED,
                           "--set", "targets.1.require_layer_precision=int8",
                           env={"PIPELINE_CACHE_DIR": str(built_trt.path / "cache")})
    assert result.code == 3, result.err
    gate = next(g for g in _engine(built_trt, folder=result.folder.removeprefix("engines/"))["gates"]
                if g["name"] == "effective_precision.int8")
    assert not gate["passed"] and "fp32" in gate["detail"]
