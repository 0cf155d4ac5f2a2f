"""Which engines/ folder a recipe's run writes into, and a folder's name back to its recipe.

A plain recipe writes engines/<recipe>/. A run with `--set` overrides is another variant of
it: it writes engines/<recipe>@<8 hex digits of the overrides>/, so trying a value never
replaces the validated entries of the plain recipe's report. The manifest records the
overrides (`recipe_overrides`), so `pipeline deploy|compare|bench|run standard@1a2b3c4d`
loads the recipe with the very overrides its folder was built with. Those values are read
from a folder, which is data: one that chooses code (recipe/code_keys.py) is refused, exit 5.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from pipeline.core.errors import IntegrityError, RecipeError
from pipeline.recipe import Recipe
from pipeline.recipe import load as load_recipe
from pipeline.recipe.code_keys import naming_code
from pipeline.store.recipe_folder import Store

_FOLDER = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]*)@(?P<digest>[0-9a-f]{8})")


def overrides_digest(overrides: tuple[str, ...] | list[str]) -> str:
    """8 hex digits naming a list of --set values (their order matters: a later one wins)."""
    return hashlib.sha256("\n".join(overrides).encode()).hexdigest()[:8]


def folder_name(recipe: Recipe) -> str:
    """engines/<this>/: the recipe's name, plus @<digest> when it was loaded with --set."""
    return f"{recipe.name}@{overrides_digest(recipe.overrides)}" if recipe.overrides else recipe.name


def load(ref: str, overrides: tuple[str, ...] = (), engines_root: Path = Path("engines")) -> Recipe:
    """A recipe name or file, as recipe.load; or a folder name `<recipe>@<digest>`: that
    recipe with the overrides its folder's manifest records (then `overrides` apply after)."""
    match = _FOLDER.fullmatch(ref) if len(ref) <= 200 else None  # longer: no folder name (NAME)
    if match is None or Path(ref).suffix in (".yaml", ".yml"):
        return load_recipe(ref, overrides)
    store = Store(engines_root, ref)  # the manifest read through its model: a wrong one is exit 5
    recorded = store.manifest.recipe_overrides if store.dir.is_dir() else None
    if recorded is None or overrides_digest(recorded) != match["digest"]:
        raise RecipeError(f"{ref}: no engines folder {store.dir} recording the --set values "
                          f"it was built with",
                          f"run `pipeline run {match['name']} --set ...` first, or name the recipe "
                          "and its --set values")
    code = naming_code(recorded)
    if code:  # a folder is data: a planted manifest must not choose what gets imported
        raise IntegrityError(
            f"{store.dir / 'manifest.json'}: its recorded --set values choose code to import and "
            f"run ({', '.join(code)}); values read from an engines folder never may",
            f"if you trust them, pass them yourself: `pipeline run {match['name']} --set ...`")
    try:
        return load_recipe(match["name"], [*recorded, *overrides])
    except RecipeError as e:
        load_recipe(match["name"], overrides)  # the user's own values alone: theirs to fix
        # the values the folder recorded are what the recipe refuses (a path outside the
        # project, say): the folder is to blame, not the command line
        raise IntegrityError(f"{store.dir / 'manifest.json'}: its recorded --set values are "
                             f"refused: {e.message}",
                             f"rebuild it with `pipeline run {match['name']} --set ...`") from None
