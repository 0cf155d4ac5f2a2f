"""Importing the user's own code (`module:function` in a recipe) the way `python -m` would.

The `pipeline` console script does not have the current directory on sys.path (`python -m
pipeline` does), so a `models.py` next to the recipe was importable one way and not the
other. Both the recipe's folder and the current directory are searched, in that order,
ahead of the environment, for every user reference (model.factory, data loaders).

User code runs inside the pipeline's process, so a `sys.exit(0)` in a loader (or at the top
of its module) would end the whole run with status 0, no output and no engines, as if it
had succeeded. `exits_refused(where)` turns SystemExit raised by user code into a one-line
RecipeError naming the reference (exit 2); Ctrl-C stays an interrupt (exit 130).

A reference is `module:function` (FUNCTION_REF, the one pattern: the recipe schema's fields,
the loader's path confinement and every resolver use it); `function` finds it under these
rules and `call_ref` calls one that returns a path.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from pipeline.core.errors import PipelineError, RecipeError
from pipeline.core.text import first_line

FUNCTION_REF = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"  # `package.module:function`
_FUNCTION_REF = re.compile(FUNCTION_REF)


def is_function_ref(text: str) -> bool:
    """Whether `text` names a function (`module:function`) rather than a path or a word; the
    whole text, as the schema's pattern holds it (a trailing newline is not a function)."""
    return bool(_FUNCTION_REF.fullmatch(text))


def search_path(recipe_source: Path | None) -> list[str]:
    """The folders a user module may live in: the recipe's folder, then the current one."""
    folders = [Path(recipe_source).resolve().parent] if recipe_source else []
    folders.append(Path.cwd().resolve())
    return [str(f) for f in dict.fromkeys(folders)]


def make_importable(recipe_source: Path | None) -> None:
    for folder in reversed(search_path(recipe_source)):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    importlib.invalidate_caches()


def import_module(name: str, recipe_source: Path | None):
    """importlib.import_module after make_importable; raises what the import raises."""
    make_importable(recipe_source)
    return importlib.import_module(name)


def find_spec(name: str, recipe_source: Path | None):
    """The module's spec without importing it (its parent packages are imported), or None."""
    import importlib.util

    make_importable(recipe_source)
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


@contextlib.contextmanager
def exits_refused(where: str) -> Iterator[None]:
    """Run user code (an import, a factory, a loader) under this: its SystemExit becomes a
    RecipeError naming `where`, never the pipeline's own exit."""
    try:
        yield
    except SystemExit as e:
        raise RecipeError(f"{where}: the user code called sys.exit({e.code!r}) (raised SystemExit) "
                          "instead of returning; the pipeline stops here, nothing was built from it",
                          "return a value, or raise an exception that says what is wrong") from None


def function(ref: str, what: str, recipe_source: Path | None = None) -> Callable:
    """The function `module:function` names, its module imported beside the recipe, in the
    current directory, then from the environment, with its SystemExit refused. `what` names
    the recipe field (with its file) in the errors."""
    module_name, _, attr = ref.partition(":")
    try:
        with exits_refused(f"{what} `{ref}`"):
            module = import_module(module_name, recipe_source)
    except PipelineError:
        raise
    except Exception as e:  # the user's module may fail in any way while importing
        folders = " or ".join(search_path(recipe_source))
        raise RecipeError(f"{what}: cannot import `{module_name}` ({type(e).__name__}: {e})",
                          f"put {module_name.replace('.', '/')}.py in {folders}, or install its package") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RecipeError(f"{what}: `{module_name}` has no function `{attr}`")
    return fn


def call_ref(ref: str, what: str, returns: str, recipe_source: Path | None = None) -> str:
    """Call the function `module:function` names (no arguments; found as `function` finds
    it); its result as a string. `returns` says what it should have returned, for the error."""
    fn = function(ref, what, recipe_source)
    try:
        with exits_refused(f"{what} `{ref}`"):
            return str(fn())
    except PipelineError:
        raise
    except Exception as e:  # a function of the wrong kind, or one that fails
        raise RecipeError(f"{what}: `{ref}()` did not return {returns} ({first_line(e, with_type=True)})",
                          "name a function taking no arguments that returns a local path") from None
