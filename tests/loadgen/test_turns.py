"""turns.py: plans run alone step by step, or in turns (A, B, A, B...), a finished plan
dropping out; the capacity search as a plan takes turns with another search."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipeline.loadgen import capacity, turns


def _plan(name: str, steps: int, log: list[str]):
    got = []
    for i in range(steps):
        got.append((yield lambda i=i: log.append(f"{name}{i}") or f"{name}{i}"))
    return got


def test_plans_take_turns_and_a_finished_one_drops_out():
    log: list[str] = []
    results = turns.in_turns([_plan("a", 3, log), _plan("b", 1, log)])
    assert log == ["a0", "b0", "a1", "a2"]
    assert results == [["a0", "a1", "a2"], ["b0"]]  # each plan is sent its own steps' results


def test_alone_runs_the_steps_in_order():
    log: list[str] = []
    assert turns.alone(_plan("a", 2, log)) == ["a0", "a1"] and log == ["a0", "a1"]


def test_a_failing_step_ends_every_plan_and_propagates():
    closed = []

    def plan(name: str, fail: bool):
        try:
            yield (lambda: 1 / 0) if fail else (lambda: 1)
            yield lambda: 2
        finally:
            closed.append(name)

    with pytest.raises(ZeroDivisionError):
        turns.in_turns([plan("a", False), plan("b", True)])
    assert sorted(closed) == ["a", "b"]


@dataclass
class Point:
    offered_rate: float
    passed: bool


def test_two_capacity_searches_take_turns_and_find_what_each_finds_alone():
    """A server holding 10/s and one holding 3/s: the searches in turns end where each ends
    alone, and their points alternate while both run."""
    order: list[tuple[str, float]] = []

    def measure(name: str, holds: float):
        def at(rate: float) -> Point:
            order.append((name, rate))
            return Point(rate, rate <= holds)
        return at

    def plan(name: str, holds: float):
        return (yield from turns.each(capacity.search_steps(1.0, max_points=8, tolerance=0.1),
                                      measure(name, holds)))

    together = turns.in_turns([plan("a", 10.0), plan("b", 3.0)])
    names = [name for name, _ in order]
    assert names[:8] == ["a", "b"] * 4  # both searches ran at least 4 points: strict turns
    alone = [capacity.search(measure(n, h), 1.0, max_points=8, tolerance=0.1)
             for n, h in (("a", 10.0), ("b", 3.0))]
    assert [found for found, _ in together] == [found for found, _ in alone]
    assert together[0][0].capacity <= 10 < together[0][0].bracket[1]
