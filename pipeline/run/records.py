"""Stage records: the one writer of a stage's files and record into a recipe's folder, and
the one recipe of a record's cache key.

Whatever enters a folder is committed as a stage: a run's stages (run/stage_cache.py), a load
test's `load:<stem>` (loadgen/artifact.py) and a served engine's `serve:<engine>`
(serving/coldstart.py). Each is recorded in the manifest as one artifacts.manifest.StageRecord
{key, outputs, meta, seconds, finished}, built here as the model and dumped only by the
store (Store.commit_stage), so no caller writes a record's dict by hand.

A key is `stage_key`: the sha256 of what the stage's outputs were made from. A run's stage
gives all of it (its recipe part, input digests, model source, pipeline code, the device keys
its result depends on); a load result or a cold start is a measurement that is never looked
up as a cache hit, so it gives what it measured and leaves the code parts out.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.artifacts.manifest import StageRecord
from pipeline.core import deps
from pipeline.recipe import sha256_json
from pipeline.store.recipe_folder import Artifacts, Store, now


def stage_key(stage_id: str, spec: object, inputs: Mapping[str, str], *, code: str | None = None,
              model_code: str | None = None, device_keys: tuple[str, ...] = ()) -> str:
    """The cache key of stage `stage_id`: the sha256 of its recipe part (`spec`), its inputs'
    digests ({file name: sha256}), the pipeline `code` it runs and the model's source
    (`model_code`), the tool versions, and the part of this machine's identity its result
    depends on (`device_keys`, deps.device_part). A run's keys are this very hash since the
    stage cache began: changing its parts would rerun every cached stage of every folder."""
    return sha256_json({
        "stage": stage_id, "spec": spec, "model_code": model_code, "code": code,
        "inputs": dict(inputs), "versions": deps.versions(), "device": deps.device_part(device_keys),
    })


def commit(store: Store, stage_id: str, produced: dict[str, Path], key: str, *,
           meta: dict[str, Any] | None = None, seconds: float | None = None,
           peak_rss_mb: float | None = None, stamped: bool = True,
           **manifest_fields: Any) -> Artifacts:
    """Commit the files `produced` ({name: path in a work folder}) as stage `stage_id` with its
    record: `key` (stage_key), `meta` (the stage's own facts), `seconds` (how long it ran,
    kept to the millisecond) and, when `stamped`, `finished` (now). The record holds only
    what was given, as manifests always have: a load record carries no time (its file holds
    its own), a cold start no `seconds`. `manifest_fields` update the manifest's top level
    (recipe, recipe_sha256, ...). Call it under the folder's lock."""
    fields: dict[str, Any] = {"key": key, "outputs": list(produced), "meta": meta or {}}
    if seconds is not None:
        fields["seconds"] = round(seconds, 3)
    if peak_rss_mb is not None:
        fields["peak_rss_mb"] = round(peak_rss_mb, 1)
    if stamped:
        fields["finished"] = now()
    return store.commit_stage(stage_id, produced, StageRecord(**fields), **manifest_fields)


def recommit(store: Store, stage_id: str, produced: dict[str, Path]) -> Artifacts:
    """Replace some files of a recorded stage and keep its record as it is (key, meta, time),
    so a later run still finds the stage done: loadgen re-renders the report stage's
    report.md with its Serving section this way. A name the stage never recorded is a bug
    (ValueError); so is a stage with no record."""
    record = store.stage_record(stage_id)
    if record is None:
        raise ValueError(f"stage `{stage_id}` has no record in {store.dir} to keep")
    unknown = sorted(set(produced) - set(record.outputs))
    if unknown:
        raise ValueError(f"stage `{stage_id}` never recorded {', '.join(unknown)}")
    return store.commit_stage(stage_id, produced, record)
