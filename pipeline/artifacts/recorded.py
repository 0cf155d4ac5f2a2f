"""Reading and writing recorded JSON through the models: one entry point per direction.

`parse(name, data)` takes the parsed JSON of a recorded file and returns it as the model
sees it (a plain dict of exactly the keys the file holds, every one of them checked), or
raises Unusable naming what is wrong. `dump(model)` is the only way JSON is written.

Schema versions of report.json: 2 is read as is; 1 (or no `schema`: the earliest reports)
is migrated, since the two differ mechanically (schema 1 had the same keys, checked by
hand; the earliest entries lack `kind`, which the engine file's suffix gives); a schema-1
report that still does not fit is refused with `rerun with --force`, and so is a schema
newer than this pipeline reads.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from pydantic import BaseModel, ValidationError

from pipeline.artifacts.base import describe
from pipeline.artifacts.manifest import SCHEMA as MANIFEST_SCHEMA
from pipeline.artifacts.manifest import Manifest
from pipeline.artifacts.report import SCHEMA as REPORT_SCHEMA
from pipeline.artifacts.report import EngineResult, Report, Versus
from pipeline.artifacts.serve_start import ServeStart
from pipeline.artifacts.serving import LoadResult

SUFFIX_KIND = {".onnx": "onnxruntime", ".plan": "tensorrt", ".engine": "tensorrt",
               ".pt2": "aotinductor"}


class Unusable(ValueError):
    """A recorded JSON file that does not fit its model. `stale`: written by another version
    of the pipeline (a schema it cannot read), not changed by hand."""

    def __init__(self, problem: str, stale: bool = False):
        super().__init__(problem)
        self.problem = problem
        self.stale = stale


def dump(model: BaseModel) -> dict:
    """JSON-ready dict of a model: aliases (`schema`, `optimize:plain`), the keys that were
    set (an optional section nobody measured stays absent, not null)."""
    return model.model_dump(mode="json", by_alias=True, exclude_unset=True)


def model_for(name: str) -> type[BaseModel] | None:
    """The model of a recorded JSON file, by its name in the folder; None for the JSON
    files whose shape no other command reads (each stage's own extras)."""
    if name == "report.json":
        return Report
    if name.startswith("validate-") and name.endswith(".json"):
        return EngineResult
    if name.startswith("versus-") and name.endswith(".json"):
        return Versus
    if name.startswith("load-") and name.endswith(".json"):
        return LoadResult
    if name.startswith("serve-start-") and name.endswith(".json"):
        return ServeStart
    return None


def parse(name: str, data: Any) -> Any:
    """`data` checked against the model of file `name` (report.json migrated first)."""
    if not isinstance(data, dict):
        raise Unusable(f"a JSON {type(data).__name__}, not the object the pipeline wrote")
    model = model_for(name)
    if model is Report:
        return dump(report(data))
    if model is None:
        return data
    try:
        return dump(model.model_validate(data))
    except ValidationError as e:
        what = {EngineResult: "validation", LoadResult: "load test",
                ServeStart: "serving start"}.get(model, "comparison")
        raise Unusable(f"not a {what} this pipeline wrote ({describe(e)})") from None


def report(data: dict) -> Report:
    """report.json's content as a Report, migrated from schema 1."""
    if "recipe" not in data or "engines" not in data:  # no schema's report: not an old one either
        raise Unusable("not a report this pipeline wrote (no `recipe` or `engines`)")
    version = data.get("schema", 1)
    if type(version) is not int:  # noqa: E721 - True is an int, not a schema
        raise Unusable(f"`schema` is {version!r}, not a schema number")
    if version > REPORT_SCHEMA:
        raise Unusable(f"a schema-{version} report, newer than this pipeline reads "
                       f"(schema {REPORT_SCHEMA})", stale=True)
    if version < 1:
        raise Unusable(f"`schema` is {version}: no pipeline writes that")
    if version == 1:
        data = migrate_v1(data)
    try:
        return Report.model_validate(data)
    except ValidationError as e:
        if version == 1:
            raise Unusable(f"a schema-1 report from an older pipeline that does not migrate to "
                           f"schema {REPORT_SCHEMA} ({describe(e)})", stale=True) from None
        raise Unusable(f"not a report this pipeline wrote ({describe(e)})") from None


def migrate_v1(data: dict) -> dict:
    """Schema 1 -> 2: the same keys; entries written before `kind` existed get it from the
    engine file's suffix (else from the target id, which defaults to the kind)."""
    out = {**data, "schema": REPORT_SCHEMA}
    engines = data.get("engines")
    if isinstance(engines, list):
        out["engines"] = [_with_kind(e) for e in engines]
    return out


def _with_kind(entry: Any) -> Any:
    if not isinstance(entry, dict) or "kind" in entry:
        return entry
    path = entry.get("path")
    kind = SUFFIX_KIND.get(PurePath(path).suffix) if isinstance(path, str) else None
    return {**entry, "kind": kind or entry.get("target")}


def manifest(data: Any) -> dict:
    """manifest.json's content, checked: a plain dict the store keeps and updates."""
    if not isinstance(data, dict):
        raise Unusable(f"a JSON {type(data).__name__}, not an object")
    version = data.get("schema", MANIFEST_SCHEMA)
    if type(version) is int and version > MANIFEST_SCHEMA:  # noqa: E721
        raise Unusable(f"a schema-{version} manifest, newer than this pipeline reads "
                       f"(schema {MANIFEST_SCHEMA})", stale=True)
    try:
        parsed = Manifest.model_validate(data)
    except ValidationError as e:
        raise Unusable(describe(e)) from None
    out = dump(parsed)
    out.setdefault("files", {})
    out.setdefault("stages", {})
    return out
