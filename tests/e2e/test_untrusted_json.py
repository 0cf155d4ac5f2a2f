"""Issue 27, part B: JSON artifacts that crash readers, re-signed reports, signed provenance,
the attention memory estimate and a loader's sys.exit(), each reproduced through the real CLI
on a copy of one built folder. Every case ends in one `Error:` line with its documented
exit code (or a correct result), no traceback, and a canary tree outside the project
unchanged; a stuck folder is cleared by `run --force`."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.artifacts import json_file
from tests.conftest import FAST, ROOT, STANDARD, Project
from tests.e2e.test_untrusted import _tree

DEPLOY = ("deploy", "standard", "--triton", "models", *FAST)
VERIFY = ("verify", f"engines/{STANDARD}", "--files-only")


@pytest.fixture
def case(built_standard, tmp_path):
    """(a private copy of the built project, its folder, a check that the canary is intact)."""
    proj = Project(tmp_path / "proj")
    shutil.copytree(built_standard.engines, proj.engines)
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "secret.txt").write_text("nothing may touch this file\n")
    before = _tree(canary, ())
    yield proj, proj.engines / STANDARD
    assert _tree(canary, ()) == before


def _resign(folder: Path, name: str, text: str) -> None:
    """Rewrite a recorded file and its digest in the manifest: only the content can object."""
    (folder / name).write_text(text)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][name].update(sha256=hashlib.sha256((folder / name).read_bytes()).hexdigest(),
                                   bytes=(folder / name).stat().st_size)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _refused(proj: Project, args: tuple, code: int, *words: str) -> str:
    result = proj.run(*args, timeout=300)
    assert "Traceback" not in result.err, (args, result.err)
    assert result.code == code, (args, result.code, result.err)
    assert len(result.error_lines) == 1, (args, result.err)
    for word in words:
        assert word in result.error_lines[0], (word, result.error_lines[0])
    return result.error_lines[0]


DEEP = "[" * 100_000 + "]" * 100_000


# ----------------------------------------------------------------- defect 6: crashing JSON
def test_the_reader_bounds_integers_depth_and_size():
    for text, problem in ((b'{"bytes": ' + b"9" * 5000 + b"}", "5000 digits"),
                          (DEEP.encode(), "nested deeper"),
                          (b'{"a": ' + b"[" * 65 + b"]" * 65 + b"}", "nested deeper"),
                          (b"{\"a\": \"\xff\"}", "not UTF-8"), (b"{", "not valid JSON")):
        with pytest.raises(json_file.Unreadable, match=problem):
            json_file.loads(text)
    assert json_file.loads(b'{"a": [[1, NaN]], "n": 18446744073709551615}')["n"] == 2**64 - 1
    with pytest.raises(json_file.Unreadable, match="MiB"):
        json_file.loads(b" " * (json_file.MAX_BYTES + 1))


@pytest.mark.parametrize("damage", ["huge integer", "deep extra key"])
def test_a_manifest_that_crashed_readers_is_refused(case, damage):
    proj, folder = case
    manifest = json.loads((folder / "manifest.json").read_text())
    text = json.dumps(manifest)
    if damage == "huge integer":
        size = manifest["files"]["report.json"]["bytes"]
        text = text.replace(f'"bytes": {size}', '"bytes": ' + "9" * 5000, 1)
    else:
        text = text[:-1] + f', "x": {DEEP}}}'
    (folder / "manifest.json").write_text(text)
    for args in (VERIFY, DEPLOY, ("run", "standard", *FAST)):
        _refused(proj, args, 5, "manifest.json")


@pytest.mark.slow
def test_deep_records_are_refused_and_run_force_clears_them(case):
    """The issue's stuck folder: report.json and validate-onnxruntime.json re-signed with a
    key nested 100,000 deep; `run --force` used to redo every stage and die the same way."""
    proj, folder = case
    for name in ("report.json", "validate-onnxruntime.json"):
        text = (folder / name).read_text().rstrip()
        _resign(folder, name, text[:-1] + f', "x": {DEEP}}}')
    _refused(proj, VERIFY, 5, "validate-onnxruntime.json")
    _refused(proj, ("run", "standard", *FAST), 5, "validate-onnxruntime.json", "nested deeper")
    assert proj.run("run", "standard", "--force", *FAST, timeout=600).code == 0
    assert proj.run(*VERIFY).code == 0


def test_a_deep_report_is_refused_by_every_reader(case):
    proj, folder = case
    text = (folder / "report.json").read_text().rstrip()
    _resign(folder, "report.json", text[:-1] + f', "x": {DEEP}}}')
    for args in (VERIFY, DEPLOY, ("run", "standard", *FAST)):
        _refused(proj, args, 5, "report.json")
    assert not (proj.path / "models").exists()


# ----------------------------------------------------------------- defect 9: re-signed reports
def test_a_nan_cosine_with_passing_gates_is_refused(case):
    proj, folder = case
    report = json.loads((folder / "report.json").read_text())
    engine = report["engines"][0]
    engine["accuracy"]["logits"].update(cosine=float("nan"), top1_agreement=0.01)
    assert all(g["passed"] for g in engine["gates"])
    _resign(folder, "report.json", json.dumps(report))
    for args in (VERIFY, DEPLOY):
        _refused(proj, args, 5, "report.json")
    _refused(proj, DEPLOY, 5, "logits.cosine", "nan")
    assert not (proj.path / "models").exists()


def test_a_lowered_threshold_is_caught_by_the_recipe(case):
    """The figure and the gate's own detail agree (0.5 >= 0.1), but the recipe says 0.9999."""
    proj, folder = case
    report = json.loads((folder / "report.json").read_text())
    engine = report["engines"][0]
    engine["accuracy"]["logits"]["cosine"] = 0.5
    gate = next(g for g in engine["gates"] if g["name"] == "logits.cosine")
    gate["detail"] = "0.500000 >= 0.1"
    _resign(folder, "report.json", json.dumps(report))
    _refused(proj, DEPLOY, 5, "report.json", "logits.cosine", "recipe's threshold")


def test_a_verdict_that_does_not_follow_from_its_interval_is_refused(case):
    proj, folder = case
    report = json.loads((folder / "report.json").read_text())
    speedup = report["engines"][0]["speedup_vs_baseline"]
    speedup.update(ci95=[0.5, 0.6], verdict="faster")
    _resign(folder, "report.json", json.dumps(report))
    _refused(proj, DEPLOY, 5, "report.json", "verdict `faster`")


def test_an_engine_kind_rewritten_to_tensorrt_is_refused(case):
    proj, folder = case
    report = json.loads((folder / "report.json").read_text())
    report["engines"][0]["kind"] = "tensorrt"
    _resign(folder, "report.json", json.dumps(report))
    _refused(proj, DEPLOY, 5, "kind 'tensorrt'")
    _refused(proj, VERIFY, 5, "report.json:onnxruntime")
    assert not list((proj.path / "models").rglob("model.plan")) if (proj.path / "models").exists() else True


def test_signed_provenance_catches_a_consistent_forgery(case, tmp_path):
    proj, folder = case
    key = tmp_path / "keys" / "ci.pem"
    key.parent.mkdir()
    assert proj.run("keygen", str(key)).code == 0
    assert key.stat().st_mode & 0o077 == 0 and Path(f"{key}.pub").is_file()
    _refused(proj, ("keygen", str(key)), 2, "already exists")
    signed = proj.run("sign", f"engines/{STANDARD}", "--key", str(key))
    assert signed.code == 0, signed.err
    envelope = json.loads((folder / "provenance.intoto.json").read_text())
    import base64

    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    names = {s["name"] for s in statement["subject"]}
    assert {"manifest.json", "report.json", "onnxruntime.onnx", "baseline.npz"} <= names
    assert proj.run(*VERIFY, "--key", f"{key}.pub").code == 0

    # a consistent forgery: every digest rewritten, nothing for the models to object to
    report = json.loads((folder / "report.json").read_text())
    report["description"] = "a forged but consistent report"
    _resign(folder, "report.json", json.dumps(report))
    assert proj.run(*VERIFY).code == 0  # without the key it cannot be told apart
    _refused(proj, (*VERIFY, "--key", f"{key}.pub"), 5, "provenance.intoto.json")

    other = tmp_path / "keys" / "other.pem"  # signed again, but not with the trusted key
    assert proj.run("keygen", str(other)).code == 0
    assert proj.run("sign", f"engines/{STANDARD}", "--key", str(other)).code == 0
    _refused(proj, (*VERIFY, "--key", f"{key}.pub"), 5, "provenance.intoto.json")
    _refused(proj, (*VERIFY, "--key", str(key)), 2, "not a PEM public key")

    # CI's way: the private key from the environment (the secret), never on disk
    env = {"PIPELINE_SIGNING_KEY": key.read_text()}
    assert proj.run("sign", f"engines/{STANDARD}", "--key", "env:PIPELINE_SIGNING_KEY", env=env).code == 0
    assert proj.run(*VERIFY, "--key", f"{key}.pub").code == 0
    _refused(proj, ("sign", f"engines/{STANDARD}", "--key", "env:NO_SUCH_VARIABLE"), 2, "empty or unset")


def test_sign_refuses_a_folder_that_does_not_verify(case, tmp_path):
    proj, folder = case
    key = tmp_path / "k.pem"
    assert proj.run("keygen", str(key)).code == 0
    (folder / "report.md").write_text("changed by hand\n")
    _refused(proj, ("sign", f"engines/{STANDARD}", "--key", str(key)), 5, "does not verify")
    assert not (folder / "provenance.intoto.json").exists()


def test_the_ci_workflow_signs_what_it_verified():
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "engines.yml").read_text())
    for job in ("cpu", "gpu"):
        steps = workflow["jobs"][job]["steps"]
        names = [s.get("name", "") for s in steps]
        sign = next(i for i, s in enumerate(steps) if "pipeline sign" in s.get("run", ""))
        assert steps[sign]["env"]["PIPELINE_SIGNING_KEY"] == "${{ secrets.PIPELINE_SIGNING_KEY }}"
        assert '-z "$PIPELINE_SIGNING_KEY"' in steps[sign]["run"]  # forks: skipped, saying so
        verify = next(i for i, n in enumerate(names) if n.startswith("Verify"))
        upload = next(i for i, n in enumerate(names) if n.startswith("Upload"))
        assert verify < sign < upload


# ----------------------------------------------------------------- defect 10: attention memory
def test_attention_scores_count_in_the_memory_estimate(project):
    result = project.run("run", "standard", "--set", "inputs.0.shape.0.max=8",
                         "--set", "inputs.0.shape.1.max=16384", env={"PIPELINE_MAX_MEMORY_GB": "20"})
    assert result.code == 2, result.err
    (line,) = result.error_lines
    assert "attention scores" in line and "32.0 GB" in line, line  # 8 x 4 heads x 16384² x 4 B
    assert not project.engines.exists() or not any(project.engines.rglob("*.onnx"))


# ----------------------------------------------------------------- defect 11: sys.exit in user code
@pytest.mark.parametrize("where", ["loader", "factory"])
def test_sys_exit_in_user_code_is_an_error_naming_it(project, where):
    project.write("quitting.py", "import sys\n\ndef feeds():\n    sys.exit(0)\n\n"
                  "def build(**kwargs):\n    raise SystemExit(0)\n")
    if where == "loader":
        project.write("recipes/quits.yaml", "extends: standard.yaml\ndata:\n  validation: "
                      "{loader: 'quitting:feeds', samples: 2}\n")
    else:
        project.write("recipes/quits.yaml", "extends: standard.yaml\nmodel:\n  zoo: null\n"
                      "  factory: quitting:build\n  kwargs: {}\n")
    result = project.run("run", "quits", "--target", "onnxruntime")
    assert result.code == 2, result.err
    (line,) = result.error_lines
    assert "sys.exit(0)" in line and ("quitting:feeds" if where == "loader" else "quitting:build") in line
