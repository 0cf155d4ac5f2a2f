"""Which recipe keys choose code, and whether `--set` values read from a file set any.

A recipe is code: its `model.factory`, `data.*.loader`, a `module:function` tokenizer or
transformers directory are imported and called. An engines folder is data (a downloaded CI
artifact): its manifest's `recipe_overrides` are replayed when the folder is named as
`<recipe>@<digest>`, so they must never choose code. The fields that do are marked in the
schema (`base.CHOOSES_CODE` in their json_schema_extra); this module finds their key paths
by walking the schema's types, and `naming_code` tells which of a list of `--set` values
reaches one, read as text before any recipe is loaded (loading may already import: a
generation recipe reads its transformers config while it is validated).
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Any

from pydantic import BaseModel

from pipeline.recipe.base import CHOOSES_CODE

ANY = "*"  # one list index or mapping key


def _models(annotation: Any, suffix: tuple[str, ...] = ()):
    """(model class, key suffix) for every pydantic model a field's type can hold."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, suffix
        return
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        for arg in args[:1] if origin is typing.Annotated else args:
            yield from _models(arg, suffix)
    elif origin in (list, tuple, set, frozenset):
        for arg in args:
            yield from _models(arg, (*suffix, ANY))
    elif origin is dict and args:
        yield from _models(args[-1], (*suffix, ANY))


def _walk(model: type[BaseModel], prefix: tuple[str, ...], seen: frozenset) -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()
    if model in seen:
        return found
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        path = (*prefix, field.alias or name)
        extra = field.json_schema_extra
        if isinstance(extra, dict) and extra.get(CHOOSES_CODE):
            found.add(path)
        for sub, suffix in _models(field.annotation):
            found |= _walk(sub, (*path, *suffix), seen | {model})
    return found


@functools.cache
def code_keys() -> tuple[tuple[str, ...], ...]:
    """Key paths (ANY: any index or key) of every recipe field that chooses code."""
    from pipeline.recipe.schema import Recipe

    return tuple(sorted(_walk(Recipe, (), frozenset())))


def _matches(path: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    return len(path) == len(pattern) and all(p == ANY or p == k for k, p in zip(path, pattern))


def _leaves(path: tuple[str, ...], value: Any):
    """(key path, value) of `value` and of everything inside it."""
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves((*path, str(k)), v)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves((*path, str(i)), v)


def naming_code(overrides: list[str] | tuple[str, ...]) -> list[str]:
    """The `--set` values (KEY.PATH=VALUE) that set a key choosing code to anything but null,
    directly or inside a mapping they set (`model={factory: os:system}`)."""
    from pipeline.recipe.loader import parse_override_value

    keys = code_keys()
    found = []
    for item in overrides:
        key, _, text = str(item).partition("=")
        path = tuple(key.strip().split("."))
        value = parse_override_value(text)
        if any(v is not None and any(_matches(p, k) for k in keys) for p, v in _leaves(path, value)):
            found.append(item)
    return found
