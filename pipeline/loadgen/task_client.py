"""The HTTP client of a task load point: chat tasks arriving open loop (a schedule of task
start times) or run by N task-users back to back (closed loop).

A task's turns run in order over one connection pool: turn k+1 is sent `think` seconds after
turn k's answer ended, carrying the conversation so far (tasks.turn_body). Turn 1 is due at
the task's scheduled time, so a late start is in its TTFT and in the time per task (no
coordinated omission, as client.py); a later turn is due when it is sent. A turn that fails
(an error, a rejection, a timeout `timeout` seconds after it was due) ends its task: the
conversation cannot go on without the reply. Every task resolves.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from pipeline.core.json_object import JsonObject
from pipeline.loadgen import client
from pipeline.loadgen.outcome import Outcome
from pipeline.loadgen.protocol import Target
from pipeline.loadgen.tasks import Script, turn_body


@dataclass
class TaskOutcome:
    """One task, times in seconds from the point's start (t0)."""

    script: Script
    due: float                 # scheduled start (closed loop: when the user started it)
    turns: list[Outcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return len(self.turns) == len(self.script.questions) and \
            all(t.status == "ok" for t in self.turns)

    @property
    def done(self) -> float:
        return self.turns[-1].done if self.turns else float("nan")

    @property
    def seconds(self) -> float:
        """Scheduled start to the last turn's end; inf when a turn failed."""
        return self.done - self.due if self.ok else float("inf")


@dataclass(frozen=True)
class Pace:
    """How a task's turns go: max_tokens per turn, think time between them, the timeout;
    distinct: each task's first message starts with a tag of its own (DISTINCT)."""

    max_tokens: int
    think: float
    timeout: float
    distinct: bool = False


# Before a task's first question when Pace.distinct: no two conversations then share more
# than the system prompt (the scripts repeat; users' chats do not). Numbered per process.
DISTINCT = "[#{n}] "
_numbers = itertools.count(1)


async def run_task(session, target: Target, script: Script, t0: float, due: float,
                   pace: Pace) -> TaskOutcome:
    task = TaskOutcome(script, due)
    conversation: list[JsonObject] = []
    for k, question in enumerate(script.questions):
        if k:
            await asyncio.sleep(pace.think)
        tag = DISTINCT.format(n=next(_numbers)) if pace.distinct and k == 0 else ""
        conversation.append({"role": "user", "content": tag + question.question})
        body = turn_body(target, conversation, pace.max_tokens)
        turn_due = due if k == 0 else time.perf_counter() - t0
        out = await client.one(session, target, body, t0, turn_due, pace.timeout, empty_ok=True)
        task.turns.append(out)
        if out.status != "ok":
            break
        conversation.append({"role": "assistant", "content": out.reply.strip()})
    return task


async def open_tasks(target: Target, times: Iterable[float], scripts: list[Script], pace: Pace,
                     connections: int = 1024) -> list[TaskOutcome]:
    """Start task i at times[i] seconds after t0 (now + a short lead), scripts in turn."""
    async def send(session, i: int, t0: float, due: float) -> TaskOutcome:
        return await run_task(session, target, scripts[i % len(scripts)], t0, due, pace)

    return await client.drive_open(times, send, connections)


async def closed_tasks(target: Target, users: int, duration: float, scripts: list[Script],
                       pace: Pace) -> list[TaskOutcome]:
    """`users` task-users, each starting its next task when the last one ended, until
    `duration` seconds have passed (a task started then runs to its end)."""
    async def send(session, i: int, t0: float, due: float) -> TaskOutcome:
        return await run_task(session, target, scripts[i % len(scripts)], t0, due, pace)

    return await client.drive_closed(users, duration, send)


def run_open(target: Target, times: Iterable[float], scripts: list[Script], pace: Pace) -> list[TaskOutcome]:
    return asyncio.run(open_tasks(target, times, scripts, pace))


def run_closed(target: Target, users: int, duration: float, scripts: list[Script],
               pace: Pace) -> list[TaskOutcome]:
    return asyncio.run(closed_tasks(target, users, duration, scripts, pace))
