"""Capacity: the highest offered Poisson rate at which a point passes its SLO (summary.passed:
the percentile bound with MLPerf's early-stopping rule, achieved rate within 2% of offered,
failures under 0.1%), found with a bounded number of points.

Bracketing first: from the start rate, double while points pass (or halve while they fail)
until one passes and one fails; then bisection between the highest passing and the lowest
failing rate until they are within `tolerance` of each other or the points run out. The
capacity is the highest rate that passed, and [that rate, the lowest rate that failed] is
its bracket: the capacity lies in it as far as each point's verdict is right. Every point
uses the same seed, so arrival schedules at two rates are the same draw, scaled (common
random numbers: a point is not lucky because its schedule was calmer).

`measure(rate) -> point` is any function: the real client (loadtest.py), a simulated queue in
the tests.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Protocol, TypeVar

from pipeline.artifacts.serving import Capacity

MAX_POINTS = 10
TOLERANCE = 0.05
LOWEST_RATE = 0.05  # requests/s: below this a server does not hold the SLO at all


class Point(Protocol):
    """What the search reads of a point (an artifacts.serving.LoadPoint, or a test's own)."""

    @property
    def offered_rate(self) -> float: ...

    @property
    def passed(self) -> bool | None: ...


P = TypeVar("P", bound=Point)


def search(measure: Callable[[float], P], start: float, *, max_points: int = MAX_POINTS,
           tolerance: float = TOLERANCE,
           on_point: Callable[[P], None] | None = None) -> tuple[Capacity, list[P]]:
    """(the capacity with its bracket [passing, failing], whether it converged and why; the
    points measured, by offered rate)."""
    steps = search_steps(start, max_points=max_points, tolerance=tolerance)
    rate = next(steps)
    while True:
        point = measure(rate)
        if on_point:
            on_point(point)
        try:
            rate = steps.send(point)
        except StopIteration as done:
            return done.value


def search_steps(start: float, *, max_points: int = MAX_POINTS, tolerance: float = TOLERANCE
                 ) -> Generator[float, P, tuple[Capacity, list[P]]]:
    """The search as a generator: it yields the next rate to measure and is sent that point;
    it returns what search() returns. So whoever measures decides when (two searches can take
    turns point by point: turns.py)."""
    if start <= 0:
        raise ValueError("the start rate must be > 0")
    points: list[P] = []

    def passes(point: P) -> bool:
        points.append(point)
        return bool(point.passed)

    good, bad = None, None
    rate = start
    while len(points) < max_points and (good is None or bad is None):
        if passes((yield rate)):
            good = rate
            rate = rate * 2 if bad is None else rate
        else:
            bad = rate
            if rate / 2 < LOWEST_RATE:
                break
            rate = rate / 2 if good is None else rate
        if good is not None and bad is not None:
            break
    while (good is not None and bad is not None and len(points) < max_points
           and (bad - good) / good > tolerance):
        mid = (good + bad) / 2
        if passes((yield mid)):
            good = mid
        else:
            bad = mid
    converged = good is not None and bad is not None and (bad - good) / good <= tolerance
    if good is None:
        why = f"no rate down to {rate:g}/s passed"
    elif bad is None:
        why = f"every rate up to {good:g}/s passed: the capacity is higher (raise --max-points)"
    elif not converged:
        why = f"stopped after {len(points)} points with the bracket {(bad - good) / good:.0%} wide"
    else:
        why = f"bracket within {tolerance:.0%}"
    found = Capacity(capacity=good, bracket=[good, bad], converged=converged, why=why)
    return found, sorted(points, key=lambda p: p.offered_rate)
