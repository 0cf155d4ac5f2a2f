"""Predicted against measured on this machine: per op category, ONNX Runtime's profiled
kernel time beside the roofline floor at the same shape, efficiency = floor / measured.

The feed is built from the graph's own inputs at the point's dims: token ids drawn below the
recipe's input range, an all-ones attention mask as long as past + new tokens, a past KV
cache of random values; the profile is explain/profile.py's (kernel time per node, median
over requests, an in-place KV cache bound as the runners bind it). Calibrate nothing: the
efficiency is what it is, and a category whose working set stays in cache may beat its DRAM
floor (efficiency above 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from pipeline.hardware.entry import HardwareEntry
from pipeline.recipe import Recipe
from pipeline.roofline import costs, model, shapes
from pipeline.roofline.points import Point

Feed = dict[str, np.ndarray]


@dataclass(frozen=True)
class CategoryCheck:
    category: str
    measured_us: float
    floor_us: float
    bound: str  # of the floor

    @property
    def efficiency(self) -> float | None:
        return self.floor_us / self.measured_us if self.measured_us > 0 else None


@dataclass(frozen=True)
class PointCheck:
    engine: str  # recipe/target
    point: str
    dims: dict[str, int]
    measured_us: float  # the profile's kernel time per request (sum over nodes)
    floor_us: float
    categories: list[CategoryCheck]
    threads: int | None
    method: str

    @property
    def efficiency(self) -> float:
        return self.floor_us / self.measured_us if self.measured_us else float("nan")


def feed(skel: shapes.Skeleton, dims: dict[str, int], recipe: Recipe, seed: int = 0) -> Feed:
    """Random inputs of the graph at `dims` (ids below the recipe's range, a ones mask)."""
    rng = np.random.default_rng(seed)
    ranges = {i.name: i.range for i in recipe.inputs if i.range}
    weights = set(skel.initializers)
    out: Feed = {}
    for inp in skel.model.graph.input:
        if inp.name in weights:
            continue
        t = inp.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else dims[d.dim_param] for d in t.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        if inp.name == "attention_mask":
            out[inp.name] = np.ones(shape, dtype)
        elif t.elem_type in (TensorProto.INT64, TensorProto.INT32):
            low, high = ranges.get(inp.name, (0, 256))
            out[inp.name] = rng.integers(int(low), int(high), size=shape).astype(dtype)
        else:
            out[inp.name] = (0.1 * rng.standard_normal(shape)).astype(dtype)
    return out


def check(recipe: Recipe, target: str, engine: Path, entry: HardwareEntry, points: list[Point],
          threads: int | None, runs: int = 10, warmup: int = 2) -> list[PointCheck]:
    """Each point profiled on ONNX Runtime and put beside its floor on `entry`, by category."""
    skel = shapes.skeleton(engine)
    return [point_check(skel, recipe, target, engine, entry, point, threads, runs, warmup)[0] for point in points]


def point_check(skel: shapes.Skeleton, recipe: Recipe, target: str, engine: Path, entry: HardwareEntry,
                point: Point, threads: int | None, runs: int = 10,
                warmup: int = 2) -> tuple[PointCheck, model.Roofline]:
    """One point: its roofline on `entry` and the profile beside it, every category either
    has (most floor first; a category with time but no floor keeps a zero floor)."""
    from pipeline.explain import profile

    roof = model.roofline(costs.graph_cost(skel, point.dims), entry, threads)
    floors = roof.by_category()
    prof = profile.profile_sessions({"engine": engine}, feed(skel, point.dims, recipe), runs=runs,
                                    warmup=warmup, threads=threads)["engine"]
    timed = {c: t.us for c, t in prof.categories.items() if t.us > 0}
    names = sorted(set(floors) | set(timed), key=lambda c: -(floors[c].time_s if c in floors else 0.0))
    cats = [CategoryCheck(c, timed.get(c, 0.0), floors[c].time_s * 1e6 if c in floors else 0.0,
                          floors[c].bound if c in floors else "memory") for c in names]
    return PointCheck(f"{recipe.name}/{target}", point.label, point.dims, prof.total_us, roof.time_s * 1e6, cats,
                      threads, prof.method), roof


def spread(checks: list[PointCheck]) -> tuple[float, float]:
    """(median, worst) whole-step efficiency over the points: how far to trust the model."""
    values = sorted(c.efficiency for c in checks)
    return float(np.median(values)), values[0]


def markdown(checks: list[PointCheck]) -> str:
    """Per point: whole step, then each category (measured, floor, efficiency, the floor's bound)."""
    lines = ["| engine | point | category | measured | floor | floor / measured | floor bound |",
             "|---|---|---|---:|---:|---:|---|"]
    for c in checks:
        lines.append(f"| {c.engine} | {c.point} | **whole step** | {c.measured_us / 1e3:,.3f} ms | "
                     f"{c.floor_us / 1e3:,.3f} ms | **{c.efficiency:.2f}** | |")
        for cat in c.categories:
            eff = f"{cat.efficiency:.2f}" if cat.efficiency is not None else "-"
            lines.append(f"| | | {cat.category} | {cat.measured_us / 1e3:,.3f} ms | {cat.floor_us / 1e3:,.3f} ms | "
                         f"{eff} | {cat.bound} |")
    return "\n".join(lines)
