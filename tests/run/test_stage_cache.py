"""run/stage_cache.py on its own: the Stage records, a stage's key, commit and cache hit, its
records dumped once and handed back typed, a failing stage leaving nothing. Real stores in a
temporary folder, real recipes; the stages are small functions writing real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.artifacts import Gate, Versus
from pipeline.core import deps
from pipeline.core.errors import StageFailed
from pipeline.core.ui import Progress
from pipeline.recipe import load
from pipeline.run import code_digest
from pipeline.run.stage_cache import GRAPH_STAGES, STAGES, STOPS, StageCache, build_keys, code
from pipeline.stages import Produced
from pipeline.store.recipe_folder import Store


@pytest.fixture
def cache(tmp_path) -> StageCache:
    recipe = load("standard")
    return StageCache(Store(tmp_path, recipe.name), recipe, "model-code", False, Progress())


def write(workdir: Path, name: str, text: str) -> Produced:
    (workdir / name).write_text(text)
    return Produced({name: workdir / name}, {"said": text})


def test_every_stage_record_names_a_module_and_known_upstream_stages():
    for kind, stage in STAGES.items():
        assert stage.kind == kind and code_digest._path(stage.module) is not None, stage
        assert set(stage.upstream) <= set(STAGES) - {kind}, stage
    assert GRAPH_STAGES == ("export", "optimize", "precision")
    assert STOPS == ("export", "optimize", "precision", "build", "validate", "report")
    # a stage's key holds its upstream's code: the report's holds every other stage's module
    report_code = code_digest.closure(tuple(STAGES[k].module for k in (*STAGES["report"].upstream, "report")))
    assert {s.module for s in STAGES.values()} <= set(report_code)
    assert code("validate") != code("build")


def test_build_keys_follow_the_target_not_the_backend():
    recipe = load("standard")
    ort, trt = recipe.targets
    cpu = ort.model_copy(update={"provider": "cpu"})
    assert build_keys(cpu) == () and set(build_keys(trt)) == set(deps.GPU_KEYS)
    assert set(build_keys(ort)) == set(deps.GPU_KEYS)  # provider auto: may build for the GPU
    assert build_keys(cpu.model_copy(update={"optimization_level": "all"})) == ("cpu_isa",)


def test_a_key_changes_with_spec_inputs_and_device_keys_and_nothing_else(cache, tmp_path):
    base = cache.key("export", {"a": 1}, [])
    assert base == cache.key("export", {"a": 1}, [])
    assert base != cache.key("export", {"a": 2}, [])
    assert base != cache.key("export", {"a": 1}, [], device_keys=deps.CPU_KEYS)
    assert cache.key("optimize", {}, []) != cache.key("optimize:plain", {}, [])


def test_a_stage_runs_once_then_is_cached_with_its_meta(cache):
    calls = []

    def produce(wd: Path) -> Produced:
        calls.append(wd)
        return write(wd, "out.txt", "hello")

    first = cache.stage("export", {"a": 1}, [], produce)
    again = cache.stage("export", {"a": 1}, [], produce)
    assert len(calls) == 1 and not first.cached and again.cached
    assert again.meta == {"said": "hello"} and again.one().path.read_text() == "hello"
    assert cache.store.manifest.stages["export"].outputs == ["out.txt"]
    cache.stage("export", {"a": 2}, [], produce)  # another spec: runs again
    assert len(calls) == 2


def test_records_are_dumped_at_commit_and_read_back_typed(cache, tmp_path):
    made = Versus(other="flash", target="onnxruntime", reason="no engine to compare with")
    result = cache.stage("versus:onnxruntime:flash", {}, [],
                         lambda wd: Produced(records={"versus-onnxruntime-flash.json": made}))
    assert result.record("versus-onnxruntime-flash.json") is made  # in memory, as made
    on_disk = json.loads((cache.store.dir / "versus-onnxruntime-flash.json").read_text())
    assert on_disk["reason"] == "no engine to compare with" and "comparison" not in on_disk
    hit = cache.stage("versus:onnxruntime:flash", {}, [], lambda wd: pytest.fail("cached"))
    read = hit.record("versus-onnxruntime-flash.json")
    assert hit.cached and isinstance(read, Versus) and read == made


def test_a_failing_stage_is_one_stage_failure_and_leaves_nothing(cache):
    def produce(wd: Path) -> Produced:
        (wd / "half.onnx").write_text("half")
        raise ValueError("a library failed")

    with pytest.raises(StageFailed, match="export failed: ValueError: a library failed"):
        cache.stage("export", {}, [], produce)
    assert "export" not in cache.store.manifest.stages
    assert not (cache.store.dir / "half.onnx").exists()
    assert not cache.store.workdir("export").exists() or not any(cache.store.workdir("export").iterdir())


def test_records_of_targets_the_recipe_dropped_are_forgotten(cache):
    cache.stage("validate:gone", {}, [], lambda wd: write(wd, "v.txt", "x"))
    cache.stage("validate:onnxruntime", {}, [], lambda wd: write(wd, "w.txt", "y"))
    cache.forget_targets_not_in(cache.recipe)
    assert set(cache.store.manifest.stages) == {"validate:onnxruntime"}


def test_a_gate_is_a_typed_record():
    gate = Gate(name="logits.cosine", passed=True, detail="1.0 >= 0.99")
    with pytest.raises(ValueError):
        Gate(name="x", passed="yes", detail="strict: a string is no bool")
    assert gate.model_dump() == {"name": "logits.cosine", "passed": True, "detail": "1.0 >= 0.99"}
