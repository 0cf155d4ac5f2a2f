"""The checks a run makes before any work: user errors stop it with nothing written.

In order: the model source (models.check), each graph stage's own `preflight(recipe)`, the
baseline's device and the recipes named by `expect.faster_than` (when the run validates),
the targets that cannot be built here (a required one stops the run), and, under the
folder's lock, that engines/<name>/ is not another recipe file's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline import backends
from pipeline.core import deps
from pipeline.core.errors import DependencyError, RecipeError
from pipeline.model import sources as models
from pipeline.recipe import Recipe
from pipeline.run.limits import check_limits
from pipeline.run.stage_cache import GRAPH_STAGES, graph_stage
from pipeline.store.recipe_folder import Store

RecipesByName = dict[str, Recipe]  # the name expect.faster_than gives -> that recipe, loaded
Unavailable = dict[str, str]  # target id -> why it cannot be built here


@dataclass
class Plan:
    """What the checks found that the run goes on with."""

    unavailable: dict[str, str] = field(default_factory=dict)  # target id -> why not here
    faster_than: dict[str, Recipe] = field(default_factory=dict)  # expect.faster_than, loaded


def before_work(recipe: Recipe, targets: list, validates: bool) -> Plan:
    """Every check that needs no lock; `validates`: the run goes as far as validation."""
    # first: the memory and time the recipe asks for (exit 2 beyond the ceilings), before
    # anything below draws feeds at the recipe's shapes and sample counts
    check_limits(recipe)
    models.check(recipe)
    for name in GRAPH_STAGES:
        graph_stage(name).preflight(recipe)
    plan = Plan()
    if validates:
        from pipeline import data

        data.preflight(recipe)  # real validation data loads, fits and suits validate.task
        check_baseline_device(recipe)
        plan.faster_than = expect_recipes(recipe)
    plan.unavailable = unavailable_targets(targets)
    return plan


def check_baseline_device(recipe: Recipe) -> None:
    """validate.device: cuda needs a GPU and a CUDA build of torch (found without
    importing torch: a CPU wheel's version ends in +cpu)."""
    if recipe.validate_.device != "cuda":
        return
    torch_version = deps.version("torch") or ""
    why = ("this machine has no NVIDIA GPU (nvidia-smi found none)" if not deps.gpus() else
           f"torch {torch_version} is a CPU-only build" if torch_version.endswith("+cpu") else None)
    if why:
        raise DependencyError(f"{recipe.where}: validate.device: cuda, but {why}",
                              "use validate.device=auto or cpu, or run on a CUDA machine")


def expect_recipes(recipe: Recipe) -> RecipesByName:
    """expect.faster_than: every recipe named loads and is another recipe."""
    from pipeline import recipe as recipe_mod

    loaded = {}
    for ref in recipe.expect.faster_than:
        try:
            other = recipe_mod.load(ref)
        except RecipeError as e:
            raise RecipeError(f"{recipe.where}: expect.faster_than: {e.message}", e.hint) from None
        if other.name == recipe.name:
            raise RecipeError(f"{recipe.where}: expect.faster_than: `{ref}` is this recipe itself")
        loaded[ref] = other
    return loaded


def unavailable_targets(targets: list) -> Unavailable:
    """target id -> why it cannot be built here; a required one stops the run first."""
    reasons = {}
    for target in targets:
        reason = backends.get(target.kind).unavailable(target)
        if reason is None:
            continue
        if target.required:
            raise DependencyError(f"target `{target.id}` is required but cannot be built here: {reason}")
        reasons[target.id] = reason
    return reasons


def folder_owner(store: Store, recipe: Recipe) -> None:
    """engines/<name>/ is named after the recipe file's stem, so two files of one name
    (recipes/standard.yaml, recipes/old/standard.yaml) would overwrite each other's
    engines. Refused while the file that built the folder still exists and is another
    file; a folder whose recipe file moved (or a run from another directory) is not."""
    recorded = store.manifest.recipe_file
    if not recorded or recipe.source is None:
        return
    built_by = Path(recorded)
    if built_by.stem != recipe.name:
        return  # a folder copied under another name, not a second file of this name
    try:
        same = built_by.exists() and built_by.samefile(recipe.source)
    except OSError:
        return
    if built_by.exists() and not same:
        raise RecipeError(
            f"{store.dir}: holds the engines of {recorded}, not of {recipe.where} "
            f"(two recipe files named `{recipe.name}`)",
            "rename one of the files, give this one another --engines-dir, or rerun with "
            "--force to rebuild the folder from this file")
