"""What the separate HTTP ingress (pipeline/serving/ingress.py) costs per streamed token.

Three Ray Serve applications run side by side in one local Ray, each serving the same paced
token stream (a replica app that writes one server-sent event every PACE_MS, the SmolLM2
INT4 decode step measured on this machine, stamped with the time it was written):

    direct   the replica app as Serve's own ingress (the layout before issue 39)
    ingress  Serve's proxy -> the ingress deployment -> the replica (ReplicaHttp), window 0
    window   the same, the replica joining the pieces that come within WINDOW_S

One client streams from them in turn (1 stream at a time, the order rotated every round),
and records for every token the delay from the replica writing it to the client reading it,
and the CPU time the ingress process used per token (psutil, before and after each mode's
streams). A second part streams real tokens from a real generation engine (`--engines`,
`--recipe`: a built generation folder) through `direct` and `ingress`, interleaved, and
compares the client's time per output token.

    .venv/bin/python benchmarks/ingress_hop.py --engines /tmp/proj/engines --recipe lm-gen@469fdc52 \
        --out benchmarks/results/ingress-hop-2026-12-05.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PACE_MS = 10.9    # SmolLM2 INT4's decode step on this machine (the lead's figure)
TOKENS = 64       # tokens per stream
WINDOW_S = 0.02


def paced_app():
    """A FastAPI app streaming `n` events, one every PACE_MS, each stamped when written."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    api = FastAPI()

    @api.get("/{rest:path}")
    async def stream(rest: str, n: int = TOKENS):
        async def events():
            for i in range(n):
                await asyncio.sleep(PACE_MS / 1000)
                yield f"data: {json.dumps({'i': i, 't': time.time()})}\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    return api


def paced_deployments(window_s: float | None):
    """The bound application: the paced app as its own ingress (window_s None), else behind
    pipeline's ingress deployment."""
    from ray import serve

    from pipeline.serving import app as serving_app

    class Paced:
        def __init__(self):
            from pipeline.serving.ingress import ReplicaHttp

            self.api = paced_app()
            self.forwarded = ReplicaHttp(self.api, window_s or 0.0)

        def __serve_build_asgi_app__(self):
            return self.api

        async def http(self, request: dict):
            async for item in self.forwarded.answer(request):
                yield item

        async def body_limit(self) -> int:
            return 1 << 20

    options = {"max_ongoing_requests": 1000, "ray_actor_options": {"num_cpus": 0}}
    if window_s is None:
        return serve.deployment(name="paced", **options)(serve.ingress()(Paced)).bind()
    replica = serve.deployment(name="paced", **options)(Paced).bind()
    ingress = serve.deployment(name="ingress", ray_actor_options={"num_cpus": 0})(
        serve.ingress()(serving_app._ingress(None)))
    return ingress.bind(replica)


def stream_delays(url: str) -> tuple[list[float], float]:
    """(per token: ms from written to read, the stream's wall ms) of one paced stream."""
    import requests

    delays, began = [], time.perf_counter()
    with requests.get(url, stream=True, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                delays.append((time.time() - json.loads(line[6:])["t"]) * 1000)
    return delays, (time.perf_counter() - began) * 1000


def ingress_processes(app_name: str):
    import psutil

    tag = f"ServeReplica:{app_name}:ingress"
    return [p for p in psutil.process_iter(["cmdline"]) if tag in " ".join(p.info["cmdline"] or [])]


def cpu_s(processes) -> float:
    total = 0.0
    for p in processes:
        t = p.cpu_times()
        total += t.user + t.system
    return total


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def paced_part(port: int, rounds: int) -> dict:
    from ray import serve

    modes = {"direct": None, "ingress": 0.0, "window": WINDOW_S}
    for name, window in modes.items():
        serve.run(paced_deployments(window), name=name, route_prefix=f"/{name}", blocking=False)
    procs = {name: ingress_processes(name) for name in modes}
    delays = {name: [] for name in modes}
    cpu = {name: 0.0 for name in modes}
    for _ in range(2):  # warm-up
        for name in modes:
            stream_delays(f"http://127.0.0.1:{port}/{name}/s")
    for r in range(rounds):
        order = list(modes)[r % 3:] + list(modes)[:r % 3]
        for name in order:
            before = cpu_s(procs[name])
            d, _ = stream_delays(f"http://127.0.0.1:{port}/{name}/s")
            cpu[name] += cpu_s(procs[name]) - before
            delays[name].append(d)
    out = {}
    for name in modes:
        flat = [x for d in delays[name] for x in d]
        out[name] = {"tokens": len(flat), "delay_ms_p50": statistics.median(flat),
                     "delay_ms_p90": percentile(flat, 0.9), "delay_ms_p99": percentile(flat, 0.99),
                     "ingress_cpu_ms_per_token": cpu[name] * 1000 / len(flat) if procs[name] else 0.0,
                     "stream_medians_ms": [statistics.median(d) for d in delays[name]]}
    for name in modes:
        serve.delete(name)
    return out


def engine_part(port: int, engines: Path, recipe_ref: str, rounds: int) -> dict:
    """Real tokens: /v1/completions streamed from `direct` and `ingress`, interleaved."""
    import requests
    from ray import serve

    from pipeline.generation.decoder import context_length
    from pipeline.serving import app as serving_app
    from pipeline.store.folder_names import load

    recipe = load(recipe_ref, (), engines)
    spec = recipe.serve
    for name, separate in (("gdirect", False), ("gingress", True)):
        serve.run(serving_app.deployment(recipe, engines.resolve(), None, spec, 1, None, None, separate),
                  name=name, route_prefix=f"/{name}", blocking=False)
    room = context_length(recipe) - 8
    tpot = {"gdirect": [], "gingress": []}
    for r in range(rounds + 1):
        for name in (("gdirect", "gingress") if r % 2 else ("gingress", "gdirect")):
            body = {"model": recipe.name, "prompt": "ROMEO:", "max_tokens": room, "temperature": 0,
                    "stream": True}
            stamps = []
            with requests.post(f"http://127.0.0.1:{port}/{name}/v1/completions", json=body,
                               stream=True, timeout=120) as resp:
                for line in resp.iter_lines():
                    if line.startswith(b"data: {"):
                        stamps.append(time.perf_counter())
            if r and len(stamps) > 2:  # round 0 warms up
                tpot[name].append((stamps[-1] - stamps[0]) * 1000 / (len(stamps) - 1))
    for name in tpot:
        serve.delete(name)
    ratio = [i / d for i, d in zip(tpot["gingress"], tpot["gdirect"], strict=False)]
    return {"recipe": recipe.name, "max_tokens": room,
            "tpot_ms_median": {k: statistics.median(v) for k, v in tpot.items()},
            "ingress_over_direct_median": statistics.median(ratio), "pairs": len(ratio)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engines", type=Path)
    parser.add_argument("--recipe")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from ray import serve

    from pipeline.serving.app import free_port, local_ray

    port = free_port()
    with local_ray(num_cpus=2):
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        load_before = os.getloadavg()
        result = {"pace_ms": PACE_MS, "tokens_per_stream": TOKENS, "window_s": WINDOW_S,
                  "rounds": args.rounds, "paced": paced_part(port, args.rounds)}
        if args.engines:
            result["engine"] = engine_part(port, args.engines, args.recipe, args.rounds)
        result["loadavg_before_after"] = [load_before, os.getloadavg()]
        serve.shutdown()
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
