"""Engine backends, by target kind: the registry.

Each backend is a module keeping the contract in base.py (Backend): its target schema,
engine suffix, whether it builds from ONNX, how Triton serves it, build() and open().
Stages and deploy ask the backend (`backends.get(target.kind)`), never `kind == ...`.

Built-in kinds are listed below by module path, imported on first use. A third-party
backend is a module of its own package, announced by an entry point:

    # the plugin's pyproject.toml
    [project.entry-points."pipeline.backends"]
    my-kind = "my_package.my_backend"

`load_plugins()` (the CLI calls it before reading any recipe) imports each one and
registers it; `register(module)` does the same in-process. Registering adds the module's
TARGET schema to the recipe's `targets:` union, so recipes may use the kind.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from pipeline.backends.base import Backend, TritonModel, check  # noqa: F401
from pipeline.core.errors import DependencyError
from pipeline.core.text import first_line

ENTRY_POINTS = "pipeline.backends"

BUILTIN = {
    "onnxruntime": "pipeline.backends.onnxruntime",
    "tensorrt": "pipeline.backends.tensorrt",
    "aotinductor": "pipeline.backends.aotinductor",
}
_paths: dict[str, str] = dict(BUILTIN)  # kind -> module path, imported on first get()
_loaded: dict[str, Backend] = {}


def kinds() -> list[str]:
    return list(_paths)


def get(kind: str) -> Backend:
    """The backend of `kind`; one error naming the known kinds when there is none."""
    if kind not in _loaded:
        if kind not in _paths:
            raise DependencyError(
                f"no backend for target kind `{kind}` (known: {', '.join(_paths)})",
                f"install the package that provides it (entry point group `{ENTRY_POINTS}`)")
        _loaded[kind] = check(kind, importlib.import_module(_paths[kind]))
    return _loaded[kind]


def lookup(kind: str | None) -> Backend | None:
    """`get`, or None for a kind no backend here knows (a report from another machine)."""
    return get(kind) if kind in _paths else None


def kind_of_suffix(suffix: str) -> str | None:
    """The kind whose engines carry this file suffix (the first one registered)."""
    return next((k for k in _paths if get(k).EXTENSION == suffix), None)


def register(module: ModuleType) -> str:
    """Register a backend module (its kind is its TARGET schema's); returns the kind."""
    from pipeline.recipe.plugins import add_target_schema

    field = getattr(getattr(module, "TARGET", None), "model_fields", {}).get("kind")
    kind = getattr(field, "default", None)
    if not isinstance(kind, str):
        raise DependencyError(f"backend module {module.__name__} has no TARGET schema with a "
                              "`kind` (see pipeline/backends/base.py)")
    if _loaded.get(kind) is module:
        return kind
    if kind in _paths:
        raise DependencyError(f"backend module {module.__name__}: target kind `{kind}` is "
                              f"already provided by {_paths[kind]}")
    check(kind, module)
    add_target_schema(module.TARGET)
    _paths[kind], _loaded[kind] = module.__name__, module
    return kind


def load_plugins() -> list[str]:
    """Register every backend announced in the `pipeline.backends` entry point group."""
    from importlib.metadata import entry_points

    found = []
    for ep in entry_points(group=ENTRY_POINTS):
        try:
            module = ep.load()
        except Exception as e:  # a plugin's own bug or missing dependency: name the plugin
            raise DependencyError(f"backend plugin `{ep.name}` ({ep.value}) cannot be imported: "
                                  f"{first_line(e, with_type=True)}",
                                  "fix or uninstall the package that provides it") from e
        kind = register(module)
        if kind != ep.name:
            raise DependencyError(f"backend plugin `{ep.name}` ({ep.value}) declares target kind "
                                  f"`{kind}`; the entry point's name must be its kind")
        found.append(kind)
    return found


def engine_name(target) -> str:
    """The engine's file name in a recipe's folder: the target's id and its backend's suffix."""
    return f"{target.id}{get(target.kind).EXTENSION}"
