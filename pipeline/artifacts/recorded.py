"""Reading and writing recorded JSON through the models: one entry point per direction.

`parse(name, data)` takes the parsed JSON of a recorded file and returns it as the model
sees it (a plain dict of exactly the keys the file holds, every one of them checked), or
raises Unusable naming what is wrong. `dump(model)` is the only way JSON is written.

Schema versions of report.json: 3 is read as is; older ones are migrated step by step,
since each differs mechanically: 1 (or no `schema`: the earliest reports) had the same keys
as 2, checked by hand, and its earliest entries lack `kind` (the engine file's suffix gives
it); 2 kept both runtimes' effective precision under one key, `effective_precision`, which
3 splits into `ort_flop_shares` (ONNX Runtime's FLOP shares) and `tensorrt_layer_shares`
(TensorRT's layer/time shares), told apart here once, by the ORT record's `integer_share`.
An old report that still does not fit is refused with `rerun with --force`, and so is a
schema newer than this pipeline reads. A validate-<target>.json of schema 2 is migrated the
same way.
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
from pipeline.core.json_object import JsonObject

SUFFIX_KIND = {".onnx": "onnxruntime", ".plan": "tensorrt", ".engine": "tensorrt",
               ".pt2": "aotinductor"}


class Unusable(ValueError):
    """A recorded JSON file that does not fit its model. `stale`: written by another version
    of the pipeline (a schema it cannot read), not changed by hand."""

    def __init__(self, problem: str, stale: bool = False):
        super().__init__(problem)
        self.problem = problem
        self.stale = stale


def dump(model: BaseModel) -> JsonObject:
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
    if model is EngineResult:
        data = split_effective_precision(data)
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
    data = migrate(data, version)
    try:
        return Report.model_validate(data)
    except ValidationError as e:
        if version < REPORT_SCHEMA:
            raise Unusable(f"a schema-{version} report from an older pipeline that does not migrate to "
                           f"schema {REPORT_SCHEMA} ({describe(e)})", stale=True) from None
        raise Unusable(f"not a report this pipeline wrote ({describe(e)})") from None


def migrate(data: JsonObject, version: int) -> JsonObject:
    """A schema-`version` report brought to REPORT_SCHEMA, one schema at a time; each step
    changes every engine entry and nothing else (ENTRY_MIGRATIONS)."""
    for step in range(version, REPORT_SCHEMA):
        engines = data.get("engines")
        data = {**data, "schema": step + 1}
        if isinstance(engines, list):
            data["engines"] = [ENTRY_MIGRATIONS[step](e) for e in engines]
    return data


def split_effective_precision(entry: Any) -> Any:
    """An engine entry's schema-2 `effective_precision` under its schema-3 name: ONNX
    Runtime's FLOP shares carry `integer_share`, TensorRT's layer shares never do."""
    if not isinstance(entry, dict) or "effective_precision" not in entry:
        return entry
    out = {k: v for k, v in entry.items() if k != "effective_precision"}
    shares = entry["effective_precision"]
    if shares is not None:
        onnxruntime = isinstance(shares, dict) and "integer_share" in shares
        out["ort_flop_shares" if onnxruntime else "tensorrt_layer_shares"] = shares
    return out


def _with_kind(entry: Any) -> Any:
    if not isinstance(entry, dict) or "kind" in entry:
        return entry
    path = entry.get("path")
    kind = SUFFIX_KIND.get(PurePath(path).suffix) if isinstance(path, str) else None
    return {**entry, "kind": kind or entry.get("target")}


# schema N -> N + 1 of one engine entry: 1 -> 2 gives the earliest entries their `kind`
# (the engine file's suffix, else the target id, which defaults to the kind); 2 -> 3 splits
# `effective_precision` by the runtime that measured it
ENTRY_MIGRATIONS = {1: _with_kind, 2: split_effective_precision}


def manifest(data: Any) -> Manifest:
    """manifest.json's content as its model, checked: what the store keeps and updates."""
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
    return parsed  # `files`, `stages` and `pending` are always set: dumped even when empty
