"""metrics/task.py: the task metrics (pure functions), and the perplexity of the trained
byte-level LM end to end, where the max_task_loss gate fails an INT4 engine (exit 3)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.metrics import task as tm
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
    assert task.baseline == task.engine == pytest.approx(10 / 12)
    assert task.delta == 0 and task.ci95 == [0.0, 0.0] and tm.loss(task) == 0


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
    assert task.baseline > 0.8 and task.delta < 0 and task.ci95[1] < 0
    assert tm.loss(task) > 0 and 0 <= task.retrieval_top1_agreement < 1


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


