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
from pipeline.run.execute import failed_gates
from pipeline.stages.report import rows
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
    for name, entry in read["files"].items():  # what store.artifact / verify use
        assert "/" not in name and isinstance(entry["bytes"], int) and len(entry["sha256"]) == 64
    for record in read["stages"].values():
        assert all(o in read["files"] for o in record["outputs"])


def _cheap(path: tuple) -> bool:
    """Damage that cannot make `run` rebuild a stage (a new key, a dropped record): those
    are correct reruns, only slow."""
    return not (path[0] == "stages" and (len(path) <= 2 or path[2] == "key"))


@settings(max_examples=4, deadline=None, derandomize=True,
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
