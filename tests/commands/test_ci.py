"""The CI workflow: linted by actionlint (a real linter, with shellcheck for run: scripts),
its matrix is recipes/, and the names it gives artifacts and caches."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import FAST, ROOT, STANDARD

WORKFLOW = ROOT / ".github" / "workflows" / "engines.yml"
BIN = str(Path(sys.executable).parent)  # the venv's bin: actionlint and shellcheck live there


CONFIG = ROOT / ".github" / "actionlint.yaml"  # the self-hosted runner labels


def _actionlint(workflow: Path) -> subprocess.CompletedProcess:
    path = BIN + os.pathsep + os.environ.get("PATH", "")
    exe = shutil.which("actionlint", path=path)
    if exe is None:
        pytest.skip("actionlint is not installed (the `dev` extra: pip install -e '.[dev]')")
    return subprocess.run([exe, "-no-color", "-config-file", str(CONFIG), str(workflow)], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "PATH": path}, timeout=120)


def test_workflow_passes_actionlint():
    proc = _actionlint(WORKFLOW)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""


def test_actionlint_catches_a_broken_workflow(tmp_path):
    # the same workflow with a typo in an expression and an unknown runner label must fail:
    # the lint above is a real check, not one that passes whatever the file says
    broken = WORKFLOW.read_text().replace("matrix.recipe }}", "matrix.recipes }}", 1)
    broken = broken.replace("[self-hosted, linux, gpu]", "[self-hosted, linux, gpux]")
    (tmp_path / "engines.yml").write_text(broken)
    proc = _actionlint(tmp_path / "engines.yml")
    assert proc.returncode == 1, proc.stdout
    assert "recipes" in proc.stdout and "gpux" in proc.stdout


def test_matrix_lists_every_recipe():
    recipes = sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))
    assert recipes  # the comparison is not between two empty lists
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    assert set(jobs) == {"cpu", "gpu"}
    for name, job in jobs.items():
        assert sorted(job["strategy"]["matrix"]["recipe"]) == recipes, f"job {name}"
    assert "self-hosted" in jobs["gpu"]["runs-on"] and "gpu" in jobs["gpu"]["runs-on"]
    # each job builds its own kind of target and uploads engines/<recipe>/
    assert any("--target onnxruntime" in s.get("run", "") for s in jobs["cpu"]["steps"])
    assert any("--target tensorrt" in s.get("run", "") for s in jobs["gpu"]["steps"])
    for job in jobs.values():
        upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
        assert "engines/${{ matrix.recipe }}/" in upload["with"]["path"]
        assert "outputs.artifact" in upload["with"]["name"]
    cache = next(s for s in jobs["gpu"]["steps"] if s.get("uses", "").startswith("actions/cache"))
    assert "cache_key" in cache["with"]["key"]


def test_ci_names_come_from_the_manifest(built_standard):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "pipeline.commands.ci", "standard", "engines"],
                          cwd=built_standard.path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    values = dict(line.split("=", 1) for line in proc.stdout.splitlines())
    from pipeline import recipe as recipe_mod

    kinds = [t.kind for t in recipe_mod.load(ROOT / "recipes" / "standard.yaml").targets]
    assert values["kinds"] == ",".join(kinds)
    # this machine has no GPU and no TensorRT, and the manifest says so
    assert values["gpu"] == "cpu" and values["tensorrt"] == "none"
    assert values["artifact"] == "engines-standard-cpu-trtnone"
    assert values["cache_key"] == "trt-timing-cpu-none"


def test_ci_slug_keeps_artifact_names_legal():
    from pipeline.commands.ci import slug

    assert slug("NVIDIA H200 NVL") == "nvidia-h200-nvl"
    assert slug("10.13.0.35") == "10.13.0.35"
    assert slug("2.13.0+cpu") == "2.13.0-cpu"


def test_target_filter_builds_only_the_named_targets(standard_copy):
    result = standard_copy.run("run", "standard", *FAST, "--target", "onnxruntime")
    assert result.code == 0, result.err
    # the onnxruntime chain is reused (every recorded stage but the report); the report is
    # rewritten, keeping the other target's entry from the last report of this same recipe
    before = json.loads((standard_copy.engines / STANDARD / "report.json").read_text())
    stages = json.loads((standard_copy.engines / STANDARD / "manifest.json").read_text())["stages"]
    assert result.err.count("cached (inputs unchanged)") == len(stages) - 1 and "✓ report" in result.err
    report = json.loads((standard_copy.engines / STANDARD / "report.json").read_text())
    assert [e["target"] for e in report["engines"]] == ["onnxruntime", "tensorrt"]
    assert report["engines"][1] == before["engines"][1]  # kept as it was, not rebuilt
    bad = standard_copy.run("run", "standard", *FAST, "--target", "nosuch")
    assert bad.code == 2 and len(bad.error_lines) == 1
    assert "--target nosuch: recipe `standard` has no such target (targets: onnxruntime, tensorrt)" in bad.err
