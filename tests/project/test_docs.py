"""The documentation is what the code does: the recipe reference is generated from the schema,
every link resolves, and the README's "your own model" example runs as printed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import FAST, ROOT


def test_recipe_reference_is_generated_from_the_schema():
    from pipeline.recipe import reference

    committed = (ROOT / "docs" / "recipes.md").read_text()
    assert committed == reference.markdown(), "docs/recipes.md is stale: run `make docs`"
    # every key of every shipped section is documented
    for key in ("data.calibration.samples", "validate.latency.noise_threshold", "precision.mode",
                "targets[].provider", "expect.min_speedup"):
        assert f"`{key}`" in committed, key


def test_links_in_readme_and_docs_resolve():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.endswith(".png") and "benchmarks" not in target:
                continue
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


def test_readme_own_model_example_runs_as_printed(project):
    """The module, the recipe and the command of the README's "Your own model", verbatim."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Your own model"):text.index("## The CLI")]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    files = {}
    for lang, body in blocks:
        first = body.splitlines()[0]
        if lang in ("python", "yaml") and first.startswith("# "):
            files[first[2:].strip()] = body
    assert set(files) == {"my_models.py", "recipes/my-classifier.yaml"}, files
    for name, body in files.items():
        project.write(name, body)
    command = next(body for lang, body in blocks if lang == "sh").split()
    assert command[:2] == [".venv/bin/pipeline", "run"]
    # the console script, as the README runs it (not `python -m`, which puts the current
    # folder on sys.path by itself)
    script = Path(sys.executable).parent / "pipeline"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env.pop("PIPELINE_ENGINES", None)
    proc = subprocess.run([str(script), *command[1:], *FAST], cwd=project.path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    folders = [p for p in project.engines.iterdir() if p.name.startswith("my-classifier")]
    report = json.loads((folders[0] / "report.json").read_text())
    engine = report["engines"][0]
    assert engine["status"] == "built" and engine["speedup_vs_baseline"]["ratio"] > 0
    assert all(g["passed"] for g in engine["gates"]), engine["gates"]
