"""pipeline/workloads: the registry picks one workload per recipe, the one EngineResult
builder, and no state a second run in the same process could see (data cache, --debug)."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import pytest

from pipeline import data, workloads
from pipeline.cli import main
from pipeline.core.errors import DependencyError
from pipeline.recipe import load
from pipeline.stages.validate import engine_result
from pipeline.store.recipe_folder import Artifact
from pipeline.workloads.base import Measured, Measurement, check


def test_the_registry_picks_the_workload_and_its_comparer_from_the_recipe():
    forward, generation = load("standard"), load("standard-gen")
    assert workloads.of(forward).KIND == "forward" and workloads.of(generation).KIND == "generation"
    assert workloads.of(forward).BASELINE == "torch-eager"
    assert workloads.comparer(forward).__name__ == "pipeline.compare.tensor"
    assert workloads.comparer(generation).__name__ == "pipeline.compare.generation"
    with pytest.raises(DependencyError, match="no workload `serving`"):
        workloads.get("serving")


def test_a_module_missing_part_of_the_contract_is_named():
    half = types.ModuleType("half")
    half.KIND, half.BASELINE = "forward", "x"
    with pytest.raises(DependencyError, match="lacks baseline, measure, engine_markdown"):
        check("forward", half)


ENGINE = Artifact(name="onnxruntime.onnx", path=Path("onnxruntime.onnx"), sha256="0" * 64, bytes=10)
ACCURACY = {"logits": {"max_abs": 1e-6, "mean_abs": 1e-7, "max_rel": 1e-5, "cosine": 0.99999,
                       "top1_agreement": 1.0, "nonfinite": 0}}
LATENCY = {"p50": 1.0, "p90": 1.1, "p99": 1.2, "mean": 1.0, "std": 0.1, "cov": 0.1, "n": 40}
SPEEDUP = {"ratio": 1.5, "ci95": [1.4, 1.6], "verdict": "faster", "noise_threshold": 0.05}


def _measured(accuracy: dict) -> Measured:
    return Measured(measurement=Measurement(
        accuracy=accuracy, latency_ms=LATENCY, baseline_latency_ms=LATENCY, speedup_vs_baseline=SPEEDUP,
        latency_method="test", threads=None, device="cpu"))


def test_one_builder_makes_every_engine_result(tmp_path):
    recipe = load("standard")
    target = recipe.targets[0]
    skipped = engine_result(recipe, target, ENGINE, Measured(skipped="no runner for this engine"), tmp_path)
    assert skipped.status == "skipped" and skipped.reason == "no runner for this engine" and not skipped.gates
    built = engine_result(recipe, target, ENGINE, _measured(ACCURACY), tmp_path)
    assert built.status == "built" and built.precision == "fp32" and built.sha256 == "0" * 64
    assert [g.name for g in built.gates] == ["logits.cosine", "logits.top1_agreement", "logits.finite"]
    assert all(g.passed for g in built.gates)
    worse = {"logits": {**ACCURACY["logits"], "cosine": 0.5}}
    failed = engine_result(recipe, target, ENGINE, _measured(worse), tmp_path)
    assert not failed.gates[0].passed and "0.500000 >= 0.9999" in failed.gates[0].detail


def test_the_data_cache_hands_each_caller_its_own_split():
    recipe = load("lm-fp32")
    first = data.split(recipe, "validation")
    count = len(first.feeds)
    first.feeds.clear()
    with pytest.raises(dataclasses.FrozenInstanceError):  # no caller can change it for the next
        first.provenance.source = "changed by a caller"
    second = data.split(recipe, "validation")
    assert len(second.feeds) == count and second.provenance == first.provenance


def test_debug_in_one_invocation_is_not_seen_by_the_next(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no recipes/ here: both fail the same way
    for argv, traced in ((["run", "nothing", "--debug"], True), (["run", "nothing"], False)):
        with pytest.raises(SystemExit) as ended:
            main(argv)
        err = capsys.readouterr().err
        assert ended.value.code == 2 and "Error: unknown recipe `nothing`" in err
        assert ("Traceback" in err) is traced, err
