"""manifest.json as a pydantic model: what engines/<recipe>/ holds and how it was made.

    {schema: 1, files: {name: {sha256, bytes, stage}}, stages: {id: {key, outputs, meta,
     seconds, finished}}, pending: {name: sha256}, recipe, recipe_sha256, recipe_file,
     updated, versions: {tool: version | null}, device: {cpu, gpu, compute_capability}}

Closed throughout (store/recipe_folder.py writes every key; a key it never writes is a file changed by
hand) except the device block and a stage's `meta`, which is the stage's own. A stage's
record is a StageRecord from the start: pipeline.run.records builds it, the store dumps it
into the manifest and hands it back typed (Store.stage_record). The metas
another command reads are typed where it reads them: `baseline` (the report's Baseline) and
`build:*` (deploy opens meta.source from the folder: a file name, never a path).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from pipeline.artifacts.base import Closed, Count, Device, FileName, Open, Sha256, describe
from pipeline.artifacts.report import Baseline

SCHEMA = 1


class FileEntry(Closed):
    sha256: Sha256
    bytes: Count
    stage: str = Field(description="The stage id that committed it.")


class BuildMeta(Open):
    """What a backend's build records; deploy reads `source` and `providers`."""

    source: FileName | None = Field(None, description="The ONNX graph the engine was built from.")
    providers: list[str] | None = None


# One committed stage: its key (pipeline.run.records.stage_key), its files, its own facts, and
# (when its writer keeps them) how long it ran and when it finished. A comment, not a
# docstring: a docstring would change what `pipeline schema manifest` prints.
class StageRecord(Closed):
    key: Sha256 = Field(description="The stage's cache key.")
    outputs: list[FileName]
    meta: dict[str, Any] = {}
    seconds: float | None = None
    peak_rss_mb: float | None = Field(None, description=(
        "The run process's peak resident memory while the stage ran (VmHWM reset at its "
        "start; a child process's peak where one went higher), MiB."))
    finished: str | None = None

    def typed_meta(self, stage_id: str) -> None:
        """Check the metas other commands read (ValueError names what is wrong)."""
        if stage_id == "baseline":
            Baseline.model_validate(self.meta)
        elif stage_id.startswith("build:"):
            BuildMeta.model_validate(self.meta)


class Manifest(Closed):
    schema_: Literal[1] = Field(SCHEMA, alias="schema")
    files: dict[FileName, FileEntry] = {}
    stages: dict[str, StageRecord] = {}
    pending: dict[FileName, Sha256] = Field(
        {}, description="Digests a commit announced before renaming its files in.")
    recipe: str | None = None
    recipe_sha256: Sha256 | None = None
    recipe_file: str | None = None
    recipe_overrides: list[str] | None = Field(
        None, description="The --set values of a run into engines/<recipe>@<digest>/ (pipeline.store.folder_names).")
    updated: str | None = None
    versions: dict[str, str | None] = {}
    device: Device | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        for stage_id, record in self.stages.items():
            unknown = [o for o in record.outputs if o not in self.files]
            if unknown:
                raise ValueError(f"stage `{stage_id}` records outputs not in `files`: {', '.join(unknown)}")
            try:
                record.typed_meta(stage_id)
            except ValidationError as e:
                raise ValueError(f"stage `{stage_id}`'s meta: {describe(e)}") from None
        return self
