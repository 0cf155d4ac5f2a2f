"""Generation end to end: the recipe's KV signature, KV-cache export, genai_config.json, the
runners (onnxruntime-genai, the IOBinding loop, the PyTorch static cache) and `pipeline run`
of a generation recipe (tiny GLM, a workload of a few tokens)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.recipe import load
from tests.conftest import Project, shared_build

# A workload of a few tokens: the shape of standard-gen, seconds instead of minutes.
TINY = (
    "--set", "workload.prompt_lengths=[8]", "--set", "workload.new_tokens=4",
    "--set", "workload.batch_sizes=[1,2]", "--set", "workload.long=null",
    "--set", "workload.task=[{prompt: 6, new_tokens: 3}, {prompt: 4, new_tokens: 3}]",
    "--set", "optimize.passes=[attention_with_past]",
)
# TINY with a long point: the phases of a long request are timed too
LONG = tuple(a if a != "workload.long=null" else "workload.long={prompt: 24, new_tokens: 4, bins: 1}"
             for a in TINY)


def _recipe(**workload):
    r = load("standard-gen")
    if workload:
        r = r.model_copy(update={"workload": r.workload.model_copy(update=workload)})
    return r


# ----------------------------------------------------------------------------- recipe
def test_generation_recipe_derives_the_kv_signature():
    r = load("standard-gen")
    names = [i.name for i in r.inputs]
    assert names == ["input_ids", "attention_mask", "past_key_values.0.key", "past_key_values.0.value",
                     "past_key_values.1.key", "past_key_values.1.value"]
    assert r.outputs == ["logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value"]
    past = r.inputs[2].shape
    assert past[1] == 2 and past[3] == 16  # grouped: 2 KV heads of 16, not 4 query heads
    mask = r.inputs[1].shape[1]
    seq = r.inputs[0].shape[1]
    # total = past + sequence at every profile point, so random feeds are consistent
    for point in ("min", "opt", "max"):
        assert getattr(mask, point) == getattr(seq, point) + getattr(past[2], point)
    assert past[2].max == r.workload.context_max()


def test_generation_needs_a_decoder(project: Project):
    res = project.run("export", "gpt2-tiny", "--set", "workload.kind=generation", "--set", "model.transformers.task=hidden_states")
    assert res.code == 2
    assert len(res.error_lines) == 1 and "workload" in res.error_lines[0]
    assert "decoder" in res.error_lines[0]


# ----------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def built_gen(tmp_path_factory) -> Project:
    """`pipeline run standard-gen` of the LONG workload, built once for the session
    (serving/test_generation.py and generation/test_compare.py take it too), this module's
    own copy."""
    return shared_build(tmp_path_factory, "standard-gen-long", "standard-gen", "--target", "onnxruntime", *LONG)


def test_run_writes_the_generation_section(built_gen: Project):
    report = json.loads((built_gen.built / "report.json").read_text())
    assert report["export"]["mode"] == "kv_cache"
    assert report["export"]["parity"]["logits"]["max_abs"] < 1e-3
    (attention,) = report["optimize"]["passes"]  # checked against the exported graph, kept
    assert attention["status"] == "accepted" and attention["info"]["attention_with_past"] == 2
    assert attention["ops_before"]["Concat"] - attention["ops_after"].get("Concat", 0) == 4
    base = report["baseline"]["generation"]["points"]
    engine = report["engines"][0]
    gen = engine["generation"]
    assert set(gen["points"]) == {"b1-p8", "b2-p8", "task", "long"} == set(base)
    for key in ("ttft_ms", "tpot_ms"):
        assert {"p50", "p90", "p99"} <= set(gen[key]) and {"p50", "p90", "p99"} <= set(gen["baseline"][key])
    assert gen["points"]["b2-p8"]["tokens_per_s"]["aggregate"] == pytest.approx(
        2 * gen["points"]["b2-p8"]["tokens_per_s"]["per_sequence"])
    assert gen["points"]["task"]["runner"] == "onnxruntime-iobinding"  # genai cannot append turns
    assert gen["points"]["b1-p8"]["runner"] == "onnxruntime-genai"
    assert gen["time_per_task_s"] > 0 and gen["baseline"]["time_per_task_s"] > 0
    assert gen["memory"]["kv_cache_bytes_per_token"] == 512
    # fp32 engine vs PyTorch: the same greedy tokens, every point, both runners
    assert gen["token_agreement"]["share"] == 1.0
    assert all(a["first_divergence"] is None for a in gen["token_agreement"]["per_point"].values())
    s = engine["speedup_vs_baseline"]
    assert s["ci95"][0] <= s["ratio"] <= s["ci95"][1] and s["verdict"] in ("faster", "slower", "indistinguishable")
    config = json.loads((built_gen.built / "genai_config.json").read_text())
    assert config["model"]["decoder"]["num_key_value_heads"] == 2


def test_runners_generate_the_same_tokens(built_gen: Project, tmp_path):
    """genai, the IOBinding loop and the PyTorch static cache on the built engine."""
    import onnxruntime_genai  # noqa: F401  (a real dependency: no skip)

    from pipeline.generation import genai_config, runners
    from pipeline.generation.timed_requests import Request, generate
    from pipeline.model import sources as models

    recipe = _recipe()
    engine = built_gen.built / "onnxruntime.onnx"
    cfg = json.loads((built_gen.built / "genai_config.json").read_text())
    folder = genai_config.write_folder(tmp_path / "genai", engine, cfg)
    genai = runners.GenaiRunner(folder, cfg["model"]["context_length"])
    loop = runners.OrtLoopRunner(engine, eos=511, threads=1)
    torch_runner = runners.TorchStaticRunner(runners.torch_decoder(recipe, models.load(recipe), 64), eos=511)
    rng = np.random.default_rng(0)
    one = Request("p", "point", 2, ((rng.integers(0, 511, size=(2, 7)), 6),))
    tokens = [generate(r, one).tokens for r in (genai, loop, torch_runner)]
    assert tokens[0].shape == (2, 6)
    assert (tokens[0] == tokens[2]).all() and (tokens[1] == tokens[2]).all()
    turns = Request("t", "task", 1, ((rng.integers(0, 511, size=(1, 5)), 4),
                                     (rng.integers(0, 511, size=(1, 3)), 4)))
    assert (generate(loop, turns).tokens == generate(torch_runner, turns).tokens).all()


def test_genai_cannot_append_a_turn_to_a_concatenating_cache(built_gen: Project, tmp_path):
    """Why the task runs on the IOBinding loop: if this starts to pass in a genai release,
    GenaiRunner.turns can become True."""
    from pipeline.generation import genai_config, runners

    engine = built_gen.built / "onnxruntime.onnx"
    cfg = json.loads((built_gen.built / "genai_config.json").read_text())
    genai = runners.GenaiRunner(genai_config.write_folder(tmp_path / "g", engine, cfg),
                                cfg["model"]["context_length"])
    assert genai.turns is False
    genai.new(1)
    genai.prefill(np.arange(1, 6)[None])
    genai.step()
    # the mask (and, without attention_with_past, the presents) one token longer than the cache
    with pytest.raises(RuntimeError, match="present|total_sequence_length"):
        genai.generator.append_tokens(np.array([[7, 8]], dtype=np.int32))


# ----------------------------------------------------------------------------- TensorRT
def test_tensorrt_profiles_cover_prefill_and_decode_of_the_kv_graph(project, monkeypatch, tmp_path):
    """Up to the TensorRT boundary: Polygraphy's real loader objects for the KV-cache graph."""
    from pipeline.backends import tensorrt as trt_backend

    monkeypatch.chdir(project.path)
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "cache"))
    recipe = load("standard-gen")
    target = next(t for t in recipe.targets if t.kind == "tensorrt")
    plan = trt_backend.plan(tmp_path / "model.onnx", tmp_path / "e.plan", recipe, target,
                            {"tensorrt": "10.8.0.43", "gpu": "NVIDIA H200", "compute_capability": "9.0"})
    chain = trt_backend.loaders(plan, enum=lambda kind, name: f"trt.{kind}.{name}")
    general, decode = chain._engine._config.profiles
    past = recipe.workload.context_max()
    assert tuple(map(list, general["past_key_values.0.key"])) == ([1, 2, 1, 16], [2, 2, 64, 16], [8, 2, past, 16])
    assert tuple(map(list, decode["input_ids"])) == ([1, 1], [2, 1], [8, 1])
    assert tuple(map(list, decode["attention_mask"])) == ([1, 2], [2, 65], [8, past + 1])
    # every input of the graph has a range in every profile
    assert set(general) == set(decode) == {i.name for i in recipe.inputs}


def test_compare_refuses_a_forward_recipe_before_building(project: Project):
    res = project.run("compare", "standard-gen", "standard")
    assert res.code == 2, res.err
    assert len(res.error_lines) == 1 and "generation" in res.error_lines[0]
    assert not project.engines.exists()  # refused before any work


def test_workload_needs_batch_one(project: Project):
    res = project.run("export", "standard-gen", "--set", "workload.batch_sizes=[4]")
    assert res.code == 2 and len(res.error_lines) == 1
    assert "workload.batch_sizes" in res.error_lines[0] and "needs 1" in res.error_lines[0]
