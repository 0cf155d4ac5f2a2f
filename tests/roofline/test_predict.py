"""`pipeline predict` on engines the suite builds: the tiny GLM decoder (standard-gen, the
generation module's shared build) and `standard` (forward); the workload's points."""

from __future__ import annotations

import json

from tests.conftest import Project
from tests.hardware.test_database import _fake_entry


def _cached_here(tmp_path) -> dict:
    """PIPELINE_CACHE_DIR holding a made-up entry for this machine: no measuring in tests."""
    from pipeline.hardware import database

    cache = tmp_path / "hw-cache"
    cache.mkdir(exist_ok=True)
    (cache / "hardware.json").write_text(json.dumps({database._identity(): _fake_entry().model_dump(mode="json")}))
    return {"PIPELINE_CACHE_DIR": str(cache)}


def test_generation_points_follow_the_workload():
    from pipeline.recipe import load
    from pipeline.roofline import points

    recipe = load("standard-gen", ["workload.prompt_lengths=[8]", "workload.new_tokens=4",
                                   "workload.task=[{prompt: 6, new_tokens: 3}, {prompt: 4, new_tokens: 3}]"])
    found = points.generation_points(recipe)
    # each prompt's prefill and a step in the middle of its 4 new tokens; the long point's
    # (standard-gen: 32 + 224 new tokens); the decode curve at the first prompt's context
    assert [p.label for p in found[:4]] == ["prefill 8", "decode @10", "prefill 32", "decode @144"]
    assert found[0].dims == {"batch": 1, "sequence": 8, "past_sequence": 0, "total_sequence": 8}
    assert found[1].dims == {"batch": 1, "sequence": 1, "past_sequence": 10, "total_sequence": 11}
    assert [(p.batch, p.dims["past_sequence"]) for p in found[4:]] == [(4, 10), (16, 10), (64, 10)]
    assert [p.label for p in points.generation_points(recipe, context=100)][1] == "decode @100"
    first, second = points.task_turns(recipe)
    assert first.prefill.dims["past_sequence"] == 0 and first.steps == 2 and first.decode.dims["past_sequence"] == 6
    assert second.prefill.dims == {"batch": 1, "sequence": 4, "past_sequence": 9, "total_sequence": 13}
    assert second.decode.dims["past_sequence"] == 13


def test_each_workload_gives_its_points_and_marks_what_a_build_profiles():
    """The one interface (workloads' roofline_points): the generation workload's points are
    generation_points and its task turns; the forward one's the batch dim's min/opt/max; the
    points a build profiles are the first prompt's prefill and decode, or the opt request."""
    from pipeline import workloads
    from pipeline.recipe import load
    from pipeline.roofline import points

    gen = load("standard-gen", ["workload.prompt_lengths=[8, 12]", "workload.new_tokens=4"])
    found = workloads.of(gen).roofline_points(gen)
    assert found.points == points.generation_points(gen) and found.task == points.task_turns(gen)
    assert [p.label for p in found.profiled()] == ["prefill 8", "decode @10"]
    longest = found.longest_prefill()  # standard-gen's long point: a 32-token prompt, its report key
    assert (longest.tokens, longest.report_key) == (32, "long")
    fwd = load("standard", [])
    flat = workloads.of(fwd).roofline_points(fwd)
    batch = next(d for d in fwd.inputs[0].shape if getattr(d, "name", None) == "batch")
    assert [p.batch for p in flat.points] == sorted({batch.min, batch.opt, batch.max}) and flat.task == []
    assert [p.batch for p in flat.profiled()] == [batch.opt] and flat.longest_prefill() is None


def test_predict_a_decoder_on_h100_is_a_lower_bound_naming_what_would_not_run(built_gen: Project, tmp_path):
    name = built_gen.built.name
    result = built_gen.run("predict", name, "--device", "h100", env=_cached_here(tmp_path))
    assert result.code == 0, result.err
    out = result.out
    assert "lower bound from specifications" in out and "nvidia-tensor-core-gpu-datasheet" in out
    assert "(TTFT)" in out and "(TPOT)" in out and "task (script at batch 1)" in out
    # ORT's QuickGelu fusion (com.microsoft) has a CUDA kernel but is no TensorRT layer
    assert "CUDAExecutionProvider: every op has a kernel" in out and "OperatorKernels.md" in out
    assert "TensorRT: would not run as built" in out and "com.microsoft.QuickGelu x2" in out
    assert "efficiency measured on this machine" in out  # shown apart, from this machine's cached entry
    data = json.loads(built_gen.run("predict", name, "--device", "h100", "--json", env=_cached_here(tmp_path)).out)
    (engine,) = data["prediction"]["engines"]
    prefill, decode = engine["points"][:2]
    assert prefill["dims"]["sequence"] == 8 and decode["dims"]["past_sequence"] == 10
    assert 0 < decode["floor_ms"] < prefill["floor_ms"] and decode["measured_ms"] is None
    assert engine["task_ms"] > prefill["floor_ms"] and data["here"]["provenance"] == "measured"
    assert any(s["runtime"] == "TensorRT" and s["unsupported"] for s in engine["support"])


def test_predict_here_puts_the_measured_times_beside_the_floors(built_gen: Project, tmp_path):
    data = json.loads(built_gen.run("predict", built_gen.built.name, "--json", env=_cached_here(tmp_path)).out)
    (engine,) = data["prediction"]["engines"]
    prefill, decode = engine["points"][:2]
    assert prefill["measured_ms"] > 0 and decode["measured_ms"] > 0  # the report's TTFT and TPOT p50
    assert engine["support"][0]["runtime"] == "CPUExecutionProvider" and not engine["support"][0]["unsupported"]
    assert data["here"] is None and engine["task_measured_ms"] > 0


def test_predict_a_forward_recipe_per_batch(built_standard: Project, tmp_path):
    result = built_standard.run("predict", built_standard.built.name, "--device", "a100", env=_cached_here(tmp_path))
    assert result.code == 0, result.err
    assert "batch 1" in result.out and "A100" in result.out and "lower bound from specifications" in result.out
    missing = built_standard.run("predict", "flash", "--device", "h100")
    assert missing.code == 2 and "pipeline run flash" in missing.err
