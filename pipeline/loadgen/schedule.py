"""Arrival schedules for an open-loop load point: when each request is due, from a seed.

An open-loop generator sends request i at its scheduled time whatever happened to request
i-1, the way independent users arrive; latency is then measured from that scheduled time
(client.py), so a stall of the server or of the client is charged to every request that
should have gone out during it (no coordinated omission).

    poisson    exponential gaps, mean 1/rate (CV 1): independent users, MLPerf's Server scenario
    constant   equal gaps 1/rate (CV 0): a fixed-rate feeder
    gamma      gamma-distributed gaps with mean 1/rate and coefficient of variation `cv`
               (shape 1/cv^2): cv > 1 is burstier than Poisson, cv < 1 smoother, cv 1 = Poisson

The same (kind, rate, duration, seed, cv) always gives the same times (numpy's PCG64). A
schedule is a generator, drawn as it is sent: `--rate 1e5 --duration 604800` holds no more
memory than `--rate 1 --duration 1`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Literal

import numpy as np

Arrival = Literal["poisson", "constant", "gamma"]
ARRIVALS: tuple[str, ...] = ("poisson", "constant", "gamma")


def gaps(kind: Arrival, rate: float, count: int, seed: int, cv: float = 1.0) -> np.ndarray:
    """`count` inter-arrival gaps in seconds, mean 1/rate. [count] float64."""
    if not (np.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive number of requests per second, not {rate}")
    if kind not in ARRIVALS:
        raise ValueError(f"unknown arrival process {kind!r}; one of {', '.join(ARRIVALS)}")
    if kind == "gamma" and not (np.isfinite(cv) and cv > 0):
        raise ValueError(f"gamma arrivals need a burstiness (CV) > 0, not {cv}")
    return _draw(np.random.default_rng(seed), kind, 1.0 / rate, count, cv)


def _draw(rng: np.random.Generator, kind: Arrival, mean: float, count: int, cv: float) -> np.ndarray:
    if kind == "poisson":
        return rng.exponential(mean, count)
    if kind == "constant":
        return np.full(count, mean)
    shape = 1.0 / cv**2  # gamma: CV = 1/sqrt(shape); mean = shape * scale
    return rng.gamma(shape, mean / shape, count)


CHUNK = 4096  # gaps drawn at a time: the memory of a schedule, whatever its rate x duration


def stream(kind: Arrival, rate: float, seed: int, cv: float = 1.0) -> Iterator[float]:
    """Send times in seconds from the start, ascending, without end: drawn CHUNK gaps at a
    time from one seeded generator (numpy draws the same values in chunks as in one call),
    so memory does not grow with rate x duration. The first request is due at its first gap
    (not at 0), so every gap is a real inter-arrival."""
    gaps(kind, rate, 0, seed, cv)  # the arguments checked now, not at the first next()
    return _stream(kind, rate, seed, cv)


def _stream(kind: Arrival, rate: float, seed: int, cv: float) -> Iterator[float]:
    for block in blocks(kind, rate, seed, cv):
        yield from block.tolist()


def blocks(kind: Arrival, rate: float, seed: int, cv: float = 1.0) -> Iterator[np.ndarray]:
    """The same send times as stream(), CHUNK at a time: for counting through a schedule at
    numpy's speed."""
    rng = np.random.default_rng(seed)
    t = 0.0
    while True:
        block = t + np.cumsum(_draw(rng, kind, 1.0 / rate, CHUNK, cv))
        yield block
        t = float(block[-1])


def nth_after(kind: Arrival, rate: float, seed: int, cv: float, start: float, n: int) -> float:
    """The send time of the n-th request (1-based) due at or after `start`."""
    gaps(kind, rate, 0, seed, cv)
    for block in blocks(kind, rate, seed, cv):
        later = block[block >= start]
        if later.size >= n:
            return float(later[n - 1])
        n -= later.size
    raise AssertionError("unreachable: the stream has no end")


def arrivals(kind: Arrival, rate: float, duration: float, seed: int, cv: float = 1.0) -> Iterator[float]:
    """The send times before `duration` (lazily: see stream)."""
    return itertools.takewhile(lambda t: t < duration, stream(kind, rate, seed, cv))


def describe(kind: Arrival, cv: float) -> str:
    """The arrival process in words, for reports."""
    if kind == "gamma":
        return f"gamma arrivals (burstiness CV {cv:g})"
    return {"poisson": "Poisson arrivals", "constant": "constant arrivals"}[kind]
