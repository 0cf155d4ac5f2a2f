"""Folders that are consistent but broken, or not this user's to write: a JSON artifact whose
manifest entry was rewritten to match it, an unreadable manifest, a partial `--target` run,
a folder of several recipes with one bad manifest, and folders owned by another user. Every
case is one `Error:` line with the right exit code, and nothing already built is lost."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import FAST, ROOT, STANDARD, Project


def rehash(folder: Path, name: str, text: str) -> None:
    """Write `text` into `name` and its new sha256 and size into the manifest."""
    path = folder / name
    path.write_text(text)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][name].update(sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                                   bytes=path.stat().st_size)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def one_error(result, code: int) -> str:
    assert result.code == code, result.err
    assert "Traceback" not in result.err, result.err
    assert len(result.error_lines) == 1, result.err
    return result.error_lines[0]


@pytest.mark.parametrize("text, problem", [
    ("not json\n", "report.json: not valid JSON"),
    ("{}\n", "report.json: not a report this pipeline wrote"),
])
def test_a_rehashed_broken_report_is_refused_by_every_command(standard_copy, tmp_path, text, problem):
    proj = standard_copy
    rehash(proj.engines / STANDARD, "report.json", text)
    before = proj.snapshot()
    for args in (("run", "standard", *FAST), ("report", "standard", *FAST),
                 ("compare", "standard", "flash", *FAST),
                 ("deploy", "standard", "--triton", str(tmp_path / "models"), *FAST)):
        line = one_error(proj.run(*args), 5)
        assert problem in line and f"pipeline run {STANDARD} --force" in line, (args, line)
    assert not (tmp_path / "models").exists()
    verified = proj.run("verify", f"engines/{STANDARD}")
    assert f"{STANDARD}/report.json" in one_error(verified, 5)
    assert "✗ MISMATCH report.json: sha256 matches the manifest, but the file is" in verified.out
    assert proj.snapshot() == before


def test_a_rehashed_broken_validation_is_refused(standard_copy):
    proj = standard_copy
    rehash(proj.engines / STANDARD, "validate-onnxruntime.json", "[1]\n")
    before = proj.snapshot()
    line = one_error(proj.run("validate", "standard", *FAST), 5)
    assert "validate-onnxruntime.json: a JSON list" in line
    assert proj.snapshot() == before


def test_force_sets_an_unreadable_manifest_aside_and_rebuilds(standard_copy):
    proj = standard_copy
    folder = proj.engines / STANDARD
    (folder / "manifest.json").write_text("{x\n")
    line = one_error(proj.run("run", "standard", *FAST), 5)
    assert "unreadable manifest" in line and f"rebuild with `pipeline run {STANDARD} --force`" in line
    verified = proj.run("verify", f"engines/{STANDARD}")
    assert f"pipeline run {STANDARD} --force" in one_error(verified, 5)  # a hint that works
    forced = proj.run("run", "standard", *FAST, "--force")
    assert forced.code == 0, forced.err
    (aside,) = folder.glob("manifest.json.unreadable-*")
    assert aside.read_text() == "{x\n"  # kept, not deleted
    assert proj.run("verify", f"engines/{STANDARD}", "--files-only").code == 0


def test_verify_reports_every_folder_when_one_manifest_is_bad(standard_copy):
    proj = standard_copy
    shutil.copytree(proj.engines / STANDARD, proj.engines / "other")
    (proj.engines / "other" / "manifest.json").write_text("[]")
    result = proj.run("verify", "engines", "--files-only")
    line = one_error(result, 5)
    assert "other/manifest.json" in line
    assert f"engines/{STANDARD}" in result.out and "✓ onnxruntime.onnx: sha256" in result.out
    assert "engines/other" in result.out and "✗ MISMATCH manifest.json" in result.out


def test_a_run_of_one_target_keeps_the_other_targets_in_the_report(standard_copy, tmp_path):
    proj = standard_copy
    result = proj.run("run", "standard", *FAST, "--target", "tensorrt")
    assert result.code == 0, result.err
    report = json.loads((proj.engines / STANDARD / "report.json").read_text())
    assert [(e["target"], e["status"]) for e in report["engines"]] == [
        ("onnxruntime", "built"), ("tensorrt", "skipped")]
    deployed = proj.run("deploy", "standard", "--triton", str(tmp_path / "models"), *FAST)
    assert deployed.code == 0, deployed.err
    assert (tmp_path / "models" / "standard-onnxruntime" / "1" / "model.onnx").is_file()
    assert "not deployed: target `tensorrt` was skipped" in deployed.err
    assert "'.[gpu]'" in deployed.err.replace("\n", "")  # rich markup escaped, not eaten
    refused = proj.run("deploy", "standard", "--triton", str(tmp_path / "trt"), *FAST, "--target", "tensorrt")
    assert "cannot deploy: target `tensorrt` was skipped (" in one_error(refused, 2)


# ------------------------------------------------------------------ another user's folders
def _python_for_nobody() -> list[str] | None:
    """An interpreter `nobody` can start (a venv under /root is not readable to it)."""
    site = next((p for p in sys.path if p.endswith("site-packages") and p.startswith(str(ROOT))), None)
    for exe in (sys.executable, f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"):
        probe = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                                exe, "-c", "import click, pydantic"], capture_output=True,
                               env={"PYTHONPATH": site or "", "HOME": "/tmp"})
        if probe.returncode == 0:
            return [exe]
    return None


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root to hand files to another user (setpriv)")
def test_folders_another_user_owns_are_named_as_such(built_standard, request):
    python = _python_for_nobody()
    if python is None:
        pytest.skip("no interpreter the user `nobody` can run")
    site = next((p for p in sys.path if p.endswith("site-packages") and p.startswith(str(ROOT))), "")
    work = Path(tempfile.mkdtemp(prefix="pipeline-nobody-"))  # pytest's tmp_path is root's alone
    request.addfinalizer(lambda: shutil.rmtree(work, ignore_errors=True))
    proj = Project(work / "p")
    shutil.copytree(built_standard.engines, proj.engines)
    for p in [work, *work.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o555)  # readable by all, owned by root
    folder = proj.engines / STANDARD

    def run_as_nobody(*args):
        proc = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                               *python, "-m", "pipeline", *args], cwd=proj.path, capture_output=True,
                              text=True, env={"PYTHONPATH": f"{ROOT}:{site}", "HOME": "/tmp",
                                              "PATH": os.environ.get("PATH", "")}, timeout=120)
        return proc

    proc = run_as_nobody("run", "standard", *FAST)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert f"engines/{STANDARD}: the output folder exists but this user cannot write into it" in errors[0]
    assert "cannot create" not in errors[0]

    shutil.chown(folder, "nobody")  # the folder is theirs, the lock and an old .tmp/ are root's
    (folder / ".lock").chmod(0o444)
    proc = run_as_nobody("run", "standard", *FAST)
    assert proc.returncode == 2 and f"engines/{STANDARD}/.lock: this user cannot open the lock file" in proc.stderr

    (folder / ".lock").chmod(0o666)
    (folder / ".tmp" / "export").mkdir(parents=True, exist_ok=True)
    (folder / ".tmp").chmod(0o755)
    proc = run_as_nobody("run", "standard", *FAST)
    assert proc.returncode == 2, proc.stderr
    assert f"engines/{STANDARD}/.tmp: cannot remove what an earlier run left there" in proc.stderr
    assert "File exists" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_second_recipe_file_of_the_same_name_cannot_overwrite_the_folder(standard_copy):
    """engines/<stem>/ is named after the file: recipes/old/standard.yaml must not rebuild
    (and so overwrite) the engines recipes/standard.yaml built."""
    original = (standard_copy.path / "recipes" / "standard.yaml").read_text()
    standard_copy.write("recipes/old/standard.yaml",
                        original.replace("extends: base/", "extends: ../base/")
                        .replace("description: ", "description: an older copy of ", 1))
    before = standard_copy.snapshot()
    result = standard_copy.run("export", "recipes/old/standard.yaml", *FAST)
    assert result.code == 2 and len(result.error_lines) == 1, result.err
    assert (f"engines/{STANDARD}: holds the engines of recipes/standard.yaml, not of "
            "recipes/old/standard.yaml (two recipe files named `standard`)") in result.err
    assert standard_copy.snapshot() == before
    assert standard_copy.run("run", "standard", *FAST).code == 0  # its own file still may
