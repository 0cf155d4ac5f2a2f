"""The recipe reference (docs/recipes.md), generated from the schema: every key with its type,
default and description, so the documentation cannot drift from what the loader accepts.

    python -m pipeline.recipe.reference > docs/recipes.md      (make docs)
"""

from __future__ import annotations

import json
from typing import Any

HEADER = """# Recipe reference

Generated from the recipe schema (`pipeline/recipe/`) by `make docs`; do not edit by hand.
Unknown and repeated keys are errors; values are strictly typed (`true` and `"7"` are no
integers, `1e-3` is a float, `.inf`/`.nan` are refused).

## Recipe files in an editor

`pipeline schema recipe` prints the JSON Schema of a recipe *file*, made from the same
pydantic models the pipeline validates with: every key's type, allowed values and
description, misspelt keys flagged. A file that `extends:` another may leave any key to its
base, so keys are required only inside list items (an input, a target), which a file always
sets whole; what the merged recipe still lacks, and rules across fields, the pipeline checks.
For an editor with the YAML language server (VS Code's YAML extension, Neovim's yamlls):

```sh
pipeline schema recipe > recipe.schema.json
```

```yaml
# yaml-language-server: $schema=../recipe.schema.json
description: my variant
extends: base/glm-tiny.yaml
```

(the path is relative to the recipe file; or map `recipes/**/*.yaml` to the schema once in
the editor's `yaml.schemas` setting). `pipeline schema report` and `pipeline schema manifest`
print the schemas of report.json (schema 2) and manifest.json, for tools that read them.
"""


EXTENDS = """## `extends`

A base file (path relative to this file, e.g. `base/glm-tiny.yaml`) merged key by key under
this one: mappings merge, everything else is replaced. Bases may extend bases.

A dim in `inputs[].shape` is a fixed integer or `{name, min, opt, max}` (`min <= opt <= max`);
dims sharing a name are one dynamic axis.
"""


def markdown() -> str:
    from pipeline.recipe.schema import Recipe

    schema = Recipe.model_json_schema(by_alias=True)
    defs = schema["$defs"]
    lines = [HEADER, EXTENDS]
    excluded = {k for k, f in Recipe.model_fields.items() if f.exclude}
    required = set(schema.get("required", ()))
    for key, prop in schema["properties"].items():
        if key in excluded:  # set by the loader (the file's name and path), not recipe keys
            continue
        lines += [f"## `{key}`", "", _cell(prop.get("description", "")), ""]
        target = _ref(prop) or _ref(prop.get("items", {}))
        variants = prop.get("items", {}).get("oneOf", [])
        if variants:  # targets: one table per kind
            for variant in variants:
                name = variant["$ref"].rsplit("/", 1)[1]
                kind = defs[name]["properties"]["kind"].get("const", name)
                lines += [f"### `kind: {kind}`", "", _cell(defs[name].get("description", "")), ""]
                lines += _table(defs, name, key + "[]")
        elif target:
            lines += _table(defs, target, key + ("[]" if "items" in prop else ""))
        else:
            lines += _rows_header() + [_row(key, prop, key in required)] + [""]
    return "\n".join(lines).rstrip() + "\n"


def _table(defs: dict, name: str, prefix: str) -> list[str]:
    rows: list[str] = []
    _walk(defs, name, prefix, rows, seen=())
    return _rows_header() + rows + [""]


def _walk(defs: dict, name: str, prefix: str, rows: list[str], seen: tuple) -> None:
    """One row per field; nested sections are expanded in place (`a.b.c`)."""
    required = set(defs[name].get("required", ()))
    for field, prop in defs[name].get("properties", {}).items():
        path = f"{prefix}.{field}"
        rows.append(_row(path, prop, field in required))
        nested = _ref(prop) or _ref(prop.get("items", {})) or _ref_in_any_of(prop)
        if nested and nested not in seen and nested != "Dim":
            _walk(defs, nested, path + ("[]" if "items" in prop else ""), rows, (*seen, name))


def _rows_header() -> list[str]:
    return ["| key | type | default | description |", "|---|---|---|---|"]


def _row(path: str, prop: dict, required: bool) -> str:
    default = ("required" if required else "optional") if "default" not in prop \
        else f"`{_short(prop['default'])}`"
    return f"| `{path}` | {_type(prop)} | {default} | {_cell(prop.get('description', ''))} |"


def _type(prop: dict) -> str:
    if "const" in prop:
        return f"`{prop['const']}`"
    if "enum" in prop:
        return " \\| ".join(f"`{v}`" for v in prop["enum"])
    if "$ref" in prop:
        return "section"
    if "anyOf" in prop:
        return " or ".join(_type(p) for p in prop["anyOf"])
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}))}"
    if kind == "object" and "additionalProperties" in prop and isinstance(prop["additionalProperties"], dict):
        return f"map to {_type(prop['additionalProperties'])}"
    bounds = [f"{sym} {prop[k]}" for k, sym in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                                ("maximum", "<="), ("exclusiveMaximum", "<"))
              if k in prop]
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _ref(prop: dict) -> str | None:
    ref = prop.get("$ref")
    return ref.rsplit("/", 1)[1] if ref else None


def _ref_in_any_of(prop: dict) -> str | None:
    return next((r for r in (_ref(p) for p in prop.get("anyOf", [])) if r), None)


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


if __name__ == "__main__":
    print(markdown(), end="")
