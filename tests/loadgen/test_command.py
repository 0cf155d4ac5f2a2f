"""`pipeline load` into a built recipe's folder, end to end with real subprocesses: the load
file is committed through the store (the manifest records it, `pipeline verify` passes),
report.md gains its Serving section at once and keeps it through a later `pipeline report`;
and against the real server (`pipeline load --serve` starting `pipeline serve`: Ray Serve,
dynamic batching) it batches more than one request and writes a valid result."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.conftest import Project, digits_build
from tests.loadgen_server import Behaviour, FakeServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> tuple[Project, str]:
    """A real `pipeline run digits` (the session's one build), this module's own copy: the
    load results are committed into it."""
    project = digits_build(tmp_path_factory)
    return project, project.built.name


def test_load_results_land_in_report_md(digits):
    project, name = digits
    folder = project.engines / name
    with FakeServer(Behaviour(service=0.002), model="digits") as server:
        loaded = project.run("load", name, "--url", server.url, "--sweep", "20,40",
                             "--duration", "1", "--warmup", "0.2", "--min-requests", "30",
                             "--slo", "p99=200ms", "--name", "stand-in", timeout=180)
    assert loaded.code == 0, loaded.err
    report = (folder / "report.md").read_text()
    assert "## Serving" in report and "![sweep](load-onnxruntime-stand-in.png)" in report
    assert report.count("| 20.00 |") == 1 and report.count("| 40.00 |") == 1
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["stages"]["load:load-onnxruntime-stand-in"]["outputs"] == [
        "load-onnxruntime-stand-in.png", "load-onnxruntime-stand-in.json"]
    verified = project.run("verify", str(folder))
    assert verified.code == 0, verified.out + verified.err
    again = project.run("report", name)
    assert again.code == 0, again.err
    assert "## Serving" in (folder / "report.md").read_text()


@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason="ray[serve] is not installed (the cpu/gpu extras install it)")
def test_load_serve_batches_against_the_real_server(digits):
    """A burst of Poisson requests at a rate where a 2-core server must queue: the dynamic
    batcher serves some of them together, and the result says so."""
    import os

    from pipeline.artifacts.serving import LoadResult

    project, name = digits
    result = project.run("load", name, "--serve", "--rate", "150", "--duration", "2", "--warmup",
                         "0.5", "--min-requests", "200", "--timeout", "30",
                         timeout=900)
    assert result.code == 0, result.err
    loaded = LoadResult.model_validate_json((project.engines / name / "load-onnxruntime.json").read_text())
    point = loaded.points[0]
    assert point.requests >= 200 and point.ok == point.requests, point.error_examples
    assert max(int(size) for size in point.batch_sizes) > 1  # batched
    assert sum(point.batch_sizes.values()) == point.ok
    assert loaded.server["started_here"] and loaded.engine == "onnxruntime"
    assert loaded.server["protocol"] == "KServe v2 (binary tensors)"
    # the server's own batch-size histogram moved by the requests this point sent
    moved = point.server_metrics
    assert moved and moved.batch_histogram == "pipeline:inference_batch_size"
    assert moved.counters["nv_inference_count"] >= point.ok  # warm-up requests count there too
    assert moved.histograms["pipeline:inference_batch_size"].count >= 1 and moved.mean_batch > 1
    assert point.resources and point.resources.rss_mib_peak > 0  # the server's processes
    # the server and its Ray instance are gone: its process group is empty
    pid = loaded.server["sampled_pid"]
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> tuple[Project, str]:
    """The tiny byte-level chat model the OpenAI API tests serve (one build per session)."""
    from tests.conftest import shared_build
    from tests.serving.test_openai_api import BUILD

    project = shared_build(tmp_path_factory, "lm-gen-chat-openai", *BUILD)
    return project, project.built.name


@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason="ray[serve] is not installed (the cpu/gpu extras install it)")
def test_load_scrapes_the_generation_servers_metrics_as_they_move(chat_model):
    """`pipeline load --serve` of a chat model: streamed OpenAI completions (the workload's
    prompts; this tiny model answers the chat questions with an end of line at once) from 4
    closed-loop users; the server's /metrics, scraped before, during and after, shows decode
    steps in its batch histogram, KV-cache tokens in use while requests ran, none after."""
    from pipeline.artifacts.serving import LoadResult

    project, name = chat_model
    result = project.run("load", name, "--serve", "--api", "completions", "--concurrency", "4",
                         "--duration", "3",
                         "--warmup", "0.5", "--timeout", "60", timeout=900)
    assert result.code == 0, result.err
    loaded = LoadResult.model_validate_json((project.engines / name / "load-onnxruntime.json").read_text())
    point = loaded.points[0]
    assert loaded.server["protocol"].startswith("OpenAI /v1/completions")
    assert point.ok == point.requests > 0, point.error_examples
    assert point.generation.ttft_ms["p50"].value > 0 and point.generation.mean_tokens >= 1
    moved = point.server_metrics
    assert moved is not None and moved.scrapes >= 1, loaded.server["metrics"]
    steps = moved.histograms["pipeline:decode_step_sequences"]
    assert moved.batch_histogram == "pipeline:decode_step_sequences" and steps.count > 0
    assert moved.counters["pipeline:generation_tokens"] >= sum([point.ok])  # >= 1 a request
    kv = moved.gauges["pipeline:kv_cache_used_tokens"]
    assert kv.before == 0 and kv.peak > 0 and kv.after == 0
    assert moved.gauges["pipeline:num_requests_running"].after == 0
    report = (project.engines / name / "report.md").read_text()
    assert "| pipeline:decode_step_sequences |" in report  # report.md's table of the movement
