"""Issue 39 (untrusted folders, round 3), each reproduced through the real CLI on a copy of a
built folder: no code from a genai config, a folder verified before any library opens it,
the chat tokenizer confined, `generate` bounded by the engine's sequence, ratios bounded,
a planted lock cleared by --force, no stage reuse from a planted sibling, and user code that
ends the process never making a run look successful."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FAST, ROOT, STANDARD, Project
from tests.e2e.test_untrusted import _one_error, _rehash
from tests.generation.test_run import built_gen  # noqa: F401  (the session's generation build)


@pytest.fixture
def gen_copy(built_gen, tmp_path) -> tuple[Project, str, Path]:  # noqa: F811
    """(a private copy of the built generation project, its folder's name, a marker path
    outside it that only a loaded planted library would create)."""
    proj = Project(tmp_path / "proj")
    shutil.copytree(built_gen.engines, proj.engines)
    return proj, built_gen.built.name, tmp_path / "outside" / "PWNED"


def _evil_library(folder: Path, marker: Path) -> None:
    """lib/evil.so in the folder: a shared library whose constructor writes `marker` (built
    with the C compiler when there is one; else bytes that would fail to load, which the
    check must refuse just the same, before genai opens anything)."""
    (folder / "lib").mkdir()
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        (folder / "lib" / "evil.so").write_bytes(b"\x7fELF not really")
        return
    source = folder.parent.parent / "evil.c"
    source.write_text('#include <stdio.h>\n__attribute__((constructor)) static void pwn(void) {\n'
                      f'  FILE *f = fopen("{marker}", "w"); if (f) fclose(f);\n}}\n')
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(folder / "lib" / "evil.so"), str(source)], check=True)


# ------------------------------------------------------------------ 1: no code from genai configs
@pytest.mark.parametrize("forged", [True, False], ids=["manifest-rewritten", "sha256-mismatch"])
def test_generate_never_loads_the_library_a_planted_genai_config_names(gen_copy, forged):
    proj, name, marker = gen_copy
    folder = proj.engines / name
    marker.parent.mkdir()
    _evil_library(folder, marker)
    cfg = json.loads((folder / "genai_config.json").read_text())
    cfg["model"]["decoder"]["session_options"]["custom_ops_library"] = "lib/evil.so"
    text = json.dumps(cfg, indent=2).encode()
    if forged:  # what `verify` passes: only the content can object
        _rehash(folder, "genai_config.json", text)
    else:
        (folder / "genai_config.json").write_bytes(text)
    line = _one_error(proj.run("generate", name, "--prompt", "hi", "--max-tokens", "2"), 5,
                      "genai_config.json")
    assert ("custom_ops_library (loads a shared library)" in line) == forged, line
    assert not marker.exists(), "the planted library's constructor ran"


def test_a_genai_config_rewritten_within_its_keys_is_not_what_the_pipeline_writes(gen_copy):
    proj, name, _ = gen_copy
    folder = proj.engines / name
    cfg = json.loads((folder / "genai_config.json").read_text())
    cfg["model"]["context_length"] *= 1000  # a key the pipeline writes, another value
    _rehash(folder, "genai_config.json", json.dumps(cfg).encode())
    _one_error(proj.run("generate", name, "--prompt", "hi"), 5, "not what the pipeline writes",
               "model.context_length")
    (folder / "tokenizer.json").write_text("{}")  # a file genai's folder would read, unrecorded
    _one_error(proj.run("generate", name, "--prompt", "hi"), 5, "tokenizer.json", "not recorded")


@pytest.mark.parametrize("swap", ["another graph", "fifo"])
def test_generate_refuses_a_swapped_engine_or_a_fifo_in_its_place(gen_copy, swap):
    proj, name, _ = gen_copy
    folder = proj.engines / name
    engine = folder / "onnxruntime.onnx"
    engine.unlink()
    if swap == "fifo":
        os.mkfifo(engine)  # genai would block reading it
    else:
        shutil.copyfile(folder / "model.onnx", engine)
    line = _one_error(proj.run("generate", name, "--prompt", "hi", timeout=120), 5,
                      "`generate` refuses it", "onnxruntime.onnx")
    assert ("FIFO" in line) == (swap == "fifo"), line


# ------------------------------------------------------------------ 12: generate's bounds
def test_generate_is_bounded_by_the_engines_sequence(gen_copy):
    proj, name, _ = gen_copy
    context = json.loads((proj.engines / name / "genai_config.json").read_text())["model"]["context_length"]
    longer = proj.run("generate", name, "--prompt", "hi", "--max-tokens", "300")
    assert longer.code == 0 and "Traceback" not in longer.err, longer.err
    assert f"where the engine's {context}-token sequence ends (--max-tokens 300)" in longer.err
    huge = proj.run("generate", name, "--prompt", "hi", "--max-tokens", "1000000000")
    assert huge.code == 0 and "Traceback" not in huge.err, huge.err
    _one_error(proj.run("generate", name, "--prompt", "x" * 100_000), 2, "the prompt is",
               f"this engine holds {context}")


def _chat(proj: Project, name: str, stdin: bytes) -> subprocess.CompletedProcess:
    """`generate --chat` fed raw bytes (Project.run passes text)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PIPELINE_ENGINES", None)
    return subprocess.run([sys.executable, "-m", "pipeline", "generate", name, "--chat"], cwd=proj.path,
                          env=env, input=stdin, capture_output=True, timeout=300)


@pytest.mark.parametrize("stdin, words", [
    (bytes(range(128, 256)) * 8 + b"\n", ("line 1 of the input is not UTF-8",)),
    (b"y" * 1_000_000 + b"\n", ("the prompt is", "this engine holds")),
], ids=["random-bytes", "1MB-line"])
def test_chat_input_beyond_text_or_the_sequence_is_one_line(gen_copy, stdin, words):
    proj, name, _ = gen_copy
    proc = _chat(proj, name, stdin)
    err = proc.stderr.decode()
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert proc.returncode == 2 and "Traceback" not in err and len(errors) == 1, err
    assert all(w in errors[0] for w in words), errors[0]


# ------------------------------------------------------------------ 9: the chat tokenizer is confined
def test_the_chat_tokenizer_is_confined_from_the_recipe_and_from_a_folder(gen_copy):
    proj, name, _ = gen_copy
    _one_error(proj.run("run", "standard-gen", "--set", "workload.chat={tokenizer: ../../etc}"), 2,
               "workload.chat.tokenizer", "outside the project")
    from pipeline.store.folder_names import overrides_digest

    recorded = ["workload.chat={tokenizer: ../../etc}"]
    planted = f"standard-gen@{overrides_digest(recorded)}"
    shutil.copytree(proj.engines / name, proj.engines / planted)
    manifest = json.loads((proj.engines / planted / "manifest.json").read_text())
    manifest["recipe_overrides"] = recorded
    (proj.engines / planted / "manifest.json").write_text(json.dumps(manifest))
    for command in (("run", planted), ("generate", planted, "--prompt", "hi")):
        _one_error(proj.run(*command), 5, f"{planted}/manifest.json", "recorded --set values are refused",
                   "workload.chat.tokenizer")


# ------------------------------------------------------------------ 14: ratios within their ranges
@pytest.mark.parametrize("field, value, words", [
    ("top1_agreement", "Infinity", ("a share inf is not [0, 1]",)),
    ("cosine", "1.5", ("a cosine 1.5 is not [-1, 1]",)),
    ("speedup", "Infinity", ("a ratio of times inf is not finite",)),
])
def test_a_resigned_report_with_a_figure_beyond_its_range_is_refused(standard_copy, field, value, words):
    folder = standard_copy.engines / STANDARD
    report = json.loads((folder / "report.json").read_text())
    engine = report["engines"][0]
    if field == "speedup":
        engine["speedup_vs_baseline"]["ratio"] = engine["speedup_vs_baseline"]["ci95"][1] = float(value)
    else:
        engine["accuracy"]["logits"][field] = float(value)
    _rehash(folder, "report.json", json.dumps(report).encode())
    for command in (("verify", f"engines/{STANDARD}", "--files-only"),
                    ("deploy", "standard", "--triton", "models", *FAST)):
        result = standard_copy.run(*command)
        assert result.code == 5 and "Traceback" not in result.err, (command, result.out, result.err)
        assert all(w in result.out + result.err for w in words), (command, result.out, result.err)
    assert not (standard_copy.path / "models").exists()


# ------------------------------------------------------------------ 16: --force clears a planted lock
@pytest.mark.parametrize("planted", ["symlink", "folder"])  # a FIFO or hard link: the same path
def test_force_clears_a_planted_lock_whatever_it_is(standard_copy, tmp_path, planted):
    folder = standard_copy.engines / STANDARD
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "secret.txt").write_text("nothing may touch this file\n")
    lock = folder / ".lock"
    lock.unlink(missing_ok=True)
    if planted == "symlink":
        lock.symlink_to(canary / "secret.txt")
    elif planted == "fifo":
        os.mkfifo(lock)
    elif planted == "folder":
        lock.mkdir()
        (lock / "inside").symlink_to(canary)
    else:
        os.link(canary / "secret.txt", lock)
    line = _one_error(standard_copy.run("export", "standard", *FAST), 5, ".lock: the lock file is")
    assert "--force" in line  # the way out it names ...
    forced = standard_copy.run("export", "standard", *FAST, "--force")  # ... works
    assert forced.code == 0 and "Traceback" not in forced.err, forced.err
    assert lock.is_file() and not lock.is_symlink() and lock.stat().st_nlink == 1
    assert sorted(p.name for p in canary.iterdir()) == ["secret.txt"]
    assert (canary / "secret.txt").read_text() == "nothing may touch this file\n"


# ------------------------------------------------------------------ 2: stage reuse from trusted builds only
def test_a_planted_sibling_never_supplies_a_stage_to_a_fresh_build(standard_copy):
    """engines/poison/: the built folder with its engine swapped and a manifest that matches
    (`verify` passes it). A fresh build of `standard` has the same keys, yet takes nothing
    this user's builds did not make: the swapped engine is rebuilt, and the run says so."""
    engines = standard_copy.engines
    shutil.copytree(engines / STANDARD, engines / "poison")
    genuine = (engines / STANDARD / "onnxruntime.onnx").read_bytes()
    swapped = (engines / STANDARD / "optimized.onnx").read_bytes()  # a valid graph, not the engine
    assert swapped != genuine
    _rehash(engines / "poison", "onnxruntime.onnx", swapped)
    report = json.loads((engines / "poison" / "report.json").read_text())
    report["engines"][0].update(sha256=hashlib.sha256(swapped).hexdigest(), bytes=len(swapped))
    _rehash(engines / "poison", "report.json", json.dumps(report).encode())
    verified = standard_copy.run("verify", "engines/poison", "--files-only")
    assert verified.code == 0, verified.out  # a consistent forgery: only its origin can object
    shutil.rmtree(engines / STANDARD)
    result = standard_copy.run("run", "standard", *FAST)
    assert result.code == 0, result.err
    said = " ".join(result.err.split())
    assert "build:onnxruntime: engines/poison records the same key, but no build of this user made " \
           "its files: not reused" in said, said
    assert "build:onnxruntime: the same key is built in engines/poison" not in said
    assert (engines / STANDARD / "onnxruntime.onnx").read_bytes() != swapped
    # what this user's own build made (the export, byte for byte) is still copied, and said from where
    assert "export: the same key is built in engines/poison: its verified files reused (this user " \
           "built them:" in said, said


# ------------------------------------------------------------------ 15: user code ending the process
@pytest.mark.parametrize("ending, code", [
    ("os._exit(0)", 2),
    ("signal.signal(signal.SIGUSR1, lambda *a: os._exit(0)); os.kill(os.getpid(), signal.SIGUSR1)", 2),
    ("os.kill(os.getpid(), signal.SIGTERM)", -15),  # the command dies of it too
], ids=["os._exit", "handler-exits-0", "sigterm"])
def test_a_factory_that_ends_the_process_never_looks_like_a_success(project, ending, code):
    project.write("ends.py", f"import os, signal\n\ndef model(**kwargs):\n    {ending}\n")
    project.write("recipes/ends.yaml", "description: a factory that ends the process\n"
                  "extends: standard.yaml\nmodel: {zoo: null, factory: 'ends:model'}\n")
    result = project.run("export", "ends")
    assert result.code == code, (result.code, result.err)
    if code == 2:
        _one_error(result, 2, "ended the process itself", "nothing it left counts as built")
    assert not list(project.engines.glob("*/model.onnx"))
