"""The JSON Schema of a recipe *file* (`pipeline schema recipe`), for editors and linters.

A recipe file is not always a whole recipe: one that `extends:` another may set a single
key (recipes/standard.yaml sets `description` and `model.kwargs`). The loader merges
mappings key by key and replaces anything else whole (lists included), so this schema is
the Recipe's own (pydantic) with two changes:

  - `extends` (a file name) is allowed at the top, and `name` / `source` (set by the
    loader from the file) are not;
  - an object reached from the top through mappings only has no required keys (its base may
    hold them); an object inside a list (an input, a target, a dim) keeps them, since a
    list is taken whole from the file that sets it.

Types, allowed values, unknown keys and descriptions are checked as in the pipeline. Rules
across fields (min <= opt <= max, int8 needs calibration data) and whether the merged recipe
is complete are checked by the pipeline itself, which names the file and key.
"""

from __future__ import annotations

import copy
from typing import Any

from pipeline.core.json_object import JsonObject
from pipeline.recipe.schema import Recipe

DIALECT = "https://json-schema.org/draft/2020-12/schema"
LOADER_KEYS = ("name", "source")  # set by the loader; a file that holds them is refused
PARTIAL = "Partial"  # suffix of the $defs copies without required keys


def recipe_file_schema() -> JsonObject:
    schema = Recipe.model_json_schema(by_alias=True)
    defs: dict[str, Any] = schema.get("$defs", {})
    for key in LOADER_KEYS:
        schema["properties"].pop(key, None)
    schema["properties"]["extends"] = {
        "type": "string", "title": "Extends",
        "description": "A base recipe file, relative to this one's folder; its keys are the "
                       "defaults, mappings merge key by key, lists are replaced whole."}
    _partial(schema, defs)
    schema["$defs"] = defs
    return {"$schema": DIALECT, "title": "engine-pipeline recipe file", **schema}


def _partial(node: dict, defs: dict[str, Any]) -> None:
    """Drop `required` from `node` and from every object below it through mappings."""
    node.pop("required", None)
    ref = node.get("$ref")
    if ref and ref.startswith("#/$defs/"):
        name = ref.rsplit("/", 1)[1]
        if not name.endswith(PARTIAL):
            partial = f"{name}{PARTIAL}"
            if partial not in defs:
                defs[partial] = copy.deepcopy(defs[name])
                _partial(defs[partial], defs)
            node["$ref"] = f"#/$defs/{partial}"
    for value in node.get("properties", {}).values():
        _partial(value, defs)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):  # dict[str, X]: merged key by key too
        _partial(extra, defs)
    for branch in ("anyOf", "oneOf", "allOf"):
        for option in node.get(branch, []):
            _partial(option, defs)
    # `items` is left alone: a list comes whole from one file
