"""load-<engine>[-<name>].json as pydantic models: what `pipeline load` measured against a
served recipe (pipeline/loadgen), read back by report.md and `compare --load`.

    LoadResult
      recipe, engine, url, mode (rate | sweep | capacity | closed | soak), arrival, slo
      requests: where the bodies came from      client: the generator's own limits
      points: [LoadPoint]  one per offered rate (or concurrency)
        rates, goodput, failures, latency_ms {p50, p90, p99, p99.9: Quantile}, late,
        queue_ms / compute_ms, batch_sizes, slo: [SloVerdict], resources: Resources,
        generation: TokenTimings, server_metrics: ServerMetrics (its /metrics' movement)
      capacity: Capacity | None    soak: Soak (windows: [SoakWindow], verdict) | None
      tasks: TaskLoad | None  (`--tasks`: multi-turn chat tasks; then `points` is empty)
        points: [TaskPoint]  time per task, per-turn token timings, goodput in tasks/s,
          answers under load beside the batch-1 score; capacity: Capacity (tasks/s)
      plot: the knee / soak / tasks PNG

pipeline/loadgen builds these where it measures (summary.summarize makes the LoadPoint) and
the store dumps them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pipeline.artifacts.base import Closed, Count, Device, FileName, Share

SCHEMA = 1


class Quantile(Closed):
    """A percentile (ms) and its distribution-free 95% interval; None: unbounded by the data."""

    value: float | None
    lo: float | None
    hi: float | None


class SloVerdict(Closed):
    term: str
    metric: Literal["latency", "ttft", "tpot", "task"]
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


# A percentile's name (p50, p90, p99, p99.9) -> its Quantile.
Percentiles = dict[str, Quantile]


class Resources(Closed):
    """The server's processes while a point ran (pipeline.loadgen.resources)."""

    cpu_pct_mean: float = Field(description="Percent of one core, summed over the processes.")
    cpu_pct_max: float
    rss_mib_mean: float
    rss_mib_peak: float
    samples: float = Field(description="Samples taken (a count, written as a number).")


class TokenTimings(Closed):
    """A generation point's token timings, from the client (ms) and the server's own."""

    ttft_ms: Percentiles = Field(description="Scheduled send to the first token.")
    tpot_ms: Percentiles = Field(description="Each request's mean gap after its first token.")
    itl_ms: Percentiles = Field(description="Every gap between two tokens, pooled.")
    e2e_ms: Percentiles = Field(description="The request's latency (the point's latency_ms).")
    tokens_per_s: float
    mean_tokens: float
    server_ttft_ms: Spread | None = None
    server_tpot_ms: Spread | None = None


class GaugeMove(Closed):
    """A server gauge over a point: before it, its highest during it, after it."""

    before: float | None
    peak: float | None
    after: float | None


class HistogramMove(Closed):
    """What a server histogram gained over a point: observations, their sum, and the
    cumulative count per bucket edge (`le`)."""

    count: float
    sum: float
    buckets: dict[str, float] = {}


class ServerMetrics(Closed):
    """The server's Prometheus /metrics scraped before, during and after a point
    (pipeline.loadgen.scrape): counters' increase, gauges' movement, histograms' gain."""

    url: str
    scrapes: Count = Field(description="Scrapes while the point ran (before and after apart).")
    counters: dict[str, float] = {}
    gauges: dict[str, GaugeMove] = {}
    histograms: dict[str, HistogramMove] = {}
    batch_histogram: str | None = Field(None, description="The batch-size histogram read.")
    mean_batch: float | None = Field(None, description="Its sum / count over the point.")


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
    latency_ms: Percentiles
    latency_mean_ms: float | None
    late: Late
    queue_ms: Spread | None
    compute_ms: Spread | None
    batch_sizes: dict[str, Count] = {}
    slo: list[SloVerdict] = []
    passed: bool | None = Field(description="The capacity criterion; None without an SLO.")
    resources: Resources | None = None
    generation: TokenTimings | None = None
    concurrency: Count | None = None
    server_metrics: ServerMetrics | None = None


class Capacity(Closed):
    capacity: float | None = Field(description="Highest offered rate that passed (requests/s).")
    bracket: list[float | None] = Field(description="[highest passing, lowest failing] rate.")
    converged: bool
    why: str


class SoakWindow(Closed):
    """One time window of a soak's point (by scheduled send time)."""

    start_s: float
    end_s: float
    requests: Count
    failures: Count
    p99_ms: Quantile
    ttft_p99_ms: Quantile | None = Field(None, description=(
        "Streamed generation: time to first token's p99 in the window (None for tensor models)."))
    tpot_p99_ms: Quantile | None = Field(None, description=(
        "Streamed generation: time per output token's p99 (requests of >= 2 tokens)."))
    rss_mib: float | None = Field(description="The server's mean RSS in the window.")
    cpu_pct: float | None
    cache_mib: float | None = Field(None, description=(
        "The mean memory the server's caches held by design in the window (its /metrics' "
        "pipeline:prefix_cache_bytes); None when it does not say."))


class Slope(Closed):
    """A least-squares slope per hour over the windows, with its 95% t-interval."""

    per_hour: float
    ci95: list[float]
    points: Count


class SoakVerdict(Closed):
    memory_slope_mib_per_hour: Slope | None
    uncached_slope_mib_per_hour: Slope | None = Field(None, description=(
        "The slope of RSS less what the server's caches hold (the verdict's, when the server "
        "says what they hold)."))
    p99_slope_ms_per_hour: Slope | None
    ttft_p99_slope_ms_per_hour: Slope | None = None  # streamed generation only
    tpot_p99_slope_ms_per_hour: Slope | None = None
    threshold_mib_per_hour: float
    leak: Literal["leak", "no leak", "inconclusive"]
    why: str


class Soak(Closed):
    windows: list[SoakWindow]
    verdict: SoakVerdict


class TaskTurn(Closed):
    """The n-th turn of every measured task: the conversation the server was given (its
    usage's prompt_tokens) and the time to its first token."""

    turn: Count = Field(description="1-based position in the task.")
    turns: Count = Field(description="Measured tasks that reached this turn.")
    prompt_tokens_mean: float | None = Field(description="The server's usage: the conversation so far.")
    prompt_tokens_min: Count | None
    prompt_tokens_max: Count | None
    cached_tokens_mean: float | None = Field(
        None, description="Of those, taken from the server's prefix cache, not prefilled (usage."
        "prompt_tokens_details.cached_tokens; null when the server does not say).")
    ttft_ms: Percentiles


class TaskAnswers(Closed):
    """The measured turns' replies graded as generation's task score grades them (a reply is
    right when an accepted answer appears in it as whole words), beside the engine's batch-1
    answers from report.json when the folder has them."""

    right: Count
    of: Count
    share: Share
    ci95: list[float] = Field(description="Wilson 95% interval of the share.")
    questions: Count = Field(description="Distinct questions asked.")
    batch1_share: Share | None = Field(description="report.json's share over the same questions.")
    batch1_questions: Count | None
    identical_to_batch1: Count | None = Field(description="Replies equal to the batch-1 reply.")
    compared: Count | None = Field(description="Replies with a batch-1 reply to compare to.")


class TaskPoint(Closed):
    """One load point of chat tasks: tasks arrive (open loop, offered tasks/s) or N task-users
    run them back to back (closed loop); a task's turns run in order, each carrying the
    conversation so far."""

    offered_rate: float = Field(description="Tasks/s asked for (closed loop: the scheduled rate).")
    scheduled_rate: float = Field(description="Tasks/s the measured schedule holds.")
    achieved_rate: float = Field(description="Completed tasks/s over the measured span.")
    goodput: float = Field(description="Tasks/s whose every turn (and the task) met the SLO.")
    goodput_share: Share = Field(description="Share of measured tasks that met the SLO.")
    concurrency: Count | None = None
    think_time_s: float
    tasks: Count
    tasks_ok: Count
    warmup_tasks: Count
    window_s: float
    turns: Count = Field(description="Turns sent by the measured tasks.")
    turns_ok: Count
    rejected: Count
    errors: Count
    timeouts: Count
    error_examples: list[str] = []
    time_per_task_ms: Percentiles = Field(description="Scheduled start to the last turn's last "
                                          "token; a failed task is infinitely late.")
    turn_timings: TokenTimings = Field(description="Every measured turn pooled.")
    per_turn: list[TaskTurn]
    answers: TaskAnswers
    late: Late
    slo: list[SloVerdict] = []
    passed: bool | None = Field(description="The capacity criterion; None without an SLO.")
    resources: Resources | None = None
    server_metrics: ServerMetrics | None = None


class TaskLoad(Closed):
    """`pipeline load --tasks`: the recipe's multi-turn chat scripts as the load."""

    source: str = Field(description="The scripts and questions files.")
    scripts: Count
    turns_per_task: list[Count] = Field(description="[fewest, most] turns in a script.")
    answer_tokens: Count = Field(description="max_tokens of each turn (workload.chat.answer_tokens).")
    min_tasks: Count = Field(description="Measured tasks per point (at least), and why.")
    min_tasks_why: str
    points: list[TaskPoint]
    capacity: Capacity | None = Field(None, description="In tasks/s.")


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
    tasks: TaskLoad | None = None
    plot: FileName | None = None
    device: Device
    extra: dict[str, Any] | None = None


def file_name(engine: str, name: str | None) -> str:
    return f"load-{engine}{'-' + name if name else ''}.json"

