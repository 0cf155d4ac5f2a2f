"""stages/export.py: the export defects found trying real models (each test failed before
its fix): parity and baseline on an instance never traced, TorchScript export of a
transformers BERT, and an export failure that names its cause and the other exporter."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.errors import StageFailed
from pipeline.recipe import Recipe


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
