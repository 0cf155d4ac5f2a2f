"""The CLI as users run it: a real subprocess, real exports, real ONNX Runtime sessions."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import FAST, ROOT, STANDARD


def test_help_imports_neither_torch_nor_onnxruntime():
    # -X importtime lists every module the real entry point imports, on stderr
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "pipeline", "--help"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "Usage: pipeline" in proc.stdout
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in proc.stderr.splitlines()}
    assert "click" in imported  # the listing is real
    assert not imported & {"torch", "onnxruntime", "tensorrt", "onnx", "ray", "fastapi", "numpy"}


def test_recipes_lists_the_shipped_recipes(project):
    result = project.run("recipes")
    assert result.code == 0, result.err
    assert "standard" in result.out and "flash" in result.out and "block_sparse" in result.out
    assert "transformers None" not in result.out  # a GGUF source names its checkpoint
    assert "transformers GGUF" in result.out


def test_run_writes_the_report_contract(built_standard):
    folder = built_standard.engines / STANDARD
    report = json.loads((folder / "report.json").read_text())
    for key in ("schema", "recipe", "recipe_sha256", "created", "device", "versions", "baseline", "engines"):
        assert key in report, key
    assert report["schema"] == 3 and report["recipe"] == "standard"
    assert report["versions"]["torch"] and report["versions"]["onnxruntime"]
    assert report["baseline"]["runner"] == "torch-eager"
    assert report["baseline"]["latency_ms"]["p50"] > 0
    engine = next(e for e in report["engines"] if e["target"] == "onnxruntime")
    assert engine["status"] == "built"
    acc = engine["accuracy"]["logits"]
    assert acc["cosine"] > 0.9999 and acc["max_abs"] < 1e-3 and acc["top1_agreement"] > 0.99
    lat = engine["latency_ms"]
    assert lat["p50"] > 0 and lat["p50"] <= lat["p90"] <= lat["p99"] and lat["n"] >= 40
    lo, hi = engine["speedup_vs_baseline"]["ci95"]
    assert lo <= engine["speedup_vs_baseline"]["ratio"] <= hi
    assert all(g["passed"] for g in engine["gates"]) and engine["gates"]
    # the engine in the report is the file on disk, by sha256
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["files"]["onnxruntime.onnx"]["sha256"] == engine["sha256"]
    assert (folder / "report.md").read_text().startswith("# standard")


def test_unchanged_rerun_does_no_work(built_standard):
    before = built_standard.snapshot()
    # -X importtime lists every import: a rerun with nothing to do must not even load
    # torch or onnxruntime (that is what keeps it to a second or two).
    result = built_standard.run("-X", "importtime", "run", "standard", *FAST, python_flags=True)
    assert result.code == 0, result.err
    assert "nothing to do" in result.err
    # one `cached` line per stage the manifest records (tensorrt is skipped, not cached)
    stages = json.loads((built_standard.engines / STANDARD / "manifest.json").read_text())["stages"]
    assert result.err.count("cached (inputs unchanged)") == len(stages) >= 6
    assert built_standard.snapshot() == before
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0]
                for line in result.err.splitlines() if line.startswith("import time:")}
    assert "click" in imported and not imported & {"torch", "onnxruntime"}
    assert "onnxruntime" in result.out  # the summary table is still printed


def test_changed_setting_reruns_only_what_depends_on_it(standard_copy):
    # a different latency protocol in the recipe file: export and build stay cached, validation
    # reruns (in the same folder: the --set values are FAST's, as before)
    recipe = standard_copy.path / "recipes" / "standard.yaml"
    recipe.write_text(recipe.read_text() + "validate: {latency: {noise_threshold: 0.03}}\n")
    result = standard_copy.run("validate", "standard", *FAST)
    assert result.code == 0, result.err
    assert "export" in result.err and "cached" in result.err
    lines = {line.split()[1]: line for line in result.err.splitlines() if line[:1] in "✓·"}
    assert "cached" in lines["export"] and "cached" in lines["build:onnxruntime"]
    assert "cached" not in lines["validate:onnxruntime"]


def test_tampered_engine_is_refused(standard_copy):
    proj = standard_copy
    engine = proj.engines / STANDARD / "onnxruntime.onnx"
    data = bytearray(engine.read_bytes())
    data[len(data) // 2] ^= 0xFF
    engine.write_bytes(bytes(data))
    before = proj.snapshot()
    result = proj.run("validate", "standard", *FAST)
    assert result.code == 5
    assert len(result.error_lines) == 1
    assert "onnxruntime.onnx: sha256" in result.err and "does not match the manifest" in result.err
    assert "Traceback" not in result.err
    assert proj.snapshot() == before


BAD_INPUTS = [
    # (recipe file text or None for a name, args, expected message part)
    ("extends: standard.yaml\nmodel: {kwargs: {colour: red}}\n", (),
     "recipes/bad.yaml: model.kwargs.colour: unknown key"),
    ("extends: standard.yaml\ndata: {seed: one}\n", (),
     "recipes/bad.yaml: data.seed: Input should be a valid integer"),
    ("extends: missing-base.yaml\n", (),
     "recipes/bad.yaml: extends: missing-base.yaml: no such file"),
    ("extends: standard.yaml\ninputs:\n  - {name: input_ids, dtype: int64, range: [0, 512], "
     "shape: [{min: 4, opt: 2, max: 1}, 8]}\n", (),
     "recipes/bad.yaml: inputs.0.shape.0: needs min <= opt <= max (got 4, 2, 1)"),
    ("extends: standard.yaml\nmodel: {zoo: null, factory: 'no_such_package.models:build'}\n", (),
     "model.factory: cannot import `no_such_package.models`"),
    (None, ("no-such-recipe",), "unknown recipe `no-such-recipe`"),
    ("extends: standard.yaml\ntargets: [{kind: tensorrtx}]\n", (),
     "recipes/bad.yaml: targets.0: unknown target kind 'tensorrtx'"),
]


@pytest.mark.parametrize("text, args, expected", BAD_INPUTS)
def test_bad_input_is_one_error_line_exit_2_and_changes_nothing(built_standard, text, args, expected):
    if text is not None:
        built_standard.write("recipes/bad.yaml", text)
        args = ("bad",)
    before = built_standard.snapshot()
    result = built_standard.run("run", *args)
    assert result.code == 2, result.err
    assert "Traceback" not in result.err
    assert len(result.error_lines) == 1, result.err
    assert expected in result.error_lines[0]
    assert built_standard.snapshot() == before


def test_debug_shows_the_traceback(project):
    result = project.run("run", "no-such-recipe", "--debug")
    assert result.code != 0
    assert "Traceback" in result.err and "RecipeError" in result.err


# ------------------------------------------------------------------ refused before any work
def _refused(project, args, code, *parts, env=None):
    result = project.run(*args, env=env)
    assert result.code == code, result.err
    assert "Traceback" not in result.err and len(result.error_lines) == 1, result.err
    for part in parts:
        assert part in result.error_lines[0], result.error_lines[0]
    assert not project.engines.exists()  # refused before any stage (or the lock) ran
    return result.error_lines[0]


def _npz(path, **arrays):
    import numpy as np

    np.savez(path, **arrays)
    return path.name


def test_a_bad_calibration_file_is_named_before_any_work(project):
    import numpy as np

    ids = np.random.default_rng(0).integers(0, 512, size=(4, 2, 16))
    good = project.path / _npz(project.path / "good.npz", input_ids=ids)
    (project.path / "cut.npz").write_bytes(good.read_bytes()[:300])
    cases = {
        "cut.npz": "not a readable .npz (BadZipFile",
        _npz(project.path / "k1.npz", **{"in/input_ids": ids[0]}): "array `in/input_ids` is not named in/<sample index>/<input name>",
        _npz(project.path / "k2.npz", **{"in/x/input_ids": ids[0]}): "array `in/x/input_ids` is not named",
        _npz(project.path / "range.npz", input_ids=ids + 600): "beyond the model's vocabulary of 512",
        _npz(project.path / "none.npz", input_ids=ids[:0]): "holds no samples",
    }
    for name, part in cases.items():
        _refused(project, ("export", "standard-int8", "--set", f"data.calibration.file={name}"), 2,
                 f"data.calibration.file {name}: ", part)


def test_a_model_function_of_the_wrong_kind_is_a_recipe_error(project):
    from pipeline.core import deps

    if deps.has("transformers"):
        _refused(project, ("export", "minilm", "--set", "model.transformers.pretrained=json:dumps"), 2,
                 "model.transformers.pretrained: `json:dumps()` did not return a model directory (TypeError")
    # a factory that raises is the recipe's to fix, like one that returns no module: exit 2
    line = project.run("export", "standard", "--set", "model.zoo=null", "--set", "model.factory=json:dumps")
    assert line.code == 2 and "Traceback" not in line.err and len(line.error_lines) == 1, line.err
    assert "model.factory `json:dumps` failed" in line.error_lines[0]
    assert not list(project.engines.glob("*/model.onnx"))


def test_expectations_and_devices_are_checked_before_any_work(project):
    from pipeline.core import deps

    _refused(project, ("run", "standard", "--set", "expect.faster_than=[nosuch]"), 2,
             "recipes/standard.yaml: expect.faster_than: unknown recipe `nosuch`")
    if not deps.gpus():
        _refused(project, ("run", "standard", "--set", "validate.device=cuda"), 2,
                 "validate.device: cuda, but this machine has no NVIDIA GPU")


def test_an_empty_engines_dir_is_refused(project):
    result = project.run("run", "standard", "--engines-dir", "")
    assert result.code == 2 and "'--engines-dir': is empty" in result.err
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PIPELINE_ENGINES": ""}
    proc = subprocess.run([sys.executable, "-m", "pipeline", "run", "standard"], cwd=project.path,
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "PIPELINE_ENGINES" in proc.stderr
    assert not (project.path / "standard").exists() and not project.engines.exists()


def test_bench_refuses_itself_and_gives_the_other_recipe_the_same_set(project):
    _refused(project, ("bench", "standard", "--vs", "standard"), 2, "bench --vs standard: `standard` against itself")
    project.write("recipes/solo.yaml", "extends: standard.yaml\ntargets: [{kind: onnxruntime}]\n")
    # valid for standard (two targets), not for solo (one): the --set reaches the other recipe
    _refused(project, ("bench", "standard", "--vs", "solo", "--set", "targets.1.required=false"), 2,
             "--set targets.1.required=false")


def test_debug_keeps_exit_codes_and_every_command_takes_it(project):
    (project.path / "empty").mkdir()
    for args, code in ((("run", "no-such-recipe", "--debug"), 2), (("verify", "empty", "--debug"), 2),
                       (("--debug", "verify", "empty"), 2), (("inspect", "nosuch.onnx", "--debug"), 2),
                       (("recipes", "--debug"), 0)):
        result = project.run(*args)
        assert result.code == code, (args, result.err)
        if code:
            assert "Traceback" in result.err and len(result.error_lines) == 1, (args, result.err)


def test_recipes_needs_a_folder_and_quantize_says_why_nothing_is_done(built_standard, project):
    _refused(project, ("recipes", "--dir", str(project.path / "nosuch")), 2, "nosuch: no such folder")
    result = built_standard.run("quantize", "standard", *FAST)
    assert result.code == 0, result.err
    assert "recipe `standard` has precision.mode fp32" in result.err


def test_help_texts(project):
    bare = project.run()
    assert bare.code == 0 and "Usage: pipeline" in bare.out + bare.err
    run_help = project.run("run", "--help").out
    assert all(s in run_help for s in ("export", "optimize", "precision", "build", "baseline", "validate"))
    assert "--target" not in project.run("export", "--help").out
    assert "--target" in project.run("build", "--help").out
    for command in ("compare", "deploy"):
        text = project.run(command, "--help").out
        assert "PIPELINE_ENGINES" in text, text
    for command in ("verify", "inspect", "recipes", "deploy", "compare", "bench"):
        assert "--debug" in project.run(command, "--help").out, command


def test_a_lock_wait_that_is_not_seconds_is_refused(project):
    result = project.run("run", "standard", env={"PIPELINE_LOCK_WAIT": "abc"})
    assert result.code == 2 and result.error_lines == [
        "Error: PIPELINE_LOCK_WAIT='abc': not a number of seconds (set it to seconds >= 0 "
        "(e.g. PIPELINE_LOCK_WAIT=60), or unset it for 600)"], result.err
    assert not list(project.engines.rglob("*.onnx"))  # refused before any work
