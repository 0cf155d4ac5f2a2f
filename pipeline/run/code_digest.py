"""The digest of the pipeline code a stage runs, read statically (no module is imported).

A stage's cache key holds the sha256 of its module and of every pipeline module that module
imports, transitively, so editing pipeline/stages/optimize.py reruns the optimize stage (and
the stages after it, whose keys hold their upstream stages' code too) while editing
pipeline/cli/ reruns nothing. The imports are read from every `import` and `from ... import`
statement, function-level ones included, plus the registries' string references
(`pipeline.backends.onnxruntime`, `pipeline.passes.onnx_passes:fold_constants`), which name
modules that are imported by name at run time. Nothing here imports torch, so an unchanged
rerun stays fast. Results are cached per process.

Every CLI command that runs a stage computes these digests (about 130 modules), so the
statements are found by a regular expression and only they are parsed with `ast`: parsing
whole files took 0.3 s of a cached `pipeline run`'s 0.8 s. tests/run/test_code_digest.py
holds the whole-file `ast` reading as the reference, module by module.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
from pathlib import Path

PACKAGE = "pipeline"
ROOT = Path(__file__).resolve().parent.parent  # the pipeline package this process runs

# A string constant that names a pipeline module, optionally with ":attribute".
_MODULE_REF = re.compile(rf"{PACKAGE}(\.[A-Za-z_][A-Za-z0-9_]*)+(:[A-Za-z_][A-Za-z0-9_]*)?")
_QUOTED_REF = re.compile(rf"""(["'])({_MODULE_REF.pattern})\1""")
# An import statement at any indent: `import a.b as c, d` or `from ..a import (x,\n y)`; a
# comment inside the parentheses is read to its line's end (it may hold a ")").
# A docstring line that reads like one is parsed too: at worst one module more is hashed.
_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+[.\w]+[ \t]+import[ \t]+(?:\((?:[^)#]|#[^\n]*)*\)|[^\n]*)"
                     r"|import[ \t]+[^\n]*)", re.MULTILINE)


def _path(module: str) -> Path | None:
    """pipeline.a.b -> pipeline/a/b.py or pipeline/a/b/__init__.py; None if neither exists."""
    parts = module.split(".")[1:]
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if parts and candidate.is_file():
            return candidate
    return ROOT / "__init__.py" if not parts else None


def _parents(module: str) -> list[str]:
    """The packages Python imports before `module` (their __init__ runs first)."""
    parts = module.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts))]


@functools.cache
def _source(module: str) -> tuple[bytes, frozenset[str]]:
    """(the module's bytes, the pipeline modules it refers to)."""
    path = _path(module)
    if path is None:
        return b"", frozenset()
    data = path.read_bytes()
    text = data.decode().replace("\\\n", " ")  # backslash continuations joined
    names = {m.group(2).partition(":")[0] for m in _QUOTED_REF.finditer(text)}
    for statement in _IMPORT.finditer(text):
        try:
            nodes = ast.parse(statement.group(0).strip()).body
        except SyntaxError:  # prose that starts like an import
            continue
        for node in nodes:
            names |= imported(node, module, is_package=path.name == "__init__.py")
    found = {n for n in names if n.split(".")[0] == PACKAGE and _path(n) is not None}
    return data, frozenset(found)


def imported(node: ast.AST, module: str, is_package: bool) -> set[str]:
    """The module names an import statement of `module` may load (for `from a import b`,
    both a and a.b: b may be a module)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = node.module or ""
    if node.level:  # relative: from the module's package, up level-1 more
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    return {base, *(f"{base}.{a.name}" for a in node.names)}


@functools.cache
def closure(roots: tuple[str, ...]) -> tuple[str, ...]:
    """`roots` and every pipeline module they import, transitively (sorted)."""
    seen: set[str] = set()
    todo = [m for root in roots for m in (*_parents(root), root)]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for ref in _source(module)[1]:
            todo += [m for m in (*_parents(ref), ref) if m not in seen]
    return tuple(sorted(seen))


@functools.cache
def digest(roots: tuple[str, ...]) -> str:
    """sha256 over the closure's module names and bytes."""
    h = hashlib.sha256()
    for module in closure(tuple(sorted(set(roots)))):
        data = _source(module)[0]
        h.update(f"{module}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()
