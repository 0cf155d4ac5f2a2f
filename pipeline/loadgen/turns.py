"""Measuring plans, run alone or taking turns point by point.

A load test's mode is a *plan*: a generator that yields one step at a time (a callable that
measures one point and returns it), is sent that step's result, and returns what the mode
measured. Run alone, its steps run back to back. Two plans in turns run A's first step, then
B's, then A's second... (ABAB): both sides see the same machine, point by point, instead of
one side's whole run and then the other's (this machine's capacity for the same engine moved
from 8.5/s to 32.5/s between two runs 13 minutes apart: docs/serving.md). A plan that is done
drops out; the other goes on alone.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeVar

R = TypeVar("R")
Step = Callable[[], Any]
Plan = Generator[Step, Any, R]


def alone(plan: Plan[R]) -> R:
    """Run every step of `plan` in order; its result."""
    return in_turns([plan])[0]


def in_turns(plans: list[Plan]) -> list:
    """Run the plans' steps in turn, one step each per round (ABAB...); their results, in the
    plans' order. An exception in a step ends every plan (each is closed) and propagates."""
    results: list = [None] * len(plans)
    pending: dict[int, Step] = {}
    try:
        for i in range(len(plans)):
            _advance(plans, i, None, pending, results, first=True)
        while pending:
            for i in sorted(pending):
                step = pending.pop(i)
                _advance(plans, i, step(), pending, results)
    finally:
        for plan in plans:
            plan.close()
    return results


def _advance(plans: list[Plan], i: int, value, pending: dict[int, Step], results: list,
             first: bool = False) -> None:
    """Send `value` to plan i (start it when `first`): its next step goes in `pending`, or its
    result in `results` when it returned."""
    try:
        pending[i] = next(plans[i]) if first else plans[i].send(value)
    except StopIteration as done:
        results[i] = done.value


def each(steps: Generator[Any, Any, R], measure: Callable[[Any], Any]) -> Plan[R]:
    """A generator that yields *what* to measure (capacity.search_steps yields rates) as a
    plan that yields *how*: measure(item), one step each; `yield from` it inside a plan."""
    item = next(steps)
    while True:
        result = yield (lambda item=item: measure(item))
        try:
            item = steps.send(result)
        except StopIteration as done:
            return done.value
