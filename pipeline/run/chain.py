"""The graph stages of one run: which graph each target builds from.

    export -> optimize -> precision        the chain: its last graph is what targets build from
           -> optimize:plain -> precision:plain
                                           the plain-ONNX chain, for a backend marked PLAIN_ONNX
                                           (TensorRT) when the chain's graph holds ONNX Runtime
                                           contrib ops: the same stages without the ORT-only
                                           passes, from the same export (files *-plain.onnx)

A graph stage is a module keeping the GraphStage contract (pipeline/stages/__init__.py):
NAME, SECTIONS, enabled, preflight, spec, run (its first output file is the next graph) and
summary. Adding one is a module plus its `Stage(..., graph=True)` record in
run/stage_cache.py.
"""

from __future__ import annotations

from pathlib import Path

from pipeline import backends
from pipeline.recipe import Recipe
from pipeline.run.stage_cache import GRAPH_STAGES, StageCache, graph_stage
from pipeline.stages import Produced
from pipeline.store.recipe_folder import Artifact


def needs_graph(targets: list, unavailable: dict[str, str]) -> bool:
    """Does any target that will be built here build from the ONNX graph?"""
    return any(backends.get(t.kind).NEEDS_ONNX
               for t in targets if t.id not in unavailable)


class GraphChain:
    """Runs the graph stages through a StageCache; remembers what a second chain needs."""

    def __init__(self, recipe: Recipe, cache: StageCache, verbose: bool = False):
        self.recipe = recipe
        self.cache = cache
        self.verbose = verbose
        self.meta: dict[str, dict] = {}  # graph stage id -> its meta, for the report
        self.exported: Artifact | None = None  # the export's graph: where the plain chain starts
        self.graph: Artifact | None = None  # the chain's last graph
        self.plain: Artifact | None = None  # the plain chain's last graph, once built

    def run(self, until: str | None = None) -> Artifact | None:
        """The chain, stopping after stage `until` when it is a graph stage."""
        stages = GRAPH_STAGES[:GRAPH_STAGES.index(until) + 1] if until in GRAPH_STAGES else GRAPH_STAGES
        self.exported = self.graph = self._stage(stages[0], None)
        for name in stages[1:]:
            self.graph = self._stage(name, self.graph)
        return self.graph

    def for_target(self, target) -> Artifact | None:
        """The graph `target` builds from: the chain's own, unless the target's backend takes
        plain ONNX only and the chain wrote ONNX Runtime ops; then the plain chain's graph
        (built once per run, cached across runs like any stage)."""
        from pipeline import passes
        from pipeline.model import onnx_info

        graph = self.graph
        if graph is None or not backends.get(target.kind).PLAIN_ONNX:
            return graph
        if not onnx_info.foreign_ops(graph.path):
            return graph
        if self.plain is None:
            spec = self.recipe.optimize
            keep = [p for p in spec.passes if not passes.PASSES[p].ort_only]
            plain = self.recipe.model_copy(update={"optimize": spec.model_copy(update={
                "passes": keep, "options": {k: v for k, v in spec.options.items() if k in keep}})})
            chain = self.exported  # the export is shared
            for name in GRAPH_STAGES[1:]:
                chain = self._stage(name, chain, plain, "plain")
            self.plain = chain
        return self.plain

    def _stage(self, name: str, graph: Artifact | None, recipe: Recipe | None = None,
               flavor: str = "") -> Artifact | None:
        """Run one graph stage (if the recipe enables it); returns the graph to go on with.
        A `flavor` runs it as a second chain: its own stage id and output file names."""
        recipe = recipe or self.recipe
        module = graph_stage(name)
        if not module.enabled(recipe):
            return graph
        spec = module.spec(recipe)
        stage_id = f"{module.NAME}:{flavor}" if flavor else module.NAME

        def produce(wd: Path) -> Produced:
            made = module.run(recipe, graph, wd, verbose=self.verbose)
            if flavor:  # typed.onnx -> typed-plain.onnx: both chains' files live side by side
                made.files = {f"{Path(n).stem}-{flavor}{Path(n).suffix}": path
                              for n, path in made.files.items()}
            return made

        result = self.cache.stage(stage_id, spec, [graph] if graph else [], produce)
        self.meta[stage_id] = result.meta
        line = None if result.cached else module.summary(result.meta)
        if line:
            self.cache.progress.note(line)
        return next(iter(result.outputs.values()))
