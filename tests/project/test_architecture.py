"""The shape of the code: packages in layers that import only downward (the order written in
docs/design.md), no import of a module that does not exist, no import cycle, short modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

PIPELINE = ROOT / "pipeline"

# Lowest first. A unit is a subpackage of pipeline/, or a top-level module by its own name;
# `<root>` is pipeline/__init__.py. docs/design.md ("Layers") lists the same order.
LAYERS = [
    "<root>",
    "core",  # errors, env, deps, stats, text, ui, logs, safe files, recipe paths, user code
    "zoo", "passes",  # built-in models; graph passes and their registry (names the schema lists)
    "artifacts",  # the typed file contract
    "recipe", "store",
    "model", "data", "metrics", "precision",
    "hardware",  # the hardware feature database: measured here (cached), specified elsewhere
    "bench", "backends",  # the timing core (takes openers, imports no backend); engines
    "generation", "explain",  # decoders: export, runners, figures; profiles, causes
    "roofline",  # the performance model: per-node cost at a shape, floors on a hardware entry
    "workloads", "render",  # what one request is; report.md and the table
    "stages", "run",  # the cached stages; the orchestration over them
    "compare",  # the workloads' comparers (read built folders)
    "commands",  # what the commands do: deploy, tune, bench, compare, ci, generate's chat
    "serving", "loadgen", "fleet",  # the long-running apps, each a library its command calls
    "cli", "__main__",  # the click group, one module per command
]


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for p in root.rglob("*.py"):
        parts = p.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imported(module: str, path: Path, package: str):
    """(line, dotted name) of every import of `package` in the file: module level and inside
    functions, relative ones resolved, and `import_module("...")` with a literal name."""
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                keep = len(parts) - node.level + (path.name == "__init__.py")
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" for a in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
              and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        for name in names:
            if name == package or name.startswith(package + "."):
                yield node.lineno, name


def layer_problems(root: Path, layers: list[str]) -> list[str]:
    """Every import under `root` (a package folder) that points to a higher layer, names a
    module of the package that does not exist, or comes from a unit the order lacks."""
    modules, rank, problems = _modules(root), {u: i for i, u in enumerate(layers)}, []
    for module, path in sorted(modules.items()):
        where = path.relative_to(root.parent)
        if _unit(module) not in rank:
            problems.append(f"{where}: its package `{_unit(module)}` is in no layer")
            continue
        for line, name in _imported(module, path, root.name):
            target = name if name in modules else name.rsplit(".", 1)[0]
            if target not in modules:
                problems.append(f"{where}:{line} imports {name}: no such module")
            elif rank.get(_unit(target), -1) > rank[_unit(module)]:
                problems.append(f"{where}:{line} imports {name}: `{_unit(module)}` is below "
                                f"`{_unit(target)}`")
    return problems


def test_packages_import_only_downward_and_only_what_exists():
    assert layer_problems(PIPELINE, LAYERS) == []


def test_the_check_finds_an_upward_import_and_a_missing_module(tmp_path):
    """The check itself, on a planted package: a core module reaching up into the command
    line from inside a function, and an import of a module that was renamed away."""
    pkg = tmp_path / "pipeline"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "text.py").write_text("def f():\n    from pipeline.cli import main\n")
    (pkg / "core" / "old.py").write_text("from pipeline.models import gone\n")
    (pkg / "cli.py").write_text("from pipeline.core import text\n\ndef main():\n    pass\n")
    problems = layer_problems(pkg, ["<root>", "core", "cli"])
    assert problems == ["pipeline/core/old.py:1 imports pipeline.models.gone: no such module",
                        "pipeline/core/text.py:2 imports pipeline.cli.main: `core` is below `cli`"]
    # the same files under the other order: now the command line's import points up
    assert layer_problems(pkg, ["<root>", "cli", "core"]) == [
        "pipeline/cli.py:1 imports pipeline.core.text: `cli` is below `core`",
        "pipeline/core/old.py:1 imports pipeline.models.gone: no such module"]


def test_docs_design_lists_the_same_layers():
    design = (ROOT / "docs" / "design.md").read_text()
    block = re.search(r"<!-- layers -->\n```\n(.*?)```", design, re.S)
    assert block, "docs/design.md has no ```-fenced layer list after <!-- layers -->"
    written = [line.split()[0] for line in block.group(1).splitlines() if line.strip()]
    assert list(reversed(written)) == LAYERS  # the doc draws them top first


def test_run_py_is_short_and_no_module_is_long():
    assert len((PIPELINE / "run" / "execute.py").read_text().splitlines()) < 250
    long = {p.relative_to(PIPELINE).as_posix() for p in PIPELINE.rglob("*.py")
            if len(p.read_text().splitlines()) > 400}
    assert long == set()


def test_no_import_cycles():
    """The static import graph of pipeline/'s modules (every import statement, function-level
    ones too) has no cycle."""
    modules = _modules(PIPELINE)
    edges = {m: set() for m in modules}
    for m, p in modules.items():
        for _, name in _imported(m, p, "pipeline"):
            target = name if name in modules else name.rsplit(".", 1)[0]
            if target in modules and target not in (m, "pipeline"):
                edges[m].add(target)
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
