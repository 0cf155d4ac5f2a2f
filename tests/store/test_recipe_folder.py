"""store/recipe_folder.py on its own: atomic commits checked against the manifest, the
folder's lock, in real folders under tmp_path."""

from __future__ import annotations

import pytest

from pipeline.errors import IntegrityError, LockError
from pipeline.store.recipe_folder import Store


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
