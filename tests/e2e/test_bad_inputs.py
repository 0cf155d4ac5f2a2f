"""The bad-input corpus (tests/bad_inputs/cases.yaml) through the real CLI, one case each:
the exit code, exactly one `Error:` line holding the expected text, no traceback, and no
artifact under engines/ created or changed."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import FAST, STANDARD, Project

CASES_DIR = Path(__file__).resolve().parent.parent / "bad_inputs"
CASES = yaml.safe_load((CASES_DIR / "cases.yaml").read_text())


def artifacts(project: Project) -> dict[str, str]:
    """sha256 of every file under engines/ but the bookkeeping ones (.lock, .tmp/)."""
    if not project.engines.exists():
        return {}
    return {
        str(p.relative_to(project.engines)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(project.engines.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(project.engines).parts)
    }


class _Payload:
    def __reduce__(self):
        return (open, ("PWNED", "w"))


def tamper(folder: Path, change: dict) -> None:
    path = folder / change["file"]
    data = bytearray(path.read_bytes())
    if change["do"] == "flip":
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    elif change["do"] == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif change["do"] == "write":
        path.write_text(change["text"])
    elif change["do"] == "pickle":  # loading this with pickle allowed would create ./PWNED
        np.savez(path, **{"in/0/input_ids": np.array([_Payload()], dtype=object)})
    elif change["do"] == "rehash":  # the manifest agrees with the broken file
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["files"][change["file"]].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    else:
        raise ValueError(change)


def test_the_corpus_is_complete():
    assert len(CASES) >= 30
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids))
    # every fixture file is used by a case (directly, as a base, or as a weights file)
    used = " ".join((CASES_DIR / c["recipe"]).read_text(errors="replace") + c["recipe"]
                    for c in CASES if "recipe" in c)
    for path in CASES_DIR.iterdir():
        if path.name not in ("cases.yaml", "make_weights.py", "__pycache__"):
            assert path.name in used, f"{path.name} is in no case"
    for case in CASES:
        assert case["code"] in (2, 4, 5) and case["error"], case["id"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bad_input(case, tmp_path, request):
    project = Project(tmp_path)
    shutil.copytree(CASES_DIR, project.path / "recipes" / "bad")
    for name, target in (case.get("symlink") or {}).items():
        (project.path / "recipes" / "bad" / name).symlink_to(target)
    if case.get("built"):
        shutil.copytree(request.getfixturevalue("built_standard").engines, project.engines)
        for change in case["tamper"]:
            tamper(project.engines / STANDARD, change)
        args = ("standard", *FAST)
    elif "recipe" in case:
        args = (f"recipes/bad/{case['recipe']}",)
    else:
        args = tuple(case["args"])
    before = artifacts(project)

    result = project.run(case.get("command", "run"), *args)

    assert "Traceback" not in result.err, result.err
    assert len(result.error_lines) == 1, result.err
    expected = case["error"].replace("FOLDER", STANDARD)  # where `run standard *FAST` writes
    assert expected in result.error_lines[0], result.error_lines[0]
    assert result.code == case["code"], result.err
    assert artifacts(project) == before
    assert not (project.path / "PWNED").exists()  # nothing in the input was executed
