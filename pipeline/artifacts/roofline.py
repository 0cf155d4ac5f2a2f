"""An engine's time against its roofline floor on this machine (EngineResult.roofline): per
workload point, ONNX Runtime's profiled kernel time per op category beside the floor the
graph's FLOPs and bytes set on this machine's measured hardware (pipeline/roofline), with
efficiency = floor / measured. Written by pipeline/roofline/report_section.py."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.artifacts.base import Closed

Bound = Literal["compute", "memory"]


class CategoryVsFloor(Closed):
    category: str = Field(description="explain.profile's op category.")
    measured_ms: float = Field(description="The profile's kernel time per request, summed over the category's nodes.")
    floor_ms: float
    efficiency: float | None = Field(description="floor / measured; None: nothing measured.")
    bound: Bound = Field(description="What holds most of the category's floor.")
    above_floor_ms: float = Field(description="measured - floor: the time there is to win.")


class PointVsFloor(Closed):
    point: str = Field(description="prefill 128, decode @136, batch 8 ...")
    phase: Literal["prefill", "decode", "forward"]
    dims: dict[str, int]
    measured_ms: float = Field(description="The profile's kernel time per request (sum over nodes).")
    floor_ms: float = Field(description="The sum of the categories' floors: the whole step's.")
    efficiency: float | None
    compute_floor_ms: float = Field(description="The compute time alone (FLOPs / peak), summed over nodes.")
    compute_bound_share: float = Field(description="The share of the floor under compute-bound nodes.")
    report_p50_ms: float | None = Field(None, description="The workload's own wall-clock p50 at this point.")
    categories: list[CategoryVsFloor] = Field(description="Most time above the floor first.")


class LongPrefill(Closed):
    """The longest prefill the workload timed, costed (not profiled again: its p50 TTFT is the
    workload's own wall-clock figure)."""

    point: str
    tokens: int
    floor_ms: float
    compute_floor_ms: float
    compute_bound_share: float
    measured_ms: float | None = Field(description="The workload's p50 TTFT at this prompt length.")
    times_floor: float | None = Field(description="measured / floor.")
    times_compute_floor: float | None = Field(description="measured / the compute floor.")


class RooflineCheck(Closed):
    """How the floors were made (hardware entry, cached or measured now, threads) and how the
    time was measured; `reason`: why there are no points (not an ONNX Runtime CPU engine, ...)."""

    hardware: str = Field("", description="The hardware entry: device, provenance, when measured.")
    hardware_source: str = Field("", description="Where the report took it from: the cache file, or measured now.")
    threads: int | None = None
    bandwidth_gb_s: float | None = None
    peaks: dict[str, float] = Field(default_factory=dict, description="dtype -> G ops/s at `threads`.")
    method: str = ""
    points: list[PointVsFloor] = []
    long_prefill: LongPrefill | None = None
    furthest: list[str] = Field(default_factory=list, description="Where to look: the categories most "
                                "time above their floors, over the points.")
    notes: list[str] = []
    reason: str | None = None
