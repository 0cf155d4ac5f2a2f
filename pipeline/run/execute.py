"""Chains the stages for one recipe.

    graph stages (export -> ...) -> baseline -> build(target)... -> validate(target)...
        -> versus (expect.faster_than) -> report

The parts live beside it: preflight.py (the checks before any work), stage_cache.py (a
stage's key, lookup and commit), chain.py (the graph stages and the plain-ONNX chain),
run/versus.py (the cross-recipe A/B). A run writes into engines/<folder>/, the recipe's
name plus `@<digest>` when it was loaded with --set overrides (store/folder_names.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline import backends, workloads
from pipeline.artifacts import EngineResult, Report, dump
from pipeline.core.errors import GateFailed, IntegrityError, RecipeError, StageFailed
from pipeline.core.ui import Progress
from pipeline.model import sources as models
from pipeline.recipe import Recipe
from pipeline.run import chain, gate_recheck, preflight
from pipeline.run.stage_cache import GRAPH_STAGES, STOPS, Result, StageCache, build_keys
from pipeline.store.folder_names import folder_name
from pipeline.store.recipe_folder import Artifact, Store

ORDER = STOPS  # where a run may stop: export, optimize, precision, build, validate, report


@dataclass
class Outcome:
    """What a run produced: the report (when it got that far) and per-target states."""

    store: Store
    report: Report | None = None
    graph: Artifact | None = None  # the graph chain's last graph, when it ran
    engines: list[EngineResult] = field(default_factory=list)
    built: dict[str, Artifact] = field(default_factory=dict)  # target id -> its engine file
    graph_meta: dict[str, dict] = field(default_factory=dict)  # graph stage id -> its meta
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
        self.store = Store(engines_root, folder_name(recipe))
        self.force = force
        self.verbose = verbose
        self.progress = progress or Progress()
        self.cache = StageCache(self.store, recipe, models.code_digest(recipe), force, self.progress)
        self.chain = chain.GraphChain(recipe, self.cache, verbose)

    def execute(self, until: str = "report") -> Outcome:
        validates = ORDER.index(until) >= ORDER.index("validate")
        plan = preflight.before_work(self.recipe, self.targets, validates)
        skipped = plan.unavailable
        outcome = Outcome(self.store)
        with self.store.lock(on_wait=self.progress.note, clear_planted=self.force):
            if self.force:
                aside = self.store.set_aside_bad_manifest()
                if aside is not None:
                    self.progress.note(f"--force: the unreadable {aside.parent / 'manifest.json'} is "
                                       f"kept as {aside.name}; every stage is rebuilt")
            self.cache.forget_targets_not_in(self.recipe)
            if not self.force:
                preflight.folder_owner(self.store, self.recipe)
                # Before any work: a file changed by hand stops the run with nothing rewritten.
                self.store.verify_all()
            if until in GRAPH_STAGES or chain.needs_graph(self.targets, skipped):
                self.chain.run(until)
                if until in GRAPH_STAGES:
                    return self._finish(outcome)
            else:
                self.progress.note("no target builds from ONNX: export, optimize and precision "
                                   "are not run")
            base = self._baseline() if validates else None
            engines: list[EngineResult] = []
            failures: list[str] = []
            for target in self.targets:
                if target.id in skipped:
                    self.progress.skipped(f"build:{target.id}", skipped[target.id])
                    engines.append(_not_built(target, "skipped", skipped[target.id]))
                    continue
                try:
                    engine = self._build(target, self.chain.for_target(target))
                    outcome.built[target.id] = engine
                    if base is not None:
                        engines.append(self._validate(target, engine, base))
                except StageFailed as e:
                    self.progress.failed(target.id, str(e))
                    engines.append(_not_built(target, "failed", str(e)))
                    failures.append(f"{target.id}: {e}")
            if base is not None:
                self._expect(engines, plan.faster_than)
            outcome.engines = engines
            if until == "report":
                outcome.report = self._report(base, self.chain.graph, engines, self._kept())
            self._finish(outcome)
        if failures:
            raise StageFailed("; ".join(failures))
        return outcome

    def _finish(self, outcome: Outcome) -> Outcome:
        outcome.work_done = self.cache.work_done
        outcome.graph = self.chain.graph
        outcome.graph_meta = dict(self.chain.meta)
        return outcome

    def _kept(self) -> list[EngineResult]:
        """With --target, the last report's entries for the other targets (report.kept_entries)."""
        from pipeline.stages import report

        chosen = [t.id for t in self.targets]
        try:
            previous = (self.store.read_json("report.json") if "report.json" in self.store.manifest.files
                        and (self.store.dir / "report.json").is_file() else None)
        except IntegrityError as e:
            if not self.force:
                raise
            self.progress.note(f"--force: the last report is not kept ({e.message})")
            return []  # --force must clear a folder whatever its old report holds
        kept = report.kept_entries(self.recipe, chosen, previous)
        if kept is None:
            self.progress.note(f"the last report was made from another version of `{self.recipe.name}`: "
                               f"the new one holds only {', '.join(sorted(chosen))}")
        return [EngineResult.model_validate(e) for e in kept or []]

    def _baseline(self) -> Result:  # the workload (and its chat files) decide what is generated
        from pipeline import data
        from pipeline.generation.chat import files_key
        from pipeline.stages import validate

        # the data files' contents, not only their names (validation feeds are drawn
        # disjoint from calibration ones, so both splits count)
        return self.cache.stage(
            "baseline", {**self.recipe.section("model", "inputs", "outputs", "data", "validate", "workload"),
                         "data_files": data.key(self.recipe, "validation", "calibration"),
                         "chat_files": files_key(self.recipe.workload.chat)}, [],
            lambda wd: validate.baseline(self.recipe, wd),
        )

    def _build(self, target, graph: Artifact | None) -> Artifact:
        """`graph` is None for a backend that builds from the PyTorch model (NEEDS_ONNX False),
        when no target needed the graph stages; its key then covers the model's section."""
        from pipeline.stages import build

        sections = ("inputs",) if graph is not None else ("model", "inputs")
        return self.cache.stage(
            f"build:{target.id}",
            {"target": target.model_dump(mode="json"), **self.recipe.section(*sections)},
            [graph] if graph is not None else [],
            lambda wd: build.build(self.recipe, target, graph, wd),
            device_keys=build_keys(target),
        ).outputs[backends.engine_name(target)]

    def _validate(self, target, engine: Artifact, base: Result) -> EngineResult:
        from pipeline.generation.chat import files_key  # workload.chat's files, in the key
        from pipeline.stages import validate

        # The file timed must be the file built: check its sha256 right before opening it.
        engine = self.store.verify(engine.name)
        result = self.cache.stage(
            f"validate:{target.id}",
            {"target": target.model_dump(mode="json"),
             **self.recipe.section("model", "outputs", "validate", "precision", "workload"),
             "chat_files": files_key(self.recipe.workload.chat)},
            [engine, base.one()],
            lambda wd: validate.validate(self.recipe, target, engine, base.one(), wd),
        )
        found = result.record(f"validate-{target.id}.json")
        gate_recheck.refuse_failing(self.recipe, self.store.dir / f"validate-{target.id}.json", [found])  # a cached file too
        return found

    def _expect(self, engines: list[EngineResult], faster_than: dict[str, Recipe]) -> None:
        """expect: gates on every built engine; faster_than first times the A/Bs it needs."""
        from pipeline.metrics import gates
        from pipeline.run import versus

        def build_other(other: Recipe) -> Store:  # its own Run, folder and lock
            return Run(other, self.store.dir.parent, progress=self.progress,
                       verbose=self.verbose).execute("build").store

        built = [e for e in engines if e.status == "built"]
        versus.faster_than(self.cache, faster_than, built, build_other)
        for e in built:
            e.gates = e.gates + gates.expect(self.recipe, e)

    def _report(self, base: Result | None, graph: Artifact | None, engines: list[EngineResult],
                others: list[EngineResult] = ()) -> Report:
        """`others`: entries kept from the last report for targets this run did not build."""
        from pipeline.stages import report

        inputs = ([graph] if graph else []) + ([base.one()] if base else [])
        inputs += [self.store.artifact(f"validate-{e.target}.json") for e in engines if e.status == "built"]
        inputs += [self.store.artifact(v.file) for e in engines for v in e.versus if v.file]
        loads = [self.store.artifact(n) for n in self.store.file_names()
                 if n.startswith("load-") and n.endswith(".json")]  # `pipeline load`'s results
        inputs += loads
        skipped = [dump(e) for e in engines if e.status != "built"]
        by_id = {e.target: e for e in [*engines, *others]}
        every = [by_id[t.id] for t in self.recipe.targets if t.id in by_id]  # the recipe's order
        costs = report.stage_costs(self.store.manifest.stages)
        spec = {"recipe": self.recipe.digest, "not_built": skipped, "stages": costs}
        if others:
            spec["kept"] = [dump(e) for e in others]
        result = self.cache.stage(
            "report", spec, inputs,
            lambda wd: report.write(report.assemble(
                self.recipe, base.meta if base else None, self.chain.meta, every, costs), wd,
                workloads.of(self.recipe), [self.store.read_json(a.name) for a in loads]),
        )
        found = result.record("report.json")
        gate_recheck.refuse_failing(self.recipe, self.store.dir / "report.json", found.engines)
        return found


def _not_built(target, status: str, reason: str) -> EngineResult:
    return EngineResult(target=target.id, kind=target.kind, status=status, reason=reason,
                        path=None, sha256=None, precision=None, accuracy=None,
                        latency_ms=None, speedup_vs_baseline=None, gates=[])


def failed_gates(report: Report | dict) -> list[str]:
    """`target: gate (detail)` for every failed gate in a report (a Report, or report.json
    as recorded.parse returned it)."""
    if isinstance(report, dict):
        report = Report.model_validate(report)
    return [f"{e.target}: {g.name} ({g.detail})" for e in report.engines for g in e.gates if not g.passed]


def check_gates(report: Report) -> None:
    failed = failed_gates(report)
    if failed:
        raise GateFailed(f"{len(failed)} gate(s) failed: " + "; ".join(failed))


__all__ = ["Run", "Outcome", "ORDER", "check_gates", "failed_gates", "IntegrityError"]

