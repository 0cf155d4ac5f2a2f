"""One stage, cached by content hash: its key, the lookup in the manifest, the commit
(the key's hash and the record's commit are run/records.py's, shared with loadgen and serving).

A stage's key hashes:
  - its id and its recipe part (`spec`), the sha256 of its input files, the model's source
    code (models.code_digest) and the tool versions;
  - the pipeline code it runs: its module and every pipeline module that imports,
    transitively, plus the same for the stages before it (code_digest), so editing
    pipeline/stages/optimize.py reruns optimize and every stage after it, and editing
    pipeline/cli/ reruns none;
  - the part of this machine's identity its result depends on (Stage.device_keys): a latency
    measured on another CPU or GPU is never reused, a graph made on another machine is.

When the key matches the manifest's record and the outputs still have their recorded sha256,
the stage is skipped; when an output was changed by hand, the run refuses (IntegrityError)
rather than use it.
"""

from __future__ import annotations

import gc
import importlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.artifacts.manifest import StageRecord
from pipeline.bench import monitor
from pipeline.core import deps, heap
from pipeline.core.errors import PipelineError, StageFailed
from pipeline.core.text import first_line
from pipeline.core.ui import Progress
from pipeline.recipe import Recipe
from pipeline.run import build_ledger, code_digest, records
from pipeline.stages import GraphStage, Produced
from pipeline.stages import graph_stage as check_graph_stage
from pipeline.store.recipe_folder import (
    Artifact,
    Artifacts,
    Interrupted,
    Store,
    WorkFiles,
    sha256_file,
)

Produce = Callable[[Path], Produced]

# The device keys (deps.device()) a stage's result depends on. Graph stages write the same
# graph on any machine; optimize also times the exported vs optimized graph (ORT on the CPU);
# whatever times engines depends on all of it. A build's depends on its target (build_keys).
ALL = (*deps.CPU_KEYS, *deps.GPU_KEYS)


@dataclass(frozen=True)
class Stage:
    """One kind of stage (a stage id is `kind` or `kind:target...`): everything its cache
    key and the run need to know about it, in one record.

    module       the module it runs (its code, and what it imports, is in the key)
    upstream     the stages whose output it uses, directly or not: their code is in its key
                 too, so a stage whose code changed reruns with everything after it, even
                 when its files come out byte for byte the same
    device_keys  the part of this machine's identity its result depends on; None: the
                 target's (build_keys)
    graph        a graph stage (stages.GraphStage: one ONNX graph to the next), run in this
                 order by run/chain.py
    stop         a command may stop after it (`pipeline export|...|report`)
    """

    kind: str
    module: str
    upstream: tuple[str, ...]
    device_keys: tuple[str, ...] | None
    graph: bool = False
    stop: bool = True


_GRAPH = ("export", "optimize", "precision")
STAGES: dict[str, Stage] = {s.kind: s for s in (
    Stage("export", "pipeline.stages.export", (), (), graph=True),
    Stage("optimize", "pipeline.stages.optimize", ("export",), deps.CPU_KEYS, graph=True),
    Stage("precision", "pipeline.stages.precision", ("export", "optimize"), (), graph=True),
    Stage("baseline", "pipeline.stages.validate", (), ALL, stop=False),
    Stage("build", "pipeline.stages.build", _GRAPH, None),
    Stage("validate", "pipeline.stages.validate", (*_GRAPH, "build", "baseline"), ALL),
    Stage("versus", "pipeline.run.versus", (*_GRAPH, "build"), ALL, stop=False),
    Stage("report", "pipeline.stages.report",
          (*_GRAPH, "baseline", "build", "validate", "versus"), ALL),
)}
GRAPH_STAGES: tuple[str, ...] = tuple(k for k, s in STAGES.items() if s.graph)
# where a run may stop, in order (run/execute.py's `until`)
STOPS: tuple[str, ...] = tuple(k for k, s in STAGES.items() if s.stop)


def graph_stage(kind: str) -> GraphStage:
    """The module of graph stage `kind`, checked against the GraphStage contract."""
    return check_graph_stage(importlib.import_module(STAGES[kind].module))


def build_keys(target) -> tuple[str, ...]:
    """A build that may run on the GPU (TensorRT plans; `cuda` or `auto` providers and devices)
    is tied to the GPU, its compute capability and driver (all None without one). An ONNX
    Runtime CPU build saves a graph; at optimization level `all` that graph holds layout
    transforms chosen for this CPU's instruction set (ORT's documentation). Read from the
    target alone: asking the backend would import its runtime on an unchanged rerun."""
    keys = deps.GPU_KEYS if target.may_use_gpu() else ()
    if getattr(target, "optimization_level", None) == "all":
        keys = (*keys, "cpu_isa")
    return keys


def code(kind: str) -> str:
    """The digest of the pipeline code a stage of this kind runs, its upstream's included."""
    stage = STAGES[kind]
    return code_digest.digest(tuple(STAGES[k].module for k in (*stage.upstream, kind)))


@dataclass
class Result:
    """What one stage left in the store: its files, its meta, and its records as models (the
    ones it made in this run, else read back from the verified files on first use)."""

    outputs: Artifacts
    meta: dict
    cached: bool
    store: Store | None = None
    records: dict[str, Any] = field(default_factory=dict)

    def one(self) -> Artifact:
        (artifact,) = self.outputs.values()
        return artifact

    def record(self, name: str) -> Any:
        """The model of recorded file `name` (EngineResult, Versus, Report)."""
        if name not in self.records:
            from pipeline.artifacts.recorded import model_for

            self.records[name] = model_for(name).model_validate(self.store.read_json(name))
        return self.records[name]


class StageCache:
    """Runs stages into one recipe's store, each only when its key changed."""

    def __init__(self, store: Store, recipe: Recipe, model_code: str, force: bool, progress: Progress):
        self.store = store
        self.recipe = recipe
        self.model_code = model_code  # model source edits invalidate every stage
        self.force = force
        self.progress = progress
        self.work_done = False

    def key(self, stage_id: str, spec: object, inputs: list[Artifact],
            device_keys: tuple[str, ...] | None = None) -> str:
        """records.stage_key with everything a run's stage depends on: its code (its kind's
        and its upstream's), the model's source, its kind's device keys unless given."""
        kind = stage_id.partition(":")[0]
        keys = STAGES[kind].device_keys if device_keys is None else device_keys
        return records.stage_key(stage_id, spec, {a.name: a.sha256 for a in inputs}, code=code(kind),
                                 model_code=self.model_code, device_keys=keys)

    def stage(self, stage_id: str, spec: object, inputs: list[Artifact], produce: Produce,
              device_keys: tuple[str, ...] | None = None) -> Result:
        key = self.key(stage_id, spec, inputs, device_keys)
        record = self.store.stage_record(stage_id)
        if not self.force and record is not None and record.key == key:
            outputs = self._cached_outputs(record)
            if outputs is not None:
                self.progress.cached(stage_id)
                return Result(outputs, record.meta, cached=True, store=self.store)

        workdir = self.store.workdir(stage_id)
        # What earlier stages freed goes back to the system first: one process runs every stage,
        # and the export's temporaries otherwise sat under the optimize stage's peak.
        gc.collect()
        heap.trim()
        t0, memory = time.perf_counter(), monitor.PeakWatch().start()
        twin = None if self.force else self._from_twin(stage_id, key, workdir)
        if twin is not None:
            produce = lambda wd: twin  # noqa: E731 - the twin's verified copies, its meta
        try:
            with self.progress.stage(stage_id):
                made = produce(workdir)
                produced = {**_dumped(made.records, workdir), **made.files}
        except BaseException as e:
            shutil.rmtree(workdir, ignore_errors=True)  # no half-written leftovers (full disk)
            if isinstance(e, Exception) and not isinstance(e, PipelineError):
                # A library failing on this stage's input (a corrupt graph, memory, a full disk)
                # is a failed stage for the user; --debug still shows the original trace.
                used = f" on {', '.join(a.name for a in inputs)}" if inputs else ""
                raise StageFailed(f"{stage_id} failed{used}: {first_line(e, with_type=True)}",
                                  "rerun with --debug for the trace") from e
            raise
        seconds = time.perf_counter() - t0
        outputs = records.commit(self.store, stage_id, produced, key, meta=made.meta, seconds=seconds,
                                 peak_rss_mb=memory.peak_mb(),
                                 recipe=self.recipe.name, recipe_sha256=self.recipe.digest,
                                 recipe_file=self.recipe.where,
                                 recipe_overrides=list(self.recipe.overrides))
        build_ledger.record(stage_id, self.store.stage_record(stage_id),
                            {name: a.sha256 for name, a in outputs.items()})
        self.work_done = True
        self.progress.done(stage_id, seconds)
        return Result(outputs, made.meta, cached=False, store=self.store, records=dict(made.records))

    def _from_twin(self, stage_id: str, key: str, workdir: Path) -> Produced | None:
        """Another folder of the engines root that recorded this very key, when one of this
        user's own runs committed exactly that stage (run/build_ledger.py): its outputs,
        verified against its own manifest and copied into `workdir`, with its meta. A key holds
        everything the stage depends on (its recipe part, inputs' digests, model code, code,
        versions, device part) and nothing of the recipe's name, so a --set variant
        (engines/<name>@<digest>/) or another recipe on the same model and export (an INT4
        recipe next to the FP32 one) copies an export it cannot change instead of redoing it.
        This recipe's own folders are looked at first. A twin that does not verify is passed
        over (it is not this folder's to judge); one this user did not build (a download, a
        planted folder with a consistent manifest) is passed over and said so."""
        for folder in twin_folders(self.store.dir, self.recipe.name):
            other = Store(folder.parent, folder.name)
            try:
                record = other.stage_record(stage_id)
                if record is None or record.key != key:
                    continue
                verified = {name: other.verify(name) for name in record.outputs}
            except (PipelineError, OSError, KeyError, TypeError, AttributeError):
                continue
            if not build_ledger.built_here(stage_id, record, {n: a.sha256 for n, a in verified.items()}):
                self.progress.note(f"{stage_id}: {folder} records the same key, but no build of this "
                                   "user made its files: not reused")
                continue
            produced = {}
            for name, artifact in verified.items():
                produced[name] = workdir / name
                shutil.copyfile(artifact.path, produced[name])
            if {n: sha256_file(p) for n, p in produced.items()} != {n: a.sha256 for n, a in verified.items()}:
                continue  # changed between its check and the copy: not the files vouched for
            self.progress.note(f"{stage_id}: the same key is built in {folder}: its verified files "
                               f"reused (this user built them: {build_ledger.root()})")
            return Produced(produced, record.meta)
        return None

    def _cached_outputs(self, record: StageRecord) -> Artifacts | None:
        """The recorded outputs, verified; None if one is gone (then the stage reruns)."""
        outputs = {}
        for name in record.outputs:
            if not (self.store.dir / name).is_file():
                return None
            try:
                outputs[name] = self.store.verify(name)  # raises IntegrityError if it changed
            except Interrupted:  # only its pending digest: never a cache hit, the stage reruns
                return None
        return outputs

    def forget_targets_not_in(self, recipe: Recipe) -> None:
        """Drop records of targets the recipe no longer has (their files stay in the folder)."""
        ids = {t.id for t in recipe.targets}
        for stage_id in self.store.stage_ids():
            kind, _, target = stage_id.partition(":")
            if target and kind in ("build", "validate") and target not in ids:
                self.store.forget_stage(stage_id)


def twin_folders(folder: Path, recipe_name: str) -> list[Path]:
    """The other folders of `folder`'s engines root that hold a manifest: this recipe's own
    (engines/<name>@<digest>/) first, then every other recipe's, each group by name."""
    try:
        others = [p for p in folder.parent.iterdir()
                  if p != folder and p.is_dir() and not p.is_symlink() and (p / "manifest.json").is_file()]
    except OSError:
        return []
    return sorted(others, key=lambda p: (p.name.partition("@")[0] != recipe_name, p.name))


def _dumped(records: dict[str, Any], workdir: Path) -> WorkFiles:
    """Each record (a pydantic model) written as its JSON file, the only place a stage's
    typed result becomes a file."""
    from pipeline.artifacts import dump

    out = {}
    for name, model in records.items():
        out[name] = workdir / name
        out[name].write_text(json.dumps(dump(model), indent=2) + "\n")
    return out
