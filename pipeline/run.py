"""Chains the stages for one recipe, and owns caching by content hash.

    graph stages (export -> ...) -> baseline -> build(target)... -> validate(target)... -> report

Graph stages each turn the previous ONNX graph into the next (export makes the first); the
last graph is what every target builds from, with one exception: a backend marked PLAIN_ONNX
(TensorRT) cannot parse ONNX Runtime's contrib ops, so when the chain's graph holds some, that
target builds from a second chain after the export, without the ORT-only passes (stage ids
`optimize:plain`, `precision:plain`; files `optimized-plain.onnx`, `typed-plain.onnx`).

A graph stage is a module under pipeline/stages with NAME, VERSION, SECTIONS (the recipe
sections in its cache key), `enabled(recipe)`, `run(recipe, graph, workdir, verbose)` ->
({file: path}, meta)`, whose first output file is the next graph. Optional:
`preflight(recipe)` (user errors, run before any stage works) and `spec(recipe)` (the cache
key's recipe part, when SECTIONS is not enough).
Adding one is a module plus a line in GRAPH_STAGES.

A stage's cache key hashes its name and version, the recipe sections it reads, the sha256
of its input artifacts, the model's source code, the tool versions and the device. When the
key matches the manifest's record and the outputs still have their recorded sha256, the
stage is skipped; when an output was changed by hand, the run refuses (IntegrityError)
rather than use it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import backends, deps, models
from pipeline.errors import (
    DependencyError,
    GateFailed,
    IntegrityError,
    PipelineError,
    RecipeError,
    StageFailed,
)
from pipeline.recipe import Recipe, sha256_json
from pipeline.store import Artifact, Store, now
from pipeline.text import first_line
from pipeline.ui import Progress

# Graph stages, in order (modules under pipeline.stages).
GRAPH_STAGES: tuple[str, ...] = ("export", "optimize", "precision")
ORDER: tuple[str, ...] = (*GRAPH_STAGES, "build", "validate", "report")

Produce = Callable[[Path], tuple[dict[str, Path], dict]]


@dataclass
class Result:
    """What one stage left in the store."""

    outputs: dict[str, Artifact]
    meta: dict
    cached: bool

    def one(self) -> Artifact:
        (artifact,) = self.outputs.values()
        return artifact


@dataclass
class Outcome:
    """What a run produced: the report (when it got that far) and per-target states."""

    store: Store
    report: dict | None = None
    engines: list[dict] = field(default_factory=list)
    work_done: bool = False


class Run:
    def __init__(self, recipe: Recipe, engines_root: Path, force: bool = False,
                 progress: Progress | None = None, verbose: bool = False, only: tuple[str, ...] = ()):
        self.recipe = recipe
        # `only`: target ids or kinds to build in this run (e.g. CI's CPU and GPU jobs)
        self.targets = [t for t in recipe.targets if not only or t.id in only or t.kind in only]
        if only and not self.targets:
            raise RecipeError(f"--target {', '.join(only)}: recipe `{recipe.name}` has no such target "
                              f"(targets: {', '.join(t.id for t in recipe.targets)})")
        self.store = Store(engines_root, recipe.name)
        self.force = force
        self.verbose = verbose
        self.progress = progress or Progress()
        self.work_done = False
        self.model_code = models.code_digest(recipe)  # model source edits invalidate every stage
        self.graph_meta: dict[str, dict] = {}  # graph stage name -> its meta, for the report
        self.faster_than: dict[str, Recipe] = {}  # expect.faster_than, loaded before any work
        self._exported: Artifact | None = None  # the first graph stage's output
        self._plain_graph: Artifact | None = None  # the plain-ONNX chain's graph, once built

    # ------------------------------------------------------------------ one stage
    def stage(self, stage_id: str, version: int, spec: object, inputs: list[Artifact],
              produce: Produce) -> Result:
        key = sha256_json({
            "stage": stage_id, "version": version, "spec": spec, "model_code": self.model_code,
            "inputs": {a.name: a.sha256 for a in inputs},
            "versions": deps.versions(), "device": deps.device(),
        })
        record = self.store.manifest["stages"].get(stage_id)
        if not self.force and record and record["key"] == key:
            outputs = self._cached_outputs(record)
            if outputs is not None:
                self.progress.cached(stage_id)
                return Result(outputs, record["meta"], cached=True)

        workdir = self.store.workdir(stage_id)
        t0 = time.perf_counter()
        try:
            with self.progress.stage(stage_id):
                produced, meta = produce(workdir)
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
        record = {"key": key, "outputs": list(produced), "meta": meta,
                  "seconds": round(seconds, 3), "finished": now()}
        outputs = self.store.commit_stage(stage_id, produced, record, recipe=self.recipe.name,
                                          recipe_sha256=self.recipe.digest,
                                          recipe_file=self.recipe.where)
        self.work_done = True
        self.progress.done(stage_id, seconds)
        return Result(outputs, meta, cached=False)

    def _cached_outputs(self, record: dict) -> dict[str, Artifact] | None:
        """The recorded outputs, verified; None if one is gone (then the stage reruns)."""
        outputs = {}
        for name in record["outputs"]:
            if not (self.store.dir / name).is_file():
                return None
            outputs[name] = self.store.verify(name)  # raises IntegrityError if it changed
        return outputs

    # ------------------------------------------------------------------ the chain
    def execute(self, until: str = "report") -> Outcome:
        recipe = self.recipe
        models.check(recipe)
        self._check_graph_stages()
        if ORDER.index(until) >= ORDER.index("validate"):
            from pipeline import data

            data.preflight(recipe)  # real validation data loads, fits and suits validate.task
            self._check_baseline_device()
            self._check_expect()
        skipped = self._unavailable_targets()
        outcome = Outcome(self.store)
        with self.store.lock(on_wait=self.progress.note):
            if self.force:
                aside = self.store.set_aside_bad_manifest()
                if aside is not None:
                    self.progress.note(f"--force: the unreadable {aside.parent / 'manifest.json'} is "
                                       f"kept as {aside.name}; every stage is rebuilt")
            self._forget_stale_stages()
            if not self.force:
                self._check_folder_owner()
                # Before any work: a file changed by hand stops the run with nothing rewritten.
                self.store.verify_all()
            graph = None
            if until in GRAPH_STAGES or self._needs_graph(skipped):
                for name in GRAPH_STAGES:
                    graph = self._graph_stage(name, graph)
                    if name == GRAPH_STAGES[0]:
                        self._exported = graph  # where a second (plain-ONNX) chain starts
                    if until == name:
                        return self._finish(outcome)
            else:
                self.progress.note("no target builds from ONNX: export, optimize and precision "
                                   "are not run")
            base = self._baseline() if ORDER.index(until) >= ORDER.index("validate") else None
            engines: list[dict] = []
            failures: list[str] = []
            for target in self.targets:
                if target.id in skipped:
                    self.progress.skipped(f"build:{target.id}", skipped[target.id])
                    engines.append(_not_built(target, "skipped", skipped[target.id]))
                    continue
                try:
                    engine = self._build(target, self.graph_for(target, graph))
                    if base is not None:
                        engines.append(self._validate(target, engine, base))
                except StageFailed as e:
                    self.progress.failed(target.id, str(e))
                    engines.append(_not_built(target, "failed", str(e)))
                    failures.append(f"{target.id}: {e}")
            if base is not None:
                self._expect(engines)
            outcome.engines = engines
            if until == "report":
                outcome.report = self._report(base, graph, engines, self._other_targets())
            self._finish(outcome)
        if failures:
            raise StageFailed("; ".join(failures))
        return outcome

    def _finish(self, outcome: Outcome) -> Outcome:
        outcome.work_done = self.work_done
        return outcome

    def _needs_graph(self, skipped: dict[str, str]) -> bool:
        """Does any target that will be built here build from the ONNX graph?"""
        return any(getattr(backends.get(t.kind), "NEEDS_ONNX", True)
                   for t in self.targets if t.id not in skipped)

    def _unavailable_targets(self) -> dict[str, str]:
        """target id -> why it cannot be built here; a required one stops the run first."""
        reasons = {}
        for target in self.targets:
            reason = backends.get(target.kind).unavailable(target)
            if reason is None:
                continue
            if target.required:
                raise DependencyError(f"target `{target.id}` is required but cannot be built here: {reason}")
            reasons[target.id] = reason
        return reasons

    def _forget_stale_stages(self) -> None:
        """Drop records of targets the recipe no longer has (their files stay until clean)."""
        ids = {t.id for t in self.recipe.targets}
        stages = self.store.manifest["stages"]
        for stage_id in list(stages):
            kind, _, target = stage_id.partition(":")
            if target and kind in ("build", "validate") and target not in ids:
                del stages[stage_id]

    def _check_folder_owner(self) -> None:
        """engines/<name>/ is named after the recipe file's stem, so two files of one name
        (recipes/standard.yaml, recipes/old/standard.yaml) would overwrite each other's
        engines. Refused while the file that built the folder still exists and is another
        file; a folder whose recipe file moved (or a run from another directory) is not."""
        recorded = self.store.manifest.get("recipe_file")
        if not recorded or self.recipe.source is None:
            return
        built_by = Path(recorded)
        if built_by.stem != self.recipe.name:
            return  # a folder copied under another name, not a second file of this name
        try:
            same = built_by.exists() and built_by.samefile(self.recipe.source)
        except OSError:
            return
        if built_by.exists() and not same:
            raise RecipeError(
                f"{self.store.dir}: holds the engines of {recorded}, not of {self.recipe.where} "
                f"(two recipe files named `{self.recipe.name}`)",
                "rename one of the files, give this one another --engines-dir, or rerun with "
                "--force to rebuild the folder from this file")

    def _check_baseline_device(self) -> None:
        """validate.device: cuda needs a GPU and a CUDA build of torch (found without
        importing torch: a CPU wheel's version ends in +cpu)."""
        if self.recipe.validation.device != "cuda":
            return
        torch_version = deps.version("torch") or ""
        why = ("this machine has no NVIDIA GPU (nvidia-smi found none)" if not deps.gpus() else
               f"torch {torch_version} is a CPU-only build" if torch_version.endswith("+cpu") else None)
        if why:
            raise DependencyError(f"{self.recipe.where}: validate.device: cuda, but {why}",
                                  "use validate.device=auto or cpu, or run on a CUDA machine")

    def _check_expect(self) -> None:
        """expect.faster_than: every recipe named loads and is another recipe, before any work."""
        from pipeline import recipe as recipe_mod

        for ref in self.recipe.expect.faster_than:
            try:
                other = recipe_mod.load(ref)
            except RecipeError as e:
                raise RecipeError(f"{self.recipe.where}: expect.faster_than: {e.message}", e.hint) from None
            if other.name == self.recipe.name:
                raise RecipeError(f"{self.recipe.where}: expect.faster_than: `{ref}` is this recipe itself")
            self.faster_than[ref] = other

    def _other_targets(self) -> list[dict]:
        """With --target, the entries the last report holds for the recipe's other targets
        (when it was made from this same recipe), so a partial run keeps them in the report."""
        chosen = {t.id for t in self.targets}
        rest = [t.id for t in self.recipe.targets if t.id not in chosen]
        if not rest or "report.json" not in self.store.manifest["files"] \
                or not (self.store.dir / "report.json").is_file():
            return []
        previous = self.store.read_json("report.json")
        if previous.get("recipe_sha256") != self.recipe.digest:
            self.progress.note(f"the last report was made from another version of `{self.recipe.name}`: "
                               f"the new one holds only {', '.join(sorted(chosen))}")
            return []
        kept = {e["target"]: e for e in previous["engines"] if e["target"] in rest}
        return [kept[t] for t in rest if t in kept]

    def _check_graph_stages(self) -> None:
        """A graph stage's optional `preflight(recipe)`: user errors before any work starts."""
        import importlib

        for name in GRAPH_STAGES:
            module = importlib.import_module(f"pipeline.stages.{name}")
            if hasattr(module, "preflight"):
                module.preflight(self.recipe)

    def _graph_stage(self, name: str, graph: Artifact | None, recipe: Recipe | None = None,
                     flavor: str = "") -> Artifact | None:
        """Run one graph stage (if the recipe enables it); returns the graph to go on with.
        A `flavor` runs it as a second chain: its own stage id and output file names."""
        import importlib

        recipe = recipe or self.recipe
        module = importlib.import_module(f"pipeline.stages.{name}")
        if not module.enabled(recipe):
            return graph
        spec = module.spec(recipe) if hasattr(module, "spec") else recipe.section(*module.SECTIONS)
        stage_id = f"{module.NAME}:{flavor}" if flavor else module.NAME

        def produce(wd: Path):
            files, meta = module.run(recipe, graph, wd, verbose=self.verbose)
            if flavor:  # typed.onnx -> typed-plain.onnx: both chains' files live side by side
                files = {f"{Path(n).stem}-{flavor}{Path(n).suffix}": path for n, path in files.items()}
            return files, meta

        result = self.stage(stage_id, module.VERSION, spec, [graph] if graph else [], produce)
        self.graph_meta[stage_id] = result.meta
        if hasattr(module, "summary") and not result.cached:
            self.progress.note(module.summary(result.meta))
        return next(iter(result.outputs.values()))

    def graph_for(self, target, graph: Artifact) -> Artifact:
        """The graph `target` builds from: the chain's own, unless the target's backend takes
        plain ONNX only and the chain wrote ONNX Runtime ops; then the plain chain's graph
        (built once per run, cached across runs like any stage)."""
        from pipeline import onnx_info, passes

        if not getattr(backends.get(target.kind), "PLAIN_ONNX", False):
            return graph
        if not onnx_info.foreign_ops(graph.path):
            return graph
        if self._plain_graph is None:
            spec = self.recipe.optimize
            keep = [p for p in spec.passes if not passes.PASSES[p].ort_only]
            plain = self.recipe.model_copy(update={"optimize": spec.model_copy(update={
                "passes": keep, "options": {k: v for k, v in spec.options.items() if k in keep}})})
            chain = self._exported  # the export is shared
            for name in GRAPH_STAGES[1:]:
                chain = self._graph_stage(name, chain, plain, "plain")
            self._plain_graph = chain
        return self._plain_graph

    def _baseline(self) -> Result:
        from pipeline import data
        from pipeline.stages import validate

        # the data files' contents, not only their names (validation feeds are drawn
        # disjoint from calibration ones, so both splits count)
        return self.stage(
            "baseline", validate.VERSION,
            {**self.recipe.section("model", "inputs", "outputs", "data", "validate"),
             "data_files": data.key(self.recipe, "validation", "calibration")}, [],
            lambda wd: validate.baseline(self.recipe, wd),
        )

    def _build(self, target, graph: Artifact | None) -> Artifact:
        """`graph` is None for a backend that builds from the PyTorch model (NEEDS_ONNX False),
        when no target needed the graph stages; its key then covers the model's section."""
        from pipeline.stages import build

        sections = ("inputs",) if graph is not None else ("model", "inputs")
        return self.stage(
            f"build:{target.id}", build.VERSION,
            {"target": target.model_dump(mode="json"), **self.recipe.section(*sections)},
            [graph] if graph is not None else [],
            lambda wd: build.build(self.recipe, target, graph, wd),
        ).outputs[build.engine_name(target)]

    def _validate(self, target, engine: Artifact, base: Result) -> dict:
        from pipeline.stages import validate

        # The file timed must be the file built: check its sha256 right before opening it.
        engine = self.store.verify(engine.name)
        result = self.stage(
            f"validate:{target.id}", validate.VERSION,
            {"target": target.model_dump(mode="json"),
             **self.recipe.section("model", "outputs", "validate", "precision")},
            [engine, base.one()],
            lambda wd: validate.validate(self.recipe, target, engine, base.one(), wd),
        )
        return self.store.read_json(result.outputs[f"validate-{target.id}.json"].name)

    def _expect(self, engines: list[dict]) -> None:
        """expect: gates on every built engine; faster_than first times the A/Bs it needs."""
        from pipeline.bench import gates

        for ref, other in self.faster_than.items():
            self._versus(ref, other, [e for e in engines if e["status"] == "built"])
        for e in engines:
            if e["status"] == "built":
                e["gates"] = e["gates"] + gates.expect(self.recipe, e)

    def _versus(self, ref: str, other: Recipe, engines: list[dict]) -> None:
        """Build recipe `other` (named `ref`; its own Run and lock), then time each engine
        against its twin."""
        import dataclasses
        import json

        from pipeline.bench import ab
        from pipeline.stages import build

        self.progress.note(f"expect.faster_than: {other.name} (building it to time against it)")
        Run(other, self.store.dir.parent, progress=self.progress, verbose=self.verbose).execute("build")
        other_store = Store(self.store.dir.parent, other.name)
        for e in engines:
            target = next(t for t in self.recipe.targets if t.id == e["target"])
            twin = next((t for t in other.targets if t.id == target.id), None)
            if twin is None or build.engine_name(twin) not in other_store.manifest["files"]:
                e.setdefault("versus", []).append(
                    {"other": ref, "target": target.id,
                     "reason": f"`{other.name}` has no built `{target.id}` engine to compare with"})
                continue
            # both engine files are checked right before they are timed, as in validate
            mine = self.store.verify(build.engine_name(target))
            theirs = dataclasses.replace(other_store.verify(build.engine_name(twin)),
                                         name=f"{other.name}/{build.engine_name(twin)}")
            result = self.stage(
                f"versus:{target.id}:{other.name}", ab.VERSION,
                {"target": target.model_dump(mode="json"), "other_target": twin.model_dump(mode="json"),
                 **self.recipe.section("inputs", "validate")}, [mine, theirs],
                lambda wd, t=target, w=twin, m=mine, o=theirs: ab.versus(
                    self.recipe, t, m, ref, other, w, o, wd),
            )
            e.setdefault("versus", []).append(json.loads(result.one().path.read_text()))

    def _report(self, base: Result | None, graph: Artifact, engines: list[dict],
                others: list[dict] = ()) -> dict:
        """`others`: entries kept from the last report for targets this run did not build."""
        from pipeline.stages import report

        inputs = ([graph] if graph else []) + ([base.one()] if base else [])
        inputs += [self.store.artifact(f"validate-{e['target']}.json")
                   for e in engines if e["status"] == "built"]
        inputs += [self.store.artifact(v["file"]) for e in engines for v in e.get("versus", [])
                   if "file" in v]
        skipped = [e for e in engines if e["status"] != "built"]
        by_id = {e["target"]: e for e in [*engines, *others]}
        every = [by_id[t.id] for t in self.recipe.targets if t.id in by_id]  # the recipe's order
        spec = {"recipe": self.recipe.digest, "not_built": skipped}
        if others:
            spec["kept"] = list(others)
        result = self.stage(
            "report", report.VERSION, spec, inputs,
            lambda wd: (report.write(report.assemble(
                self.recipe, base.meta if base else None, self.graph_meta, every), wd), {}),
        )
        return self.store.read_json(result.outputs["report.json"].name)


def _not_built(target, status: str, reason: str) -> dict:
    return {"target": target.id, "kind": target.kind, "status": status, "reason": reason,
            "path": None, "sha256": None, "precision": None, "accuracy": None,
            "latency_ms": None, "speedup_vs_baseline": None, "gates": []}


def failed_gates(report: dict) -> list[str]:
    """`target: gate (detail)` for every failed gate in a report."""
    return [f"{e['target']}: {g['name']} ({g['detail']})"
            for e in report["engines"] for g in e.get("gates") or [] if not g["passed"]]


def check_gates(report: dict) -> None:
    failed = failed_gates(report)
    if failed:
        raise GateFailed(f"{len(failed)} gate(s) failed: " + "; ".join(failed))


__all__ = ["Run", "Outcome", "ORDER", "check_gates", "failed_gates", "IntegrityError"]
