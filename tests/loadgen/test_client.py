"""The load generator against a local stdlib server whose behaviour is known exactly
(tests/loadgen_server.py): a stall is charged from each request's scheduled time, on the
server's side and on the client's; closed loop keeps N requests in flight at most; every
request resolves (timeouts and 503s counted, never dropped); streamed tokens give TTFT and
TPOT; and `pipeline load` (a real subprocess) writes its typed artifact into the recipe's
folder. Assertions are relationships between times, never absolute rates."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np

from pipeline.loadgen import client, summary
from pipeline.loadgen.protocol import Target, kserve_payload, openai_payload
from pipeline.loadgen.slo import parse
from tests.loadgen_server import Behaviour, FakeServer

BODY = [kserve_payload({"x": np.array([[0.0, 1.0]])}, {"x": "float32"}, binary=False)]


def _kserve(server: FakeServer) -> Target:
    return Target(server.base, "m")


def _constant(rate: float, duration: float) -> np.ndarray:
    return np.arange(1, int(rate * duration) + 1) / rate


def test_a_server_stall_is_charged_to_every_request_due_during_it():
    b = Behaviour(service=0.001, stall_at_request=30, stall_seconds=1.0)
    with FakeServer(b) as server:
        start = time.perf_counter() + 0.1
        outs = asyncio.run(client.open_loop(_kserve(server), _constant(60, 2.5), BODY,
                                            timeout=5.0, start=start))
    stall_start, stall_end = b.arrivals[30], b.stall_end
    # the open loop kept sending while the server stalled (a closed loop of one user would
    # have sent nothing more until the stalled answer came back)
    sent_during = [o for o in outs if stall_start <= start + o.sent < stall_end - 0.01]
    assert len(sent_during) >= 2
    for o in sent_during:
        assert start + o.done >= stall_end - 0.002               # held by the stall...
        assert o.latency >= stall_end - (start + o.due) - 0.002  # ...charged from when it was due
        assert o.latency >= o.done - o.sent                      # never less than the round trip
    assert [o.error for o in outs if o.status != "ok"] == []


def test_a_client_stall_sends_late_and_still_counts_from_the_schedule():
    async def stalled(url: str) -> list[client.Outcome]:
        start = time.perf_counter() + 0.1

        async def block_the_loop():
            await asyncio.sleep(0.6)
            time.sleep(0.3)  # the event loop itself stops, as under a GC pause or a busy CPU

        blocker = asyncio.create_task(block_the_loop())
        outs = await client.open_loop(Target(url, "m"), _constant(100, 1.5), BODY, 5.0, start=start)
        await blocker
        return outs

    with FakeServer(Behaviour(service=0.001)) as server:
        outs = asyncio.run(stalled(server.url))
    late = [o for o in outs if o.sent - o.due > 0.1]
    assert len(late) >= 15  # ~30 requests were due while the loop was blocked
    for o in late:
        assert o.latency >= o.sent - o.due  # the time spent waiting to be sent is in the latency
    point = summary.summarize(outs, warmup=0.0, window=1.5, offered_rate=100.0)
    assert point.late.share >= len(late) / len(outs) - 1e-9
    assert point.late.max_ms >= 100


def test_closed_loop_keeps_at_most_n_requests_in_flight():
    b = Behaviour(service=0.02)
    with FakeServer(b) as server:
        outs = client.run_closed(_kserve(server), users=3, duration=1.0, bodies=BODY,
                                 timeout=5.0)
    assert 1 <= b.max_in_flight <= 3
    assert len(outs) >= 6 and all(o.status == "ok" for o in outs)
    assert all(o.due == o.sent or abs(o.sent - o.due) < 0.01 for o in outs)  # sent when due


def test_timeouts_and_rejections_are_counted_never_dropped():
    b = Behaviour(service=0.001, reject_every=4, hang_request=5, hang_seconds=2.0)
    with FakeServer(b) as server:
        outs = client.run_open(_kserve(server), _constant(50, 0.8), BODY, timeout=0.6)
    point = summary.summarize(outs, warmup=0.0, window=1.0, offered_rate=50.0,
                              terms=parse("p99=500ms"))
    assert point.requests == len(outs) == len(b.arrivals) == 40
    # the hung request timed out (a busy machine may add more); every 4th arrival was a 503
    assert point.timeouts >= 1 and point.rejected >= 9
    assert point.ok + point.rejected + point.timeouts + point.errors == 40
    assert point.slo[0].over >= 40 - point.ok  # every failure is over the bound
    assert point.passed is False
    timed_out = [o for o in outs if o.status == "timeout"]
    assert all(o.latency == float("inf") and o.done - o.due >= 0.6 - 0.01 for o in timed_out)


def test_streamed_tokens_give_ttft_tpot_and_goodput():
    b = Behaviour(service=0.0, tokens=5, token_gap=0.004)
    with FakeServer(b) as server:
        target = Target(server.base, "m", "completions")
        outs = client.run_open(target, _constant(40, 0.5), [openai_payload(target, [1, 2, 3], 5)],
                               5.0)
    point = summary.summarize(outs, warmup=0.0, window=1.0, offered_rate=40.0, generation=True,
                              terms=parse("ttft=1s,tpot=1s", generation=True))
    g = point.generation
    assert point.ok == 20 and g.mean_tokens == 5
    assert g.ttft_ms["p50"].value < point.latency_ms["p50"].value
    assert g.tpot_ms["p50"].value >= 3.0  # the server waits 4 ms between tokens
    assert point.goodput > 0


def test_pipeline_load_writes_its_typed_artifact(project):
    from pipeline.artifacts.serving import LoadResult

    with FakeServer(Behaviour(service=0.002), model="digits") as server:
        result = project.run("load", "digits", "--url", server.url, "--rate", "40", "--duration",
                             "1", "--warmup", "0.2", "--min-requests", "20", "--slo", "p99=500ms",
                             timeout=120)
    assert result.code == 0, result.err
    folder = project.engines / "digits"
    data = json.loads((folder / "load-onnxruntime.json").read_text())
    loaded = LoadResult.model_validate(data)
    assert loaded.mode == "rate" and loaded.points[0].requests >= 20
    assert "data/digits/validation.npz" in loaded.requests["source"]
    # 40 requests cannot show a p99 at 99% confidence: the point does not pass, and says why
    assert loaded.points[0].passed is False and loaded.points[0].slo[0].more_needed > 0
    manifest = json.loads((folder / "manifest.json").read_text())
    assert {"load-onnxruntime.json", "load-onnxruntime.png"} <= set(manifest["files"])
    assert (folder / "load-onnxruntime.png").stat().st_size > 0


def test_pipeline_load_refuses_two_servers_or_no_mode(project):
    both = project.run("load", "digits", "--url", "http://127.0.0.1:9/v1/models/x", "--serve",
                       "--rate", "1")
    assert both.code == 2 and both.error_lines and "--url" in both.error_lines[0]
    nothing = project.run("load", "digits", "--url", "http://127.0.0.1:9/v1/models/x")
    assert nothing.code == 2 and "nothing to measure" in nothing.err
    bad = project.run("load", "digits", "--url", "http://127.0.0.1:9/v1/models/x", "--slo", "p99=fast")
    assert bad.code == 2 and "--slo" in bad.err
    assert not (project.engines / "digits").exists() or not list((project.engines / "digits").glob("load-*"))


def test_compare_load_puts_two_results_side_by_side(project):
    """Two serving variants' load files at the same offered rate: B/A p99 with its interval;
    a recipe without load results is named with the command that makes them."""
    with FakeServer(Behaviour(service=0.001), model="digits") as fast, \
            FakeServer(Behaviour(service=0.5), model="digits") as slow:
        for name, server in ((None, fast), ("slow", slow)):
            result = project.run("load", "digits", "--url", server.url, "--rate", "10", "--duration",
                                 "1.5", "--warmup", "0.2", "--min-requests", "30",
                                 *(("--name", name) if name else ()), timeout=180)
            assert result.code == 0, result.err
    assert (project.engines / "digits" / "load-onnxruntime-slow.json").is_file()
    result = project.run("compare", "digits", "digits:slow", "--load")
    assert result.code == 0, result.err
    data = json.loads((project.engines / "compare" / "digits-vs-digits-slow" / "compare-load.json").read_text())
    row = data["same_rate"][0]
    assert row["rate"] == 10.0 and row["ratio"] > 1  # the second stand-in takes 0.5 s a request
    assert row["verdict"] in ("B slower", "indistinguishable")
    missing = project.run("compare", "digits", "standard", "--load")
    assert missing.code == 2 and "pipeline load standard" in missing.err
    same = project.run("compare", "digits", "digits", "--load")
    assert same.code == 2 and "digits:b1" not in same.err and "twice" in same.err


def test_load_versus_measures_two_servers_in_turns_and_compares_them(project):
    """`pipeline load A --versus B`: the points go A, B, A, B (each server sees its requests in
    blocks that alternate), both results are written, each naming the other, and the
    comparison says it was measured in turns; a comparison of separate runs says it was not."""
    with FakeServer(Behaviour(service=0.001), model="digits") as fast, \
            FakeServer(Behaviour(service=0.2), model="digits") as slow:
        result = project.run("load", "digits", "--url", fast.url, "--name", "fast", "--versus",
                             "digits:slow", "--versus-url", slow.url, "--sweep", "8,12",
                             "--duration", "1", "--warmup", "0.2", "--min-requests", "8",
                             timeout=180)
        assert result.code == 0, result.err
        blocks = [side for _, side in sorted([(t, "A") for t in fast.behaviour.arrivals] +
                                             [(t, "B") for t in slow.behaviour.arrivals])]
        alone = project.run("load", "digits", "--url", fast.url, "--name", "alone", "--sweep", "8",
                            "--duration", "1", "--warmup", "0.2", "--min-requests", "8", timeout=180)
        assert alone.code == 0, alone.err
    runs = [side for i, side in enumerate(blocks) if i == 0 or blocks[i - 1] != side]
    assert runs == ["A", "B", "A", "B"], runs  # rate 8: A then B; rate 12: A then B
    folder = project.engines / "digits"
    a = json.loads((folder / "load-onnxruntime-fast.json").read_text())
    b = json.loads((folder / "load-onnxruntime-slow.json").read_text())
    assert a["client"]["interleaved_with"] == "digits:slow"
    assert b["client"]["interleaved_with"] == "digits:fast"
    assert [p["offered_rate"] for p in a["points"]] == [p["offered_rate"] for p in b["points"]] == [8, 12]
    compared = project.engines / "compare" / "digits-fast-vs-digits-slow"
    data = json.loads((compared / "compare-load.json").read_text())
    assert data["in_turns"] is True and [r["rate"] for r in data["same_rate"]] == [8, 12]
    assert all(r["ratio"] > 1 for r in data["same_rate"])  # B takes 0.2 s a request, A 1 ms
    assert "taking turns point by point" in (compared / "compare-load.md").read_text()
    assert "taking turns point by point" in result.out
    # B's result beside one measured in another run: not in turns, and it says so
    separate = project.run("compare", "digits:alone", "digits:slow", "--load")
    assert separate.code == 0, separate.err
    assert "Measured in separate runs" in separate.out


def test_load_versus_refuses_what_cannot_take_turns(project):
    url = ("--url", "http://127.0.0.1:9")
    no_b = project.run("load", "digits", *url, "--versus", "digits:b", "--rate", "1")
    assert no_b.code == 2 and "--versus-url" in no_b.error_lines[0]
    soak = project.run("load", "digits", *url, "--versus", "digits:b", "--versus-url",
                       "http://127.0.0.1:9", "--rate", "1", "--soak")
    assert soak.code == 2 and "--soak with --versus" in soak.error_lines[0]
    alone = project.run("load", "digits", *url, "--versus-url", "http://127.0.0.1:9", "--rate", "1")
    assert alone.code == 2 and "needs --versus" in alone.error_lines[0]
    same = project.run("load", "digits", *url, "--versus", "digits", "--versus-url",
                       "http://127.0.0.1:9", "--rate", "1")
    assert same.code == 2 and "the same recipe and name" in same.error_lines[0]
    running = project.run("load", "digits", *url, "--versus", "digits:b", "--versus-url",
                          "http://127.0.0.1:9", "--versus-set", "serve.max_batch_size=1", "--rate", "1")
    assert running.code == 2 and "--versus-set needs --serve" in running.error_lines[0]


def test_pipeline_load_set_is_for_serve_settings_with_a_name(project):
    url = ("--url", "http://127.0.0.1:9/v1/models/x")
    other = project.run("load", "digits", "--serve", "--rate", "1", "--set", "validate.threads=2")
    assert other.code == 2 and "serve.KEY=VALUE" in other.err
    unnamed = project.run("load", "digits", "--serve", "--rate", "1", "--set", "serve.max_batch_size=1")
    assert unnamed.code == 2 and "--name" in unnamed.err
    running = project.run("load", "digits", *url, "--rate", "1", "--set", "serve.max_batch_size=1")
    assert running.code == 2 and "--serve" in running.err


def test_pipeline_load_soak_reports_windows_and_a_verdict(project):
    import os

    from pipeline.artifacts.serving import LoadResult

    with FakeServer(Behaviour(service=0.001), model="digits") as server:
        result = project.run("load", "digits", "--url", server.url, "--rate", "40", "--soak",
                             "--duration", "3", "--warmup", "0.2", "--windows", "3",
                             "--server-pid", str(os.getpid()), timeout=180)
    assert result.code == 0, result.err
    loaded = LoadResult.model_validate_json(
        (project.engines / "digits" / "load-onnxruntime.json").read_text())
    assert loaded.mode == "soak" and len(loaded.soak.windows) == 3
    assert sum(w.requests for w in loaded.soak.windows) == loaded.points[0].requests
    assert any((w.rss_mib or 0) > 0 for w in loaded.soak.windows)  # this process, sampled
    assert loaded.soak.verdict.leak in ("leak", "no leak", "inconclusive")
    assert "soak:" in result.err


def test_load_help_imports_no_client_ray_or_torch():
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = ("import sys; import pipeline.cli as c; from click.testing import CliRunner; "
            "r = CliRunner().invoke(c.cli, ['load', '--help']); assert r.exit_code == 0, r.output; "
            "print(sorted(m for m in ('aiohttp', 'ray', 'torch', 'psutil', 'numpy', 'matplotlib') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_url_is_read_as_a_servers_base_and_a_models_name():
    from pipeline.loadgen.protocol import resolve

    assert resolve("http://h:8000", None, "r") == ("http://h:8000", "r")
    assert resolve("http://h:8000/v1/", None, "r") == ("http://h:8000", "r")  # OpenAI's base URL
    assert resolve("http://h:8000/v1/models/minilm", None, "r") == ("http://h:8000", "minilm")
    assert resolve("http://h/proxy/v2/models/m/infer", "x", "r") == ("http://h/proxy", "x")


def test_an_external_server_is_driven_by_its_own_model_name(project):
    """A server that serves the model under another name (vLLM's, llama.cpp's): refused in
    one line naming what it serves, measured with --model."""
    with FakeServer(Behaviour(tokens=3), model="their-name") as server:
        wrong = project.run("load", "lm-gen", "--url", f"{server.base}/v1", "--rate", "5")
        right = project.run("load", "lm-gen", "--url", f"{server.base}/v1", "--model", "their-name",
                            "--rate", "20", "--duration", "0.5", "--warmup", "0",
                            "--min-requests", "5", timeout=180)
    assert wrong.code == 2 and "their-name" in wrong.err and "--model" in wrong.err
    assert right.code == 0, right.err
    data = json.loads(next((project.engines / "lm-gen").glob("load-*.json")).read_text())
    point = data["points"][0]
    assert point["ok"] == point["requests"] >= 5 and point["generation"]["mean_tokens"] == 3
    assert data["server"]["model"] == "their-name" and "/v1/completions" in data["url"]
    assert data["server"]["metrics"].startswith("not scraped")  # the stand-in has no /metrics
