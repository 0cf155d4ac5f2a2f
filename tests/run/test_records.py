"""run/records.py: the one writer of stage records and the one recipe of their keys. Real
stores in a temporary folder; the manifest read back from the disk, as another command would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.artifacts.manifest import StageRecord
from pipeline.core import deps
from pipeline.core.ui import Progress
from pipeline.recipe import load, sha256_json
from pipeline.run import records
from pipeline.run.stage_cache import StageCache, code
from pipeline.store.recipe_folder import MANIFEST, Store


def files(store: Store, stage_id: str, **texts: str) -> dict[str, Path]:
    work = store.workdir(stage_id)
    for name, text in texts.items():
        (work / name).write_text(text)
    return {name: work / name for name in texts}


def on_disk(store: Store) -> dict:
    return json.loads((store.dir / MANIFEST).read_text())["stages"]


def test_a_runs_key_is_the_hash_every_cached_folder_was_recorded_with(tmp_path):
    # the parts and their names are the cache's contract with every engines folder: a change
    # here reruns every stage of every folder after an upgrade
    recipe = load("standard")
    cache = StageCache(Store(tmp_path, recipe.name), recipe, "model-code", False, Progress())
    expected = sha256_json({"stage": "optimize", "spec": {"a": 1}, "model_code": "model-code",
                            "code": code("optimize"), "inputs": {}, "versions": deps.versions(),
                            "device": deps.device_part(deps.CPU_KEYS)})
    assert cache.key("optimize", {"a": 1}, []) == expected
    assert records.stage_key("load:x", {"a": 1}, {}) != records.stage_key("load:y", {"a": 1}, {})


def test_a_record_holds_exactly_what_was_given_as_manifests_always_have(tmp_path):
    store = Store(tmp_path, "r")
    key = records.stage_key("x", None, {})
    with store.lock():
        records.commit(store, "run", files(store, "run", **{"a.txt": "a"}), key,
                       meta={"n": 1}, seconds=1.23456)
        records.commit(store, "load:x", files(store, "load:x", **{"b.txt": "b"}), key, stamped=False)
        records.commit(store, "serve:x", files(store, "serve:x", **{"c.txt": "c"}), key)
    stages = on_disk(store)
    assert list(stages["run"]) == ["key", "outputs", "meta", "seconds", "finished"]
    assert stages["run"]["seconds"] == 1.235 and stages["run"]["meta"] == {"n": 1}
    assert stages["load:x"] == {"key": key, "outputs": ["b.txt"], "meta": {}}
    assert list(stages["serve:x"]) == ["key", "outputs", "meta", "finished"]
    typed = Store(tmp_path, "r").stage_record("run")
    assert isinstance(typed, StageRecord) and typed.outputs == ["a.txt"] and typed.key == key
    assert Store(tmp_path, "r").stage_record("never") is None


def test_recommit_replaces_files_and_keeps_the_record_as_it_was(tmp_path):
    store = Store(tmp_path, "r")
    with store.lock():
        records.commit(store, "report", files(store, "report", **{"report.json": "{}", "report.md": "old"}),
                       records.stage_key("report", None, {}), meta={"m": 1}, seconds=2.0)
        before = on_disk(store)["report"]
        records.recommit(store, "report", files(store, "again", **{"report.md": "new"}))
        assert on_disk(store)["report"] == before
        assert store.verify("report.md").path.read_text() == "new"
        with pytest.raises(ValueError, match="never recorded other.md"):
            records.recommit(store, "report", files(store, "again", **{"other.md": "x"}))
        with pytest.raises(ValueError, match="no record"):
            records.recommit(store, "missing", files(store, "again", **{"report.md": "x"}))


def test_a_meta_that_cannot_be_written_fails_before_any_file_moves(tmp_path):
    store = Store(tmp_path, "r")
    with store.lock(), pytest.raises(Exception, match="serialize"):
        records.commit(store, "run", files(store, "run", **{"a.txt": "a"}),
                       records.stage_key("run", None, {}), meta={"not json": object()})
    assert not (store.dir / "a.txt").exists() and not (store.dir / MANIFEST).exists()


def test_the_report_says_each_stage_s_time_and_peak_memory(built_standard):
    """A run records every stage's peak resident memory (VmHWM reset at its start) beside its
    time, and report.json / report.md carry them: a build that outgrows a runner shows where."""
    from tests.conftest import STANDARD

    folder = built_standard.engines / STANDARD
    stages = json.loads((folder / "manifest.json").read_text())["stages"]
    report = json.loads((folder / "report.json").read_text())
    for sid in ("export", "baseline", "build:onnxruntime", "validate:onnxruntime"):
        peak = stages[sid]["peak_rss_mb"]
        assert 50 < peak < 24 * 1024, (sid, peak)  # a Python process with torch, under RAM
        assert report["stages"][sid] == {"seconds": stages[sid]["seconds"], "peak_rss_mb": peak,
                                         "finished": stages[sid]["finished"]}
    assert "report" not in report["stages"]
    text = (folder / "report.md").read_text()
    assert "## Stages" in text
    assert f"| export | {stages['export']['seconds']:.1f} | {stages['export']['peak_rss_mb']:,.0f} |" in text
