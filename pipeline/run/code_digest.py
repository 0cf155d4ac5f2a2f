"""The digest of the pipeline code a stage runs, read statically (no module is imported).

A stage's cache key holds the sha256 of its module and of every pipeline module that module
imports, transitively, so editing pipeline/stages/optimize.py reruns the optimize stage (and
the stages after it, whose keys hold their upstream stages' code too) while editing
pipeline/cli.py reruns nothing. The imports are read with `ast` from every `import` and
`from ... import` statement, function-level ones included, plus the registries' string
references ("pipeline.backends.onnxruntime", "pipeline.passes.onnx_passes:fold_constants"),
which name modules that are imported by name at run time. Nothing here imports torch, so an
unchanged rerun stays fast. Results are cached per process.
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
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(data, filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level-1 more
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and _MODULE_REF.fullmatch(node.value):
            names.add(node.value.partition(":")[0])
    found = {n for n in names if n.split(".")[0] == PACKAGE and _path(n) is not None}
    return data, frozenset(found)


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
