"""pipeline/run/code_digest.py: the pipeline modules each module refers to, found from its
import statements alone, are the ones a whole-file `ast` reading finds."""

from __future__ import annotations

import ast

import pytest

from pipeline.run import code_digest


def _by_whole_file(module: str) -> frozenset[str]:
    """The reference: every Import / ImportFrom node and every string constant naming a
    pipeline module, anywhere in the module's syntax tree."""
    path = code_digest._path(module)
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        names |= code_digest.imported(node, module, is_package=path.name == "__init__.py")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and code_digest._MODULE_REF.fullmatch(node.value):
            names.add(node.value.partition(":")[0])
    return frozenset(n for n in names if n.split(".")[0] == "pipeline" and code_digest._path(n))


def _modules() -> list[str]:
    root = code_digest.ROOT
    return sorted(".".join(("pipeline", *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
                  for p in root.rglob("*.py"))


@pytest.mark.parametrize("module", _modules())
def test_the_statements_name_what_the_whole_tree_names(module):
    assert code_digest._source(module)[1] == _by_whole_file(module)


def test_continued_parenthesized_relative_and_quoted_references(tmp_path, monkeypatch):
    package = tmp_path / "pipeline"
    (package / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "b.py", "c.py", "d.py", "e.py", "sub/__init__.py", "sub/f.py"):
        (package / name).write_text("")
    (package / "sub" / "g.py").write_text(
        'import pipeline.a, \\\n    pipeline.b as b\n'
        'def f():\n    from pipeline import (\n        c,  # the module c (a ) in a comment ends nothing)\n        d,\n    )\n'
        'from . import f\nfrom .. import e\n'
        'TARGET = "pipeline.sub.f:run"\n'
        '"""import this is prose, from which nothing is read"""\n')
    monkeypatch.setattr(code_digest, "ROOT", package)
    code_digest._source.cache_clear()
    try:
        refs = code_digest._source("pipeline.sub.g")[1]
    finally:
        code_digest._source.cache_clear()
    assert refs == {"pipeline", "pipeline.a", "pipeline.b", "pipeline.c", "pipeline.d", "pipeline.e",
                    "pipeline.sub", "pipeline.sub.f"}
