"""Recipe schema of the `validate:` section (accuracy tolerances, the timing protocol, the
task metric) and the `expect:` gates."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from pipeline.recipe.base import Strict


class ToleranceSpec(Strict):
    cosine_min: float = Field(0.999, ge=-1, le=1, description="Worst-sample cosine, per output.")
    max_abs: float | None = Field(None, gt=0, description="Largest |engine - torch| element.")
    top1_min: float | None = Field(
        None, ge=0, le=1, description="Share of positions whose argmax agrees (logit outputs)."
    )


class LatencySpec(Strict):
    """The timing protocol (docs/measurement.md). The defaults are the documented protocol."""

    warmup: int = Field(100, ge=0, description="Untimed requests before timing each runner.")
    iterations: int = Field(1000, ge=10, description="Least number of timed requests per runner.")
    min_seconds: float = Field(
        1.0, ge=0, description="Least timed duration per runner (unless `target_ci` stops early)."
    )
    target_ci: float | None = Field(
        None, gt=0, lt=1,
        description="Early stop: once `iterations` requests are timed, stop before `min_seconds` "
        "when the 95% interval of every runner's median is within +-target_ci of it (0.01 = 1%).",
    )
    block: int = Field(
        50, ge=1, description="Requests per block when two runners are timed interleaved."
    )
    noise_threshold: float = Field(
        0.02, ge=0, lt=0.5,
        description="A/B verdicts say `faster` or `slower` only when the whole 95% interval of "
        "the ratio lies beyond 1 by more than this (0.02 = 2%); smaller differences are "
        "`indistinguishable`, below what the protocol resolves (docs/measurement.md).",
    )
    spin: bool = Field(
        False,
        description="Let ONNX Runtime's idle worker threads spin-wait. Off by default: when runners "
        "are interleaved, one runtime's spinning threads steal the cores of the other (measured "
        "on 2 cores: the PyTorch baseline's p90 more than doubled).",
    )
    sweep: dict[str, list[Annotated[int, Field(ge=1)]]] = Field(
        default_factory=dict,
        description="Shapes to time besides the opt point: dim symbol -> sizes, e.g. "
        "{batch: [1, 8], sequence: [16, 128]}; every combination is one shape, each within the "
        "dim's [min, max]. Results per shape.",
    )
    monitor_interval: float = Field(
        0.1, gt=0, description="Seconds between resource samples (CPU, RSS, NVML) while timing."
    )


class ValidateSpec(Strict):
    tolerance: ToleranceSpec = Field(ToleranceSpec(), description="Accuracy gates vs PyTorch.")
    latency: LatencySpec = Field(LatencySpec(), description="Timing protocol.")
    threads: int | None = Field(
        None, ge=1, le=4096,  # a thread pool's size: an int of C (a huge one fails late, in the runtime)
        description="Intra-op threads for PyTorch and ONNX Runtime (default: cores)."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the PyTorch baseline computes the reference outputs and its "
        "own latency: `auto` takes CUDA where a GPU is present. Each engine is also timed "
        "against the baseline on the engine's own device.",
    )
    top1_outputs: list[str] | None = Field(
        None, description="Outputs that are logits (top-1 agreement). Default: names with 'logit'."
    )
    task: Literal["perplexity", "accuracy", "embedding_similarity"] | None = Field(
        None, description="Task metric on the validation data, for PyTorch and each engine on the "
        "same samples, with the delta's 95% paired-bootstrap interval: `perplexity` (causal-LM "
        "logits on text), `accuracy` (labels), `embedding_similarity` (Spearman of pair cosines "
        "vs gold scores). Scored on the first output.")


# ----------------------------------------------------------------------------- expect
class ExpectSpec(Strict):
    """Gates on what the engines must deliver; a failed one exits 3 with the evidence."""

    min_speedup: float | None = Field(
        None, gt=0,
        description="Speedup over the PyTorch baseline each engine must show across its whole "
        "95% interval (the interval's lower bound must be >= this).",
    )
    max_p99_ms: float | None = Field(None, gt=0, description="Largest allowed engine P99, in ms.")
    max_accuracy_loss: float | None = Field(
        None, ge=0, le=1,
        description="Largest share of top-1 predictions that may disagree with PyTorch, per "
        "logits output (1 - top-1 agreement): an upper bound on the accuracy lost on any labels.",
    )
    max_task_loss: float | str | None = Field(
        None, description="Largest task-metric loss of an engine against PyTorch (validate.task): "
        "a number in the metric's units (0.01 = one accuracy point) or a share of the baseline "
        "('2%'). Loss is the worsening: engine - baseline for perplexity, baseline - engine "
        "otherwise; judged on the point estimate, the interval is shown with it.")
    faster_than: list[str] = Field(
        default_factory=list,
        description="Recipes (names or paths) whose engine of the same target each engine here "
        "must beat: both timed interleaved in one process, the whole 95% interval of the time "
        "ratio below 1 / (1 + validate.latency.noise_threshold).",
    )
