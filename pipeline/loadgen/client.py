"""The HTTP client of a load point: open loop (a schedule) or closed loop (N users).

Open loop: one dispatcher walks the schedule and starts request i at t0 + times[i], never
waiting for earlier answers. Each request's latency is counted from its *scheduled* time:
when the server (or this client) stalls, the requests that should have gone out during the
stall still count from when they were due, so the stall is charged to every one of them
(coordinated omission would charge it to one). How late each was actually sent is kept too.

Closed loop: N users each send, wait for the answer, send again; latency from the send.

Every request resolves: 200 ok, 503 rejected (the server's queue was full), another status
or a broken connection is an error, and no answer by `timeout` seconds after it was due is a
timeout. None is dropped. aiohttp (also a dependency of Ray Serve) is the client; one event
loop in this process, separate from the server's.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Target:
    """Where requests go: `url` is the model's base, e.g. http://127.0.0.1:8000/v1/models/minilm;
    `generate`: POST {url}/generate with streamed tokens, else POST {url}/infer."""

    url: str
    generate: bool = False

    @property
    def endpoint(self) -> str:
        return f"{self.url.rstrip('/')}/{'generate' if self.generate else 'infer'}"


@dataclass
class Outcome:
    """One request, times in seconds from the point's start (t0)."""

    due: float                 # scheduled send time (closed loop: the send time)
    sent: float = float("nan")
    done: float = float("nan")
    status: str = "error"      # ok | rejected | error | timeout
    queue_ms: float | None = None
    compute_ms: float | None = None
    batch_size: int | None = None
    tokens: list[float] = field(default_factory=list)  # arrival of each streamed token
    server: dict = field(default_factory=dict)  # generation: the server's own ttft/tpot (ms)
    error: str | None = None

    @property
    def latency(self) -> float:
        """Seconds from due to the last byte; inf unless ok (never below the bound)."""
        return self.done - self.due if self.status == "ok" else float("inf")


async def _exchange(session, target: Target, body: dict, out: Outcome, t0: float) -> None:
    async with session.post(target.endpoint, json=body) as resp:
        if resp.status == 503:
            out.status = "rejected"
            await resp.read()
            return
        if resp.status != 200:
            out.status, out.error = "error", f"HTTP {resp.status}: {(await resp.text())[:200]}"
            return
        if not target.generate:
            reply = await resp.json(content_type=None)
            out.queue_ms, out.compute_ms = reply.get("queue_ms"), reply.get("compute_ms")
            out.batch_size = reply.get("batch_size")
            out.status = "ok"
            return
        async for line in resp.content:  # NDJSON: {"token": id} ..., then {"done": true, ...}
            if not line.strip():
                continue
            message = json.loads(line)
            if "token" in message:
                out.tokens.append(time.perf_counter() - t0)
            elif message.get("done"):
                out.queue_ms, out.batch_size = message.get("queue_ms"), message.get("batch_size")
                out.server = {k: message[k] for k in ("ttft_ms", "tpot_ms") if k in message}
                out.status = "ok"
            elif "error" in message:
                out.status, out.error = "error", str(message["error"])[:200]
                return


async def _one(session, target: Target, body: dict, t0: float, due: float,
               timeout: float) -> Outcome:
    out = Outcome(due=due, sent=time.perf_counter() - t0)
    left = t0 + due + timeout - time.perf_counter()  # the timeout runs from the scheduled time
    try:
        if left <= 0:
            raise asyncio.TimeoutError
        await asyncio.wait_for(_exchange(session, target, body, out, t0), left)
    except asyncio.TimeoutError:
        out.status, out.error = "timeout", f"no answer {timeout:g} s after it was due"
    except Exception as e:  # a refused or reset connection, a malformed reply: an error, resolved
        out.status, out.error = "error", f"{type(e).__name__}: {e}"[:200]
    out.done = time.perf_counter() - t0
    if out.status == "ok" and target.generate and not out.tokens:
        out.status, out.error = "error", "the stream ended without a token"
    return out


async def _until(when: float) -> None:
    """Sleep until perf_counter() >= when. epoll sleeps in whole milliseconds, rounded up, so
    this wakes up to ~1 ms late (summary.LATE_MS allows for it); no busy wait, which would
    take CPU from a server on the same machine. The lateness is in the latency anyway."""
    delay = when - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


def _session(connections: int):
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, force_close=False),
        timeout=aiohttp.ClientTimeout(total=None))


async def open_loop(target: Target, times: np.ndarray, bodies: list[dict], timeout: float,
                    connections: int = 1024, start: float | None = None) -> list[Outcome]:
    """Send request i at times[i] seconds after `start` (a time.perf_counter() value; default:
    now + a short lead), bodies in turn."""
    async with _session(connections) as session:
        t0 = time.perf_counter() + 0.05 if start is None else start  # the lead: no negative sleep
        tasks = []
        for i, due in enumerate(times):
            await _until(t0 + float(due))
            body = bodies[i % len(bodies)]
            tasks.append(asyncio.create_task(_one(session, target, body, t0, float(due), timeout)))
        return list(await asyncio.gather(*tasks))


async def closed_loop(target: Target, users: int, duration: float, bodies: list[dict],
                      timeout: float) -> list[Outcome]:
    """`users` concurrent users, each sending its next request as soon as the last is
    answered, until `duration` seconds have passed."""
    async with _session(users) as session:
        t0 = time.perf_counter()
        counter = iter(range(1 << 62))

        async def user() -> list[Outcome]:
            mine = []
            while (now := time.perf_counter() - t0) < duration:
                body = bodies[next(counter) % len(bodies)]
                mine.append(await _one(session, target, body, t0, now, timeout))
            return mine

        per_user = await asyncio.gather(*(user() for _ in range(users)))
    return sorted((o for outs in per_user for o in outs), key=lambda o: o.due)


def run_open(target: Target, times: np.ndarray, bodies: list[dict], timeout: float) -> list[Outcome]:
    return asyncio.run(open_loop(target, times, bodies, timeout))


def run_closed(target: Target, users: int, duration: float, bodies: list[dict],
               timeout: float) -> list[Outcome]:
    return asyncio.run(closed_loop(target, users, duration, bodies, timeout))
