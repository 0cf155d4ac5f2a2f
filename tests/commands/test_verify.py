"""`pipeline verify` on a real build (store/integrity.py, cli/verify.py): every recorded file's sha256 and
the tool versions and device against this machine, a changed byte or version named."""

from __future__ import annotations

import json

from tests.conftest import STANDARD


def _flip_a_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_verify_passes_on_a_fresh_build(built_standard):
    result = built_standard.run("verify", f"engines/{STANDARD}")
    assert result.code == 0, result.out + result.err
    manifest = json.loads((built_standard.engines / STANDARD / "manifest.json").read_text())
    for name in manifest["files"]:
        assert f"✓ {name}: sha256" in result.out
    assert "✓ versions.onnxruntime" in result.out and "✓ device.cpu" in result.out
    assert "MISMATCH" not in result.out


def test_verify_names_the_changed_file_and_the_changed_version(standard_copy):
    proj = standard_copy
    folder = proj.engines / STANDARD
    _flip_a_byte(folder / "onnxruntime.onnx")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["versions"]["onnxruntime"] = "0.0.1"
    (folder / "manifest.json").write_text(json.dumps(manifest))

    result = proj.run("verify", "engines")  # a folder of engine folders works too
    assert result.code == 5, result.out + result.err
    mismatches = [line for line in result.out.splitlines() if "MISMATCH" in line]
    assert len(mismatches) == 2, result.out
    assert "onnxruntime.onnx: sha256" in mismatches[0] and "does not match the manifest" in mismatches[0]
    assert "versions.onnxruntime: built with 0.0.1, this machine has" in mismatches[1]
    assert len(result.error_lines) == 1 and "Traceback" not in result.err
    assert "2 of" in result.error_lines[0]
    assert f"{STANDARD}/onnxruntime.onnx" in result.error_lines[0]
    assert f"{STANDARD}/versions.onnxruntime" in result.error_lines[0]
    # --files-only still catches the engine, and only the engine
    files_only = proj.run("verify", f"engines/{STANDARD}", "--files-only")
    assert files_only.code == 5 and "versions." not in files_only.out
    assert "1 of" in files_only.error_lines[0] and "onnxruntime.onnx" in files_only.error_lines[0]


def test_verify_without_a_manifest_is_a_user_error(project):
    (project.path / "empty").mkdir()
    result = project.run("verify", "empty")
    assert result.code == 2 and len(result.error_lines) == 1
    assert "no manifest.json" in result.error_lines[0]
