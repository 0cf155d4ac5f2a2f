"""Loading recipes: YAML (safe loader only), `extends:` base files, `--set` overrides,
path confinement, and the one-line error messages that name file, key path and what is
allowed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from pipeline import paths
from pipeline.errors import RecipeError
from pipeline.recipe import ModelSpec, Recipe, _NestedError
from pipeline.targets import TARGET_KINDS


def recipes_dir() -> Path:
    return Path.cwd() / "recipes"


def list_recipes(folder: Path | None = None) -> list[Path]:
    """Recipes a user can run: the top-level YAML files (base files live in subfolders)."""
    folder = folder or recipes_dir()
    return sorted(p for p in folder.glob("*.yaml") if p.is_file())


def resolve_path(ref: str) -> Path:
    """RECIPE on the command line: a path to a YAML file, or a name under recipes/."""
    path = Path(ref)
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
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", path.stem):  # it names engines/<stem>/
        raise RecipeError(f"{_display(path)}: a recipe file name must start with a letter or "
                          f"digit and hold only letters, digits, `.`, `_`, `-` (got {path.stem!r})")
    raw, origin = _load_merged(path, chain=())
    for item in overrides:
        _apply_override(raw, origin, item)
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as e:
        raise RecipeError(_format_validation_error(e, path, origin)) from None
    except RecursionError:  # a list/dict that contains itself, e.g. from --set
        raise RecipeError(f"{_display(path)}: the recipe nests too deeply") from None
    _confine_paths(recipe, path, origin)
    recipe.name = path.stem
    recipe.source = path
    return recipe


def _confine_paths(recipe: Recipe, path: Path, origin: Origin) -> None:
    """Every file a recipe names (any Path field) stays in the project or a data folder."""
    roots = paths.allowed_roots()
    for loc, value in _path_fields(recipe, ()):
        problem = paths.escape(value, roots)
        if problem:
            source = _source_of(loc, origin) or _display(path)
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


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _read_yaml(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RecipeError(f"{_display(path)}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise RecipeError(f"{_display(path)}: not UTF-8 text (byte {e.start}); a recipe is YAML") from None
    try:
        data = yaml.safe_load(text)  # safe: plain data only, never Python objects
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise RecipeError(f"{_display(path)}:{where}: malformed YAML: {problem}") from None
    except RecursionError:
        raise RecipeError(f"{_display(path)}: malformed YAML: nested too deeply") from None
    _check_tree(data, _display(path))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError(
            f"{_display(path)}: a recipe is a mapping of sections, got {type(data).__name__}"
        )
    return data


Origin = dict[tuple, str]  # key path -> file (or --set) that set it

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
        cycle = " -> ".join(_display(p) for p in (*chain, resolved))
        raise RecipeError(f"{_display(path)}: extends: cycle {cycle}")
    data = _read_yaml(path)
    base_ref = data.pop("extends", None)
    own_origin = _origins(data, _display(path))
    if base_ref is None:
        return data, own_origin
    if not isinstance(base_ref, str):
        raise RecipeError(f"{_display(path)}: extends: must be a file name (got {base_ref!r})")
    base_path = path.parent / base_ref
    if not base_ref.strip() or "\0" in base_ref or not base_path.name:
        raise RecipeError(f"{_display(path)}: extends: must be a file name (got {base_ref!r})")
    if base_path.suffix not in (".yaml", ".yml"):
        base_path = base_path.with_name(base_path.name + ".yaml")
    # A base stays inside the project, the first recipe's folder or a data folder.
    problem = paths.escape(base_path, paths.allowed_roots((chain[0] if chain else resolved).parent))
    if problem:
        raise RecipeError(f"{_display(path)}: extends: {problem}")
    if not base_path.is_file():
        raise RecipeError(
            f"{_display(path)}: extends: {base_ref}: no such file {_display(base_path)}",
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


def _apply_override(raw: dict, origin: Origin, item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise RecipeError(f"--set {item}: expected KEY.PATH=VALUE (e.g. validate.threads=2)")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    except RecursionError:
        raise RecipeError(f"--set {item}: the value nests too deeply") from None
    _check_tree(value, f"--set {item}")
    parts = key.strip().split(".")
    node: Any = raw
    for part in parts[:-1]:
        node = _step(node, part, item)
    last = parts[-1]
    if isinstance(node, list):
        index = _index(node, last, item)
        node[index] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise RecipeError(f"--set {item}: `{'.'.join(parts[:-1])}` is not a mapping or list")
    origin[tuple(_keyify(p) for p in parts)] = f"--set {item}"


def _step(node: Any, part: str, item: str) -> Any:
    if isinstance(node, list):
        return node[_index(node, part, item)]
    if isinstance(node, dict):
        if part not in node or node[part] is None:
            node[part] = {}
        return node[part]
    raise RecipeError(f"--set {item}: cannot descend into `{part}`")


def _index(node: list, part: str, item: str) -> int:
    if not re.fullmatch(r"-?\d+", part) or not -len(node) <= int(part) < len(node):
        raise RecipeError(f"--set {item}: `{part}` is not an index of a list of {len(node)}")
    return int(part)


def _keyify(part: str) -> Any:
    return int(part) if re.fullmatch(r"\d+", part) else part


# ----------------------------------------------------------------------- error messages
def _format_validation_error(error: ValidationError, path: Path, origin: Origin) -> str:
    """One line: `file: key.path: what is wrong (what is allowed)` for the first error."""
    errors = _flatten(error)
    loc, message = errors[0]
    source = _source_of(loc, origin) or _display(path)
    key = ".".join(p if isinstance(p, str) and re.fullmatch(r"[\w-]+", p) else
                   str(p) if isinstance(p, int) else repr(p) for p in loc) or "(top level)"
    more = f" (and {len(errors) - 1} more problem{'s' * (len(errors) > 2)})" if len(errors) > 1 else ""
    return f"{source}: {key}: {message}{more}"


_BRANCH_MISMATCH = ("int_type", "int_parsing", "model_type", "dict_type", "model_attributes_type")


def _is_branch_tag(part: Any) -> bool:
    return isinstance(part, str) and (
        part.startswith("function-") or part in ("int", "constrained-int", "Dim")
    )


def _flatten(error: ValidationError, prefix: tuple = ()) -> list[tuple[tuple, str]]:
    errs = error.errors()
    # `int | Dim` reports both branches; the branch whose type does not fit is noise.
    relevant = [
        e for e in errs
        if not (e["type"] in _BRANCH_MISMATCH and any(_is_branch_tag(p) for p in e["loc"]))
    ]
    out = []
    for err in relevant or errs:
        loc = _clean_loc(prefix + tuple(err["loc"]))
        ctx = err.get("ctx") or {}
        nested = ctx.get("error")
        if isinstance(nested, _NestedError):
            out.extend(_flatten(nested.error, loc + (nested.prefix,)))
            continue
        out.append((loc, _describe(err, loc)))
    return out


def _clean_loc(loc: tuple) -> tuple:
    """Drop pydantic's union tags (`targets.0.onnxruntime.x` -> `targets.0.x`)."""
    cleaned = []
    for i, part in enumerate(loc):
        if i and isinstance(loc[i - 1], int) and part in TARGET_KINDS:
            continue
        if _is_branch_tag(part):
            continue
        cleaned.append("validate" if part == "validate_" else part)
    return tuple(cleaned)




def _describe(err: dict, loc: tuple) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return f"unknown key{hint}"
    if kind == "missing":
        return "required key is missing"
    if kind == "union_tag_invalid":
        return f"unknown target kind {err['input'].get('kind')!r}; allowed: {', '.join(TARGET_KINDS)}"
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    if kind not in ("value_error", "assertion_error") and not isinstance(got, (dict, list)):
        msg = f"{msg} (got {got!r})"
    return msg


def _allowed_keys(loc: tuple) -> list[str]:
    """Field names of the schema at `loc`, to list in an `unknown key` message."""
    model: Any = Recipe
    for part in loc:
        if isinstance(part, int):
            continue
        if model is ModelSpec and part == "kwargs":
            return []  # zoo kwargs are reported by their own schema
        field = model.model_fields.get("validate_" if part == "validate" else part)
        if field is None:
            return []
        model = _inner_model(field.annotation)
        if model is None:
            return []
    names = [("validate" if n == "validate_" else n) for n, f in model.model_fields.items() if not f.exclude]
    return names


def _inner_model(annotation: Any) -> Any:
    """The BaseModel inside Optional[...] / list[...] / Annotated[Union[...]] (first one)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    meta = getattr(annotation, "__origin__", None)
    if meta is not None and isinstance(meta, type) and issubclass(meta, BaseModel):
        return meta
    return None


def _source_of(loc: tuple, origin: Origin) -> str | None:
    """The --set that touched `loc` or below it, else the file that set its deepest prefix."""
    for key, source in origin.items():
        if source.startswith("--set") and key[: len(loc)] == loc:
            return source
    for n in range(len(loc), 0, -1):
        if loc[:n] in origin:
            return origin[loc[:n]]
    return None
