"""Typed artifacts: report.json (schema 2), validate-<target>.json and manifest.json read and
written through pipeline.artifacts; old reports migrated or refused; JSON of the right syntax
but the wrong shape is one `Error:` line and exit 5 in every command; `pipeline schema`."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from pipeline.artifacts import EngineResult, Report, Unusable, dump, parse
from pipeline.artifacts.recorded import manifest as parse_manifest
from pipeline.render.report_markdown import markdown
from pipeline.render.report_table import rows
from tests.conftest import FAST, ROOT, STANDARD


def read(folder: Path, name: str) -> dict:
    return json.loads((folder / name).read_text())


def rehash(folder: Path, name: str, data: object) -> None:
    """Write `data` as `name` and its new sha256 and size into the manifest, as someone
    covering their tracks would: only the models can tell the file is wrong."""
    path = folder / name
    path.write_text(json.dumps(data))
    manifest = read(folder, "manifest.json")
    manifest["files"][name].update(sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                                   bytes=path.stat().st_size)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def one_error(result, code: int = 5) -> str:
    assert result.code == code, result.err
    assert "Traceback" not in result.err, result.err
    assert len(result.error_lines) == 1, result.err
    return result.error_lines[0]


# ----------------------------------------------------------------------------- in-process
def test_what_a_run_writes_is_exactly_what_the_models_read(built_standard):
    folder = built_standard.engines / STANDARD
    report = read(folder, "report.json")
    assert report["schema"] == 3
    assert parse("report.json", report) == report  # no key added, dropped or changed
    assert parse("validate-onnxruntime.json", read(folder, "validate-onnxruntime.json")) \
        == read(folder, "validate-onnxruntime.json")
    assert dump(parse_manifest(read(folder, "manifest.json"))) == read(folder, "manifest.json")
    skipped = next(e for e in report["engines"] if e["status"] != "built")
    assert skipped["reason"] and skipped["gates"] == []  # run._not_built, through EngineResult
    assert markdown(report) and rows(report)


def test_a_schema_1_report_is_migrated(built_standard):
    report = read(built_standard.engines / STANDARD, "report.json")
    old = copy.deepcopy(report)
    old["schema"] = 1
    for e in old["engines"]:
        del e["kind"]  # the earliest reports had none
    migrated = parse("report.json", old)
    assert migrated["schema"] == 3
    assert [e["kind"] for e in migrated["engines"]] == [e["kind"] for e in report["engines"]]
    del old["schema"]  # before `schema` existed: schema 1
    assert parse("report.json", old)["schema"] == 3


OLD_REPORTS = Path(__file__).resolve().parent.parent / "old_reports"


def keys(obj) -> set[str]:
    """Every key of every mapping in a JSON document."""
    if isinstance(obj, dict):
        return set(obj).union(*(keys(v) for v in obj.values()))
    return set().union(*(keys(v) for v in obj)) if isinstance(obj, list) else set()


def test_a_schema_2_report_reads_with_effective_precision_split_by_runtime():
    """A real schema-2 report (standard-int8, written by the pipeline before the split): its
    ONNX Runtime FLOP shares read as `ort_flop_shares`; a TensorRT entry's layer shares as
    `tensorrt_layer_shares`; no `effective_precision` key is left."""
    old = json.loads((OLD_REPORTS / "report-schema2-standard-int8.json").read_text())
    assert old["schema"] == 2 and "integer_share" in old["engines"][0]["effective_precision"]
    layers = {"detailed": True, "layers": 5, "reformat_layers": 1,
              "layer_share": {"int8": 0.8, "fp32": 0.2}, "time_share": None, "time_ms": None,
              "untimed_layers": []}
    trt = {**old["engines"][0], "target": "tensorrt", "kind": "tensorrt", "effective_precision": layers}
    old["engines"] = [old["engines"][0], trt]
    migrated = parse("report.json", old)
    assert migrated["schema"] == 3
    ort, trt = migrated["engines"]
    assert ort["ort_flop_shares"] == old["engines"][0]["effective_precision"]
    assert trt["tensorrt_layer_shares"] == layers
    assert "tensorrt_layer_shares" not in ort and "ort_flop_shares" not in trt
    assert "effective_precision" not in keys(migrated)
    # a validate-<target>.json of schema 2 reads the same way
    assert parse("validate-tensorrt.json", trt | {"effective_precision": layers})["tensorrt_layer_shares"] == layers
    assert markdown(migrated)  # and renders


@pytest.mark.parametrize("change, words", [
    (lambda r: r.update(schema=4), "a schema-4 report, newer than this pipeline reads"),
    (lambda r: (r.update(schema=1), r["engines"][0]["speedup_vs_baseline"].pop("verdict")),
     "a schema-1 report from an older pipeline that does not migrate"),
])
def test_an_old_or_newer_schema_is_refused_as_stale(built_standard, change, words):
    report = read(built_standard.engines / STANDARD, "report.json")
    change(report)
    with pytest.raises(Unusable) as caught:
        parse("report.json", report)
    assert caught.value.stale and words in caught.value.problem


@pytest.mark.parametrize("change, where", [
    (lambda e: e.update(gates="nope"), "`gates`"),
    (lambda e: e.update(sha256=12), "`sha256`"),
    (lambda e: e.update(plot="../../x.png"), "`plot`"),
    (lambda e: e["latency_ms"].update(n="40"), "`latency_ms.n`"),
    (lambda e: e.pop("latency_ms"), "a built engine needs latency_ms"),
    (lambda e: e.update(surprise=1), "`surprise`: Extra inputs are not permitted"),
])
def test_a_validation_of_the_wrong_shape_names_the_key(built_standard, change, where):
    result = read(built_standard.engines / STANDARD, "validate-onnxruntime.json")
    change(result)
    with pytest.raises(Unusable) as caught:
        parse("validate-onnxruntime.json", result)
    assert not caught.value.stale and where in caught.value.problem, caught.value.problem


def test_the_sections_other_stages_are_adding_are_declared():
    """data provenance (report), task metrics and generation (engine): one-line merges."""
    entry = EngineResult(target="onnxruntime", kind="onnxruntime", status="skipped", reason="x",
                         task={"metric": "perplexity", "baseline": 3.1, "engine": 3.2,
                               "delta": 0.1, "ci95": [0.05, 0.15]},
                         generation=None)
    assert dump(entry)["task"]["ci95"] == [0.05, 0.15]
    fields = Report.model_fields
    assert fields["data"].annotation is not None and "data" not in Report.model_json_schema()["required"]


# --------------------------------------------------------------------------- every command
MANIFEST_DAMAGE = {
    "a file entry without bytes": lambda m: m["files"]["model.onnx"].pop("bytes"),
    "versions as a list": lambda m: m.update(versions=["torch"]),
    "a numeric sha256": lambda m: m["files"]["report.json"].update(sha256=12345),
    "a build graph outside the folder": lambda m: m["stages"]["build:onnxruntime"]["meta"].update(
        source="../../model.onnx"),
}


@pytest.mark.parametrize("damage", list(MANIFEST_DAMAGE))
def test_a_manifest_of_the_wrong_shape_stops_every_command(standard_copy, tmp_path, damage):
    proj = standard_copy
    folder = proj.engines / STANDARD
    manifest = read(folder, "manifest.json")
    MANIFEST_DAMAGE[damage](manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    before = proj.snapshot()
    for args in (("verify", f"engines/{STANDARD}"), ("run", "standard", *FAST),
                 ("report", "standard", *FAST), ("compare", "standard", "flash", *FAST),
                 ("deploy", "standard", "--triton", str(tmp_path / "models"), *FAST)):
        result = proj.run(*args)
        line = one_error(result)
        said = line if args[0] != "verify" else result.out  # verify: one line per check
        assert "manifest.json" in line and "not a manifest this pipeline wrote" in said, (args, line)
    assert proj.snapshot() == before and not (tmp_path / "models").exists()


def test_a_rehashed_report_of_the_wrong_shape_stops_every_command(standard_copy, tmp_path):
    proj = standard_copy
    folder = proj.engines / STANDARD
    report = read(folder, "report.json")
    report["engines"][0]["gates"] = "nope"
    rehash(folder, "report.json", report)
    for args in (("run", "standard", *FAST), ("report", "standard", *FAST),
                 ("compare", "standard", "flash", *FAST),
                 ("deploy", "standard", "--triton", str(tmp_path / "models"), *FAST)):
        line = one_error(proj.run(*args))
        assert "report.json: not a report this pipeline wrote (`engines.0.gates`" in line, (args, line)
    assert "report.json" in one_error(proj.run("verify", f"engines/{STANDARD}"))


def test_an_old_report_is_refused_naming_the_file_and_force(standard_copy, tmp_path):
    proj = standard_copy
    folder = proj.engines / STANDARD
    report = read(folder, "report.json")
    report["schema"] = 1
    report["engines"][0]["speedup_vs_baseline"].pop("verdict")
    rehash(folder, "report.json", report)
    for args in (("deploy", "standard", "--triton", str(tmp_path / "m"), *FAST),
                 ("run", "standard", *FAST)):
        line = one_error(proj.run(*args))
        assert f"{STANDARD}/report.json: a schema-1 report from an older pipeline" in line, line
        assert "rerun with --force" in line and "tampered" not in line and "changed" not in line


# ------------------------------------------------------------------------------ schemas
def test_pipeline_schema_validates_every_recipe_file(project):
    result = project.run("schema", "recipe")
    assert result.code == 0, result.err
    schema = json.loads(result.out)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    files = sorted((ROOT / "recipes").rglob("*.yaml"))
    assert len(files) > 10
    for path in files:
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert not errors, (path, errors)
    # what the schema is for: a misspelt key, a wrong type or value, a loader-only key
    for bad in ({"modle": {}}, {"validate": {"latency": {"warmup": "5"}}},
                {"targets": [{"kind": "nope"}]}, {"name": "x"}, {"extends": 3}):
        assert list(validator.iter_errors(bad)), bad


@pytest.mark.parametrize("what, model", [("report", "Report"), ("manifest", "Manifest")])
def test_pipeline_schema_prints_the_artifact_models(built_standard, what, model):
    result = built_standard.run("schema", what)
    assert result.code == 0, result.err
    schema = json.loads(result.out)
    assert schema["title"] == model
    name = "report.json" if what == "report" else "manifest.json"
    jsonschema.validate(read(built_standard.engines / STANDARD, name), schema)
