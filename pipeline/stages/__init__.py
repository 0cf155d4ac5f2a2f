"""The cached stages: export, optimize, precision (graph stages), build, baseline and
validate (validate.py), versus, report. Which stages exist and what each one's cache key
holds: the `Stage` records in run/stage_cache.py.

A graph stage turns one ONNX graph into the next and keeps the GraphStage contract below;
the chain (run/chain.py) runs them in order and preflight asks each for its user errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pipeline.core.errors import DependencyError


@dataclass
class Produced:
    """What a stage made: its files ({name: path in its workdir}), its meta (recorded in the
    manifest, read back on a cache hit) and its records ({file name: pydantic model}: the
    run passes them on in memory; the StageCache dumps each as JSON only when it commits
    the stage). A stage writes only into its workdir."""

    files: dict[str, Path] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    records: dict[str, Any] = field(default_factory=dict)


class GraphStage(Protocol):
    """A module that turns the graph before it into the next one.

    NAME          its stage id
    SECTIONS      the recipe sections its cache key holds (unless `spec` says more)
    enabled(recipe) -> bool                 does this recipe run it
    preflight(recipe) -> None               user errors, raised before any stage works
    spec(recipe) -> object                  its cache key's recipe part
    run(recipe, graph, workdir, verbose) -> Produced: its first file is the next graph
    summary(meta) -> str | None             a line after it ran (None: nothing to add)
    """

    NAME: str
    SECTIONS: tuple[str, ...]

    def enabled(self, recipe) -> bool: ...

    def preflight(self, recipe) -> None: ...

    def spec(self, recipe) -> object: ...

    def run(self, recipe, graph, workdir: Path, verbose: bool = False) -> Produced: ...

    def summary(self, meta: dict) -> str | None: ...


GRAPH_STAGE_NEEDS = ("NAME", "SECTIONS", "enabled", "preflight", "spec", "run", "summary")


def graph_stage(module: Any) -> GraphStage:
    """`module` if it keeps the GraphStage contract, else one error naming what it lacks."""
    missing = [name for name in GRAPH_STAGE_NEEDS if not hasattr(module, name)]
    if missing:
        raise DependencyError(f"graph stage {getattr(module, '__name__', module)} lacks "
                              f"{', '.join(missing)} (see pipeline/stages/__init__.py)")
    return module
