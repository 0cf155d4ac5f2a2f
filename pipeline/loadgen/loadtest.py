"""One load test against one server: points at offered rates (open loop), at a concurrency
(closed loop), a sweep, the capacity search, a soak. Each point warms up first (its requests
are sent and excluded), then measures for at least `duration` seconds and at least
`min_requests` requests (the schedule is lengthened to hold them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pipeline.artifacts.serving import Capacity, LoadPoint, Soak
from pipeline.loadgen import capacity, client, resources, schedule, soak, summary
from pipeline.loadgen.slo import Term


@dataclass
class Settings:
    arrival: schedule.Arrival = "poisson"
    burstiness: float = 1.0
    duration: float = 10.0       # seconds measured per point (at least)
    warmup: float = 2.0          # seconds of requests sent first and not measured
    min_requests: int = 500      # measured requests per point (at least)
    timeout: float = 10.0        # seconds after its scheduled time a request times out
    seed: int = 0
    terms: tuple[Term, ...] = ()
    generation: bool = False


@dataclass
class LoadTest:
    target: client.Target
    bodies: list[dict]
    settings: Settings
    server_pid: int | None = None
    on_point: Callable[[LoadPoint], None] | None = None
    samples: list = field(default_factory=list)

    def schedule(self, rate: float, window: float | None = None) -> tuple[np.ndarray, float]:
        """(send times, measured window): at least `duration` seconds and `min_requests`
        requests after the warm-up; a Poisson draw short of requests is lengthened to the
        min_requests-th arrival (same seed, so the same draw). `window` given: exactly that."""
        s = self.settings
        if window is not None:
            return schedule.arrivals(s.arrival, rate, s.warmup + window, s.seed, s.burstiness), window
        longest = s.warmup + 2 * max(s.duration, s.min_requests / rate) + 10 / rate
        times = schedule.arrivals(s.arrival, rate, longest, s.seed, s.burstiness)
        measured = times[times >= s.warmup]
        needed = measured[s.min_requests - 1] - s.warmup + 1e-9 if measured.size >= s.min_requests \
            else longest - s.warmup
        window = max(s.duration, needed)
        return times[times < s.warmup + window], window

    def point(self, rate: float, window: float | None = None) -> tuple[LoadPoint, list[client.Outcome]]:
        """One open-loop point at `rate` requests/s: (summary, outcomes)."""
        s = self.settings
        times, window = self.schedule(rate, window)
        with resources.ServerSampler(self.server_pid) as sampler:
            outcomes = client.run_open(self.target, times, self.bodies, s.timeout)
        point = summary.summarize(outcomes, warmup=s.warmup, window=window, offered_rate=rate,
                                  terms=s.terms, generation=s.generation)
        # the sampler started ~0.05 s (the client's lead) before t0: close enough for windows
        used = resources.summary(sampler.between(s.warmup, s.warmup + window))
        point = point.model_copy(update={"resources": used})
        self.samples = sampler.samples
        if self.on_point:
            self.on_point(point)
        return point, outcomes

    def closed(self, users: int) -> LoadPoint:
        s = self.settings
        with resources.ServerSampler(self.server_pid) as sampler:
            outcomes = client.run_closed(self.target, users, s.warmup + s.duration, self.bodies,
                                         s.timeout)
        point = summary.summarize(outcomes, warmup=s.warmup, window=s.duration,
                                  offered_rate=float(users), terms=s.terms,
                                  generation=s.generation)
        point = point.model_copy(update={
            "concurrency": users,
            "offered_rate": point.scheduled_rate,  # closed loop offers what it gets back
            "resources": resources.summary(sampler.between(s.warmup, s.warmup + s.duration))})
        if self.on_point:
            self.on_point(point)
        return point

    def sweep(self, rates: list[float]) -> list[LoadPoint]:
        return [self.point(r)[0] for r in rates]

    def capacity(self, start: float, max_points: int,
                 tolerance: float) -> tuple[Capacity, list[LoadPoint]]:
        return capacity.search(lambda r: self.point(r)[0], start, max_points=max_points,
                               tolerance=tolerance)

    def soak(self, rate: float, count: int, threshold: float) -> tuple[LoadPoint, Soak]:
        """A point as long as `duration`, cut into `count` windows: (point, soak)."""
        s = self.settings
        point, outcomes = self.point(rate, window=s.duration)
        wins = soak.windows(outcomes, self.samples, start=s.warmup, end=s.warmup + s.duration,
                            count=count)
        return point, Soak(windows=wins, verdict=soak.verdict(wins, threshold))
