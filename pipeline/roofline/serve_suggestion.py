"""Where `serve.max_running_sequences` and `serve.kv_cache_tokens` could start: a model's
suggestion from the decode step's roofline curve over batch sizes, never a measurement.

The curve: one decode step (one new token per sequence, `context` tokens in each cache) at
batch 1, 2, 4, ... on a hardware entry. While the step is memory-bound on the weights, a
larger batch costs almost nothing (the weights are read once per step for all sequences) and
tokens/s nearly doubles with each doubling; once the matrix products turn compute-bound, and
as every sequence's own KV cache is read, the step time grows with the batch and tokens/s
stops growing. max_running_sequences is the last batch on the curve whose doubling still
raised tokens/s by GAIN_PER_DOUBLING (1.25x: a quarter more throughput for twice the
sequences, each of which waits longer per token), no more than the KV budget holds at full
context, and at most the schema's 1,024.

kv_cache_tokens: KV_SHARE of the memory left after the weights, over the KV bytes per token,
read from the graph's cache inputs (every input with a `past_sequence` dim: its bytes for one
sequence and one token). The memory is the device's (a specified GPU's) or, on this machine,
what is available now (psutil): the number behind the suggestion says which.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.hardware.entry import HardwareEntry
from pipeline.roofline import costs, model, points
from pipeline.roofline.shapes import Skeleton, bits

GAIN_PER_DOUBLING = 1.25
KV_SHARE = 0.5  # of the memory after the weights: the rest for activations, the runtime, the OS
MAX_RUNNING = 1024  # serve.max_running_sequences' schema bound
BATCHES = tuple(2**i for i in range(11))  # 1 .. 1,024
PAST = "past_sequence"


@dataclass(frozen=True)
class CurvePoint:
    batch: int
    step_ms: float  # the decode step's floor
    tokens_per_s: float  # batch / step
    compute_bound_share: float
    gain: float | None  # tokens/s over the previous point's (None for the first)


@dataclass(frozen=True)
class ServeSuggestion:
    device: str
    context: int
    curve: list[CurvePoint]
    max_running_sequences: int
    why: str
    kv_bytes_per_token: int
    weights_bytes: int
    memory_bytes: int
    memory_source: str
    kv_cache_tokens: int
    threshold: float = GAIN_PER_DOUBLING


def kv_bytes_per_token(skel: Skeleton) -> int:
    """Bytes one token of one sequence takes in the cache: each cache input's (a `past_sequence`
    dim) size with batch 1 and one past token (shape per input: [1, kv_heads, 1, head_dim])."""
    total = 0
    for inp in skel.model.graph.input:
        t = inp.type.tensor_type
        names = [d.dim_param for d in t.shape.dim]
        if PAST not in names:
            continue
        n = 1
        for d in t.shape.dim:
            n *= 1 if d.dim_param else d.dim_value  # every symbolic dim (batch, past) at 1
        total += n * bits(t.elem_type) // 8
    return total


def weights_bytes(skel: Skeleton) -> int:
    return sum(v.nbytes or 0 for v in skel.initializers.values())


def decode_curve(skel: Skeleton, entry: HardwareEntry, threads: int | None, context: int,
                 batches: tuple[int, ...] = BATCHES) -> list[CurvePoint]:
    curve: list[CurvePoint] = []
    for b in batches:
        roof = model.roofline(costs.graph_cost(skel, points.decode_dims(context, b)), entry, threads)
        tokens = b / roof.time_s if roof.time_s else 0.0
        gain = tokens / curve[-1].tokens_per_s if curve and curve[-1].tokens_per_s else None
        curve.append(CurvePoint(b, roof.time_s * 1e3, tokens, roof.compute_bound_share, gain))
    return curve


def knee(curve: list[CurvePoint], threshold: float = GAIN_PER_DOUBLING) -> tuple[int, str]:
    """(the last batch whose step from the previous point still gained `threshold`, why)."""
    best = curve[0]
    for prev, point in zip(curve, curve[1:]):
        if point.gain is None or point.gain < threshold:
            return best.batch, (f"from {prev.batch} to {point.batch} sequences tokens/s grows only "
                                f"{point.gain:.2f}x (step {prev.step_ms:.3f} -> {point.step_ms:.3f} ms, "
                                f"{point.compute_bound_share:.0%} of it compute-bound)")
        best = point
    return best.batch, f"tokens/s still grows {threshold:g}x or more per doubling up to {best.batch}"


def suggest(skel: Skeleton, entry: HardwareEntry, threads: int | None, context: int,
            memory_bytes: int, memory_source: str) -> ServeSuggestion:
    """The suggestion for one engine's graph on `entry` (one with a KV cache: ValueError if not)."""
    per_token = kv_bytes_per_token(skel)
    if not per_token:
        raise ValueError(f"the graph has no KV-cache inputs (no `{PAST}` dim): no decode curve to suggest from")
    weights = weights_bytes(skel)
    kv_tokens = max(int((memory_bytes - weights) * KV_SHARE) // per_token, 0)
    curve = decode_curve(skel, entry, threads, context)
    batch, why = knee(curve)
    fits = max(kv_tokens // context, 1)  # sequences at full context the KV budget holds
    if fits < batch:
        batch, why = fits, why + f"; the KV budget holds {fits} at the full context of {context} tokens"
    return ServeSuggestion(entry.name, context, curve, min(batch, MAX_RUNNING), why, per_token, weights,
                           memory_bytes, memory_source, kv_tokens)


def memory_of(entry: HardwareEntry) -> tuple[int, str]:
    """(bytes, where from): a device's own memory (a specified GPU), else what is available on
    this machine now."""
    if entry.memory_bytes:
        return entry.memory_bytes, f"{entry.title}'s memory ({entry.source.document})"
    import psutil

    return int(psutil.virtual_memory().available), "memory available on this machine now (psutil)"


def yaml_lines(s: ServeSuggestion, target: str) -> list[str]:
    """A `serve:` section to paste, labelled as a model's suggestion, the numbers behind it."""
    return [f"# {target}: a model's suggestion (roofline floors of a decode step on {s.device}, "
            f"context {s.context}; `pipeline predict --serve`), not a measurement",
            "serve:",
            f"  max_running_sequences: {s.max_running_sequences}  # {s.why}",
            f"  kv_cache_tokens: {s.kv_cache_tokens}  # {KV_SHARE:g} x ({s.memory_bytes / 2**30:,.1f} GiB: "
            f"{s.memory_source} - {s.weights_bytes / 2**20:,.1f} MiB of weights) / "
            f"{s.kv_bytes_per_token:,} KV bytes per token"]
