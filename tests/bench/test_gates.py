"""metrics/gates.py: the max_task_loss gate, absolute or relative to the baseline's score."""

from __future__ import annotations

from pipeline.recipe import Recipe


def test_perplexity_loss_is_the_rise_and_relative_bounds_scale_with_the_baseline():
    from pipeline.artifacts.report import TaskMetric
    from pipeline.metrics.gates import task_gate

    task = TaskMetric(metric="perplexity", baseline=10.0, engine=10.5, delta=0.5, ci95=[0.3, 0.7])
    base = {"model": {"zoo": "glm"}, "inputs": [{"name": "input_ids", "dtype": "int64", "shape": [1, 4],
                                                 "range": [0, 256]}],
            "outputs": ["logits"], "targets": [{"kind": "onnxruntime"}],
            "data": {"validation": {"text": "x.txt", "tokenizer": "bytes"}}, "validate": {"task": "perplexity"}}
    for bound, passed in ((0.4, False), (0.5, True), ("4%", False), ("5%", True)):
        r = Recipe.model_validate({**base, "expect": {"max_task_loss": bound}})
        gate = task_gate(r, task)
        assert gate.passed is passed, gate.detail
    assert not task_gate(r, None).passed  # a set gate with nothing measured fails
