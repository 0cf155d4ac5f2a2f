"""report.json (schema 3) and validate-<target>.json as pydantic models: the report contract.

    Report
      device, versions, export | optimize | precision (graph stages' meta), baseline, data
      engines: [EngineResult]   (validate-<target>.json is one EngineResult)
        accuracy {output: OutputAccuracy}, latency_ms / baseline_latency_ms (LatencySummary),
        speedup_vs_baseline (Speedup), cold_start_ms (ColdStart), sweep [SweepPoint],
        resources, gates [Gate], versus [Versus], task, generation (artifacts/generation.py)

Extra keys: `Closed` (refused) wherever the pipeline writes the whole shape (the report, an
engine, a gate, a speedup...): a key no writer declared is a file changed by hand or an
undeclared writer, and either must fail loudly. `Open` (kept) where the shape grows outside
the validation code: the device block, measured resources, and the sections other stages
are adding (data provenance, task metrics, generation). The graph stages' meta (export,
optimize, precision) and backend details (effective precision, TensorRT runtime) belong to
the stages and backends that write them; they are objects here, typed when a second reader
needs them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from pipeline.artifacts.base import Closed, Cosine, Count, Device, FileName, Open, Sha256, Share
from pipeline.artifacts.generation import HEADLINE_TIMED, BaselineGeneration, Generation
from pipeline.artifacts.latency import (  # noqa: F401  (re-exported: the report's own names)
    ColdStart,
    Interval,
    LatencySummary,
    Speedup,
    Verdict,
)
from pipeline.artifacts.roofline import RooflineCheck
from pipeline.artifacts.verdicts import gate_problems, verdict_problem

SCHEMA = 3  # 3: effective precision split by runtime (ort_flop_shares, tensorrt_layer_shares);
#           2: the models below are the contract; 1: the same keys, checked by hand


class CudaGraphSpeedup(Speedup):
    """The engine against the eager model replayed as CUDA Graphs (GPU only)."""

    baseline: str
    baseline_latency_ms: LatencySummary


class Comparison(Closed):
    """B time / A time over interleaved rounds; the verdict is B's."""

    a: str | None = None
    b: str | None = None
    time_ratio: float
    ci95: Interval
    verdict: Verdict
    noise_threshold: float
    blocks: Count

    @model_validator(mode="after")
    def _verdict_follows(self) -> Comparison:
        problem = verdict_problem(self.verdict, *self.ci95, self.noise_threshold, time_ratio=True)
        if problem:
            raise ValueError(problem)
        return self


class OutputAccuracy(Closed):
    """One output of the engine against PyTorch's, worst over the validation feeds."""

    max_abs: float
    mean_abs: float
    max_rel: float
    cosine: Cosine
    cosine_worst_sample: Cosine | None = Field(
        None, description="The worst row's cosine (one sentence, one sequence), on real data.")
    top1_agreement: Share | None = None
    nonfinite: Count = 0


class Gate(Closed):
    name: str
    passed: bool
    detail: str


class MeanMax(Closed):
    mean: float
    max: float


class GpuResources(Open):
    available: bool
    reason: str | None = None
    name: str | None = None
    util_pct: MeanMax | None = None
    throttle: list[str] = []


class Resources(Open):
    """bench.monitor's summary while timing."""

    cores: Count
    process_cpu_pct: MeanMax | None = None
    system_busy_pct: MeanMax | None = None
    other_cores: MeanMax | None = None
    peak_rss_mb: float | None = None
    gpu: GpuResources


class HarnessOverhead(Closed):
    p50: float
    mean: float
    p99: float
    n: Count
    method: str


class SweepPoint(Closed):
    shape: str
    dims: dict[str, int]
    latency_ms: LatencySummary
    baseline_latency_ms: LatencySummary
    speedup_vs_baseline: Speedup


class Versus(Closed):
    """An A/B against another recipe's engine of the same target (expect.faster_than):
    measured (`comparison` ...) or not (`reason`). versus-<target>-<other>.json is one."""

    other: str = Field(description="The recipe as expect.faster_than names it.")
    target: str
    reason: str | None = None
    other_recipe: str | None = None
    file: FileName | None = None
    this_sha256: Sha256 | None = None
    other_sha256: Sha256 | None = None
    shape: str | None = None
    this_ms: LatencySummary | None = None
    other_ms: LatencySummary | None = None
    comparison: Comparison | None = None
    cold_start_ms: dict[str, ColdStart] | None = None
    timer: str | None = None
    resources: Resources | None = None
    warnings: list[str] = []
    harness_overhead_us: HarnessOverhead | None = None

    @model_validator(mode="after")
    def _measured_or_why(self) -> Versus:
        if self.reason is None and (self.comparison is None or self.this_ms is None
                                    or self.other_ms is None or self.other_recipe is None):
            raise ValueError("a comparison needs `comparison`, `this_ms`, `other_ms` and "
                             "`other_recipe`, or a `reason` why it was not measured")
        return self


class TaskMetric(Open):
    """A task metric of the engine against the baseline's (perplexity, accuracy, ...)."""

    metric: str
    baseline: float | None = None
    engine: float | None = None
    delta: float | None = None
    ci95: Interval | None = None
    retrieval_top1_agreement: Share | None = Field(
        None, description="embedding_similarity: share of queries whose nearest pair is PyTorch's.")


# What a built engine must carry: every reader (report.md, gates, compare, deploy) uses these.
BUILT_NEEDS = ("path", "sha256", "bytes", "precision", "accuracy", "latency_ms",
               "baseline_latency_ms", "speedup_vs_baseline")


class EngineResult(Closed):
    """One target of the recipe: built and validated, or skipped / failed with the reason."""

    target: str = Field(description="The target's id.")
    kind: str = Field(description="Backend kind (onnxruntime, tensorrt, aotinductor, ...).")
    status: Literal["built", "skipped", "failed"]
    reason: str | None = Field(None, description="Why it was skipped or failed.")
    path: str | None = Field(None, description="The engine file, as the run named it.")
    sha256: Sha256 | None = None
    bytes: Count | None = None
    precision: str | None = None
    accuracy: dict[str, OutputAccuracy] | None = None
    latency_ms: LatencySummary | None = None
    baseline_latency_ms: LatencySummary | None = None
    speedup_vs_baseline: Speedup | None = None
    cold_start_ms: ColdStart | None = None
    baseline_cold_start_ms: ColdStart | None = None
    sweep: list[SweepPoint] = []
    timer: str | None = None
    threads: int | None = None
    stop: str | None = Field(None, description="Why timing stopped.")
    resources: Resources | None = None
    warnings: list[str] = []
    harness_overhead_us: HarnessOverhead | None = None
    plot: FileName | None = Field(None, description="Latency PNG beside report.md.")
    latency_method: str | None = None
    latency_note: str | None = Field(None, description="Why the latency means little here (emulated).")
    device: str | None = Field(None, description="Where engine and baseline ran (cpu | cuda).")
    speedup_vs_cudagraph: CudaGraphSpeedup | None = None
    runtime: dict[str, Any] | None = Field(None, description="Backend runtime details (TensorRT).")
    ort_flop_shares: dict[str, Any] | None = Field(
        None, description="ONNX Runtime: the share of matrix-multiply FLOPs its profiler saw run "
        "in integer kernels, by kind and op (precision/effective.py).")
    tensorrt_layer_shares: dict[str, Any] | None = Field(
        None, description="TensorRT: the shares of layers (and of time, when timed) per precision "
        "the engine inspector reports (backends/tensorrt_layers.py).")
    gates: list[Gate] = []
    versus: list[Versus] = []
    task: TaskMetric | None = None
    generation: Generation | None = Field(None, description="Generation workload (artifacts/generation.py).")
    roofline: RooflineCheck | None = Field(None, description="Time per op category against the roofline "
                                           "floor on this machine (artifacts/roofline.py).")

    @property
    def timed(self) -> str:
        """What `latency_ms` and `baseline_latency_ms` time: a generation engine's are one
        decode step at batch 1 (artifacts/generation.py), every other engine's one request."""
        return HEADLINE_TIMED if self.generation is not None else "request"

    @model_validator(mode="after")
    def _complete(self) -> EngineResult:
        if self.status == "built":
            missing = [k for k in BUILT_NEEDS if getattr(self, k) is None]
            if missing:
                raise ValueError(f"a built engine needs {', '.join(missing)}")
        elif not self.reason:
            raise ValueError(f"a {self.status} engine needs the `reason`")
        problems = gate_problems(self)  # a NaN, or figures that fail, never pass
        if problems:
            raise ValueError("; ".join(problems))
        return self


class Split(Open):
    """Provenance of one data split."""

    source: str
    sha256: str | None = None
    samples: Count | None = None


class DataProvenance(Open):
    validation: Split | None = None
    calibration: Split | None = None


class Baseline(Closed):
    """The PyTorch baseline timed alone (the baseline stage's meta)."""

    runner: str
    precision: str
    device: str
    threads: int | None = None
    feeds: Count
    latency_ms: LatencySummary
    cold_start_ms: ColdStart | None = None
    latency_method: str
    data: DataProvenance | None = Field(
        None, description="The data the baseline ran on (the report's `data`, from this meta).")
    generation: BaselineGeneration | None = Field(
        None, description="Generation workload: PyTorch (static KV cache) timed alone per request.")

    @property
    def timed(self) -> str:
        """What `latency_ms` times: as EngineResult.timed, for the baseline timed alone."""
        return HEADLINE_TIMED if self.generation is not None else "request"


class StageCost(Closed):
    """What one stage of the run cost when it ran (its manifest record)."""

    seconds: float | None = None
    peak_rss_mb: float | None = Field(None, description=(
        "Peak resident memory while it ran, MiB (artifacts.manifest.StageRecord)."))
    finished: str | None = None


class Report(Closed):
    """report.json: the source of truth; report.md and the tables are rendered from it."""

    schema_: Literal[3] = Field(alias="schema", description="3 since the effective precision is "
                                "split by runtime (artifacts/recorded.py migrates 1 and 2).")
    recipe: str
    recipe_sha256: Sha256
    description: str = ""
    created: str = Field(description="ISO-8601, UTC.")
    device: Device
    versions: dict[str, str | None]
    # the graph stages' meta, by stage id (run.GRAPH_STAGES; `:plain`: the plain-ONNX chain)
    export: dict[str, Any] | None = None
    optimize: dict[str, Any] | None = None
    precision: dict[str, Any] | None = None
    optimize_plain: dict[str, Any] | None = Field(None, alias="optimize:plain")
    precision_plain: dict[str, Any] | None = Field(None, alias="precision:plain")
    baseline: Baseline | None
    data: DataProvenance | None = None
    engines: list[EngineResult]
    stages: dict[str, StageCost] = Field({}, description=(
        "Each stage before the report: its time and peak memory when it ran (a stage reused "
        "from the cache keeps the figures of the run that made it)."))
    warnings: list[str] = []
