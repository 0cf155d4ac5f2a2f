"""Recorded engines checked against the recipe (run, deploy): gates recomputed with its
thresholds, and the engine kind its target names.

The recipe is trusted (it is code the user chose); the engines folder is data. A
validate-<target>.json or report.json read back from the folder, even with a digest that
matches the manifest, may have been rewritten with gates that say "pass": the accuracy gates
(stages/validate.gates) and the expect: gates (metrics/gates.expect) are computed again from
the recorded figures, and a gate the file records as passed but the recomputation fails is
refused (IntegrityError, exit 5, naming the file, the engine and the gate). A NaN never
passes a recomputed gate (every comparison there is false for NaN). The checks that need
no recipe (verdicts from intervals, NaN figures) are the models' own: artifacts/verdicts.py.
An engine's `kind` (which names its Triton platform) must be its recipe target's kind.
"""

from __future__ import annotations

from typing import Any


def _typed(engine: Any):
    """An engine entry as the report's model (deploy reads dicts, run holds EngineResults)."""
    from pipeline.artifacts.report import EngineResult

    return engine if isinstance(engine, EngineResult) else EngineResult.model_validate(engine)


def against_recipe(recipe: Any, engine: Any) -> list[str]:
    """The accuracy and expect: gates of a built engine recomputed with the recipe's
    thresholds: `gate (recomputed detail)` for each the file records as passed but fails."""
    from pipeline.metrics.gates import expect
    from pipeline.stages.validate import gates as accuracy_gates

    if engine.status != "built" or not engine.accuracy:
        return []
    try:
        recomputed = accuracy_gates(recipe, engine.accuracy) + expect(recipe, engine)
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as e:
        return [f"its gates cannot be recomputed from its figures ({type(e).__name__}: {e})"]
    recorded = {g.name: g.passed for g in engine.gates or []}
    return [f"gate `{g.name}` is recorded as passed, but the recipe's threshold fails it "
            f"({g.detail})" for g in recomputed if not g.passed and recorded.get(g.name)]


def refuse_failing(recipe: Any, path: Any, engines: list) -> None:
    """IntegrityError (exit 5) naming the file and the first problem: a kind that is not its
    target's, or a gate recorded as passed that the recipe's thresholds fail."""
    from pipeline.core.errors import IntegrityError

    kinds = {t.id: t.kind for t in recipe.targets}
    for e in map(_typed, engines):
        problems = against_recipe(recipe, e)
        if e.target in kinds and e.kind != kinds[e.target]:
            problems.insert(0, f"recorded as kind {e.kind!r}, but the recipe's target is "
                               f"`{kinds[e.target]}`")
        if problems:
            raise IntegrityError(f"{path}: engine `{e.target}`: {problems[0]}; the file was "
                                 "changed after the build",
                                 f"rebuild with `pipeline run {recipe.name} --force`")
