"""The shape of the run: module sizes, no import cycles, the timing protocol above no backend."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PIPELINE = ROOT / "pipeline"


def test_run_py_is_short_and_no_module_is_long():
    assert len((PIPELINE / "run" / "execute.py").read_text().splitlines()) < 250
    long = {p.relative_to(PIPELINE).as_posix() for p in PIPELINE.rglob("*.py")
            if len(p.read_text().splitlines()) > 400}
    assert long == set()


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_cycles():
    """The static import graph of pipeline/ (every import statement, function-level ones
    too) has no cycle: a module that imports one above it would make one."""
    modules = {_module(p): p for p in PIPELINE.rglob("*.py")}
    edges = {m: {n for n in _imports(p) if n in modules and n != m and n != "pipeline"}
             for m, p in modules.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                return [*path[path.index(n):], n] if n in path else [m, n]
            if n not in state and (cycle := visit(n, [*path, n])):
                return cycle
        state[m] = 2
        return None

    for m in sorted(modules):
        if m not in state:
            cycle = visit(m, [m])
            assert cycle is None, " -> ".join(cycle)


def _imports(path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_the_timing_protocol_imports_no_backend_and_no_stage():
    bad = {f"{p.name}: {n}" for p in (PIPELINE / "bench").glob("*.py") for n in _imports(p)
           if n.startswith(("pipeline.backends", "pipeline.stages", "pipeline.run", "pipeline.commands"))}
    assert bad == set()


def test_backends_import_no_stage():
    """A backend is below the stages: it builds and runs engines, the stages call it."""
    bad = {f"{p.name}: {n}" for p in (PIPELINE / "backends").glob("*.py") for n in _imports(p)
           if n.startswith(("pipeline.stages", "pipeline.run", "pipeline.commands"))}
    assert bad == set()

