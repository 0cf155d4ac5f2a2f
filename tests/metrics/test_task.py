"""Task metrics (pure functions), the max_task_loss gate, and the export defects found
trying real models (each test failed before its fix)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.errors import StageFailed
from pipeline.metrics import task as tm
from pipeline.recipe import Recipe
from tests.conftest import FAST


# ------------------------------------------------------------------ metrics
def test_token_nll_is_cross_entropy_over_real_next_tokens():
    import torch

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 5, 7)).astype(np.float32)
    ids = rng.integers(0, 7, size=(2, 5))
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    nll, count = tm.token_nll(logits, ids, mask)
    assert list(count) == [4, 2]  # padded positions neither predict nor are predicted
    expected = torch.nn.functional.cross_entropy(torch.from_numpy(logits[1, :2]).double(),
                                                 torch.from_numpy(ids[1, 1:3]), reduction="sum")
    assert nll[1] == pytest.approx(float(expected), rel=1e-9)
    assert tm.perplexity(nll, count) == pytest.approx(np.exp(nll.sum() / 6))


def test_scores_of_identical_outputs_have_zero_delta_and_interval():
    rng = np.random.default_rng(1)
    outs = [{"y": rng.standard_normal((4, 3))} for _ in range(3)]
    labels = np.concatenate([o["y"].argmax(-1) for o in outs])
    labels[:2] = (labels[:2] + 1) % 3  # two wrong: accuracy 10/12
    task = tm.score("accuracy", [{}] * 3, outs, outs, "y", labels, None)
    assert task["baseline"] == task["engine"] == pytest.approx(10 / 12)
    assert task["delta"] == 0 and task["ci95"] == [0.0, 0.0] and tm.loss(task) == 0


def test_embedding_similarity_ranks_pairs_and_sees_a_worse_engine():
    rng = np.random.default_rng(2)
    gold = np.linspace(0, 5, 40)
    a = rng.standard_normal((40, 16))
    noise = rng.standard_normal((40, 16))
    b = a + noise * (5 - gold)[:, None] / 2  # higher gold score: closer pair
    ref = np.empty((80, 16))
    ref[0::2], ref[1::2] = a, b
    worse = ref + rng.standard_normal(ref.shape) * 2.0
    task = tm.score("embedding_similarity", [{}], [{"e": ref}], [{"e": worse}], "e", gold, None)
    assert task["baseline"] > 0.8 and task["delta"] < 0 and task["ci95"][1] < 0
    assert tm.loss(task) > 0 and 0 <= task["retrieval_top1_agreement"] < 1


def test_perplexity_loss_is_the_rise_and_relative_bounds_scale_with_the_baseline():
    from pipeline.bench.gates import task_gate

    task = {"metric": "perplexity", "baseline": 10.0, "engine": 10.5, "delta": 0.5, "ci95": [0.3, 0.7]}
    base = {"model": {"zoo": "glm"}, "inputs": [{"name": "input_ids", "dtype": "int64", "shape": [1, 4],
                                                 "range": [0, 256]}],
            "outputs": ["logits"], "targets": [{"kind": "onnxruntime"}],
            "data": {"validation": {"text": "x.txt", "tokenizer": "bytes"}}, "validate": {"task": "perplexity"}}
    for bound, passed in ((0.4, False), (0.5, True), ("4%", False), ("5%", True)):
        r = Recipe.model_validate({**base, "expect": {"max_task_loss": bound}})
        gate = task_gate(r, task)
        assert gate.passed is passed, gate.detail
    assert not task_gate(r, None).passed  # a set gate with nothing measured fails


# ------------------------------------------------------------------ the LM family, end to end
def test_int4_lm_reports_perplexity_and_fails_a_zero_task_loss_with_exit_3(project):
    """Real text through the trained byte-level LM: report.json names both data files with
    sha256, the engine's task entry has PyTorch and engine perplexity with an interval, and
    expect.max_task_loss (set to 0: INT4 weights always cost some perplexity) exits 3."""
    result = project.run("run", "lm-int4", *FAST, "--set", "data.validation.samples=2",
                         "--set", "expect.max_task_loss=0.0", "--set", "optimize.passes=[]",
                         "--set", "validate.tolerance.top1_min=0.5",
                         "--set", "validate.tolerance.cosine_min=0.5")
    assert result.code == 3, result.err
    assert "expect.max_task_loss" in result.error_lines[0]
    report = json.loads((project.folder(result) / "report.json").read_text())
    assert report["data"]["validation"]["source"] == "data/shakespeare/validation.jsonl"
    assert report["data"]["validation"]["samples"] == 16  # 2 feeds of 8 passages
    assert len(report["data"]["calibration"]["sha256"]) == 64
    task = report["engines"][0]["task"]
    assert task["metric"] == "perplexity" and 1 < task["baseline"] < 20  # a model that learned bytes
    assert task["delta"] > 0 and task["ci95"][0] <= task["delta"] <= task["ci95"][1]
    md = (project.folder(result) / "report.md").read_text()
    assert "- data: validation data/shakespeare/validation.jsonl (16 samples" in md.splitlines()[8]
    assert "Task `perplexity`" in md


# ------------------------------------------------------------------ export defects
def _recipe(factory: str, inputs: list, outputs: list, exporter: str = "dynamo", tmp=None) -> Recipe:
    return Recipe.model_validate({"model": {"factory": factory}, "inputs": inputs, "outputs": outputs,
                                  "export": {"exporter": exporter}, "targets": [{"kind": "onnxruntime"}],
                                  "data": {"calibration": None}})


def test_parity_and_baseline_use_an_instance_that_was_never_traced(tmp_path):
    from pipeline import data
    from pipeline.model import sources as models
    from pipeline.stages import export, validate

    r = _recipe("tests.data_models:changes_when_traced",
                [{"name": "x", "dtype": "float32", "shape": [2, 4]}], ["y"], "torchscript")
    meta = export.run(r, None, tmp_path).meta  # parity against the traced instance failed (max_abs 1)
    assert meta["parity"]["y"]["max_abs"] < 1e-5
    validate.baseline(r.model_copy(update={"validate_": r.validate_.model_copy(update={
        "latency": r.validate_.latency.model_copy(update={"warmup": 1, "iterations": 10, "min_seconds": 0})})}),
        tmp_path)
    feeds, outputs = data.load_feeds(tmp_path / "baseline.npz")
    fresh = models.load(r)
    import torch

    with torch.no_grad():
        assert np.allclose(outputs[0]["y"], fresh(torch.from_numpy(feeds[0]["x"])).numpy())


def test_torchscript_exports_a_transformers_bert_by_name(tmp_path):
    from pipeline.stages import export

    shape = [{"name": "batch", "min": 1, "opt": 2, "max": 2}, {"name": "sequence", "min": 2, "opt": 8, "max": 16}]
    r = _recipe("tests.data_models:tiny_bert",
                [{"name": "input_ids", "dtype": "int64", "shape": shape, "range": [0, 64]},
                 {"name": "attention_mask", "dtype": "int64", "shape": shape, "range": [1, 2]}],
                ["hidden", "pooled"], "torchscript")
    made = export.run(r, None, tmp_path)
    files, meta = made.files, made.meta  # before: "got multiple values for argument 'use_cache'"
    assert files["model.onnx"].is_file() and meta["parity"]["hidden"]["max_abs"] < 1e-4


def test_export_failure_names_the_cause_and_the_other_exporter(tmp_path):
    from pipeline.stages import export

    r = _recipe("tests.data_models:fails_when_exporting", [{"name": "x", "dtype": "float32", "shape": [2, 4]}], ["y"])
    with pytest.raises(StageFailed) as info:
        export.run(r, None, tmp_path)
    line = str(info.value)
    assert "\n" not in line and "module 'triton' has no attribute 'language'" in line
    assert "try export.exporter: torchscript" in line


def test_top1_gate_without_a_logits_output_is_refused(project):
    result = project.run("export", "minilm", "--set", "validate.tolerance.top1_min=0.9")
    assert result.code == 2 and "validate.top1_outputs" in result.error_lines[0]


def test_a_set_top1_gate_runs_even_when_agreement_cannot_be_measured():
    from pipeline.stages.validate import gates

    r = Recipe.model_validate({"model": {"zoo": "glm"}, "outputs": ["logits"], "targets": [{"kind": "onnxruntime"}],
                               "inputs": [{"name": "input_ids", "dtype": "int64", "shape": [1, 4], "range": [0, 9]}],
                               "validate": {"tolerance": {"top1_min": 0.9}}})
    acc = {"logits": {"cosine": 1.0, "max_abs": 0.0, "top1_agreement": None, "nonfinite": 0}}
    (top1,) = [g for g in gates(r, acc) if g.name == "logits.top1_agreement"]
    assert not top1.passed and "not measurable" in top1.detail
