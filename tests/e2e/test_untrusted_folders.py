"""Engine folders are data, second round (issue 27, part A): each attack planted as a real
folder or file and run through the real CLI, as a subprocess. Every case ends in one
`Error:` line with its documented exit code (or a correct result), and a canary tree beside
the project (links, files and folders the attacks point at), hashed before and after each
case, proves that nothing outside the command's own folders was written, truncated or
deleted.

The rule these cases hold the pipeline to (pipeline/core/safe_files.py): every folder written
into is a real folder (never a link), temporary names are created exclusively, no file
with more than one link is written or truncated, nothing read from a folder chooses code,
and no FIFO or device is read as data.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import FAST, STANDARD, Project
from tests.e2e.test_untrusted import _edit_manifest, _one_error, _rehash, _tree

RUN = ("run", "standard", *FAST)


@pytest.fixture
def attack(standard_copy, tmp_path):
    """(project, its built folder, canary tree): the canary lies outside the project and
    must be byte for byte the same after every command (`check()`)."""
    canary = tmp_path / "canary"
    (canary / "victim" / ".tmp" / "export").mkdir(parents=True)
    (canary / "victim" / ".tmp" / "export" / "keep.txt").write_text("victim's own file\n")
    (canary / "victim" / ".notes.tmp").write_text("victim's notes\n")
    (canary / "victim2").mkdir()
    (canary / "secret.txt").write_text("nothing may touch this file\n")
    before = _tree(canary, ())

    def check() -> None:
        assert _tree(canary, ()) == before
        assert not (canary / "PWNED").exists()

    return standard_copy, standard_copy.engines / STANDARD, canary, check


# ------------------------------------------------------------------ 1: no code from folders
def _planted_variant(proj: Project, folder: Path, overrides: list[str]) -> str:
    """engines/standard@<digest of overrides>: the built folder, its manifest recording
    `overrides` as its --set values (the digest recomputed, as an attacker would)."""
    from pipeline.store.folder_names import overrides_digest

    name = f"standard@{overrides_digest(overrides)}"
    shutil.copytree(folder, proj.engines / name)
    _edit_manifest(proj.engines / name, lambda m: m.update(recipe_overrides=overrides))
    return name


@pytest.mark.parametrize("code", [
    ["model.zoo=null", "model.factory=os:system", "model.kwargs={command: 'touch {canary}/PWNED'}"],
    ["model={zoo: null, factory: 'os:system', kwargs: {command: 'touch {canary}/PWNED'}}"],
    ["data.validation.loader=os:getcwd"],
    ["data.validation={text: data/x.txt, tokenizer: 'os:getcwd'}"],
], ids=["factory", "factory-in-a-mapping", "loader", "tokenizer-function"])
def test_a_planted_folder_never_chooses_code(attack, code):
    proj, folder, canary, check = attack
    overrides = [*(v for i, v in enumerate(FAST) if FAST[i - 1] == "--set"),
                 *(c.replace("{canary}", str(canary)) for c in code)]
    name = _planted_variant(proj, folder, overrides)
    for command in (("run", name), ("bench", name), ("deploy", name, "--triton", "models")):
        _one_error(proj.run(*command), 5, f"{name}/manifest.json",
                   "recorded --set values choose code")
        check()
    assert not (proj.path / "models").exists()
    # the folder of a real --set run still names its values (they choose no code)
    assert proj.run("run", STANDARD).code == 0
    check()


# ------------------------------------------------------------------ 2: temp names, bench
def test_bench_never_writes_through_a_planted_temp_name_or_plot(attack):
    proj, folder, canary, check = attack
    (folder / ".bench.tmp.png").symlink_to(canary / "secret.txt")  # the old fixed temp name
    (folder / ".bench.png.1.0000abcd.tmp").symlink_to(canary / "new.png")  # dangling
    (folder / "bench.png").symlink_to(canary / "secret.txt")
    result = proj.run("bench", "standard", *FAST)
    assert result.code == 0, result.err
    check()
    assert not list(folder.glob(".*.tmp*"))  # swept, links included, never followed
    png = folder / "bench.png"
    assert not png.is_symlink() and png.read_bytes().startswith(b"\x89PNG")


# ------------------------------------------------------------------ 3: hard links
def test_a_hard_linked_lock_is_refused_not_truncated(attack):
    proj, folder, canary, check = attack
    (folder / ".lock").unlink(missing_ok=True)
    os.link(canary / "secret.txt", folder / ".lock")
    _one_error(proj.run(*RUN), 5, ".lock: the lock file is a file with 2 hard links")
    check()
    (folder / ".lock").unlink()
    assert proj.run(*RUN).code == 0  # the link gone, the folder works again
    check()


# ------------------------------------------------------------------ 4, 5: folders that are links
def test_a_recipe_folder_that_is_a_link_is_refused_before_any_write(attack):
    proj, folder, canary, check = attack
    shutil.rmtree(folder)
    folder.symlink_to(canary / "victim")
    for command in (RUN, ("deploy", "standard", "--triton", "models", *FAST),
                    ("bench", "standard", *FAST)):
        _one_error(proj.run(*command), 5, f"{STANDARD}: is a symbolic link, not a folder")
        check()
    assert folder.is_symlink()


@pytest.mark.parametrize("link", ["compare/standard-vs-standard-fp16", "compare"])
def test_compare_refuses_an_output_folder_that_is_a_link(attack, link):
    proj, _, canary, check = attack
    (proj.engines / link).parent.mkdir(parents=True, exist_ok=True)
    (proj.engines / link).symlink_to(canary / "victim2")
    # refused before anything is built: no standard-fp16 folder appears
    _one_error(proj.run("compare", "standard", "standard-fp16", *FAST), 5,
               f"{link}: is a symbolic link, not a folder")
    check()
    assert not any(p.name.startswith("standard-fp16") for p in proj.engines.iterdir())


def test_tune_refuses_a_tune_folder_that_is_a_link(project, tmp_path_factory):
    victim = tmp_path_factory.mktemp("victim")
    (victim / "keep.txt").write_text("victim's own file\n")
    (project.engines / "standard").mkdir(parents=True)
    (project.engines / "standard" / "tune").symlink_to(victim)
    _one_error(project.run("tune", "standard", timeout=120), 5,
               "standard/tune: is a symbolic link, not a folder")
    assert [p.name for p in victim.iterdir()] == ["keep.txt"]


# ------------------------------------------------------------------ 7, 13: FIFOs and devices
@pytest.mark.parametrize("setting, what", [
    (("data.validation.text=data/fifo.txt", "data.validation.tokenizer=bytes"), "is a FIFO, not a text file"),
    (("data.validation.arrays=data/fifo.npy",), "is a FIFO, not an .npy file"),
    (("data.validation.text=/dev/zero", "data.validation.tokenizer=bytes"), "is a device, not a text file"),
])
def test_fifos_and_devices_are_refused_at_once(attack, setting, what):
    proj, _, _, check = attack
    for name in ("fifo.txt", "fifo.npy"):
        if not (proj.path / "data" / name).exists():
            os.mkfifo(proj.path / "data" / name)
    sets = [a for s in setting for a in ("--set", s)]
    result = proj.run(*RUN, *sets, timeout=60, env={"PIPELINE_DATA_DIRS": "/dev"})
    _one_error(result, 2, setting[0].partition("=")[2], what)
    check()


# ------------------------------------------------------------------ 8: pending vouches for nothing
def test_a_planted_pending_entry_does_not_vouch_for_a_swapped_engine(attack):
    proj, folder, _, check = attack
    engine = folder / "onnxruntime.onnx"
    built = engine.read_bytes()
    swapped = (folder / "model.onnx").read_bytes()
    assert swapped != built
    engine.write_bytes(swapped)
    _edit_manifest(folder, lambda m: m.update(
        pending={"onnxruntime.onnx": hashlib.sha256(swapped).hexdigest()}))

    _one_error(proj.run("deploy", "standard", "--triton", "models", *FAST), 5,
               "onnxruntime.onnx: an interrupted commit")
    result = proj.run(*RUN)
    assert result.code == 0, result.err
    assert "build:onnxruntime" in result.err and "build:onnxruntime          cached" not in result.err
    assert engine.read_bytes() != swapped  # rebuilt, not validated as it was
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["files"]["onnxruntime.onnx"]["sha256"] == hashlib.sha256(engine.read_bytes()).hexdigest()
    assert not manifest.get("pending")
    assert proj.run("verify", f"engines/{STANDARD}", "--files-only").code == 0
    check()


# ------------------------------------------------------------------ 12: the tokenizer is confined
@pytest.mark.parametrize("tokenizer", ["{canary}", "../../../etc"])
def test_the_tokenizer_folder_is_confined_like_data(project, tmp_path_factory, tokenizer):
    project.write("data/lines.txt", "one sentence\nanother one\n")
    where = tokenizer.replace("{canary}", str(tmp_path_factory.mktemp("outside")))
    result = project.run("run", "standard", "--set", "data.validation.text=data/lines.txt",
                         "--set", f"data.validation.tokenizer={where}")
    _one_error(result, 2, "data.validation.tokenizer", "outside the project and the data folders")
    assert not project.engines.exists()


# ------------------------------------------------------------------ 13: the lesser ones
def test_control_characters_from_a_report_never_reach_the_terminal(attack):
    proj, folder, _, check = attack
    report = json.loads((folder / "report.json").read_text())
    skipped = next(e for e in report["engines"] if e["status"] != "built")
    skipped["reason"] = "\x1b[2J\x1b]0;owned\x07cleared"
    report["warnings"] = ["\x1b[2J\x1b]0;owned\x07cleared"]  # the run table's caption shows these
    _rehash(folder, "report.json", json.dumps(report).encode())
    result = proj.run("deploy", "standard", "--triton", "models", "--target", skipped["target"], *FAST)
    _one_error(result, 2, "\\x1b[2J\\x1b]0;owned\\x07cleared")
    assert "\x1b" not in result.out + result.err and "\x07" not in result.err
    shown = proj.run(*RUN)  # every stage cached: the table is the planted report's
    assert shown.code == 0, shown.err
    assert "warning: \\x1b[2J\\x1b]0;owned\\x07cleared" in shown.out
    assert "\x1b" not in shown.out + shown.err and "\x07" not in shown.out
    check()


def test_a_loader_is_read_only_as_far_as_samples(project):
    """A loader that would go on forever (here: one that fails on the 4th feed) is read only
    as far as `samples`; the run then stops at the next preflight check (validate.device
    cuda, on this GPU-less machine), which it could reach only past the data."""
    from pipeline.core import deps

    if deps.gpus():
        pytest.skip("needs a machine without a GPU: validate.device cuda is the stop after the data")
    project.write("endless.py", "import numpy as np\n\n\ndef feeds():\n"
                  "    for _ in range(3):\n        yield {'input_ids': np.ones((2, 8), np.int64)}\n"
                  "    raise RuntimeError('read past samples')\n")
    result = project.run("run", "standard", "--set", "data.validation={loader: 'endless:feeds', samples: 3}",
                         "--set", "validate.device=cuda", timeout=120)
    _one_error(result, 2, "validate.device: cuda")
    assert not project.engines.exists()


def test_a_report_path_leaving_the_folder_is_refused_by_deploy_as_by_verify(attack):
    proj, folder, canary, check = attack
    report = json.loads((folder / "report.json").read_text())
    built = next(e for e in report["engines"] if e["status"] == "built")
    built["path"] = f"../../..{canary}/secret.txt"
    _rehash(folder, "report.json", json.dumps(report).encode())
    _one_error(proj.run("verify", f"engines/{STANDARD}", "--files-only"), 5)
    _one_error(proj.run("deploy", "standard", "--triton", "models", *FAST), 5,
               "reports its engine as", "not the file onnxruntime.onnx")
    assert not (proj.path / "models").exists()
    check()


def test_a_planted_baseline_bomb_is_refused_from_its_headers(attack):
    """1 GiB of float64 zeros claimed by a member that deflates to about 1 MB: refused from
    its headers, before anything is decompressed (np.savez stores the baseline uncompressed)."""
    import zipfile

    import numpy as np

    proj, folder, _, check = attack
    bomb = folder / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf, \
            zf.open("out/0/logits.npy", "w", force_zip64=True) as f:
        count = 1 << 27  # float64 values: 1 GiB
        np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": (count,)})
        chunk = bytes(8 << 20)
        for _ in range(count * 8 // len(chunk)):
            f.write(chunk)
    bomb.replace(folder / "baseline.npz")
    _rehash(folder, "baseline.npz", (folder / "baseline.npz").read_bytes())
    _edit_manifest(folder, lambda m: m["stages"].pop("validate:onnxruntime"))  # validate reads it
    _one_error(proj.run(*RUN), 5, "baseline.npz: its arrays claim 1,073,741,824 bytes",
               "it did not write this file")
    check()


@pytest.mark.parametrize("args, expected", [
    (("deploy", "standard", "--triton", "models", "--version", "9" * 26), "'--version'"),
    (("run", "standard", "--set", "validate.threads=" + "9" * 23), "validate.threads"),
    (("run", "a" * 5000), "at most 200 characters"),
    (("run", "a" * 5000 + "@0123abcd"), "at most 200 characters"),
])
def test_numbers_and_names_beyond_their_bounds_are_refused_up_front(project, args, expected):
    result = project.run(*args)
    assert result.code == 2, result.err
    assert "Traceback" not in result.err and expected in result.err
    assert not project.engines.exists() and not (project.path / "models").exists()


# ------------------------------------------------------------------ the rule, on the source
WRITERS = {"write_text", "write_bytes", "savefig", "save", "savez", "savez_compressed", "unlink",
           "rmtree", "rename", "replace", "copyfile", "copytree", "truncate"}
# Modules that call those plainly, and why that is safe: a stage's own work folder is made
# new under the lock (store.workdir), so no name in it can have been planted.
PLAIN_WRITERS = {
    "core/safe_files.py": "the rule itself", "store/recipe_folder.py": "the store: folder checked, under the lock",
    "commands/deploy.py": "OUT/.<model>.<pid>.tmp made new; links refused", "commands/tune.py": "folders checked",
    "run/stage_cache.py": "the stage's work folder", "data/feeds.py": "save_feeds: the work folder",
    "bench/ab.py": "versus: the work folder", "bench/plots.py": "savefig into an exclusive temp",
    "compare/render.py": "savefig into an exclusive temp",
    "stages/report.py": "the work folder", "stages/validate.py": "the work folder",
    "stages/precision.py": "the work folder", "precision/effective.py": "the work folder",
    "precision/sensitivity.py": "the work folder", "precision/qdq.py": "the work folder",
    "backends/tensorrt.py": "the work folder", "workloads/generation_measure.py": "the work folder",
    "generation/genai_config.py": "the work folder", "bench/monitor.py": "/proc/self/clear_refs (resets the peak RSS)",
    # onnx.save of a graph stage's output: the work folder
    "generation/export.py": "onnx.save", "stages/export.py": "onnx.save",
    "stages/optimize.py": "the work folder", "precision/cast.py": "onnx.save",
    "precision/dynamic.py": "onnx.save", "precision/key_mask.py": "onnx.save",
    "precision/smooth.py": "onnx.save",
    "fleet/transfer.py": "a folder it makes new (mkdir), renamed into place whole",
    "fleet/worker.py": "the job's own TemporaryDirectory",
    "model/gguf.py": "the conversion's own mkdtemp folder, renamed into place whole",
    "precision/int4.py": "onnx.save", "loadgen/artifact.py": "the work folder",
    "serving/coldstart.py": "the work folder", "serving/http_api.py": "np.savez into a BytesIO",
    "loadgen/plots.py": "savefig into the load run's own mkdtemp folder",
    "loadgen/server.py": "the serve log in the load run's own mkdtemp folder",
    "serving/ray_node.py": "removes only Ray's temp folder, a mkdtemp it made itself",
}


def _plain_writes(source: str) -> list[int]:
    import ast

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            mode = next((a.value for a in node.args[1:2] if isinstance(a, ast.Constant)), "")
            owner = getattr(getattr(node.func, "value", None), "id", None)
            if name == "replace" and owner != "os":  # str.replace
                continue
            if name in WRITERS or name == "open" and any(c in str(mode) for c in "wax+"):
                lines.append(node.lineno)
    return lines


def test_every_writer_in_pipeline_goes_through_the_rule():
    """A module that writes, renames or deletes files either is the rule (safe_files, the
    store, deploy, tune) or writes only into a stage's fresh work folder; a new writer
    elsewhere must route through safe_files (write_atomic, folder) or be added here, saying
    why it is safe."""
    from tests.conftest import ROOT

    assert _plain_writes("p.write_text('x')\nopen(p, 'wb')\nopen(p)\n's'.replace('a', 'b')\n"
                         "os.replace(a, b)\n") == [1, 2, 5]  # the scan sees what it must
    found = {}
    for path in sorted((ROOT / "pipeline").rglob("*.py")):
        module = path.relative_to(ROOT / "pipeline").as_posix()
        lines = _plain_writes(path.read_text())
        if lines and module not in PLAIN_WRITERS:
            found[module] = lines
    assert not found, f"files written outside safe_files' rule: {found}"
