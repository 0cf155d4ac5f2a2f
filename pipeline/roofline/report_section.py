"""The report's "where the time goes against the floor": for one built ONNX Runtime engine,
at the workload's own points (a generation recipe's first prefill and the decode step in the
middle of its generation; a forward recipe's request shape, the dims' opt), ONNX Runtime's
profiled kernel time per op category beside the roofline floor on this machine's hardware
entry, efficiency = floor / measured; and the longest prefill the workload timed, costed and
put beside its p50 TTFT (not profiled again: a 5,120-token prefill takes seconds a run).

Kept cheap, since every build pays for it: the graph is costed in well under a second, each
point profiled over a few requests (RUNS), and the hardware entry read from `pipeline hw`'s
cache (measured, about 10 s, only when this device identity has none: the section says which).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.artifacts.generation import Generation
from pipeline.artifacts.roofline import CategoryVsFloor, LongPrefill, PointVsFloor, RooflineCheck
from pipeline.hardware.database import Looked
from pipeline.recipe import Recipe
from pipeline.roofline import costs, measured, model, points, shapes

RUNS = (2, 8)  # warm-up, profiled requests per point
FURTHEST = 3  # categories named as the place to look


def hardware_line(looked: Looked) -> tuple[str, str]:
    """(the entry, where the report took it from)."""
    e = looked.entry
    entry = f"{e.title} ({e.provenance} {e.source.date}; {e.source.notes})".replace("; )", ")")
    where = (f"cached by `pipeline hw` in {looked.path}" if looked.cached
             else f"measured now (no cached entry for this device identity), cached in {looked.path}")
    return entry, where


def _report_p50(point: points.Point, generation: Generation | None, latency_p50: float | None) -> float | None:
    if point.phase == "forward":
        return latency_p50
    at = (generation.points if generation else {}).get(point.report_key or "")
    if at is None:
        return None
    return (at.ttft_ms if point.phase == "prefill" else at.tpot_ms).p50


def _point(check: measured.PointCheck, roof: model.Roofline, point: points.Point,
           p50: float | None) -> PointVsFloor:
    cats = [CategoryVsFloor(category=c.category, measured_ms=c.measured_us / 1e3, floor_ms=c.floor_us / 1e3,
                            efficiency=c.efficiency, bound=c.bound,  # type: ignore[arg-type]
                            above_floor_ms=(c.measured_us - c.floor_us) / 1e3)
            for c in check.categories]
    cats.sort(key=lambda c: -c.above_floor_ms)
    return PointVsFloor(
        point=point.label, phase=point.phase, dims=dict(point.dims),  # type: ignore[arg-type]
        measured_ms=check.measured_us / 1e3, floor_ms=sum(c.floor_ms for c in cats),
        efficiency=check.efficiency if check.measured_us else None,
        compute_floor_ms=sum(n.compute_s for n in roof.nodes) * 1e3, compute_bound_share=roof.compute_bound_share,
        report_p50_ms=p50, categories=cats)


def long_prefill(skel: shapes.Skeleton, workload: points.Points, looked: Looked, threads: int | None,
                 generation: Generation | None) -> LongPrefill | None:
    """The longest prompt the workload timed (the long point's, else the longest prompt length),
    its floor and compute floor beside the workload's p50 TTFT there; None without a prefill."""
    longest = workload.longest_prefill()
    if longest is None:
        return None
    tokens = longest.tokens
    roof = model.roofline(costs.graph_cost(skel, longest.dims), looked.entry, threads)
    at = (generation.points if generation else {}).get(longest.report_key or "")
    got = at.ttft_ms.p50 if at is not None else None
    floor, compute = roof.time_s * 1e3, sum(n.compute_s for n in roof.nodes) * 1e3
    return LongPrefill(point=f"prefill {tokens}", tokens=tokens, floor_ms=floor, compute_floor_ms=compute,
                       compute_bound_share=roof.compute_bound_share, measured_ms=got,
                       times_floor=got / floor if got and floor else None,
                       times_compute_floor=got / compute if got and compute else None)


def furthest(found: list[PointVsFloor], top: int = FURTHEST) -> list[str]:
    """The categories with the most time above their floors, over the points: where to look."""
    rows = sorted(((c, p) for p in found for c in p.categories if c.above_floor_ms > 0),
                  key=lambda cp: -cp[0].above_floor_ms)[:top]
    return [f"{p.point}: {c.category} {c.above_floor_ms:,.3f} ms above its {c.bound}-bound floor "
            f"(efficiency {c.efficiency:.2f}; {c.measured_ms / p.measured_ms:.0%} of the step)"
            for c, p in rows if c.efficiency is not None]


def check(recipe: Recipe, source: points.PointSource, kind: str, engine: Path, device: str | None,
          threads: int | None, generation: Generation | None = None,
          latency_p50: float | None = None) -> RooflineCheck:
    """The section for one engine at the points `source` (the recipe's workload) marks
    profiled (a reason instead of points where there is nothing to profile)."""
    if kind != "onnxruntime" or engine.suffix != ".onnx" or (device or "cpu") != "cpu":
        return RooflineCheck(reason=f"{kind} on {device or 'cpu'}: the profile and floors cover ONNX Runtime "
                             "engines on this machine's CPU")
    try:
        return _check(recipe, source.roofline_points(recipe), engine, threads, generation, latency_p50)
    except Exception as e:  # noqa: BLE001  (a report section: never the reason a build the gates passed fails)
        return RooflineCheck(reason=f"not computed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


def _check(recipe: Recipe, workload: points.Points, engine: Path, threads: int | None,
           generation: Generation | None, latency_p50: float | None) -> RooflineCheck:
    from pipeline.hardware import database

    looked = database.this_machine()
    entry, where = hardware_line(looked)
    skel = shapes.skeleton(engine)
    found, method, notes = [], "", set()
    for point in workload.profiled():
        one, roof = measured.point_check(skel, recipe, "", engine, looked.entry, point, threads, RUNS[1], RUNS[0])
        found.append(_point(one, roof, point, _report_p50(point, generation, latency_p50)))
        method, notes = one.method, notes | set(roof.fallbacks)
        unknown = costs.graph_cost(skel, point.dims).unknown  # graph_cost is cheap; Roofline keeps no count
        if unknown:
            notes.add(f"{point.label}: {unknown} values of unknown shape counted as 0 FLOPs and bytes "
                      "(the floor is too low there)")
    bandwidth = looked.entry.memory("DRAM", threads).bytes_per_s
    peaks = {p: looked.entry.peak(p, threads) for p in ("fp32", "int8", "bf16", "fp16")}
    return RooflineCheck(
        hardware=entry, hardware_source=where, threads=threads, bandwidth_gb_s=bandwidth / 1e9,
        peaks={p: v.ops_per_s / 1e9 for p, v in peaks.items() if v is not None and v.ops_per_s},
        method="floor per node = max(FLOPs / the peak of its type, bytes / DRAM bandwidth), summed "
               f"(pipeline/roofline); measured: {method}",
        points=found, long_prefill=long_prefill(skel, workload, looked, threads, generation),
        furthest=furthest(found), notes=sorted(notes))
