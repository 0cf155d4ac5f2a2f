"""The one-line messages a bad recipe gets: the file (or `--set`) that set the key, the key
path as YAML spells it, and what is allowed, from pydantic's validation errors and the
recipe schema itself (recipe/loader.py loads; this module only words what went wrong)."""

from __future__ import annotations

import re
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from pipeline.recipe.base import LocatedError, NestedError
from pipeline.recipe.schema import ModelSpec, Recipe
from pipeline.recipe.targets import TARGET_KINDS

Origin = dict[tuple, str]  # key path -> file (or --set) that set it


def format_validation_error(error: ValidationError, where: str, origin: Origin) -> str:
    """pydantic's errors -> one line: the file (or --set) that set the key, the key path as
    YAML spells it, and what is wrong or allowed. `where`: the recipe file as shown."""
    """One line: `file: key.path: what is wrong (what is allowed)` for the first error."""
    errors = _flatten(error)
    loc, message = errors[0]
    source = source_of(loc, origin) or where
    key = ".".join(key_text(p) for p in loc) or "(top level)"
    more = f" (and {len(errors) - 1} more problem{'s' * (len(errors) > 2)})" if len(errors) > 1 else ""
    return f"{source}: {key}: {message}{more}"


def key_text(part: Any) -> str:
    """A key path part as YAML spells it: `batch`, `0`, `true`, `null`, `'a b'`."""
    if isinstance(part, bool) or part is None:
        return yaml.safe_dump(part).removesuffix("...\n").strip()
    if isinstance(part, (int, float)):
        return str(part)
    if isinstance(part, str) and re.fullmatch(r"[\w-]+", part):
        return part
    return repr(part)


_BRANCH_MISMATCH = ("int_type", "int_parsing", "model_type", "dict_type", "model_attributes_type",
                    "finite_number")


def _is_branch_tag(part: Any) -> bool:
    return isinstance(part, str) and (
        part.startswith("function-") or part in ("int", "constrained-int", "Dim")
    )


def _is_branch_noise(err: dict) -> bool:
    """`int | Dim` reports both branches; the one whose type the input does not have is noise
    (a mapping was meant as a Dim, anything else as an int)."""
    loc = err["loc"]
    if not loc or not _is_branch_tag(loc[-1]) or err["type"] not in _BRANCH_MISMATCH:
        return False
    int_branch = loc[-1] in ("int", "constrained-int")
    return isinstance(err["input"], dict) == int_branch


def _flatten(error: ValidationError, prefix: tuple = ()) -> list[tuple[tuple, str]]:
    errs = error.errors()
    relevant = [e for e in errs if not _is_branch_noise(e)]
    out = []
    for err in relevant or errs:
        raw_loc = prefix + tuple(err["loc"])
        if err["type"] == "invalid_key":  # pydantic names a key `true` 1, `null` 'None'
            raw_loc = raw_loc[:-1] + (err["input"],)
        if raw_loc and raw_loc[-1] == "[key]":  # a mapping's key, not its value, is wrong
            loc = _clean_loc(raw_loc[:-1])
            message = _describe(err, raw_loc).replace("Input should", "the key should", 1)
            out.append((loc, message))
            continue
        loc = _clean_loc(raw_loc)
        ctx = err.get("ctx") or {}
        nested = ctx.get("error")
        if isinstance(nested, NestedError):
            out.extend(_flatten(nested.error, loc + (nested.prefix,)))
            continue
        if isinstance(nested, LocatedError):
            out.append((loc + nested.loc, nested.message))
            continue
        if err["type"] == "union_tag_not_found":  # a target without `kind:`
            out.append((loc + ("kind",), f"required key is missing; allowed: {', '.join(TARGET_KINDS)}"))
            continue
        out.append((loc, _dedupe(_describe(err, raw_loc), loc)))
    return out


def _dedupe(message: str, loc: tuple) -> str:
    """`precision.exclude: exclude: ...` -> `precision.exclude: ...`: a message that starts
    with its own key (or the key path) names it once."""
    for n in range(len(loc)):
        prefix = ".".join(key_text(p) for p in loc[n:]) + ": "
        if message.startswith(prefix):
            return message[len(prefix):]
    return message


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


_TYPE_NAMES = {"int_type": "integer", "float_type": "number", "bool_type": "boolean",
               "string_type": "string"}


def _describe(err: dict, raw_loc: tuple) -> str:
    kind = err["type"]
    got = err.get("input")
    if kind == "extra_forbidden":
        allowed = allowed_keys(raw_loc[:-1])
        hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return f"unknown key{hint}"
    if kind == "missing":
        return "required key is missing"
    if kind == "union_tag_invalid":
        return f"unknown target kind {err['input'].get('kind')!r}; allowed: {', '.join(TARGET_KINDS)}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be a mapping of keys (`key: value`), got {_yaml_text(got)}"
    if kind == "invalid_key":
        return f"a key must be a string, got {_yaml_text(got)} (quote it, or remove it)"
    if kind in _TYPE_NAMES and isinstance(got, (str, bool)):
        # strict types: YAML `true` is no integer, `"8"` no number (quotes make a string)
        hint = "; write it without quotes" if isinstance(got, str) and _parses_as(got, kind) else ""
        return f"Input should be a valid {_TYPE_NAMES[kind]} (got {_yaml_text(got)}{hint})"
    msg = err["msg"].removeprefix("Value error, ")
    if kind not in ("value_error", "assertion_error") and not isinstance(got, (dict, list)):
        msg = f"{msg} (got {got!r})"
    return msg


def _yaml_text(value: Any) -> str:
    """A value as the user wrote it: null, true, 'text', 8, a list or a mapping."""
    if value is None or isinstance(value, bool):
        return key_text(value)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _parses_as(text: str, kind: str) -> bool:
    try:
        value = yaml.safe_load(text)  # a short scalar the user quoted
    except yaml.YAMLError:
        return False
    want = {"int_type": int, "float_type": (int, float), "bool_type": bool, "string_type": str}[kind]
    return isinstance(value, want) and (kind == "bool_type" or not isinstance(value, bool))


def allowed_keys(loc: tuple) -> list[str]:
    """Field names of the schema at `loc` (pydantic's raw loc, union tags included), to list
    in an `unknown key` message."""
    models: list[Any] = [Recipe]
    for part in loc:
        if isinstance(part, int) or _is_branch_tag(part):
            continue
        if len(models) > 1:  # a tagged union: pydantic's loc names the member (`tensorrt`)
            models = [m for m in models if _tag_of(m) == part]
            if not models:
                return []
            continue
        (model,) = models
        if model is ModelSpec and part == "kwargs":
            return []  # zoo kwargs are reported by their own schema
        field = model.model_fields.get("validate_" if part == "validate" else part)
        if field is None:
            return []
        models = _inner_models(field.annotation)
        if not models:
            return []
    if len(models) != 1:
        return []
    names = [("validate" if n == "validate_" else n)
             for n, f in models[0].model_fields.items() if not f.exclude]
    return names


def _tag_of(model: Any) -> Any:
    field = model.model_fields.get("kind")
    return field.default if field is not None else None


def _inner_models(annotation: Any) -> list[Any]:
    """The BaseModels inside Optional[...] / list[...] / Annotated[Union[...]]: one, or the
    members of a union (told apart by their `kind`)."""
    registered = [m for m in getattr(annotation, "__metadata__", ()) if hasattr(m, "schemas")]
    if registered:  # targets.Target: the schemas registered now
        return registered[0].schemas()
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[Any] = []
    for arg in getattr(annotation, "__args__", ()) or ():
        found += [m for m in _inner_models(arg) if m not in found]
    if found:
        return found
    meta = getattr(annotation, "__origin__", None)
    if meta is not None and isinstance(meta, type) and issubclass(meta, BaseModel):
        return [meta]
    return []


def source_of(loc: tuple, origin: Origin) -> str | None:
    """The --set that touched `loc` or below it, else the file that set its deepest prefix."""
    for key, source in origin.items():
        if source.startswith("--set") and key[: len(loc)] == loc:
            return source
    for n in range(len(loc), 0, -1):
        if loc[:n] in origin:
            return origin[loc[:n]]
    return None
