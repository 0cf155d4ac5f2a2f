"""Timed figures every artifact shares: a latency summary, a cold start, a speed-up with its
interval and verdict. What was timed (a request, a prefill, a decode step) is said by the field
that holds one (EngineResult.latency_ms, Point.tpot_ms, ...), never by these shapes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from pipeline.artifacts.base import Closed, Count, Ratio
from pipeline.artifacts.verdicts import verdict_problem

Verdict = Literal["faster", "slower", "indistinguishable"]
Interval = Annotated[list[float], Field(min_length=2, max_length=2, description="[low, high]")]
RatioInterval = Annotated[list[Ratio], Field(min_length=2, max_length=2, description="[low, high]")]


class LatencySummary(Closed):
    """Milliseconds per timed unit (core.stats.summary): a request, a prefill or a decode step,
    as the field holding it says; `n` counts those units."""

    p50: float
    p90: float
    p99: float
    mean: float
    std: float
    min: float | None = None
    max: float | None = None
    cov: float = Field(description="std / mean.")
    n: Count = Field(description="Units timed (requests, prefills or decode steps).")
    throughput_per_s: float | None = None
    p50_ci95_rel_halfwidth: float | None = Field(
        None, description="Half the 95% interval of p50, as a fraction of p50 (order statistics).")


class ColdStart(Closed):
    """Load + first request, one sample, with the runtimes already imported."""

    load: float
    first_request: float
    total: float
    n: Count


class Speedup(Closed):
    """Baseline time / engine time over interleaved rounds, and the engine's verdict."""

    ratio: Ratio
    ci95: RatioInterval
    verdict: Verdict
    noise_threshold: float = Field(description="The band around 1 a verdict must clear.")
    blocks: Count | None = Field(None, description="Rounds timed (block pairs).")

    @model_validator(mode="after")
    def _verdict_follows(self) -> Speedup:
        problem = verdict_problem(self.verdict, *self.ci95, self.noise_threshold, time_ratio=False)
        if problem:
            raise ValueError(problem)
        return self
