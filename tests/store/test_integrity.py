"""store/integrity.py's verify against a folder another process commits to meanwhile: two
`pipeline serve` of one engines folder, one recording its cold start (serve-start-*.json,
under the folder's lock) while the other checks the folder, once refused the second with
"sha256 ... does not match the manifest's" (benchmarks/chat_peers.py, 2026-12-07). Real
folders and real commits under tmp_path; the commit is made at the racy moment (after the
check read the manifest, before it hashed the file) by the check's own hashing."""

from __future__ import annotations

import pytest

from pipeline.artifacts.manifest import StageRecord
from pipeline.store import integrity
from pipeline.store.recipe_folder import Store


def _commit_serve_start(root, text: str) -> None:
    """What coldstart.record does: the stage `serve:x`'s file committed under the lock (a
    plain text file here: a serve-start-*.json's content is checked against its model too)."""
    store = Store(root, "r")
    with store.lock():
        work = store.workdir("serve:x")
        (work / "start.txt").write_text(text)
        store.commit_stage("serve:x", {"start.txt": work / "start.txt"},
                           StageRecord(key="cd" * 32, outputs=["start.txt"]))


@pytest.fixture
def folder(tmp_path):
    store = Store(tmp_path, "r")
    with store.lock():
        work = store.workdir("build:x")
        (work / "engine.bin").write_bytes(b"engine bytes")
        store.commit_stage("build:x", {"engine.bin": work / "engine.bin"},
                           StageRecord(key="ab" * 32, outputs=["engine.bin"]))
    _commit_serve_start(tmp_path, '{"cold_start_s": 1.0}')
    return store.dir


def test_a_commit_landing_mid_check_is_not_a_mismatch(folder, monkeypatch):
    hash_file, landed = integrity.sha256_file, []

    def hash_after_another_commit(path):
        if path.name == "start.txt" and not landed:  # the manifest is read by now
            _commit_serve_start(folder.parent, '{"cold_start_s": 22.0}')
            landed.append(path)
        return hash_file(path)

    monkeypatch.setattr(integrity, "sha256_file", hash_after_another_commit)
    verdict = integrity.verify(folder, environment=False)
    assert landed, "the other commit never landed during the check"
    assert verdict.mismatches == [], verdict.mismatches
    assert (folder / "start.txt").read_text() == '{"cold_start_s": 22.0}'


def test_a_file_changed_without_a_commit_is_still_a_mismatch(folder):
    (folder / "start.txt").write_text('{"cold_start_s": 9.0}')  # the manifest unchanged
    [bad] = integrity.verify(folder, environment=False).mismatches
    assert bad.what == "start.txt" and "does not match the manifest" in bad.detail
