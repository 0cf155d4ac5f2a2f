"""The generation section of an engine's result (EngineResult.generation) and of the baseline
stage's meta (Baseline.generation) as pydantic models: what the generation workload measured.

Every figure says what was timed: `ttft_ms` the prefill of a request's first turn (its first
token), `tpot_ms` one decode step (time per output token), `time_s` / `time_per_task_s` a
whole request. They are built where they are measured (generation/figures.py,
workloads/generation_measure.py) and dumped only at the store, with the keys, order and
values report.json and validate-<target>.json have always had.

    Generation
      runners, genai_config, ttft_ms / tpot_ms (the headline point), tokens_per_s {point},
      time_per_task_s, memory, kv_cache_accuracy, token_agreement, points {label: Point},
      score, baseline (BaselineSide), floor (DecodeFloor)
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pipeline.artifacts.base import Closed, Cosine, Count, Open, Share
from pipeline.artifacts.latency import LatencySummary, Speedup

# The headline of a generation engine (its `latency_ms`, `baseline_latency_ms`, speedup): the
# decode step at batch 1, as a table shows it; the baseline stage's `latency_ms` is the same.
HEADLINE_TIMED = "decode step"


class TokensPerSecond(Closed):
    per_sequence: float
    aggregate: float = Field(description="per_sequence x batch.")


class Phases(Closed):
    """Where a request's time went, medians over rounds (seconds)."""

    prefill: float
    decode: float


class Turn(Closed):
    """One turn of the task: its prefill and its median decode step (ms), medians over rounds."""

    ttft_ms: float
    tpot_ms: float


class ContextBin(Closed):
    """TPOT p50 over the decode steps whose cache held `context` [first, last] tokens."""

    context: list[int] = Field(min_length=2, max_length=2)
    tpot_ms_p50: float


class PhaseSpeedups(Closed):
    """The engine against the baseline on one request, per phase (interleaved rounds)."""

    ttft: Speedup = Field(description="The first turn's prefill.")
    tpot: Speedup = Field(description="Every decode step.")
    total: Speedup = Field(description="The whole request.")


class Point(Closed):
    """One runner on one request of the workload (a prompt length x batch point, the task, the
    long point). `runner` and `speedup_vs_baseline`: the engine's points only."""

    batch: Count
    prompt_tokens: list[int]
    new_tokens: list[int]
    ttft_ms: LatencySummary = Field(description="The first turn's prefill, one per round.")
    tpot_ms: LatencySummary = Field(description="Every decode step of every round.")
    tokens_per_s: TokensPerSecond
    time_s: float = Field(description="The whole request, median over rounds.")
    phases_s: Phases
    rounds: Count
    time_per_task_s: float | None = Field(None, description="The task: the whole conversation.")
    turns: list[Turn] | None = None
    runner: str | None = None
    speedup_vs_baseline: PhaseSpeedups | None = None
    tpot_vs_context: list[ContextBin] | None = Field(None, description="The long point only.")


class Runners(Closed):
    engine: list[str] = Field(description="The runners that drove the engine.")
    baseline: str
    per_point: dict[str, str]


class PeakMemory(Closed):
    peak_rss_bytes: Count
    growth_bytes: Count


class Memory(Closed):
    """Each runner in a process of its own while it generates `request`."""

    peak: dict[str, PeakMemory]
    load_rss_bytes: dict[str, Count]
    before_runner_bytes: dict[str, Count]
    request: str
    method: str
    kv_cache_bytes_per_token: Count
    kv_cache_bytes_at_peak: Count


class KvCacheAccuracy(Closed):
    """The KV-cache outputs (present.*) in one summary; their error shows, gated, in the logits."""

    outputs: Count
    worst: str
    worst_cosine: Cosine
    mean_cosine: Cosine
    max_abs: float
    nonfinite: Count
    gated: bool


class Agreement(Closed):
    """The engine's greedy tokens against PyTorch's on one request."""

    share: Share
    tokens: Count
    first_divergence: int | None


class TokenAgreement(Closed):
    share: Share | None = Field(description="Over every point's tokens; null without tokens.")
    first_divergence: int | None = Field(description="The task's.")
    per_point: dict[str, Agreement]
    note: str | None = None


class Answer(Closed):
    id: int
    reply: str
    correct: bool


class AnswerAccuracy(Closed):
    """Share of questions answered right, engine against PyTorch on the same questions."""

    metric: Literal["answer_accuracy"]
    baseline: Share
    engine: Share
    delta: float
    ci95: list[float] = Field(description="Paired-bootstrap interval of the delta.")
    engine_ci95: list[float]
    baseline_ci95: list[float]
    correct: Count
    baseline_correct: Count
    questions: Count


class IdenticalAnswers(Closed):
    """Answers identical to PyTorch's token for token."""

    share: Share | None
    count: Count
    of: Count


class PerplexityScore(Closed):
    """Held-out perplexity, engine against PyTorch on the same tokens."""

    metric: Literal["perplexity"]
    baseline: float
    engine: float
    delta: float
    ci95: list[float]
    ratio: float = Field(description="Engine's perplexity over PyTorch's.")
    ratio_ci95: list[float]
    tokens: Count
    blocks: Count


class SecondsPerAnswer(Closed):
    engine: float
    baseline: float


class EngineScore(Open):
    """The chat task: the engine's answers and perplexity against PyTorch's
    (generation/score.py compare)."""

    answer_accuracy: AnswerAccuracy
    identical_answers: IdenticalAnswers
    perplexity: PerplexityScore
    seconds_per_answer: SecondsPerAnswer
    answers: list[Answer]


class BaselineScore(Open):
    """PyTorch's own answers and perplexity (generation/score.py summary)."""

    answer_accuracy: float
    answer_accuracy_ci95: list[float]
    correct: Count
    questions: Count
    perplexity: float
    perplexity_tokens: Count
    seconds_per_answer: float
    answers: list[Answer]


class FloorPoint(Closed):
    context: Count
    bytes: Count = Field(description="What one decode step reads: the weights and the cache.")
    floor_ms: float
    tpot_ms: float | None = None
    tpot_over_floor: float | None = None


class DecodeFloor(Open):
    """Bytes per decode step over measured bandwidth (bench/floor.py), per batch-1 point."""

    bandwidth_gb_s: float
    bandwidth_method: str
    bandwidth_measured: str
    weights_bytes: Count
    weights_by_dtype: dict[str, Count]
    gather_table_bytes: Count
    kv_bytes_per_token: Count
    points: dict[str, FloorPoint]
    baseline: DecodeFloor | None = Field(None, description="The exported FP32 graph's weights.")


class BaselineSide(Closed):
    """PyTorch timed interleaved with the engine: the same figures, its side."""

    ttft_ms: LatencySummary
    tpot_ms: LatencySummary
    time_per_task_s: float
    points: dict[str, Point]


class Generation(Open):
    """An engine's generation section. ttft_ms / tpot_ms: the headline point's (batch 1,
    the first prompt length)."""

    runners: Runners
    genai_config: str
    ttft_ms: LatencySummary
    tpot_ms: LatencySummary
    tokens_per_s: dict[str, TokensPerSecond]
    time_per_task_s: float
    memory: Memory
    kv_cache_accuracy: KvCacheAccuracy | None
    token_agreement: TokenAgreement
    points: dict[str, Point]
    score: EngineScore | None = None
    baseline: BaselineSide
    floor: DecodeFloor | None = None


class BaselineGeneration(Open):
    """The baseline stage's generation section: PyTorch (static KV cache) alone per request."""

    workload: dict[str, Any] = Field(description="The recipe's workload, as it ran.")
    points: dict[str, Point]
    score: BaselineScore | None = None
