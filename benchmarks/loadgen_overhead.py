"""The load generator's own limits on this machine, so that a load test's figures are known to
measure the server, not the client (docs/serving.md, "Is it the client?").

An echo server that does no work (aiohttp.web, in a process of its own, answering KServe
v2's /v2/models/echo/infer with a fixed binary-tensor answer, as `pipeline serve` speaks it) is driven by `pipeline load`'s client at rising
Poisson rates. Per rate: achieved vs offered, the share of requests the client sent late
(> 2 ms after their scheduled time) and by how much, the round trip's p50/p99 (client +
loopback + echo: the floor under every latency a load test reports), and the client's CPU
time per request (its own process, user + system). The client's ceiling is the highest
rate at which it still sent 99% of requests on time and got 98% of them back.

    PYTHONPATH=. python benchmarks/loadgen_overhead.py [--rates 100,200,...] [--duration 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

ECHO = r'''
import sys
from aiohttp import web
# KServe v2, binary tensors: a JSON header then one float32 output, as `pipeline serve` answers
HEAD = (b'{"model_name": "echo", "outputs": [{"name": "y", "datatype": "FP32", "shape": [1], '
        b'"parameters": {"binary_data_size": 4}}], "parameters": {"queue_ms": 0.0, '
        b'"compute_ms": 0.0, "batch_size": 1}}')
async def infer(request):
    await request.read()
    return web.Response(body=HEAD + bytes(4), content_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(len(HEAD))})
async def ready(request):
    return web.json_response({"ready": True})
async def server(request):
    return web.json_response({"name": "echo", "extensions": ["binary_tensor_data"]})
app = web.Application()
app.add_routes([web.post("/v2/models/echo/infer", infer), web.get("/v2/health/ready", ready),
                web.get("/v2", server), web.get("/v2/models/echo", ready)])
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
'''


def _ms(q: dict) -> str:
    return "inf" if q["value"] is None else f"{q['value']:.2f}"


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rates", default="50,100,200,400,800,1200,1600,2400")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    import numpy as np

    from pipeline.artifacts import dump
    from pipeline.core import deps
    from pipeline.loadgen import protocol, server
    from pipeline.loadgen.loadtest import LoadTest, Settings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    echo = subprocess.Popen([sys.executable, "-c", ECHO, str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        server.wait_ready(server.ready_route(url, "kserve"), 30)
        row = {"input_ids": np.arange(24)[None], "attention_mask": np.ones((1, 24), np.int64)}
        body = [protocol.kserve_payload(row, {"input_ids": "int64", "attention_mask": "int64"},
                                        binary=True)]
        points = []
        for rate in (float(r) for r in args.rates.split(",")):
            test = LoadTest(protocol.Target(url, "echo", "kserve", binary=True), body, Settings(duration=args.duration, warmup=1.0,
                            min_requests=200, timeout=5.0), server_pid=echo.pid)
            cpu0 = _cpu_s()
            measured, outcomes = test.point(rate)
            cpu = _cpu_s() - cpu0
            point = dump(measured)  # the LoadPoint as load-*.json holds it, and the client's CPU
            point["client_cpu_us_per_request"] = cpu / max(1, len(outcomes)) * 1e6
            points.append(point)
            print(f"{rate:7.0f}/s offered ({point['scheduled_rate']:.1f} scheduled): achieved "
                  f"{point['achieved_rate']:7.1f}/s, failed {point['requests'] - point['ok']}, late "
                  f"{point['late']['share']:6.1%} (p99 {point['late']['p99_ms']:6.1f} ms), round trip "
                  f"p50 {_ms(point['latency_ms']['p50'])} ms p99 {_ms(point['latency_ms']['p99'])} "
                  f"ms, client CPU {point['client_cpu_us_per_request']:.0f} us/request, echo CPU "
                  f"{(point['resources'] or {}).get('cpu_pct_mean', 0):.0f}%", flush=True)
            if point["late"]["share"] > 0.5 and point["achieved_rate"] < 0.9 * point["scheduled_rate"]:
                print("the client has fallen over: higher rates would only say so again", flush=True)
                break
    finally:
        echo.terminate()
        echo.wait(10)
    ok = [p for p in points if p["late"]["share"] < 0.01
          and p["achieved_rate"] >= 0.98 * p["scheduled_rate"]]
    ceiling = max((p["offered_rate"] for p in ok), default=None)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    result = {"what": "pipeline load's client against an aiohttp echo server (separate process)",
              "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "device": deps.device_line(deps.device()), "load_average": os.getloadavg(),
              "duration_s": args.duration, "client_ceiling_per_s": ceiling, "points": points}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"loadgen-overhead-{stamp}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# pipeline load: the client's own limits ({stamp})", "",
             f"{result['what']}; {result['device']}; load average before/while "
             f"{', '.join(f'{x:.1f}' for x in result['load_average'])}; {args.duration:g} s per rate "
             "(after 1 s warm-up), Poisson arrivals.", "",
             f"**Client ceiling: {ceiling} requests/s** (highest rate with < 1% of requests sent "
             "> 2 ms late and >= 98% of them answered in time). Below it, a load test measures "
             "the server; near or above it, the client.", "",
             "| offered/s | achieved/s | sent late | late p99 ms | round trip p50 ms | p99 ms "
             "| client CPU us/request | echo CPU % |", "|---|---|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p['offered_rate']:.0f} | {p['achieved_rate']:.1f} | {p['late']['share']:.1%} "
                     f"| {p['late']['p99_ms']:.1f} | {_ms(p['latency_ms']['p50'])} | "
                     f"{_ms(p['latency_ms']['p99'])} | {p['client_cpu_us_per_request']:.0f} | "
                     f"{(p['resources'] or {}).get('cpu_pct_mean', 0):.0f} |")
    (args.out / f"loadgen-overhead-{stamp}.md").write_text("\n".join(lines) + "\n")
    print(f"client ceiling: {ceiling} requests/s; written to {args.out}")


if __name__ == "__main__":
    main()
