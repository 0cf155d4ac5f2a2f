"""Fuzzing report.json and manifest.json (hypothesis): a value anywhere replaced by one of
another type, a path that leaves the folder, a huge number, a null, or a key removed.

In-process, many examples: the models either read the file or raise Unusable, and whatever
they read, the readers that index into it (the report table, the gates, deploy's fields)
do not fail on it. Through the CLI, a few examples on a copy of a built folder: `verify`,
`deploy` and `run` end with no traceback, and a failure is one `Error:` line."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.artifacts import Unusable, parse
from pipeline.artifacts.recorded import manifest as parse_manifest
from pipeline.render.report_table import rows
from pipeline.run.execute import failed_gates
from tests.conftest import FAST, STANDARD, Project

HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["../../x", "/etc/passwd", "", ".", "..", "a/b", "built", "0" * 64, "nope"]),
    st.text(max_size=8), st.just([]), st.just({}), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path in a JSON tree (list items by index)."""
    out = [prefix] if prefix else []
    if isinstance(data, dict):
        for k, v in data.items():
            out += paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += paths(v, (*prefix, i))
    return out


def mutate(data: Any, path: tuple, value: Any, delete: bool) -> Any:
    out = copy.deepcopy(data)
    node = out
    for key in path[:-1]:
        node = node[key]
    if delete and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


@st.composite
def damaged(draw, data: Any, keep=lambda path: True):
    candidates = [p for p in paths(data) if keep(p)]
    path = draw(st.sampled_from(candidates))
    return mutate(data, path, draw(HOSTILE), draw(st.booleans())), path


@pytest.fixture(scope="module")
def originals(built_standard) -> dict[str, Any]:
    folder = built_standard.engines / STANDARD
    return {name: json.loads((folder / name).read_text()) for name in ("report.json", "manifest.json")}


def _read_like_the_commands(report: dict) -> None:
    """What cli, run.check_gates and deploy do with a report they were given."""
    rows(report)
    failed_gates(report)
    for e in report["engines"]:
        if e["status"] == "built":  # deploy: the engine's name, digest and gates
            assert isinstance(Path(e["path"]).name, str) and len(e["sha256"]) == 64
            assert all(isinstance(g["passed"], bool) for g in e["gates"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_damaged_report_is_read_or_refused_in_one_line(originals, data):
    report, _ = data.draw(damaged(originals["report.json"]))
    try:
        read = parse("report.json", report)
    except Unusable as e:
        assert "\n" not in e.problem
        return
    _read_like_the_commands(read)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_damaged_manifest_is_read_or_refused_in_one_line(originals, data):
    manifest, _ = data.draw(damaged(originals["manifest.json"]))
    try:
        read = parse_manifest(manifest)
    except Unusable as e:
        assert "\n" not in e.problem
        return
    for name, entry in read.files.items():  # what store.artifact / verify use
        assert "/" not in name and isinstance(entry.bytes, int) and len(entry.sha256) == 64
    for record in read.stages.values():
        assert all(o in read.files for o in record.outputs)


def _cheap(path: tuple) -> bool:
    """Damage that cannot make `run` rebuild a stage (a new key, a dropped record): those
    are correct reruns, only slow."""
    return not (path[0] == "stages" and (len(path) <= 2 or path[2] == "key"))


@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_commands_on_a_damaged_folder_never_trace_back(built_standard, tmp_path_factory, originals, data):
    name = data.draw(st.sampled_from(["manifest.json", "report.json"]))
    damaged_json, where = data.draw(damaged(originals[name], keep=_cheap))
    proj = Project(tmp_path_factory.mktemp("fuzz"))
    shutil.copytree(built_standard.engines, proj.engines)
    folder = proj.engines / STANDARD
    (folder / name).write_text(json.dumps(damaged_json))
    if name == "report.json":  # the manifest rewritten to match: only the model can object
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["files"][name].update(sha256=hashlib.sha256((folder / name).read_bytes()).hexdigest(),
                                       bytes=(folder / name).stat().st_size)
        (folder / "manifest.json").write_text(json.dumps(manifest))
    for args in (("verify", f"engines/{STANDARD}", "--files-only"),
                 ("deploy", "standard", "--triton", str(proj.path / "models"), *FAST),
                 ("run", "standard", *FAST)):
        result = proj.run(*args, timeout=300)
        assert "Traceback" not in result.err, (name, where, args, result.err)
        if result.code != 0:
            assert len(result.error_lines) == 1, (name, where, args, result.err)


# --------------------------------------------------------------- every artifact file type, as bytes
# Issue 27: what a planted file can do is not limited to values the models see; its bytes can
# be truncated, spliced, nested 100,000 deep or hold a 5,000-digit integer. Every JSON
# artifact goes through the one bounded reader (artifacts/json_file.py) and its model, and
# baseline.npz through data.load_all: each either reads the file or refuses it in one line.
# (compare.json, compare-generation.json and tune.json are written, never read back.)
EXIT_CODES = {0, 2, 3, 4, 5}  # docs/cli.md; 1 (a bug's traceback) and 6 (a lock) never here
JSON_ARTIFACTS = ("report.json", "manifest.json", "validate-onnxruntime.json", "versus-onnxruntime-other.json")
VERSUS = {"other": "other", "target": "onnxruntime", "reason": "`other` has no built `onnxruntime` engine"}


@st.composite
def damaged_bytes(draw, original: bytes) -> bytes:
    """`original` truncated, spliced, nested deep, with a huge integer or a NaN, or noise."""
    how = draw(st.sampled_from(["truncate", "splice", "deep", "huge int", "nan", "noise"]))
    at = draw(st.integers(0, len(original)))
    if how == "truncate":
        return original[:at]
    if how == "splice":
        return original[:at] + draw(st.binary(min_size=1, max_size=16)) + original[at:]
    if how == "deep":
        n = draw(st.sampled_from([65, 1000, 100_000]))
        colon = original.find(b":", at)
        at = colon + 1 if colon >= 0 else at
        return original[:at] + b"[" * n + b"]" * n + (b"," if colon >= 0 else b"") + original[at:]
    if how in ("huge int", "nan"):
        digits = [i for i in range(len(original)) if original[i:i + 1].isdigit()
                  and not original[i - 1:i].isdigit()] or [at]
        i = draw(st.sampled_from(digits))
        end = i
        while original[end:end + 1].isdigit():
            end += 1
        value = b"9" * draw(st.sampled_from([33, 5000])) if how == "huge int" else \
            draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity"]))
        return original[:i] + value + original[end:]
    return draw(st.binary(max_size=256))


@pytest.fixture(scope="module")
def raw_artifacts(built_standard) -> dict[str, bytes]:
    folder = built_standard.engines / STANDARD
    out = {name: (folder / name).read_bytes() for name in JSON_ARTIFACTS[:3] + ("baseline.npz",)}
    out["versus-onnxruntime-other.json"] = json.dumps(VERSUS).encode()
    return out


def read_planted(path: Path) -> None:
    """What every command does with a recorded file: read it through its reader. Returns or
    raises the one-line refusal (IntegrityError, Unusable); anything else is a bug."""
    from pipeline import data
    from pipeline.core.errors import IntegrityError
    from pipeline.store.recipe_folder import Store, read_recorded_json

    if path.name == "baseline.npz":
        try:
            data.load_all(path)
        except IntegrityError as e:
            assert "\n" not in str(e)
        return
    if path.name == "manifest.json":
        try:
            Store(path.parent.parent, path.parent.name).read_manifest()
        except IntegrityError as e:
            assert "\n" not in str(e)
        return
    content, problem = read_recorded_json(path)
    if problem is not None:
        assert "\n" not in problem.problem
    elif path.name == "report.json":
        _read_like_the_commands(content)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_bytes_of_any_artifact_are_read_or_refused_in_one_line(raw_artifacts, tmp_path, data):
    name = data.draw(st.sampled_from(sorted(raw_artifacts)))
    folder = tmp_path / "engines" / "x"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data.draw(damaged_bytes(raw_artifacts[name])))
    read_planted(folder / name)


def _canary(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def damaged_project(root: Path, engines: Path, name: str, damaged: bytes) -> tuple[Project, Path, dict]:
    """A project under root/proj holding a copy of `engines` whose recorded file `name` is
    `damaged` (re-signed in the manifest unless it is the manifest), and a canary tree beside
    it: (project, canary folder, the canary's digests before anything runs)."""
    canary = root / "canary"
    canary.mkdir()
    (canary / "secret.txt").write_text("untouched\n")
    proj = Project(root / "proj")
    shutil.copytree(engines, proj.engines)
    folder = proj.engines / STANDARD
    (folder / name).write_bytes(damaged)
    if name != "manifest.json":
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["files"][name].update(sha256=hashlib.sha256(damaged).hexdigest(), bytes=len(damaged))
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return proj, canary, _canary(canary)


def cli_problems(proj: Project, name: str, timeout: float) -> list[str]:
    """verify, deploy and run on the damaged folder: each traceback, exit code outside the
    documented set, or failure that is not exactly one error line."""
    problems = []
    for args in (("verify", f"engines/{STANDARD}", "--files-only"),
                 ("deploy", "standard", "--triton", str(proj.path / "models"), *FAST),
                 ("run", "standard", *FAST)):
        r = proj.run(*args, timeout=timeout)
        if "Traceback" in r.err or r.code not in EXIT_CODES or (r.code != 0 and len(r.error_lines) != 1):
            problems.append(f"{name} {args[0]}: exit {r.code}: {r.err[-300:]}")
    return problems


@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_commands_on_damaged_bytes_exit_cleanly_and_write_nothing_outside(
        built_standard, tmp_path_factory, raw_artifacts, data):
    """Through the CLI: a recorded file's bytes damaged and its digest re-signed; verify,
    deploy and run exit with a documented code, one line, and touch nothing outside."""
    name = data.draw(st.sampled_from(["report.json", "validate-onnxruntime.json", "manifest.json"]))
    damaged = data.draw(damaged_bytes(raw_artifacts[name]))
    proj, canary, before = damaged_project(tmp_path_factory.mktemp("fuzzbytes"),
                                           built_standard.engines, name, damaged)
    assert cli_problems(proj, name, timeout=300) == []
    assert _canary(canary) == before


def damage_every_artifact(folder: Path) -> None:
    """Every recorded JSON and the baseline cut and padded with 100,000 `[`, their digests
    re-signed in the manifest, which gets an extra key nested 100,000 deep."""
    manifest = json.loads((folder / "manifest.json").read_text())
    for name in ("report.json", "validate-onnxruntime.json", "baseline.npz"):
        bad = (folder / name).read_bytes()[:100] + b"[" * 100_000
        (folder / name).write_bytes(bad)
        manifest["files"][name].update(sha256=hashlib.sha256(bad).hexdigest(), bytes=len(bad))
    (folder / "manifest.json").write_text(json.dumps(manifest)[:-1] + ', "x": ' + "[" * 100_000 + "}")


@pytest.mark.slow
def test_run_force_clears_a_folder_with_every_artifact_damaged(built_standard, tmp_path):
    """Every recorded JSON and the baseline damaged at once, digests re-signed, the manifest
    given an extra key nested 100,000 deep: `run --force` rebuilds, and the folder verifies."""
    proj = Project(tmp_path / "proj")
    shutil.copytree(built_standard.engines, proj.engines)
    folder = proj.engines / STANDARD
    damage_every_artifact(folder)
    stuck = proj.run("run", "standard", *FAST)
    assert stuck.code == 5 and len(stuck.error_lines) == 1 and "Traceback" not in stuck.err, stuck.err
    forced = proj.run("run", "standard", "--force", *FAST)
    assert forced.code == 0, forced.err
    assert proj.run("verify", f"engines/{STANDARD}", "--files-only").code == 0
    assert list(folder.glob("manifest.json.unreadable-*"))  # the bad manifest is kept aside
