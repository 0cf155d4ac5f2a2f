"""load-<engine>[-<name>].json as pydantic models: what `pipeline load` measured against a
served recipe (pipeline/loadgen), read back by report.md and `compare --load`.

    LoadResult
      recipe, engine, url, mode (rate | sweep | capacity | closed | soak), arrival, slo
      requests: where the bodies came from      client: the generator's own limits
      points: [LoadPoint]  one per offered rate (or concurrency)
        rates, goodput, failures, latency_ms {p50, p90, p99, p99.9: Quantile}, late,
        queue_ms / compute_ms, batch_sizes, slo: [SloVerdict], resources, generation
      capacity: Capacity | None    soak: Soak | None    plot: the knee / soak PNG
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pipeline.artifacts.base import Closed, Count, Device, FileName

SCHEMA = 1


class Quantile(Closed):
    """A percentile (ms) and its distribution-free 95% interval; None: unbounded by the data."""

    value: float | None
    lo: float | None
    hi: float | None


class SloVerdict(Closed):
    term: str
    metric: Literal["latency", "ttft", "tpot"]
    percentile: float
    bound_ms: float
    over: Count = Field(description="Requests over the bound (failed ones included).")
    sample_percentile_ms: float | None
    early_stopping: bool = Field(description="MLPerf LoadGen's rule at 99% confidence.")
    passed: bool
    more_needed: Count = Field(description="Requests, all within the bound, still needed to pass.")


class Late(Closed):
    share: float = Field(description="Share of requests sent > 2 ms after their scheduled time.")
    p99_ms: float
    max_ms: float


class Spread(Closed):
    mean: float
    p50: float
    p99: float


class LoadPoint(Closed):
    offered_rate: float = Field(description="Requests/s asked for (closed loop: users).")
    scheduled_rate: float = Field(description="Requests/s the measured schedule holds.")
    achieved_rate: float = Field(description="Answered requests/s over the measured span.")
    goodput: float = Field(description="Requests/s answered within every SLO bound.")
    requests: Count
    warmup_requests: Count
    window_s: float
    ok: Count
    rejected: Count = Field(description="503: the server's queue was full.")
    errors: Count
    timeouts: Count
    error_examples: list[str] = []
    latency_ms: dict[str, Quantile]
    latency_mean_ms: float | None
    late: Late
    queue_ms: Spread | None
    compute_ms: Spread | None
    batch_sizes: dict[str, Count] = {}
    slo: list[SloVerdict] = []
    passed: bool | None = Field(description="The capacity criterion; None without an SLO.")
    resources: dict[str, float] | None = None
    generation: dict[str, Any] | None = None
    concurrency: Count | None = None


class Capacity(Closed):
    capacity: float | None = Field(description="Highest offered rate that passed (requests/s).")
    bracket: list[float | None] = Field(description="[highest passing, lowest failing] rate.")
    converged: bool
    why: str


class Soak(Closed):
    windows: list[dict[str, Any]]
    verdict: dict[str, Any]


class LoadResult(Closed):
    schema_: Literal[1] = Field(SCHEMA, alias="schema")
    recipe: str
    engine: str
    name: str | None = Field(None, description="--name: which serving variant (e.g. b1).")
    created: str
    url: str
    mode: Literal["rate", "sweep", "capacity", "closed", "soak"]
    arrival: str
    burstiness: float
    seed: int
    slo: str | None
    requests: dict[str, Any] = Field(description="Where the request bodies came from.")
    client: dict[str, Any] = Field(description="The load generator's settings and limits.")
    server: dict[str, Any] = Field(description="How the server was reached or started.")
    points: list[LoadPoint]
    capacity: Capacity | None = None
    soak: Soak | None = None
    plot: FileName | None = None
    device: Device
    extra: dict[str, Any] | None = None


def file_name(engine: str, name: str | None) -> str:
    return f"load-{engine}{'-' + name if name else ''}.json"

