"""Arrival schedules for an open-loop load point: when each request is due, from a seed.

An open-loop generator sends request i at its scheduled time whatever happened to request
i-1, the way independent users arrive; latency is then measured from that scheduled time
(client.py), so a stall of the server or of the client is charged to every request that
should have gone out during it (no coordinated omission).

    poisson    exponential gaps, mean 1/rate (CV 1): independent users, MLPerf's Server scenario
    constant   equal gaps 1/rate (CV 0): a fixed-rate feeder
    gamma      gamma-distributed gaps with mean 1/rate and coefficient of variation `cv`
               (shape 1/cv^2): cv > 1 is burstier than Poisson, cv < 1 smoother, cv 1 = Poisson

The same (kind, rate, duration, seed, cv) always gives the same times (numpy's PCG64).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Arrival = Literal["poisson", "constant", "gamma"]
ARRIVALS: tuple[str, ...] = ("poisson", "constant", "gamma")


def gaps(kind: Arrival, rate: float, count: int, seed: int, cv: float = 1.0) -> np.ndarray:
    """`count` inter-arrival gaps in seconds, mean 1/rate. [count] float64."""
    if rate <= 0 or not np.isfinite(rate):
        raise ValueError(f"rate must be a positive number of requests per second, not {rate}")
    mean = 1.0 / rate
    rng = np.random.default_rng(seed)
    if kind == "poisson":
        return rng.exponential(mean, count)
    if kind == "constant":
        return np.full(count, mean)
    if kind == "gamma":
        if cv <= 0:
            raise ValueError(f"gamma arrivals need a burstiness (CV) > 0, not {cv}")
        shape = 1.0 / cv**2  # gamma: CV = 1/sqrt(shape); mean = shape * scale
        return rng.gamma(shape, mean / shape, count)
    raise ValueError(f"unknown arrival process {kind!r}; one of {', '.join(ARRIVALS)}")


def arrivals(kind: Arrival, rate: float, duration: float, seed: int, cv: float = 1.0) -> np.ndarray:
    """Scheduled send times in seconds from the start, all < duration, ascending. The first
    request is due at its first gap (not at 0), so every gap is a real inter-arrival."""
    expected = rate * duration
    count = int(expected + 6 * np.sqrt(max(expected, 1.0)) * max(cv, 1.0) + 16)
    times = np.cumsum(gaps(kind, rate, count, seed, cv))
    while times[-1] < duration:  # an unlucky draw: extend with more of the same stream
        more = gaps(kind, rate, count, seed + len(times), cv)
        times = np.concatenate([times, times[-1] + np.cumsum(more)])
    return times[times < duration]


def describe(kind: Arrival, cv: float) -> str:
    """The arrival process in words, for reports."""
    if kind == "gamma":
        return f"gamma arrivals (burstiness CV {cv:g})"
    return {"poisson": "Poisson arrivals", "constant": "constant arrivals"}[kind]
