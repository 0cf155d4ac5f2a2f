"""Loading recipes: YAML (safe loader only, no repeated keys), `extends:` base files,
`--set` overrides and path confinement; the wording of their errors is recipe/messages.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from pipeline.core import paths, user_code
from pipeline.core.errors import RecipeError
from pipeline.core.json_object import JsonObject
from pipeline.core.text import display_path
from pipeline.recipe.messages import (
    Origin,
    allowed_keys,
    format_validation_error,
    key_text,
    source_of,
)
from pipeline.recipe.schema import Recipe


def recipes_dir() -> Path:
    return Path.cwd() / "recipes"


def list_recipes(folder: Path | None = None) -> list[Path]:
    """Recipes a user can run: the top-level YAML files (base files live in subfolders)."""
    folder = folder or recipes_dir()
    return sorted(p for p in folder.glob("*.yaml") if p.is_file())


def resolve_path(ref: str) -> Path:
    """RECIPE on the command line: a path to a YAML file, or a name under recipes/."""
    path = Path(ref)
    if len(path.stem) > 200 or any(len(part) > 255 for part in path.parts) or "\0" in ref:
        raise RecipeError(f"{ref[:80]}…: not a recipe name or file (a recipe's name becomes the "
                          "folder engines/<name>/: at most 200 characters)")
    if path.suffix in (".yaml", ".yml") or path.parent != Path("."):
        if not path.is_file():
            raise RecipeError(f"{ref}: no such recipe file")
        return path
    candidate = recipes_dir() / f"{ref}.yaml"
    if candidate.is_file():
        return candidate
    names = ", ".join(p.stem for p in list_recipes()) or "none found"
    raise RecipeError(
        f"unknown recipe `{ref}`: no recipes/{ref}.yaml",
        f"available: {names}",
    )


def load(ref: str | Path, overrides: tuple[str, ...] | list[str] = ()) -> Recipe:
    """Load, merge (`extends:`), override (`--set`) and validate a recipe."""
    path = resolve_path(str(ref))
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", path.stem):  # it names engines/<stem>/
        raise RecipeError(f"{display_path(path)}: a recipe file name must start with an ASCII letter or "
                          f"digit and hold only ASCII letters, digits, `.`, `_`, `-` (got {path.stem!r})")
    raw, origin = _load_merged(path, chain=())
    for item in overrides:
        _apply_override(raw, origin, item)
    for key in LOADER_ONLY:  # Recipe fields the loader sets: never from YAML or --set
        if key in raw:
            source = source_of((key,), origin) or display_path(path)
            raise RecipeError(f"{source}: {key}: unknown key; allowed: {', '.join(allowed_keys(()))}",
                              "the loader sets `name` and `source` from the recipe's file (and `overrides` from --set)")
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as e:
        raise RecipeError(format_validation_error(e, display_path(path), origin)) from None
    except RecursionError:  # a list/dict that contains itself, e.g. from --set
        raise RecipeError(f"{display_path(path)}: the recipe nests too deeply") from None
    _confine_paths(recipe, path, origin)
    recipe.name = path.stem
    recipe.source = path
    recipe.overrides = tuple(overrides)
    return recipe


# Set by load() from the file (recipe.name, recipe.source): an unknown key in a recipe.
LOADER_ONLY = tuple(n for n, f in Recipe.model_fields.items() if f.exclude)


def _folder_fields(recipe: Recipe):
    """The str fields that name a folder unless they name a function (`module:function`, code
    the recipe chooses) or `bytes`: a tokenizer folder (the data's, the chat workload's), a
    transformers directory."""
    named = [(("data", split, "tokenizer"), getattr(getattr(recipe.data, split), "tokenizer", None))
             for split in ("validation", "calibration") if getattr(recipe.data, split) is not None]
    if recipe.model.transformers is not None:
        named.append((("model", "transformers", "pretrained"), recipe.model.transformers.pretrained))
    chat = getattr(recipe.workload, "chat", None)
    if chat is not None:  # a tokenizer folder read as the data's are (issue 39, defect 9)
        named.append((("workload", "chat", "tokenizer"), chat.tokenizer))
    for loc, value in named:
        if isinstance(value, str) and value != "bytes" and not user_code.is_function_ref(value):
            yield loc, value


def _confine_paths(recipe: Recipe, path: Path, origin: Origin) -> None:
    """Every file a recipe names (any Path field, and the folders of _folder_fields) stays in
    the project or a data folder."""
    roots = paths.allowed_roots()
    for loc, value in [*_path_fields(recipe, ()), *_folder_fields(recipe)]:
        problem = paths.escape(value, roots)
        if problem:
            source = source_of(loc, origin) or display_path(path)
            raise RecipeError(f"{source}: {'.'.join(map(str, loc))}: {problem}")


def _path_fields(node: Any, loc: tuple):
    if isinstance(node, Path):
        yield loc, node
    elif isinstance(node, BaseModel):
        for name, field in type(node).model_fields.items():
            if not field.exclude:
                yield from _path_fields(getattr(node, name), (*loc, field.alias or name))
    elif isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            yield from _path_fields(item, (*loc, i))



def _read_yaml(path: Path) -> JsonObject:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RecipeError(f"{display_path(path)}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise RecipeError(f"{display_path(path)}: not UTF-8 text (byte {e.start}); a recipe is YAML") from None
    try:
        data = _parse_yaml(text, display_path(path))  # safe: plain data only, never Python objects
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise RecipeError(f"{display_path(path)}:{where}: malformed YAML: {problem}") from None
    except RecursionError:
        raise RecipeError(f"{display_path(path)}: malformed YAML: nested too deeply") from None
    _check_tree(data, display_path(path))
    if data is None:
        raise RecipeError(f"{display_path(path)}: the file is empty",
                          "a recipe needs at least `model`, `inputs` and `targets`, or "
                          "`extends:` a recipe that has them")
    if not isinstance(data, dict):
        raise RecipeError(
            f"{display_path(path)}: a recipe is a mapping of sections, got {type(data).__name__}"
        )
    return data


class _RecipeYAML(yaml.SafeLoader):
    """The safe loader (plain data only) plus a check that no mapping repeats a key: with the
    plain loader the last of two `validate:` sections silently wins. `1e-3` is a float (YAML
    1.1 wants `1.0e-3`; the schema's floats are strict, so it must not stay a string)."""


_RecipeYAML.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _parse_yaml(text: str, where: str) -> Any:
    loader = _RecipeYAML(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_duplicate_keys(loader, node, where)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_duplicate_keys(loader: yaml.SafeLoader, root: yaml.Node, where: str) -> None:
    """Walk the composed nodes (each once: aliases share nodes, so this stays linear)."""
    stack: list[tuple[yaml.Node, tuple]] = [(root, ())]
    visited: set[int] = set()
    while stack:
        node, loc = stack.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*loc, i)) for i, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                    key = loader.construct_object(key_node)  # a scalar: hashable
                    line = key_node.start_mark.line + 1
                    if key in seen:
                        inside = f"{'.'.join(key_text(p) for p in loc)}: " if loc else ""
                        at, also = ("", "") if where.startswith("--set") else (
                            f" line {line}:", f", also on line {seen[key]}")
                        raise RecipeError(
                            f"{where}:{at} {inside}duplicate key `{key_text(key)}`{also}",
                            "a mapping holds each key once: merge the two into one")
                    seen[key] = line
                    stack.append((value_node, (*loc, key)))
                else:
                    stack.append((value_node, (*loc, "?")))


MAX_DEPTH, MAX_VALUES = 32, 100_000


def _check_tree(data: Any, where: str) -> None:
    """A recipe is a small tree. YAML anchors and aliases (`&a`, `*a`) can make it contain
    itself or expand exponentially ("billion laughs"); refuse both before anything walks it."""
    stack, seen = [(data, 0)], 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if depth > MAX_DEPTH or seen > MAX_VALUES:
            raise RecipeError(
                f"{where}: the YAML nests deeper than {MAX_DEPTH} levels or expands to more than "
                f"{MAX_VALUES:,} values", "does an `&anchor` refer to itself through a `*alias`?")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def _load_merged(path: Path, chain: tuple[Path, ...]) -> tuple[dict, Origin]:
    resolved = path.resolve()
    if resolved in chain:
        cycle = " -> ".join(display_path(p) for p in (*chain, resolved))
        raise RecipeError(f"{display_path(path)}: extends: cycle {cycle}")
    data = _read_yaml(path)
    base_ref = data.pop("extends", None)
    own_origin = _origins(data, display_path(path))
    if base_ref is None:
        return data, own_origin
    if not isinstance(base_ref, str):
        raise RecipeError(f"{display_path(path)}: extends: must be a file name (got {base_ref!r})")
    base_path = path.parent / base_ref
    if not base_ref.strip() or "\0" in base_ref or not base_path.name:
        raise RecipeError(f"{display_path(path)}: extends: must be a file name (got {base_ref!r})")
    if base_path.suffix not in (".yaml", ".yml"):
        base_path = base_path.with_name(base_path.name + ".yaml")
    # A base stays inside the project, the first recipe's folder or a data folder.
    problem = paths.escape(base_path, paths.allowed_roots((chain[0] if chain else resolved).parent))
    if problem:
        raise RecipeError(f"{display_path(path)}: extends: {problem}")
    if not base_path.is_file():
        raise RecipeError(
            f"{display_path(path)}: extends: {base_ref}: no such file {display_path(base_path)}",
            "paths are relative to the recipe's folder",
        )
    base, origin = _load_merged(base_path, (*chain, resolved))
    _deep_merge(base, data)
    origin.update(own_origin)
    return base, origin


def _origins(data: Any, source: str, prefix: tuple = ()) -> Origin:
    out = {prefix: source} if prefix else {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(_origins(v, source, (*prefix, k)))
    return out


def _deep_merge(base: dict, over: dict) -> None:
    """Mappings merge key by key; anything else (lists included) is replaced whole."""
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = value


def parse_override_value(text: str) -> Any:
    """The value of a `--set KEY=VALUE` as _apply_override reads it (YAML, else the text;
    the text too for a tree _apply_override refuses)."""
    try:
        value = _parse_yaml(text, "--set")
        _check_tree(value, "--set")  # no self-containing or exploding tree to walk
        return value
    except (yaml.YAMLError, RecipeError, RecursionError):
        return text


def _apply_override(raw: dict, origin: Origin, item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise RecipeError(f"--set {item}: expected KEY.PATH=VALUE (e.g. validate.threads=2)")
    try:
        value = _parse_yaml(text, f"--set {item}")
    except yaml.YAMLError:
        value = text
    except RecursionError:
        raise RecipeError(f"--set {item}: the value nests too deeply") from None
    _check_tree(value, f"--set {item}")
    parts = key.strip().split(".")
    node: Any = raw
    loc: list[Any] = []  # the key path as errors name it: list indexes counted from 0
    for part in parts[:-1]:
        node, step = _step(node, part, item)
        loc.append(step)
    last = parts[-1]
    if isinstance(node, list):
        index = _index(node, last, item)
        node[index] = value
        loc.append(index)
    elif isinstance(node, dict):
        node[last] = value
        loc.append(last)
    else:
        raise RecipeError(f"--set {item}: `{'.'.join(parts[:-1])}` is not a mapping or list")
    origin[tuple(loc)] = f"--set {item}"


def _step(node: Any, part: str, item: str) -> tuple[Any, Any]:
    if isinstance(node, list):
        index = _index(node, part, item)
        return node[index], index
    if isinstance(node, dict):
        if part not in node or node[part] is None:
            node[part] = {}
        return node[part], part
    raise RecipeError(f"--set {item}: cannot descend into `{part}`")


def _index(node: list, part: str, item: str) -> int:
    if not re.fullmatch(r"-?\d+", part) or not -len(node) <= int(part) < len(node):
        raise RecipeError(f"--set {item}: `{part}` is not an index of a list of {len(node)}")
    return int(part) % len(node)  # -1 is the last item: errors name it by its position
