"""The HTTP client of a load point: open loop (a schedule) or closed loop (N users).

Open loop: one dispatcher walks the schedule and starts request i at t0 + times[i], never
waiting for earlier answers. Each request's latency is counted from its *scheduled* time:
when the server (or this client) stalls, the requests that should have gone out during the
stall still count from when they were due, so the stall is charged to every one of them
(coordinated omission would charge it to one). How late each was actually sent is kept too.

Closed loop: N users each send, wait for the answer, send again; latency from the send.

Every request resolves: 200 ok, 503 or 429 rejected (the server's queue was full), another
status, a broken connection or an answer whose figures cannot be counted (replies.py) is an
error, and no answer by `timeout` seconds after it was due is a timeout. None is dropped.
What is sent and read is the standard protocols' (protocol.py: KServe v2, the OpenAI API). aiohttp (also a dependency of Ray Serve) is the client; one event
loop in this process, separate from the server's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from pipeline.loadgen import replies
from pipeline.loadgen.outcome import Outcome
from pipeline.loadgen.protocol import HEADER_LENGTH, Payload, Target

__all__ = ["Outcome", "Target", "closed_loop", "drive_closed", "drive_open", "http_session", "one",
           "open_loop", "run_closed", "run_open"]

Unit = TypeVar("Unit")


async def _exchange(session, target: Target, body: Payload, out: Outcome, t0: float,
                    empty_ok: bool) -> None:
    async with session.post(target.endpoint, data=body.data, headers=body.headers) as resp:
        if resp.status in (429, 503):  # the server's queue was full (vLLM and OpenAI say 429)
            out.status = "rejected"
            await resp.read()
            return
        if resp.status != 200:
            out.status, out.error = "error", f"HTTP {resp.status}: {(await resp.text())[:200]}"
            return
        if target.generate:
            await replies.read_stream(resp.content, target.api == "chat", out, t0, empty_ok)
        else:
            replies.read_kserve(await resp.read(), resp.headers.get(HEADER_LENGTH), out)
        out.status = "ok"


async def one(session, target: Target, body: Payload, t0: float, due: float,
              timeout: float, empty_ok: bool = False) -> Outcome:
    """One request, resolved: sent now, due at `due` (seconds after t0), timed out `timeout`
    seconds after it was due. empty_ok: a streamed reply without text is an answer."""
    out = Outcome(due=due, sent=time.perf_counter() - t0)
    left = t0 + due + timeout - time.perf_counter()  # the timeout runs from the scheduled time
    try:
        if left <= 0:
            raise asyncio.TimeoutError
        await asyncio.wait_for(_exchange(session, target, body, out, t0, empty_ok), left)
    except asyncio.TimeoutError:
        out.status, out.error = "timeout", f"no answer {timeout:g} s after it was due"
    except replies.BadReply as e:  # an answer whose figures cannot be counted: failed, with why
        out.status, out.error = "error", str(e)[:200]
    except Exception as e:  # a refused or reset connection, a malformed reply: an error, resolved
        out.status, out.error = "error", f"{type(e).__name__}: {e}"[:200]
    out.done = time.perf_counter() - t0
    return out


async def _until(when: float) -> None:
    """Sleep until perf_counter() >= when. epoll sleeps in whole milliseconds, rounded up, so
    this wakes up to ~1 ms late (summary.LATE_MS allows for it); no busy wait, which would
    take CPU from a server on the same machine. The lateness is in the latency anyway."""
    delay = when - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


def http_session(connections: int):
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, force_close=False),
        timeout=aiohttp.ClientTimeout(total=None))


Send = Callable[[object, int, float, float], Awaitable[Unit]]  # (session, i, t0, due) -> unit


async def drive_open(times: Iterable[float], send: Send, connections: int = 1024,
                     start: float | None = None) -> list[Unit]:
    """Start unit i, send(session, i, t0, due), at t0 + times[i] (t0: `start`, a
    time.perf_counter() value; default now + a short lead), never waiting for earlier ones.
    A unit is one request (open_loop) or one multi-turn task (task_client.py)."""
    async with http_session(connections) as session:
        t0 = time.perf_counter() + 0.05 if start is None else start  # the lead: no negative sleep
        running = []
        for i, due in enumerate(times):
            await _until(t0 + float(due))
            running.append(asyncio.create_task(send(session, i, t0, float(due))))
        return list(await asyncio.gather(*running))


async def drive_closed(users: int, duration: float, send: Send) -> list[Unit]:
    """`users` concurrent users, each starting its next unit as soon as its last one ended,
    until `duration` seconds have passed (a unit started then runs to its end); sorted by
    when each was due (its `due`)."""
    async with http_session(users) as session:
        t0 = time.perf_counter()
        counter = iter(range(1 << 62))

        async def user() -> list[Unit]:
            mine = []
            while (now := time.perf_counter() - t0) < duration:
                mine.append(await send(session, next(counter), t0, now))
            return mine

        per_user = await asyncio.gather(*(user() for _ in range(users)))
    return sorted((unit for units in per_user for unit in units), key=lambda unit: unit.due)


async def open_loop(target: Target, times: Iterable[float], bodies: list[Payload], timeout: float,
                    connections: int = 1024, start: float | None = None) -> list[Outcome]:
    """Send request i at times[i] seconds after `start`, bodies in turn."""
    async def send(session, i: int, t0: float, due: float) -> Outcome:
        return await one(session, target, bodies[i % len(bodies)], t0, due, timeout)

    return await drive_open(times, send, connections, start)


async def closed_loop(target: Target, users: int, duration: float, bodies: list[Payload],
                      timeout: float) -> list[Outcome]:
    """`users` concurrent users, each sending its next request as soon as the last is
    answered, until `duration` seconds have passed."""
    async def send(session, i: int, t0: float, due: float) -> Outcome:
        return await one(session, target, bodies[i % len(bodies)], t0, due, timeout)

    return await drive_closed(users, duration, send)


def run_open(target: Target, times: Iterable[float], bodies: list[Payload], timeout: float) -> list[Outcome]:
    return asyncio.run(open_loop(target, times, bodies, timeout))


def run_closed(target: Target, users: int, duration: float, bodies: list[Payload],
               timeout: float) -> list[Outcome]:
    return asyncio.run(closed_loop(target, users, duration, bodies, timeout))
