"""store/recipe_folder.py on its own: atomic commits checked against the manifest, a stage's
commit read back by a fresh store, an interrupted commit told from tampering, an unreadable
manifest set aside, and the folder's lock; real folders under tmp_path."""

from __future__ import annotations

import hashlib

import pytest

from pipeline.artifacts.manifest import StageRecord
from pipeline.core.errors import IntegrityError, LockError
from pipeline.store.recipe_folder import ASIDE, MANIFEST, Interrupted, Store


def test_commit_is_atomic_and_verify_detects_a_changed_byte(tmp_path):
    store = Store(tmp_path, "r")
    work = store.workdir("build:x")
    (work / "e.bin").write_bytes(b"engine bytes")
    art = store.commit(work / "e.bin", "e.bin", "build:x")
    assert art.path.read_bytes() == b"engine bytes" and not (work / "e.bin").exists()
    assert store.verify("e.bin").sha256 == art.sha256
    art.path.write_bytes(b"engine bytez")
    with pytest.raises(IntegrityError, match="does not match the manifest"):
        store.verify("e.bin")


def test_lock_excludes_a_second_writer(tmp_path):
    import subprocess
    import sys

    store = Store(tmp_path, "r")
    with store.lock():
        code = (
            "import sys; from pathlib import Path; from pipeline.store.recipe_folder import Store\n"
            f"s = Store(Path({str(tmp_path)!r}), 'r')\n"
            "try:\n    s.lock(wait=0.5).__enter__()\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert out.startswith(LockError.__name__) and "locked by pid" in out


def _commit_export(store: Store, graph: bytes = b"graph bytes") -> dict:
    """The export stage's commit, as the stage cache makes it: files from the work folder."""
    work = store.workdir("export")
    (work / "model.onnx").write_bytes(graph)
    (work / "notes.txt").write_text("made by the stage")
    record = StageRecord(key="ab" * 32, outputs=["model.onnx", "notes.txt"])
    return store.commit_stage("export", {"model.onnx": work / "model.onnx",
                                         "notes.txt": work / "notes.txt"}, record)


def test_a_committed_stage_is_what_a_fresh_store_reads_and_the_lock_sweeps_leftovers(tmp_path):
    store = Store(tmp_path, "r")
    with store.lock():
        made = _commit_export(store)
        (store.tmp / "killed-stage").mkdir()  # what a killed run leaves behind
    again = Store(tmp_path, "r")  # another process, reading the manifest from the disk
    assert again.manifest.stages["export"].outputs == ["model.onnx", "notes.txt"]
    assert again.stage_record("export") == StageRecord(key="ab" * 32, outputs=["model.onnx", "notes.txt"])
    assert again.stage_ids() == ["export"] and again.file_names() == ["model.onnx", "notes.txt"]
    assert again.manifest.pending == {}
    assert {n: e.sha256 for n, e in again.manifest.files.items()} == {n: a.sha256 for n, a in made.items()}
    assert {e.stage for e in again.manifest.files.values()} == {"export"}
    again.verify_all()
    assert again.read_json("model.onnx") is None  # recorded, verified, and not JSON
    with again.lock():
        assert not store.tmp.exists()  # swept when the next writer takes the folder


def test_a_commit_under_the_lock_keeps_what_another_process_committed_meanwhile(tmp_path):
    """Two writers of one folder (a server's start record and a load result): the one whose
    manifest was read before the other's commit reads it again under the lock, so neither
    commit is lost."""
    first, second = Store(tmp_path, "r"), Store(tmp_path, "r")
    assert first.manifest.stages == {}  # read now, before the other commit
    with second.lock():
        _commit_export(second)
    with first.lock():
        work = first.workdir("serve:x")
        (work / "serve.json").write_text("{}")
        first.commit_stage("serve:x", {"serve.json": work / "serve.json"},
                           StageRecord(key="cd" * 32, outputs=["serve.json"]))
    again = Store(tmp_path, "r")
    assert again.stage_ids() == ["export", "serve:x"]
    again.verify_all()


def test_a_file_with_only_its_pending_digest_is_an_interrupted_commit_not_tampering(tmp_path):
    store = Store(tmp_path, "r")
    _commit_export(store)
    # killed after announcing a new graph (step 1) and renaming it in, before recording it
    store.forget_stage("export")
    store.manifest.pending = {"model.onnx": hashlib.sha256(b"new graph").hexdigest()}
    store.save_manifest()
    (store.dir / "model.onnx").write_bytes(b"new graph")
    again = Store(tmp_path, "r")
    with pytest.raises(Interrupted, match="an interrupted commit"):
        again.verify("model.onnx")
    again.verify_all()  # its stage has no record: it reruns, nothing to refuse
    (store.dir / "model.onnx").write_bytes(b"other graph")  # neither digest: changed by hand
    with pytest.raises(IntegrityError, match="does not match the manifest"):
        Store(tmp_path, "r").verify_all()


def test_an_unreadable_manifest_is_refused_then_set_aside_whole(tmp_path):
    store = Store(tmp_path, "r")
    _commit_export(store)
    (store.dir / MANIFEST).write_text('{"schema": 1, "files": ')
    with pytest.raises(IntegrityError, match="unreadable manifest") as info:
        Store(tmp_path, "r").read_manifest()
    assert "--force" in info.value.hint
    fresh = Store(tmp_path, "r")
    aside = fresh.set_aside_bad_manifest()
    assert aside.name.startswith(f"{MANIFEST}{ASIDE}") and aside.read_text() == '{"schema": 1, "files": '
    assert fresh.manifest.files == {} and not (store.dir / MANIFEST).exists()
    assert fresh.set_aside_bad_manifest() is None  # nothing unreadable left
