"""ServingMetrics: the exposition read back with prometheus-client's own parser, each value
moved by the calls that should move it; two instances never share a count."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.serving.metrics import ServingMetrics

TRITON = {"model": "m", "version": "1"}
VLLM = {"model_name": "m"}


def scrape(metrics: ServingMetrics) -> dict[tuple[str, frozenset], float]:
    """Every sample of the exposition: (name, labels) -> value."""
    body, content_type = metrics.exposition()
    assert content_type.startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body.decode()) for s in family.samples}


def value(samples, name: str, **labels) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_a_tensor_batch_moves_tritons_counts_and_the_batch_size_histogram():
    metrics = ServingMetrics("m")
    before = scrape(metrics)
    assert value(before, "nv_inference_count_total", **TRITON) == 0
    metrics.tensor_batch(3, [0.001, 0.002, 0.003], 0.010)
    metrics.tensor_batch(1, [0.004], 0.005)
    metrics.tensor_failure(2)
    after = scrape(metrics)
    assert value(after, "nv_inference_request_success_total", **TRITON) == 4
    assert value(after, "nv_inference_count_total", **TRITON) == 4
    assert value(after, "nv_inference_exec_count_total", **TRITON) == 2
    assert value(after, "nv_inference_request_failure_total", **TRITON) == 2
    assert value(after, "nv_inference_queue_duration_us_total", **TRITON) == pytest.approx(10_000)
    # Triton counts compute per request: each of the 3 requests counts its batch's 10 ms
    assert value(after, "nv_inference_compute_infer_duration_us_total", **TRITON) == pytest.approx(35_000)
    histogram = "pipeline:inference_batch_size"
    assert value(after, f"{histogram}_count", **TRITON) == 2
    assert value(after, f"{histogram}_sum", **TRITON) == 4
    assert value(after, f"{histogram}_bucket", le="1.0", **TRITON) == 1
    assert value(after, f"{histogram}_bucket", le="2.0", **TRITON) == 1
    assert value(after, f"{histogram}_bucket", le="4.0", **TRITON) == 2


def test_generation_state_steps_and_finished_requests_move_vllms_metrics():
    metrics = ServingMetrics("m")
    metrics.gen_state(running=3, waiting=2, kv_used_tokens=300, kv_total_tokens=1200)
    metrics.gen_step(3)
    metrics.gen_step(2)
    metrics.gen_finished("stop", prompt_tokens=12, generated=5, queue_s=0.2, ttft_s=0.05,
                         e2e_s=0.5, tpot_s=0.02)
    metrics.gen_finished("length", prompt_tokens=8, generated=1, queue_s=0.1, ttft_s=0.04,
                         e2e_s=0.04, tpot_s=None)
    metrics.gen_failure()
    metrics.gen_engine(prefill_s=0.5)
    metrics.gen_engine(decode_s=1.25)
    metrics.gen_engine(prefill_s=0.25, decode_s=0.5)
    s = scrape(metrics)
    assert value(s, "pipeline:engine_prefill_seconds_total", **VLLM) == 0.75
    assert value(s, "pipeline:engine_decode_seconds_total", **VLLM) == 1.75
    assert value(s, "pipeline:num_requests_running", **VLLM) == 3
    assert value(s, "pipeline:num_requests_waiting", **VLLM) == 2
    assert value(s, "pipeline:kv_cache_usage_perc", **VLLM) == 0.25
    assert value(s, "pipeline:kv_cache_used_tokens", **VLLM) == 300
    assert value(s, "pipeline:kv_cache_free_tokens", **VLLM) == 900
    assert value(s, "pipeline:decode_step_sequences_count", **VLLM) == 2
    assert value(s, "pipeline:decode_step_sequences_sum", **VLLM) == 5
    assert value(s, "pipeline:request_success_total", finished_reason="stop", **VLLM) == 1
    assert value(s, "pipeline:request_success_total", finished_reason="length", **VLLM) == 1
    assert value(s, "pipeline:request_failure_total", **VLLM) == 1
    assert value(s, "pipeline:prompt_tokens_total", **VLLM) == 20
    assert value(s, "pipeline:generation_tokens_total", **VLLM) == 6
    assert value(s, "pipeline:request_queue_time_seconds_sum", **VLLM) == pytest.approx(0.3)
    assert value(s, "pipeline:time_to_first_token_seconds_count", **VLLM) == 2
    assert value(s, "pipeline:time_per_output_token_seconds_count", **VLLM) == 1, "None is not observed"
    assert value(s, "pipeline:e2e_request_latency_seconds_sum", **VLLM) == pytest.approx(0.54)
    metrics.gen_state(running=0, waiting=0, kv_used_tokens=0, kv_total_tokens=1200)
    assert value(scrape(metrics), "pipeline:kv_cache_usage_perc", **VLLM) == 0


def test_each_instance_counts_in_its_own_registry():
    first, second = ServingMetrics("m"), ServingMetrics("m")  # no duplicate-name error
    first.tensor_batch(2, [0.0, 0.0], 0.001)
    assert value(scrape(first), "nv_inference_count_total", **TRITON) == 2
    assert value(scrape(second), "nv_inference_count_total", **TRITON) == 0


def test_a_load_points_scraper_reads_what_the_prefix_cache_holds_over_time():
    """The load generator's scraper (loadgen/scrape.py) against a replica's real exposition
    over HTTP: each scrape during the point is timed, so a soak can average the cache's bytes
    per window; the gauge follows gen_state (tokens x KV bytes per token)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from pipeline.loadgen.scrape import MetricsScraper
    from pipeline.loadgen.soak import CACHE_GAUGE

    metrics, scraped = ServingMetrics("m"), threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body, content_type = metrics.exposition()
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.end_headers()
            self.wfile.write(body)
            scraped.set()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with MetricsScraper(f"http://127.0.0.1:{server.server_port}", every=0.01) as scraper:
            for tokens in (0, 100, 300):
                metrics.gen_state(0, 0, 0, 1000, prefix_cached_tokens=tokens, kv_bytes_per_token=4096)
                for _ in range(2):  # two scrapes after each change (each waits for the next GET)
                    scraped.clear()
                    assert scraped.wait(30)
        seen = scraper.gauge(CACHE_GAUGE)
    finally:
        server.shutdown()
    times = [t for t, _ in seen]
    assert times == sorted(times) and times[0] >= 0
    assert {v for _, v in seen} <= {0.0, 100 * 4096.0, 300 * 4096.0} and seen[-1][1] == 300 * 4096.0
