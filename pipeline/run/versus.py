"""versus: `expect.faster_than` — this recipe's engines timed against another recipe's.

For each recipe named, `build_other` builds it first (a run of its own, with its own folder
and lock: run/execute.py hands it in, so this module needs no import of execute.py), then
each built engine is timed interleaved against the other's engine of the same target id
(bench/ab.py), one cached stage per pair (`versus:<target>:<other>`). The result goes into
the engine's entry under `versus`; expect's gates judge it afterwards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pipeline.artifacts import EngineResult, Versus
from pipeline.backends import engine_name, openers
from pipeline.bench import ab
from pipeline.recipe import Recipe
from pipeline.run.stage_cache import StageCache
from pipeline.stages import Produced
from pipeline.store.folder_names import folder_name
from pipeline.store.recipe_folder import Store


def faster_than(cache: StageCache, others: dict[str, Recipe], engines: list[EngineResult],
                build_other: Callable[[Recipe], Store]) -> None:
    """`others`: ref as written in the recipe -> that recipe (loaded before any work);
    `engines`: this run's built entries, each given its `versus` list."""
    for ref, other in others.items():
        cache.progress.note(f"expect.faster_than: {other.name} (building it to time against it)")
        versus(cache, ref, other, build_other(other), engines)


def versus(cache: StageCache, ref: str, other: Recipe, other_store: Store,
           engines: list[EngineResult]) -> None:
    recipe, store = cache.recipe, cache.store
    for e in engines:
        target = next(t for t in recipe.targets if t.id == e.target)
        twin = next((t for t in other.targets if t.id == target.id), None)
        if twin is None or engine_name(twin) not in other_store.manifest.files:
            e.versus.append(Versus(other=ref, target=target.id, reason=f"`{other.name}` has no "
                                   f"built `{target.id}` engine to compare with"))
            continue
        # both engine files are checked right before they are timed, as in validate
        mine = store.verify(engine_name(target))
        theirs = dataclasses.replace(other_store.verify(engine_name(twin)),
                                     name=f"{folder_name(other)}/{engine_name(twin)}")
        result = cache.stage(
            f"versus:{target.id}:{other.name}",
            {"target": target.model_dump(mode="json"), "other_target": twin.model_dump(mode="json"),
             **recipe.section("inputs", "validate")}, [mine, theirs],
            lambda wd, t=target, w=twin, m=mine, o=theirs: _measured(ab.versus(
                recipe, t, m, ref, other, w, o, openers.timing_feed(recipe),
                openers.engine_opener(recipe, t, m.path), openers.engine_opener(other, w, o.path))),
        )
        e.versus.append(result.record(result.one().name))


def _measured(comparison: Versus) -> Produced:
    """The A/B as its record (versus-<target>-<other>.json once committed)."""
    return Produced(records={comparison.file: comparison}, meta={"verdict": comparison.comparison.verdict})
