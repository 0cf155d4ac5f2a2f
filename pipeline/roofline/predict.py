"""`pipeline predict`: each built engine's graph on a hardware entry's roofline, at the
recipe's workload points: TTFT (prefill) and TPOT (a decode step) with the decode curve and
the task for a generation recipe, latency per batch for a forward one.

On a specified device the figures are lower bounds from its maker's specifications, nothing
more: no runtime reaches a peak, and the ops the device's runtime lacks (support.py) would
run elsewhere or not at all. On this machine the report's measured figures stand beside the
floors (efficiency = floor / measured). The efficiency measured here is shown for a
specified device too, apart, never applied to its floors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.hardware.database import Looked
from pipeline.recipe import Recipe
from pipeline.roofline import costs, model, points, serve_suggestion, shapes, support

GRAPH_SOURCES = ("typed.onnx", "optimized.onnx", "model.onnx")  # the last graph a target builds from


@dataclass(frozen=True)
class PointFloor:
    label: str
    phase: str
    dims: dict[str, int]
    batch: int
    floor_ms: float
    flops: float
    bytes: int
    compute_bound_share: float
    categories: dict[str, float]  # category -> floor ms
    measured_ms: float | None = None  # this machine's report, where it measured this point

    @property
    def efficiency(self) -> float | None:
        return self.floor_ms / self.measured_ms if self.measured_ms else None


@dataclass(frozen=True)
class EnginePrediction:
    target: str
    kind: str
    graph: str  # the ONNX file costed
    points: list[PointFloor]
    task_ms: float | None
    task_measured_ms: float | None
    support: list[support.Support]
    threads: int | None = None  # at most this many threads' figures (a measured entry)
    notes: list[str] = field(default_factory=list)
    furthest: list[str] = field(default_factory=list)  # the report's: categories furthest above their floors


@dataclass(frozen=True)
class Prediction:
    recipe: str
    workload: str
    device: str
    title: str
    provenance: str
    label: str  # "lower bound from specifications" | "floor on this machine's measured figures"
    source: str
    bandwidth_bytes_per_s: float  # the memory figure the floors use (DRAM; a measured entry's best)
    engines: list[EnginePrediction]


def _graph(kind: str, engine_file: str, files: list[str]) -> tuple[str | None, str | None]:
    """(the ONNX file to cost, a note) for an engine of `kind`."""
    if engine_file.endswith(".onnx"):
        return engine_file, None
    source = next((f for f in GRAPH_SOURCES if f in files), None)
    if source is None:
        return None, f"{kind}: no ONNX graph in the folder to cost"
    return source, f"{kind} engines are not ONNX graphs: costed on {source}, the graph it was built from"


def _floor(skel: shapes.Skeleton, point: points.Point, looked: Looked, threads: int | None,
           measured: float | None = None) -> tuple[PointFloor, model.Roofline, costs.GraphCost]:
    cost = costs.graph_cost(skel, point.dims)
    roof = model.roofline(cost, looked.entry, threads)
    return PointFloor(point.label, point.phase, point.dims, point.batch, roof.time_s * 1e3, cost.flops, cost.bytes,
                      roof.compute_bound_share, {c: v.time_s * 1e3 for c, v in roof.by_category().items()},
                      measured), roof, cost


def _measured(entry, point: points.Point) -> float | None:
    """The report's p50 for this point, where it measured it (this machine only)."""
    gen = entry.generation
    if point.phase == "forward":
        return entry.latency_ms.p50 if point.report_key == "opt" and entry.latency_ms else None
    if gen is None or point.report_key not in (gen.points or {}):
        return None
    at = gen.points[point.report_key]
    summary = at.ttft_ms if point.phase == "prefill" else at.tpot_ms
    return summary.p50 if summary else None


def _task(skel, turns: list[points.TaskTurn], looked: Looked, threads: int | None) -> float:
    total = 0.0
    for turn in turns:
        total += _floor(skel, turn.prefill, looked, threads)[0].floor_ms
        if turn.steps:
            total += turn.steps * _floor(skel, turn.decode, looked, threads)[0].floor_ms
    return total


def engine(recipe: Recipe, entry, folder: Path, files: list[str], looked: Looked,
           workload: points.Points, here: bool) -> EnginePrediction:
    """One built engine's floors at the workload's points on `looked`'s device."""
    name, graph_note = _graph(entry.kind, Path(entry.path).name, files)
    notes = [n for n in (graph_note, support.engine_kind_note(entry.kind, looked.entry)) if n]
    if name is None:
        return EnginePrediction(entry.target, entry.kind, "-", [], None, None, [], notes=notes)
    skel = shapes.skeleton(folder / name)
    threads = (entry.threads or recipe.validate_.threads) if here else None
    floors, fallbacks, unknown, method = [], set(), 0, ""
    for point in workload.points:
        floor, roof, cost = _floor(skel, point, looked, threads, _measured(entry, point) if here else None)
        floors.append(floor)
        fallbacks.update(roof.fallbacks)
        unknown, method = max(unknown, cost.unknown), cost.shape_method
    task = _task(skel, workload.task, looked, threads) if workload.task else None
    gen = entry.generation
    task_measured = gen.time_per_task_s * 1e3 if here and gen and gen.time_per_task_s else None
    notes += sorted(fallbacks)
    if unknown:
        notes.append(f"{unknown} values of unknown shape counted as 0 bytes ({method})")
    furthest = list(entry.roofline.furthest) if entry.roofline else []  # profiled at build time, here
    return EnginePrediction(entry.target, entry.kind, name, floors, task, task_measured,
                            support.support(skel, looked.entry), threads, notes, furthest)


def built_engines(folder: Path) -> tuple[list, list[str]]:
    """(the report's built engines, the folder's files), each engine's graph to cost verified
    against the manifest."""
    from pipeline.artifacts import recorded
    from pipeline.store.recipe_folder import Store

    store = Store(folder.parent, folder.name)
    report = recorded.report(store.read_json("report.json"))
    files = sorted(store.manifest.files)
    built = [e for e in report.engines if e.status == "built" and e.path]
    for entry in built:
        name, _ = _graph(entry.kind, Path(entry.path).name, files)
        if name is not None:
            store.verify(name)  # the costed graph is the one the manifest recorded
    return built, files


def predict(recipe: Recipe, folder: Path, looked: Looked, source: points.PointSource,
            context: int | None = None) -> Prediction:
    """Every built engine of the recipe's folder (verified against its manifest) on the device,
    at the points `source` (the recipe's workload) gives."""
    built, files = built_engines(folder)
    here = looked.entry.provenance == "measured"
    engines = [engine(recipe, entry, folder, files, looked, source.roofline_points(recipe, context), here)
               for entry in built]
    e = looked.entry
    src = e.source
    return Prediction(
        recipe=recipe.name, workload=recipe.workload.kind, device=e.name, title=e.title, provenance=e.provenance,
        label=("lower bound from specifications" if e.provenance == "specified"
               else "floor on this machine's measured figures"),
        source=f"{src.document}{f' <{src.url}>' if src.url else ''}, {src.date}",
        bandwidth_bytes_per_s=e.memory().bytes_per_s, engines=engines)


def serve_suggestions(recipe: Recipe, folder: Path,
                      looked: Looked) -> list[tuple[str, serve_suggestion.ServeSuggestion | str]]:
    """(target, its ServeSuggestion or why there is none) per built engine: the decode curve at
    the workload's longest context, with a serving replica's threads on this machine."""
    built, files = built_engines(folder)
    here = looked.entry.provenance == "measured"
    threads = (recipe.serve.threads or max(1, int(recipe.serve.replica_cpus))) if here else None
    memory, memory_source = serve_suggestion.memory_of(looked.entry)
    out: list[tuple[str, serve_suggestion.ServeSuggestion | str]] = []
    for entry in built:
        name, note = _graph(entry.kind, Path(entry.path).name, files)
        if name is None:
            out.append((entry.target, note))
            continue
        try:
            out.append((entry.target, serve_suggestion.suggest(shapes.skeleton(folder / name), looked.entry, threads,
                                                               recipe.workload.context_max(), memory,
                                                               memory_source)))
        except ValueError as e:
            out.append((entry.target, str(e)))
    return out
