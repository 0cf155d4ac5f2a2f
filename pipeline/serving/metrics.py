"""Prometheus metrics of one replica (`GET /metrics`), with prometheus-client.

Each ServingMetrics owns its own CollectorRegistry, never the process's global one: a Ray
Serve replica, a test and a second replica in the same process each count their own
requests, and constructing a second one never fails on a duplicate name.

Names follow the servers whose dashboards and tools people already have:

- **Tensor models: Triton's** (`nv_inference_*`, labels `model` and `version` = "1", the
  version folder `pipeline deploy --triton` writes). Triton's counters are cumulative and
  per request: a batch of N adds N to `nv_inference_count`, 1 to `nv_inference_exec_count`,
  and N times the batch's compute time to `nv_inference_compute_infer_duration_us`, so
  count / exec_count is the mean batch size and duration / count the mean per request, as
  with Triton. prometheus-client writes every counter with OpenMetrics' `_total` suffix
  (`nv_inference_count_total`): a Triton dashboard's query needs that suffix added.
  Triton has no batch-size histogram; `pipeline:inference_batch_size` is ours.
- **Generation: vLLM's, with `pipeline:` in place of `vllm:`** (label `model_name`), e.g.
  `pipeline:num_requests_running`, `pipeline:time_to_first_token_seconds`. Not vLLM's exact
  names: a fleet that runs both would add this server's numbers into vLLM's series and no
  query could tell them apart; a vLLM dashboard reads these after one find-and-replace of
  the prefix. `kv_cache_usage_perc` is a fraction 0..1, as vLLM's is. The KV tokens used
  and free, the sequences per decode step and the failures have no vLLM name and are ours.
  `prefix_cache_queries`/`prefix_cache_hits` count prompt tokens, as vLLM's do.
  `engine_prefill_seconds`/`engine_decode_seconds` split the engine thread's busy time: with
  the decode-step histogram's count they give a load point's mean step time and the share of
  its wall time each phase took (what a TPOT is made of).
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

# Powers of two: batch sizes are usually set to them, and each lands on its own bucket edge.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# vLLM's buckets, with finer edges at the low end: a CPU decode step takes ~10 ms here.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                   30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TRITON_VERSION = "1"


class ServingMetrics:
    """The metrics of one replica serving `model_name`; call the tensor_* methods from a
    tensor model's batch loop and the gen_* methods from a generation scheduler."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        self._tensor_metrics()
        self._generation_metrics()

    def _tensor_metrics(self) -> None:
        names, registry = ("model", "version"), self.registry

        def counter(name, doc):
            return Counter(name, doc, names, registry=registry).labels(self.model_name, TRITON_VERSION)

        self._success = counter("nv_inference_request_success", "Number of successful inference requests")
        self._failure = counter("nv_inference_request_failure", "Number of failed inference requests")
        self._count = counter("nv_inference_count", "Number of inferences performed (a batch of N counts N)")
        self._exec = counter("nv_inference_exec_count", "Number of model executions (batches) performed")
        self._queue_us = counter("nv_inference_queue_duration_us",
                                 "Cumulative time requests spent waiting in the queue, in microseconds")
        self._compute_us = counter("nv_inference_compute_infer_duration_us",
                                   "Cumulative compute inference duration per request (each request of "
                                   "a batch counts the batch's time), in microseconds")
        self._batch = Histogram("pipeline:inference_batch_size", "Requests per model execution (batch size)",
                                names, buckets=BATCH_BUCKETS, registry=registry,
                                ).labels(self.model_name, TRITON_VERSION)

    def _generation_metrics(self) -> None:
        names, registry, model = ("model_name",), self.registry, self.model_name

        def gauge(name, doc):
            return Gauge(name, doc, names, registry=registry).labels(model)

        def counter(name, doc):
            return Counter(name, doc, names, registry=registry).labels(model)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, names, buckets=buckets, registry=registry).labels(model)

        self._running = gauge("pipeline:num_requests_running", "Number of requests in the running batch")
        self._waiting = gauge("pipeline:num_requests_waiting", "Number of requests waiting to join it")
        self._kv_usage = gauge("pipeline:kv_cache_usage_perc", "KV-cache usage, a fraction: 1 means full")
        self._kv_used = gauge("pipeline:kv_cache_used_tokens", "KV-cache tokens held by running requests")
        self._kv_free = gauge("pipeline:kv_cache_free_tokens", "KV-cache tokens free")
        self._prefix_held = gauge("pipeline:prefix_cache_tokens",
                                  "KV-cache tokens held by cached prefixes (within the free tokens)")
        self._prefix_bytes = gauge("pipeline:prefix_cache_bytes", "Bytes the cached prefixes' keys and values hold "
                                   "(copies bounded by the KV budget: memory held by design, not leaked)")
        self._prefix_queries = counter("pipeline:prefix_cache_queries",
                                       "Prompt tokens looked up in the prefix cache")
        self._prefix_hits = counter("pipeline:prefix_cache_hits",
                                    "Prompt tokens found in the prefix cache (not prefilled)")
        self._step = histogram("pipeline:decode_step_sequences", "Sequences decoded per decode step",
                               BATCH_BUCKETS)
        # where the engine thread's time goes (a load point's phases: docs/serving.md)
        self._prefill_s = counter("pipeline:engine_prefill_seconds",
                                  "Seconds the engine spent prefilling prompts (copying in cached prefixes included)")
        self._decode_s = counter("pipeline:engine_decode_seconds",
                                 "Seconds the engine spent in decode steps (choosing each row's token included)")
        self._finished = Counter("pipeline:request_success", "Number of finished requests, by why they finished",
                                 ("model_name", "finished_reason"), registry=registry)
        self._gen_failure = counter("pipeline:request_failure", "Number of requests that failed")
        self._prompt_tokens = counter("pipeline:prompt_tokens", "Number of prefill tokens processed")
        self._generation_tokens = counter("pipeline:generation_tokens", "Number of generation tokens processed")
        self._queue_time = histogram("pipeline:request_queue_time_seconds",
                                     "Time from arrival to joining the running batch", REQUEST_BUCKETS)
        self._ttft = histogram("pipeline:time_to_first_token_seconds",
                               "Time from arrival to the first generated token", TTFT_BUCKETS)
        self._tpot = histogram("pipeline:time_per_output_token_seconds",
                               "Mean time per generated token after the first, per request", TPOT_BUCKETS)
        self._e2e = histogram("pipeline:e2e_request_latency_seconds",
                              "Time from arrival to the last token", REQUEST_BUCKETS)

    # ------------------------------------------------------------------ tensor models
    def tensor_batch(self, batch_size: int, queue_s: list[float], compute_s: float) -> None:
        """One batch of `batch_size` requests ran: each request's time in the queue, and the
        batch's engine call."""
        self._success.inc(batch_size)
        self._count.inc(batch_size)
        self._exec.inc()
        self._queue_us.inc(sum(queue_s) * 1e6)
        self._compute_us.inc(compute_s * 1e6 * batch_size)
        self._batch.observe(batch_size)

    def tensor_failure(self, n: int = 1) -> None:
        """`n` requests failed (a failed batch: each of its requests)."""
        self._failure.inc(n)

    # ------------------------------------------------------------------ generation
    def gen_state(self, running: int, waiting: int, kv_used_tokens: int, kv_total_tokens: int,
                  prefix_cached_tokens: int = 0, kv_bytes_per_token: int = 0) -> None:
        """The scheduler's state now: sequences running and waiting, KV-cache tokens used of
        the total, tokens the cached prefixes hold (and their bytes)."""
        self._prefix_held.set(prefix_cached_tokens)
        self._prefix_bytes.set(prefix_cached_tokens * kv_bytes_per_token)
        self._running.set(running)
        self._waiting.set(waiting)
        self._kv_used.set(kv_used_tokens)
        self._kv_free.set(kv_total_tokens - kv_used_tokens)
        self._kv_usage.set(kv_used_tokens / kv_total_tokens if kv_total_tokens else 0.0)

    def gen_prefix_cache(self, queried_tokens: int, hit_tokens: int) -> None:
        """One admitted prompt of `queried_tokens` found `hit_tokens` of them cached."""
        self._prefix_queries.inc(queried_tokens)
        self._prefix_hits.inc(hit_tokens)

    def gen_engine(self, prefill_s: float = 0.0, decode_s: float = 0.0) -> None:
        """The engine thread spent these seconds prefilling and decoding (called from it:
        prometheus-client's counters take their own lock)."""
        if prefill_s:
            self._prefill_s.inc(prefill_s)
        if decode_s:
            self._decode_s.inc(decode_s)

    def gen_step(self, batch_size: int) -> None:
        """One decode step ran over `batch_size` sequences."""
        self._step.observe(batch_size)

    def gen_finished(self, reason: str, prompt_tokens: int, generated: int, queue_s: float,
                     ttft_s: float | None, e2e_s: float, tpot_s: float | None) -> None:
        """One request finished (`reason`: vLLM's "stop", "length" or "abort"); ttft_s is None
        when no token came, tpot_s when fewer than two did."""
        self._finished.labels(self.model_name, reason).inc()
        self._prompt_tokens.inc(prompt_tokens)
        self._generation_tokens.inc(generated)
        self._queue_time.observe(queue_s)
        if ttft_s is not None:
            self._ttft.observe(ttft_s)
        if tpot_s is not None:
            self._tpot.observe(tpot_s)
        self._e2e.observe(e2e_s)

    def gen_failure(self) -> None:
        """One generation request failed (the engine raised)."""
        self._gen_failure.inc()

    # ------------------------------------------------------------------ exposition
    def exposition(self) -> tuple[bytes, str]:
        """The text exposition of every metric, and its Content-Type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
