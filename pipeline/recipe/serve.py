"""The `serve:` section: how `pipeline serve` batches requests, and what `pipeline deploy
--triton` writes into config.pbtxt's `dynamic_batching`, so the two agree.

The batching fields mean what Triton's `dynamic_batching` means (model_config.proto):
max_batch_size, max_queue_delay_microseconds, preferred_batch_size and the default queue
policy's max_queue_size. Length buckets and pad values are the server's own (Triton's
dynamic batcher only stacks equal shapes): requests whose variable-length dims differ are
padded up to a bucket and batched with requests of the same bucket.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from pipeline.recipe.base import Dim, Strict

VariableDims = dict[str, Dim]  # dim symbol (e.g. `sequence`) -> its Dim


class ServeSpec(Strict):
    """Dynamic batching of `pipeline serve` (and config.pbtxt's `dynamic_batching`)."""

    max_batch_size: int | None = Field(
        None, ge=1, description="Most requests (rows) in one batch. Default: the max of the "
        "inputs' `batch` dim (1 when the inputs have none). Triton: `max_batch_size`.")
    max_queue_delay_us: int = Field(
        100, ge=0, le=60_000_000, description="How long (microseconds) the oldest queued request "
        "may wait for a fuller batch before whatever is queued is sent. Triton: "
        "`max_queue_delay_microseconds`.")
    preferred_batch_sizes: list[Annotated[int, Field(ge=1)]] | None = Field(
        None, description="Batch sizes sent at once, without waiting for the delay: the largest "
        "one the queue can fill is sent. Default: the `batch` dim's opt and max; [] means only "
        "max_batch_size (or the delay) sends a batch. Triton: `preferred_batch_size`.")
    max_queue_size: int = Field(
        64, ge=0, description="Requests that may wait in a replica's queue; one more is refused "
        "with HTTP 503 (`queue full`). 0: unbounded. Triton: `default_queue_policy.max_queue_size`.")
    length_buckets: dict[str, list[Annotated[int, Field(ge=1)]]] | None = Field(
        None, description="Per variable-length dim symbol (e.g. `sequence`), the lengths a request "
        "is padded up to; only requests of one bucket share a batch. The dim's max is always a "
        "bucket. Default: powers of two from the dim's min, and its max. {sequence: []}: no "
        "padding, only equal lengths share a batch.")
    pad_values: dict[str, float] = Field(
        default_factory=dict, description="Value padding fills, per input name (default 0: a "
        "0 attention mask hides padded tokens; pad ids are then never attended).")
    max_running_sequences: int | None = Field(
        None, ge=1, le=1024, description="Generation: sequences decoded together in one engine "
        "call (continuous batching), each in a slot of a KV cache preallocated at load: "
        "max_running_sequences x the recipe's context x the engine's KV bytes per token "
        "(2 x layers x kv_heads x head_dim x 4: 45 KiB on SmolLM2). Default 16 on an ONNX "
        "Runtime engine whose cache is in place (GroupQueryAttention); the PyTorch baseline and "
        "graphs that concatenate their cache run one sequence at a time whatever is set.")
    kv_cache_tokens: int | None = Field(
        None, ge=1, description="Generation: tokens the running sequences may reserve together "
        "(each reserves its prompt + max_new_tokens on admission; one that does not fit waits). "
        "Default: every slot full (max_running_sequences x context), so only a smaller value binds.")
    prefill_tokens_per_step: int | None = Field(
        None, ge=0, description="Generation: prompt tokens prefilled between two decode steps "
        "(the first admission of a step always is, whatever its length): a burst of arrivals is "
        "prefilled a prompt or so at a time with decode steps between, not all before the next "
        "step. Default 64; 0: every admitted prompt before the next step. Like vLLM's "
        "`max_num_batched_tokens` for prompts.")
    prefix_cache: bool = Field(
        True, description="Generation: keep finished sequences' keys and values (within the KV "
        "budget the running sequences leave, least recently used evicted first) so a prompt that "
        "starts with kept tokens, such as a chat's next turn, prefills only the tokens after them. "
        "ONNX Runtime engines whose cache is in place; vLLM's `enable_prefix_caching`.")
    routing: Literal["balanced", "prefix"] = Field(
        "balanced", description="How a request picks its replica when there are several. "
        "`balanced`: Ray Serve's default, the shorter queue of two replicas drawn at random. "
        "`prefix`: the replica that served the longest prefix of its prompt text (a chat's earlier "
        "turns), while queues stay balanced: Ray Serve LLM's PrefixCacheAffinityRouter, so a "
        "conversation's next turn finds its prefix in that replica's cache (serve.prefix_cache).")
    ingress: Literal["separate", "replica"] = Field(
        "separate", description="Where the HTTP routes run. `separate`: an ingress process of its own "
        "in front of the replicas (Ray Serve LLM's layout), so a replica that dies is answered in "
        "the API's shapes (a 503, or an error event ending a stream) while Serve restarts it. "
        "`replica`: each engine replica serves the routes itself, one hop fewer per streamed token: "
        "measured on 2 cores, SmolLM2 INT4, 1.29x the tokens/s at 8 concurrent streams and 1.26x "
        "at 16 (benchmarks/results/serving-path-2026-12-07.md), but a replica's death cuts its streams "
        "and Serve's proxy answers text/plain 500. `prefix` routing needs `separate`.")
    spin: bool = Field(
        True, description="Generation: ONNX Runtime's worker threads spin-wait between the parallel "
        "sections of an engine call and stop when it returns (`session.force_spinning_stop`), so an "
        "idle replica burns nothing. Measured on SmolLM2 INT4, 2 threads: decode step 0.75x at "
        "batch 1 and 0.83x at batch 8, prefill 0.88x of workers put to sleep after each kernel "
        "(benchmarks/results/spin-policy-2026-12-07.md). false: workers sleep between kernels.")
    replicas: int = Field(1, ge=1, le=64, description="Replicas (one engine each); `pipeline serve "
                          "--replicas` overrides. Triton: `instance_group.count`.")
    replica_cpus: float = Field(1.0, gt=0, le=256, description="CPUs Ray reserves per replica "
                                "(places replicas on a cluster's nodes).")
    threads: int | None = Field(None, ge=1, le=256, description="Intra-op threads of each "
                                "replica's engine (default: a local `pipeline serve` splits its Ray's CPUs among the "
                                "replicas; on a cluster, replica_cpus, at least 1).")

    @model_validator(mode="after")
    def _sorted(self) -> ServeSpec:
        if self.routing == "prefix" and self.ingress != "separate":
            raise ValueError("routing: prefix needs ingress: separate (the ingress routes each "
                             "request to the replica holding its prefix); set one or the other")
        if self.preferred_batch_sizes is not None:
            self.preferred_batch_sizes = sorted(set(self.preferred_batch_sizes))
        for name, sizes in (self.length_buckets or {}).items():
            self.length_buckets[name] = sorted(set(sizes))
        return self


BATCH_NAMES = ("batch", "batch_size")


def batch_dim(inputs: list) -> Dim | None:
    """The batch dim: every input's first dim is one shared dynamic dim named `batch` (or
    `batch_size`) starting at 1, as deploy's Triton config requires; else None."""
    firsts = [s.shape[0] if s.shape else None for s in inputs]
    if not firsts or not all(isinstance(d, Dim) for d in firsts):
        return None
    batch = firsts[0]
    if batch.name not in BATCH_NAMES or batch.min != 1 or any(d.name != batch.name for d in firsts):
        return None
    return batch


def variable_dims(inputs: list) -> VariableDims:
    """The named dynamic dims other than the batch dim: symbol -> Dim (e.g. `sequence`)."""
    skip = 1 if batch_dim(inputs) else 0
    return {d.name: d for s in inputs for d in s.shape[skip:] if isinstance(d, Dim) and d.name}


def batching(spec: ServeSpec, inputs: list) -> tuple[int, tuple[int, ...]]:
    """(max batch size, preferred batch sizes) for `pipeline serve` and config.pbtxt alike:
    (1, ()) when the inputs have no batch dim (each request runs alone)."""
    batch = batch_dim(inputs)
    if batch is None:
        return 1, ()
    most = spec.max_batch_size or batch.max
    if spec.preferred_batch_sizes is not None:
        return most, tuple(n for n in spec.preferred_batch_sizes if n <= most)
    return most, tuple(sorted({n for n in (batch.opt, most) if n <= most}))


def buckets(spec: ServeSpec, dim_name: str, dim: Dim) -> list[int]:
    """The lengths a request's `dim_name` is padded up to (ascending, the dim's max last);
    [] means no padding (only equal lengths share a batch)."""
    given = (spec.length_buckets or {}).get(dim_name)
    if given is not None:
        return sorted({*given, dim.max}) if given else []
    sizes, n = [], dim.min
    while n < dim.max:
        sizes.append(n)
        n *= 2
    return [*sizes, dim.max]


def check(spec: ServeSpec, inputs: list) -> None:
    """Cross-checks against the recipe's inputs (ValueError naming the key and what fits)."""
    batch = batch_dim(inputs)
    top = batch.max if batch else 1
    if spec.max_batch_size is not None and spec.max_batch_size > top:
        raise ValueError(f"max_batch_size {spec.max_batch_size} exceeds what the engine accepts "
                         f"({top}: the max of the inputs' batch dim)" if batch else
                         f"max_batch_size {spec.max_batch_size}: the inputs have no `batch` dim, "
                         "so each request runs alone (max 1)")
    most = spec.max_batch_size or top
    bad = [n for n in spec.preferred_batch_sizes or [] if n > most]
    if bad:
        raise ValueError(f"preferred_batch_sizes {bad} exceed max_batch_size {most}")
    dims = variable_dims(inputs)
    for name, sizes in (spec.length_buckets or {}).items():
        if name not in dims:
            raise ValueError(f"length_buckets: `{name}` is not a variable-length dim symbol of the "
                             f"inputs (declared: {', '.join(sorted(dims)) or 'none'})")
        dim = dims[name]
        outside = [n for n in sizes if not dim.min <= n <= dim.max]
        if outside:
            raise ValueError(f"length_buckets.{name}: {outside} outside the dim's [{dim.min}, {dim.max}]")
