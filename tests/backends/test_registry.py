"""The Backend contract and registry: built-in kinds keep it, a kind the test suite brings as
a third-party plugin (tests/plugins/onnxruntime_copy.py, found through the `pipeline.backends`
entry point group) runs end to end through the real CLI, and deploy/verify take its output."""

from __future__ import annotations

import hashlib
import json
import os
import types

import pytest

from pipeline import backends
from pipeline.core.errors import DependencyError
from pipeline.recipe.targets import SCHEMAS, TARGET_KINDS
from tests.conftest import FAST, ROOT

COPY_TARGET = ("--set", "targets=[{kind: onnxruntime-copy}]")


def test_every_builtin_kind_has_a_backend_keeping_the_contract():
    assert set(backends.BUILTIN) <= set(TARGET_KINDS)
    for kind in backends.BUILTIN:
        backend = backends.get(kind)
        assert backend.TARGET is SCHEMAS[kind]
        assert backend.EXTENSION.startswith(".") and isinstance(backend.NEEDS_ONNX, bool)
    assert backends.kind_of_suffix(".plan") == "tensorrt" and backends.kind_of_suffix(".zip") is None
    assert backends.get("aotinductor").TRITON is None  # deploy refuses it, by the contract


def test_a_module_short_of_the_contract_is_refused_by_name():
    half = types.ModuleType("half_backend")
    half.TARGET, half.EXTENSION = SCHEMAS["onnxruntime"], ".x"
    with pytest.raises(DependencyError, match=r"lacks NEEDS_ONNX, PLAIN_ONNX, ENGINE_IS_ONNX, TRITON, "
                                              r"unavailable, device, build, open"):
        backends.check("onnxruntime", half)
    with pytest.raises(DependencyError, match="no backend for target kind `tpu`"):
        backends.get("tpu")


@pytest.fixture
def plugin_path(tmp_path) -> str:
    """PYTHONPATH holding the checkout and an installed-package record (dist-info) whose
    entry point announces the test's backend, as `pip install` of a plugin would leave it."""
    site = tmp_path / "site"
    info = site / "pipeline_onnxruntime_copy-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pipeline-onnxruntime-copy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[pipeline.backends]\nonnxruntime-copy = tests.plugins.onnxruntime_copy\n")
    return os.pathsep.join([str(ROOT), str(site)])


def test_a_kind_without_its_plugin_is_an_unknown_kind(project):
    result = project.run("run", "standard", *COPY_TARGET)
    assert result.code == 2
    assert result.error_lines == ["Error: --set targets=[{kind: onnxruntime-copy}]: targets.0: unknown "
                                  "target kind 'onnxruntime-copy'; allowed: onnxruntime, tensorrt, aotinductor"]


def test_a_plugin_backend_runs_end_to_end_and_deploys(standard_copy, plugin_path, tmp_path):
    env = {"PYTHONPATH": plugin_path}
    proj = standard_copy
    result = proj.run("run", "standard", *FAST, *COPY_TARGET, env=env)
    assert result.code == 0, result.err
    folder = proj.folder(result)  # the --set values' own folder
    (engine,) = json.loads((folder / "report.json").read_text())["engines"]
    assert engine["kind"] == "onnxruntime-copy" and engine["status"] == "built"
    assert min(m["cosine"] for m in engine["accuracy"].values()) > 0.999
    assert all(g["passed"] for g in engine["gates"])
    # the engine is the final graph, byte for byte (what the plugin's build says it does)
    manifest = json.loads((folder / "manifest.json").read_text())
    source = manifest["stages"]["build:onnxruntime-copy"]["meta"]["source"]
    graph = (folder / source).read_bytes()
    assert engine["sha256"] == hashlib.sha256(graph).hexdigest()

    out = tmp_path / "models"
    result = proj.run("deploy", "standard", "--triton", str(out), *FAST, *COPY_TARGET, env=env)
    assert result.code == 0, result.err
    model = out / "standard-onnxruntime-copy"
    config = (model / "config.pbtxt").read_text()
    assert 'platform: "onnxruntime_onnx"' in config and "kind: KIND_CPU" in config
    assert "optimization" not in config  # the plugin asks Triton for nothing special
    assert hashlib.sha256((model / "1" / "model.onnx").read_bytes()).hexdigest() == engine["sha256"]

    result = proj.run("verify", str(folder), env=env)
    assert result.code == 0, result.err
