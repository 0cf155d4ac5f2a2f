"""Stage cache keys: the code a stage runs and the device identity it depends on.

End to end on a copy of the built `standard` project (standard_copy), with the CLI run from
a COPY of the pipeline package where a test edits code."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from tests.conftest import FAST, ROOT, STANDARD, set_folder


def _stages(result) -> dict[str, str]:
    """stage id -> "cached" or "ran", from the progress lines."""
    lines = [line.split() for line in result.err.splitlines() if line[:1] in "✓·"]
    return {parts[1]: "cached" if "cached" in " ".join(parts) else "ran" for parts in lines}


def test_editing_a_stage_reruns_it_and_what_follows_and_cli_edits_rerun_nothing(standard_copy, tmp_path):
    package = tmp_path / "code"
    shutil.copytree(ROOT / "pipeline", package / "pipeline",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PYTHONPATH": str(package)}
    same = standard_copy.run("run", "standard", *FAST, env=env)
    assert same.code == 0 and "nothing to do" in same.err, same.err  # same bytes, same keys

    with open(package / "pipeline" / "stages" / "optimize.py", "a") as f:
        f.write("# an edit to the optimize stage\n")
    edited = standard_copy.run("run", "standard", *FAST, env=env)
    assert edited.code == 0, edited.err
    stages = _stages(edited)
    assert stages["export"] == "cached" and stages["baseline"] == "cached"
    assert all(stages[s] == "ran" for s in ("optimize", "build:onnxruntime", "validate:onnxruntime",
                                            "report")), edited.err

    with open(package / "pipeline" / "cli" / "run.py", "a") as f:
        f.write("# an edit to the command line\n")
    again = standard_copy.run("run", "standard", *FAST, env=env)
    assert again.code == 0 and "nothing to do" in again.err, again.err


def test_another_cpu_identity_reruns_what_is_timed_not_the_export(standard_copy):
    env = {"PIPELINE_DEVICE_OVERRIDE": json.dumps({"cpu": "AMD EPYC 7B13", "cpu_isa": ["avx2"]})}
    result = standard_copy.run("run", "standard", *FAST, env=env)
    assert result.code == 0, result.err
    stages = _stages(result)
    assert stages["export"] == "cached"
    assert stages["baseline"] == "ran" and stages["validate:onnxruntime"] == "ran"
    folder = standard_copy.engines / STANDARD
    report = json.loads((folder / "report.json").read_text())
    assert report["device"]["cpu_isa"] == ["avx2"] and report["device"]["cores"] >= 1
    assert "- device: AMD EPYC 7B13, " in (folder / "report.md").read_text()
    assert ", avx2, no GPU" in (folder / "report.md").read_text()
    # verify compares the identity with this machine's (not overridden): a mismatch, named
    verified = standard_copy.run("verify", f"engines/{STANDARD}")
    assert verified.code == 5 and "device.cpu_isa" in verified.out


def test_a_set_run_writes_its_own_folder_and_leaves_the_plain_one(standard_copy):
    before = standard_copy.snapshot()
    args = (*FAST, "--set", "targets=[{kind: tensorrt}]")
    result = standard_copy.run("run", "standard", *args)
    assert result.code == 0, result.err
    assert result.folder == f"engines/{set_folder('standard', *args)}"
    after = standard_copy.snapshot()
    assert {k: v for k, v in after.items() if k.startswith(f"{STANDARD}/")} == before
    # what other --set values cannot change has the same key: copied from the twin, verified
    timing = (*FAST, "--set", "validate.latency.warmup=6")
    result = standard_copy.run("run", "standard", *timing)
    assert result.code == 0, result.err
    said = " ".join(result.err.split())
    for stage in ("export", "optimize"):
        assert f"{stage}: the same key is built in engines/{STANDARD}" in said, said
    assert "validate:onnxruntime: the same key" not in said  # its protocol changed: timed again
    variant = standard_copy.snapshot()
    assert variant[f"{set_folder('standard', *timing)}/model.onnx"] == before[f"{STANDARD}/model.onnx"]
    # the folder's name stands for the recipe and its --set values
    again = standard_copy.run("run", STANDARD)
    assert again.code == 0 and "nothing to do" in again.err, again.err
    unknown = standard_copy.run("run", "standard@00000000")
    assert unknown.code == 2 and len(unknown.error_lines) == 1


def test_computing_every_key_imports_no_torch_and_cli_is_in_no_stage():
    code = ("import sys; from pipeline.run import stage_cache as c, code_digest as d\n"
            "[c.code(k) for k in c.STAGES]\n"
            "assert 'torch' not in sys.modules and 'onnx' not in sys.modules, 'imported'\n"
            "every = set().union(*(d.closure((s.module,)) for s in c.STAGES.values()))\n"
            "assert not {m for m in every if m.split('.')[:2] == ['pipeline', 'cli']}\n"
            "assert 'pipeline.run.execute' not in every\n"
            "assert 'pipeline.stages.optimize' not in d.closure(('pipeline.stages.export',))\n"
            "assert 'pipeline.backends.tensorrt' in d.closure(('pipeline.stages.build',))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_device_line_names_what_decides_speed():
    from pipeline.core.deps import device_line

    assert device_line({"cpu": "AMD EPYC 7B13", "cpu_isa": ["avx2", "avx512f", "avx512_vnni"],
                        "cores": 2, "gpu": None}) == "AMD EPYC 7B13, 2 cores, avx512_vnni, no GPU"
    assert device_line({"cpu": "X", "cpu_isa": [], "cores": 16, "gpu": "NVIDIA H200",
                        "compute_capability": "9.0", "gpu_driver": "570.86"}) == \
        "X, 16 cores, no AVX2, GPU NVIDIA H200 (sm 9.0, driver 570.86)"
    assert device_line({"cpu": "AMD EPYC", "gpu": None}) == "AMD EPYC, no GPU"  # an older record


def test_another_recipe_on_the_same_model_and_export_copies_them(standard_copy):
    """Defect 9: a derived recipe (here: other validation data and description) shares the
    export and optimize keys with `standard`: both are copied, verified, not redone."""
    standard_copy.write("recipes/standard-derived.yaml", "description: standard, other validation data\n"
                        "extends: standard.yaml\ndata: {validation: {samples: 3}}\n")
    before = standard_copy.snapshot()
    result = standard_copy.run("optimize", "standard-derived")
    assert result.code == 0, result.err
    said = " ".join(result.err.split())
    for stage in ("export", "optimize"):
        assert f"{stage}: the same key is built in engines/{STANDARD}" in said, said
    after = standard_copy.snapshot()
    for name in ("model.onnx", "optimized.onnx"):
        assert after[f"standard-derived/{name}"] == before[f"{STANDARD}/{name}"]
    # a recipe whose passes differ copies the export only
    standard_copy.write("recipes/standard-other-passes.yaml", "description: standard, fewer passes\n"
                        "extends: standard.yaml\noptimize: {passes: [fold_constants]}\n")
    other = standard_copy.run("optimize", "standard-other-passes")
    assert other.code == 0, other.err
    said = " ".join(other.err.split())
    assert "export: the same key is built in engines/" in said and "optimize: the same key" not in said
