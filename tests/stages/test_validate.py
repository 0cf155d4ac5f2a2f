"""stages/validate.py's gates: a top-1 gate needs a logits output, and a top-1 gate that is
set runs (and fails, saying why) even when agreement cannot be measured."""

from __future__ import annotations

from pipeline.recipe import Recipe


def test_top1_gate_without_a_logits_output_is_refused(project):
    result = project.run("export", "minilm", "--set", "validate.tolerance.top1_min=0.9")
    assert result.code == 2 and "validate.top1_outputs" in result.error_lines[0]


def test_a_set_top1_gate_runs_even_when_agreement_cannot_be_measured():
    from pipeline.artifacts.report import OutputAccuracy
    from pipeline.stages.validate import gates

    r = Recipe.model_validate({"model": {"zoo": "glm"}, "outputs": ["logits"], "targets": [{"kind": "onnxruntime"}],
                               "inputs": [{"name": "input_ids", "dtype": "int64", "shape": [1, 4], "range": [0, 9]}],
                               "validate": {"tolerance": {"top1_min": 0.9}}})
    acc = {"logits": OutputAccuracy(cosine=1.0, max_abs=0.0, mean_abs=0.0, max_rel=0.0,
                                    top1_agreement=None, nonfinite=0)}
    (top1,) = [g for g in gates(r, acc) if g.name == "logits.top1_agreement"]
    assert not top1.passed and "not measurable" in top1.detail
