"""A load run at 1.5x capacity with one malformed request in every 20 (issue 39's must-show):
only the malformed ones fail; valid requests are answered 200, or 503 "queue full" when the
bounded queue sheds the load beyond capacity (counted apart: an honest refusal with
Retry-After, not a failure of the request's batch-mates).

    1. `pipeline serve RECIPE` in a subprocess (the recipe's own serve: settings).
    2. Capacity: a closed loop of CLOSED_USERS users for PROBE_S seconds (valid requests only);
       capacity = answered requests / second.
    3. An open loop (Poisson arrivals, fixed seed) at 1.5x capacity for RUN_S seconds; every
       20th request malformed, rotating: floats where ids go (wrong dtype), an id beyond the
       vocabulary (out of range), input_ids and attention_mask of different lengths (shape).
    4. Each answer counted by kind and status; latencies of the 200s.

    .venv/bin/python benchmarks/malformed_load.py --recipe minilm-int8 --engines-dir /tmp/eng \
        --out benchmarks/results/malformed-load-2026-12-05.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
CLOSED_USERS = 16
PROBE_S = 15.0
RUN_S = 40.0
EVERY = 20          # one malformed request in every EVERY
OVERLOAD = 1.5
SEQ = 32            # tokens per request
VOCAB = 30522       # the recipe's input range: [0, 30522)
MALFORMED = ("wrong dtype", "out-of-range id", "bad shape")


def valid_body(rng: random.Random) -> dict:
    ids = [101] + [rng.randrange(1000, VOCAB) for _ in range(SEQ - 2)] + [102]
    return {"inputs": {"input_ids": [ids], "attention_mask": [[1] * SEQ]}}


def malformed_body(kind: str, rng: random.Random) -> dict:
    body = valid_body(rng)
    ids = body["inputs"]["input_ids"][0]
    if kind == "wrong dtype":
        body["inputs"]["input_ids"] = [[i + 0.5 for i in ids]]
    elif kind == "out-of-range id":
        ids[SEQ // 2] = 100_000
    else:  # bad shape: the mask one token shorter than the ids
        body["inputs"]["attention_mask"] = [[1] * (SEQ - 1)]
    return body


def start_server(recipe: str, engines: Path, port: int) -> subprocess.Popen:
    log = open(engines / f"serve-{port}.log", "w")  # noqa: SIM115  (closed with the process)
    return subprocess.Popen([str(ROOT / ".venv/bin/pipeline"), "serve", recipe, "--engines-dir",
                             str(engines), "--port", str(port)], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


async def wait_ready(client: aiohttp.ClientSession, url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"pipeline serve exited with {proc.returncode}")
        try:
            async with client.get(f"{url}/ready") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(1)
    raise SystemExit("the server was not ready within 300 s")


async def probe(client: aiohttp.ClientSession, url: str, seed: int) -> float:
    """Closed loop, valid requests only: answered (200) requests per second."""
    rng, done, stop = random.Random(seed), 0, time.monotonic() + PROBE_S

    async def user():
        nonlocal done
        while time.monotonic() < stop:
            async with client.post(f"{url}/infer", json=valid_body(rng)) as r:
                await r.read()
                done += r.status == 200

    began = time.monotonic()
    await asyncio.gather(*(user() for _ in range(CLOSED_USERS)))
    return done / (time.monotonic() - began)


async def open_loop(client: aiohttp.ClientSession, url: str, rate: float, seed: int) -> list[dict]:
    """Poisson arrivals at `rate` for RUN_S: every EVERY-th request malformed (rotating kinds)."""
    rng = random.Random(seed)
    records, tasks, t, n = [], [], 0.0, 0
    began = time.monotonic()

    async def send(kind: str, body: dict):
        sent = time.monotonic()
        try:
            async with client.post(f"{url}/infer", json=body) as r:
                data = await r.json(content_type=None)
                status, error = r.status, (data.get("error") if r.status != 200 else None)
                shape = r.headers.get("content-type", "")
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            status, error, shape = None, f"{type(e).__name__}: {e}", ""
        records.append({"kind": kind, "status": status, "error": error, "content_type": shape,
                        "ms": (time.monotonic() - sent) * 1000})

    while t < RUN_S:
        n += 1
        kind = MALFORMED[(n // EVERY - 1) % len(MALFORMED)] if n % EVERY == 0 else "valid"
        body = valid_body(rng) if kind == "valid" else malformed_body(kind, rng)
        await asyncio.sleep(max(0.0, began + t - time.monotonic()))
        tasks.append(asyncio.create_task(send(kind, body)))
        t += rng.expovariate(rate)
    await asyncio.gather(*tasks)
    return records


def summary(records: list[dict]) -> dict:
    out = {}
    for kind in ("valid", *MALFORMED):
        mine = [r for r in records if r["kind"] == kind]
        statuses = Counter(str(r["status"]) for r in mine)
        ok = [r["ms"] for r in mine if r["status"] == 200]
        out[kind] = {"sent": len(mine), "statuses": dict(statuses),
                     "json_errors": sum(1 for r in mine if r["status"] != 200
                                        and r["content_type"].startswith("application/json")),
                     "p50_ms_200": statistics.median(ok) if ok else None,
                     "errors_seen": sorted({str(r["error"])[:120] for r in mine if r["error"]})[:3]}
    return out


async def run(args) -> dict:
    from pipeline.serving.app import free_port

    port = free_port()
    proc = start_server(args.recipe, args.engines_dir, port)
    url = f"http://127.0.0.1:{port}/v1/models/{args.recipe}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60),
                                         connector=aiohttp.TCPConnector(limit=2000)) as client:
            await wait_ready(client, url, proc)
            capacity = await probe(client, url, args.seed)
            rate = OVERLOAD * capacity
            load_before = os.getloadavg()
            records = await open_loop(client, url, rate, args.seed)
            return {"recipe": args.recipe, "capacity_rps": capacity, "rate_rps": rate,
                    "run_s": RUN_S, "every": EVERY, "seq": SEQ, "closed_users": CLOSED_USERS,
                    "probe_s": PROBE_S, "loadavg_before_after": [load_before, os.getloadavg()],
                    "summary": summary(records)}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", default="minilm-int8")
    parser.add_argument("--engines-dir", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
