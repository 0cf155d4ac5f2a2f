"""Engine folders and data files are untrusted input (a downloaded CI artifact, a shared
.npz): each attack of issue 19 planted as a real folder or file, run through the real CLI.
Every case ends in one `Error:` line with exit 2 or 5 (or a clean success where that is
right), and a canary tree beside the project, hashed before and after, proves that nothing
outside the command's own folders was written or changed."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import FAST, ROOT, STANDARD, Project, wait_exit

CALIBRATE = ("export", "standard-int8", "--set", "data.calibration.file=cal.npz")


def _tree(root: Path, skip: tuple[Path, ...]) -> dict[str, str]:
    """Every entry under `root` but `skip`: a file's sha256, a link's target, or `dir`."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [n for n in dirnames if here / n not in skip]
        for name in dirnames + filenames:
            path = here / name
            if path in skip:
                continue
            key = str(path.relative_to(root))
            if path.is_symlink():
                found[key] = "-> " + os.readlink(path)
            elif path.is_file():
                found[key] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                found[key] = "dir"
    return found


@pytest.fixture
def planted(standard_copy, tmp_path) -> tuple[Project, Path, Path]:
    """(the built `standard` copy, its folder, a canary file outside it)."""
    canary = tmp_path / "canary" / "secret.txt"
    canary.parent.mkdir()
    canary.write_text("nothing may touch this file\n")
    return standard_copy, standard_copy.engines / STANDARD, canary


def _outside(tmp_path: Path, *roots: Path) -> dict[str, str]:
    return _tree(tmp_path, roots)


def _one_error(result, code: int, *parts: str) -> str:
    assert result.code == code, result.out + result.err
    assert "Traceback" not in result.err and len(result.error_lines) == 1, result.err
    for part in parts:
        assert part in result.error_lines[0], result.error_lines[0]
    return result.error_lines[0]


def _rehash(folder: Path, name: str, data: bytes) -> None:
    """Write `data` as `name` and record its new sha256 and size, as an attacker would."""
    (folder / name).write_bytes(data)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][name].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _edit_manifest(folder: Path, change) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


# ------------------------------------------------------------------ deploy and verify
def test_a_report_target_that_leaves_the_folder_is_refused(planted, tmp_path):
    proj, folder, _ = planted
    report = json.loads((folder / "report.json").read_text())
    built = next(e for e in report["engines"] if e["status"] == "built")
    built["target"] = "../../../ESCAPED"
    _rehash(folder, "report.json", json.dumps(report).encode())
    out = proj.path / "models"
    before = _outside(tmp_path, folder, out)

    _one_error(proj.run("deploy", "standard", "--triton", "models", *FAST), 5,
               "'../../../ESCAPED' is not a target of recipe `standard`")
    verified = proj.run("verify", f"engines/{STANDARD}", "--files-only")
    _one_error(verified, 5, f"{STANDARD}/report.json")
    assert "engine target '../../../ESCAPED' is not a plain file name" in verified.out
    assert "✓ report.json:../" not in verified.out
    assert not out.exists() and _outside(tmp_path, folder, out) == before


def test_deploy_reads_only_verified_files_of_the_folder(planted, tmp_path):
    import onnx

    proj, folder, _ = planted
    source = json.loads((folder / "manifest.json").read_text())["stages"]["build:onnxruntime"]["meta"]["source"]
    out = proj.path / "models"
    before = _outside(tmp_path, folder, out)

    # the source graph's output dims edited, the manifest left alone: deploy and verify agree
    original = (folder / source).read_bytes()
    graph = onnx.load_from_string(original)
    graph.graph.output[0].type.tensor_type.shape.dim[-1].dim_value = 7
    (folder / source).write_bytes(graph.SerializeToString())
    _one_error(proj.run("deploy", "standard", "--triton", "models", *FAST), 5,
               f"{source}: sha256", "does not match the manifest")
    _one_error(proj.run("verify", f"engines/{STANDARD}", "--files-only"), 5, f"{STANDARD}/{source}")

    # a build record naming a file outside the folder as its source graph
    (folder / source).write_bytes(original)
    _edit_manifest(folder, lambda m: m["stages"]["build:onnxruntime"]["meta"].update(source="/etc/hostname"))
    # (the manifest's model refuses it as it is read: a recorded name is one path component)
    _one_error(proj.run("deploy", "standard", "--triton", "models", *FAST), 5,
               "stage `build:onnxruntime`'s meta: `source`", "manifest.json")
    assert not out.exists() and _outside(tmp_path, folder, out) == before


def test_a_deploy_that_runs_out_of_disk_leaves_no_model_folder(standard_copy, tmp_path):
    # RLIMIT_FSIZE makes every write past 64 KiB fail with EFBIG, as a full disk fails it
    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    out = standard_copy.path / "models"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-m", "pipeline", "deploy", "standard", "--triton", "models",
                           *FAST], cwd=standard_copy.path, env=env, capture_output=True, text=True,
                          timeout=300, preexec_fn=small_files)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert proc.returncode == 4 and len(errors) == 1 and "File too large" in errors[0], proc.stderr
    assert list(out.iterdir()) == []  # no model folder, no temporary one


def test_config_pbtxt_escapes_names_that_try_to_inject_fields():
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2",
                                           reason="Triton's schema comes with tritonclient[grpc]")
    from google.protobuf import text_format

    from pipeline.commands import deploy

    crafted = 'logits" } parameters { key: "EXECUTION_ENV_PATH" value { string_value: "/tmp/x" } } output { name: "y'
    text = deploy.config_pbtxt("m", "onnxruntime", False, 0, [deploy.Tensor("ids", "TYPE_INT64", [-1], [4])],
                               [deploy.Tensor(crafted, "TYPE_FP32", [-1, 8])])
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert [o.name for o in config.output] == [crafted]
    assert not config.parameters


def test_verify_names_an_interrupted_commit_and_run_finishes_it(planted, tmp_path):
    # the state a SIGKILL between a commit's rename and its last manifest write leaves
    proj, folder, _ = planted
    (folder / "report.md").write_text("# the report a killed run had just renamed in\n")
    digest = hashlib.sha256((folder / "report.md").read_bytes()).hexdigest()

    def interrupted(m):
        m["pending"] = {"report.md": digest}
        del m["stages"]["report"]

    _edit_manifest(folder, interrupted)
    before = _outside(tmp_path, folder)
    verified = proj.run("verify", f"engines/{STANDARD}", "--files-only")
    _one_error(verified, 5, "interrupted commit", f"`pipeline run {STANDARD}`")
    assert "✗ INTERRUPTED report.md" in verified.out and "MISMATCH" not in verified.out
    assert proj.run("run", "standard", *FAST).code == 0
    assert proj.run("verify", f"engines/{STANDARD}", "--files-only").code == 0
    assert _outside(tmp_path, folder) == before


# ------------------------------------------------------------------ the store
def test_a_planted_lock_link_or_artifact_link_is_refused_not_followed(planted, tmp_path):
    proj, folder, canary = planted
    before = _outside(tmp_path, folder)
    (folder / ".lock").unlink()
    (folder / ".lock").symlink_to(canary)
    _one_error(proj.run("run", "standard", *FAST), 5, ".lock: the lock file is a symbolic link")

    (folder / ".lock").unlink()
    (folder / "model.onnx").unlink()
    (folder / "model.onnx").symlink_to(canary)
    _one_error(proj.run("run", "standard", *FAST), 5, "model.onnx: a recorded file is now a symbolic link")
    verified = proj.run("verify", f"engines/{STANDARD}", "--files-only")
    _one_error(verified, 5, f"{STANDARD}/model.onnx")
    assert "model.onnx: is a symbolic link" in verified.out
    assert _outside(tmp_path, folder) == before


def test_planted_temp_file_links_are_never_written_through(planted, tmp_path):
    proj, folder, canary = planted
    for pid in range(1, 3001):  # to the canary, and dangling (open() would create the target)
        (folder / f".manifest.json.{pid}.tmp").symlink_to(canary if pid % 2 else canary.with_name(f"new-{pid}"))
    _edit_manifest(folder, lambda m: m["stages"].pop("report"))  # the run must write the manifest
    before = _outside(tmp_path, folder)
    result = proj.run("run", "standard", *FAST)
    assert result.code == 0, result.err
    assert not list(folder.glob(".*.tmp"))  # the links are swept, not followed
    assert not (folder / "manifest.json").is_symlink() and "report" in json.loads(
        (folder / "manifest.json").read_text())["stages"]
    assert _outside(tmp_path, folder) == before


# ------------------------------------------------------------------ data files
def _zero_samples_npz(path: Path, count: int, sample: tuple[int, ...], first: int = 0) -> None:
    """An .npz of `count` int64 samples, all zeros but the first (`first`), written as a
    stream: the array is never in this process's memory (16M samples are 1 GB here)."""
    row = np.zeros(sample, np.int64)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf, \
            zf.open("input_ids.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<i8", "fortran_order": False, "shape": (count, *sample)})
        f.write(np.full(sample, first, np.int64).tobytes())
        chunk = np.tile(row, (1 << 16, *([1] * len(sample)))).tobytes()
        left = count - 1
        while left > 0:
            n = min(left, 1 << 16)
            f.write(chunk[: n * row.nbytes])
            left -= n


def test_a_calibration_file_of_16m_samples_is_read_as_the_16_it_needs(project, monkeypatch):
    from pipeline import data
    from pipeline import recipe as recipe_mod

    _zero_samples_npz(project.path / "cal.npz", 16_000_000, (1, 8))  # 1 GB of int64 unpacked
    monkeypatch.chdir(project.path)
    recipe = recipe_mod.load("standard-int8", ["data.calibration.file=cal.npz"])
    tracemalloc.start()
    try:
        feeds = data.calibration_feeds(recipe)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(feeds) == recipe.data.calibration.samples == 16
    assert feeds[0]["input_ids"].shape == (1, 8) and peak < 32 << 20, peak

    # through the CLI: the first sample holds a token id beyond the vocabulary, named before
    # any work (`range` is the random generator's; real data is checked against the model)
    _zero_samples_npz(project.path / "cal.npz", 16_000_000, (1, 8), first=600)
    _one_error(project.run(*CALIBRATE, timeout=120), 2, "cal.npz: feed 0",
               "beyond the model's vocabulary of 512")
    assert not project.engines.exists()


def test_a_fifo_as_the_calibration_file_is_refused_at_once(project):
    os.mkfifo(project.path / "cal.npz")
    _one_error(project.run(*CALIBRATE, timeout=120), 2, "cal.npz: is a FIFO, not an .npz file")
    assert not project.engines.exists()


def test_ort_temporary_files_stay_in_the_stage_folder(tmp_path):
    from pipeline.precision import calibrate

    work = tmp_path / "work"
    work.mkdir()
    with calibrate.quiet(False, work):
        inside = Path(tempfile.mkdtemp(prefix="ort.quant."))  # what ORT's calibrators do
    assert inside.parent == work.resolve()
    assert Path(tempfile.gettempdir()) != work.resolve()  # restored afterwards


# ------------------------------------------------------------------ recipes
@pytest.mark.parametrize("setting, expected", [
    ("inputs.0.shape.1.max=268435455", "of memory"),
    ("data.validation.samples=1000000000", "of memory"),
    ("validate.latency.min_seconds=1e12", "would run for about"),
])
def test_a_recipe_beyond_the_limits_is_refused_with_its_estimate(project, setting, expected):
    line = _one_error(project.run("run", "standard", "--set", setting), 2, expected, "over the ceiling")
    assert "PIPELINE_MAX_" in line
    assert not project.engines.exists()



def test_a_data_file_of_10m_rows_without_samples_is_refused_by_its_size(project):
    """`samples` unset takes every row of a file: the estimate counts them (without loading
    the file) and refuses 10M sentences before any feed is made."""
    project.write("big.txt", "a\n" * 10_000_000)  # 20 MB, 10M rows
    result = project.run("run", "minilm", "--set", "data.validation={text: big.txt}")
    _one_error(result, 2, "of memory", "feeds and reference outputs")


def test_two_checkouts_export_byte_identical_graphs(built_standard, tmp_path):
    """The same recipe exported from two checkouts at different paths (this one, for the
    shared standard build, and a copy): the same bytes, and neither checkout's path inside."""
    checkout = tmp_path / "checkout-at-another-path"
    shutil.copytree(ROOT / "pipeline", checkout / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "recipes", checkout / "recipes")
    env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PIPELINE_ENGINES", None)
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "export", "standard"],
                            cwd=checkout, env=env, stderr=subprocess.PIPE, text=True)
    assert wait_exit(proc, 600) == 0, proc.stderr.read()
    graphs = {ROOT: (built_standard.built / "model.onnx").read_bytes(),
              checkout: (checkout / "engines" / "standard" / "model.onnx").read_bytes()}
    assert len({hashlib.sha256(g).hexdigest() for g in graphs.values()}) == 1
    assert b'File "pipeline/zoo/glm.py"' in graphs[ROOT]  # the trace is kept, relative
    for where, graph in graphs.items():
        assert str(where).encode() not in graph and str(tmp_path).encode() not in graph
        assert str(built_standard.path).encode() not in graph


def test_deploy_replaces_a_model_folder_whole_and_keeps_its_other_versions(standard_copy):
    proj, out = standard_copy, standard_copy.path / "models"
    assert proj.run("deploy", "standard", "--triton", "models", *FAST).code == 0
    model = out / "standard-onnxruntime"
    (out / f".standard-onnxruntime.{2**22 + 1}.tmp").mkdir()  # a killed deploy's (no such pid)
    assert proj.run("deploy", "standard", "--triton", "models", "--version", "2", *FAST).code == 0
    assert sorted(p.name for p in out.iterdir()) == ["standard-onnxruntime"]
    assert sorted(p.name for p in model.iterdir()) == ["1", "2", "config.pbtxt"]
    assert (model / "1" / "model.onnx").read_bytes() == (model / "2" / "model.onnx").read_bytes()

    shutil.rmtree(model)
    model.symlink_to(proj.path)  # a link where the model folder goes is not followed
    _one_error(proj.run("deploy", "standard", "--triton", "models", *FAST), 2,
               "standard-onnxruntime: is a symbolic link, not a model folder")
    assert model.is_symlink() and not (proj.path / "config.pbtxt").exists()
