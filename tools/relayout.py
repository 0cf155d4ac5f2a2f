"""Rewrite references to modules the `layout:` commit moved into packages (a one-off for branches
started before it): `python tools/relayout.py FILE...` rewrites dotted module paths
(pipeline.models -> pipeline.model.sources), `from pipeline import x` lines, `from
pipeline.stages import compare` lines and slash paths (pipeline/models.py) in place."""

from __future__ import annotations

import re
import sys
from pathlib import Path

MOVES = {
    "run": "run.execute",
    "chain": "run.chain",
    "stage_cache": "run.stage_cache",
    "preflight": "run.preflight",
    "code_digest": "run.code_digest",
    "limits": "run.limits",
    "stages.openers": "run.openers",
    "store": "store.recipe_folder",
    "folders": "store.folder_names",
    "safe_files": "store.safe_files",
    "paths": "store.paths",
    "npz_files": "data.npz_files",
    "models": "model.sources",
    "hf": "model.hf",
    "user_code": "model.user_code",
    "shapes": "model.shapes",
    "onnx_info": "model.onnx_info",
    "metrics": "metrics.accuracy",
    "task_metrics": "metrics.task",
    "tune_metrics": "metrics.budget",
    "generation.metrics": "metrics.generation",
    "deploy": "commands.deploy",
    "tune": "commands.tune",
    "verify": "commands.verify",
    "ci": "commands.ci",
    "stages.bench": "commands.bench",
    "stages.compare": "commands.compare",
}

_DONE = "\x00pipeline\x00"
_ALT = "|".join(re.escape(old) for old in sorted(MOVES, key=len, reverse=True))
_DOTTED = re.compile(rf"\bpipeline\.({_ALT})(?![\w])")
_SLASHED = re.compile(rf"\bpipeline/({'|'.join(re.escape(o.replace('.', '/')) for o in sorted(MOVES, key=len, reverse=True))})\.py\b")
# `from pipeline import a, b as c` / `from pipeline.stages import x` (one line or parenthesized)
_NEW = set(MOVES.values())
_FROM = re.compile(r"^(?P<indent>[ \t]*)from pipeline(?P<pkg>(?:\.\w+)?) import (?P<names>\([^)]*\)|[^\n#]+?)(?P<tail>[ \t]*(?:#[^\n]*)?)$",
                   re.M)


def _from_line(m: re.Match) -> str:
    pkg = m["pkg"][1:] if m["pkg"] else ""
    raw = m["names"].strip().strip("()")
    items = [i.strip() for i in raw.replace("\n", " ").split(",") if i.strip()]
    if pkg in MOVES and all(f"{pkg}.{i.split(' as ')[0].strip()}" in _NEW for i in items):
        return m.group(0).replace("from pipeline", f"from {_DONE}", 1)  # already new
    kept, moved = [], []
    for item in items:
        name = item.split(" as ")[0].strip()
        full = f"{pkg}.{name}" if pkg else name
        if full in MOVES:
            new = MOVES[full]
            parent, _, leaf = new.rpartition(".")
            alias = item.split(" as ")[1].strip() if " as " in item else (name if leaf != name else None)
            moved.append(f"{m['indent']}from {_DONE}.{parent} import {leaf}" + (f" as {alias}" if alias and alias != leaf else ""))
        else:
            kept.append(item)
    if not moved:
        return m.group(0)
    lines = []
    if kept:
        lines.append(f"{m['indent']}from pipeline{m['pkg']} import {', '.join(kept)}{m['tail']}")
    lines.extend(moved)
    return "\n".join(lines)


def _dotted(m: re.Match) -> str:
    # `pipeline.store.recipe_folder` is already new: a module of the package that replaced
    # the old module `pipeline.store` (so running this twice changes nothing)
    leaf = re.match(r"\.(\w+)", m.string[m.end():])
    if leaf and f"{m[1]}.{leaf[1]}" in _NEW:
        return m.group(0)
    return f"{_DONE}." + MOVES[m[1]]


def rewrite(text: str) -> str:
    # rewritten names carry a marker until the end, so no rule rewrites them twice
    text = _FROM.sub(_from_line, text)
    text = _DOTTED.sub(_dotted, text)
    text = _SLASHED.sub(lambda m: f"{_DONE}/" + MOVES[m[1].replace("/", ".")].replace(".", "/") + ".py", text)
    return text.replace(_DONE, "pipeline")


def main(argv: list[str]) -> None:
    for name in argv:
        path = Path(name)
        try:
            old = path.read_text()
        except UnicodeDecodeError:
            continue
        new = rewrite(old)
        if new != old:
            path.write_text(new)
            print(f"rewrote {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
