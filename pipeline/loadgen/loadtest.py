"""One load test against one server: points at offered rates (open loop), at a concurrency
(closed loop), a sweep, the capacity search, a soak. Each point warms up first (its requests
are sent and excluded), then measures for at least `duration` seconds and at least
`min_requests` requests (the schedule is lengthened to hold them). The server's /metrics is
scraped around each point (scrape.py) and its movement kept in the point.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pipeline.artifacts.serving import LoadPoint, Soak
from pipeline.loadgen import client, resources, schedule, scrape, soak, summary
from pipeline.loadgen.protocol import Payload
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
    bodies: list[Payload]
    settings: Settings
    server_pid: int | None = None
    on_point: Callable[[LoadPoint], None] | None = None
    samples: list = field(default_factory=list)      # the last point's server (t, cpu %, rss MiB)
    cache_bytes: list = field(default_factory=list)  # its (t, bytes) of soak.CACHE_GAUGE, if served
    scrape_metrics: bool = True  # the server's /metrics before, during and after each point
    metrics_why: str | None = None  # why the last point has no server_metrics

    def _scraper(self) -> scrape.MetricsScraper:
        return scrape.MetricsScraper(self.target.base if self.scrape_metrics else None)

    def _scraped(self, point: LoadPoint, scraper: scrape.MetricsScraper) -> LoadPoint:
        moved = scraper.movement()
        self.metrics_why = None if moved else scraper.why
        return point.model_copy(update={"server_metrics": moved})

    def schedule(self, rate: float, window: float | None = None) -> tuple[Iterator[float], float]:
        """(send times, lazily; measured window): at least `duration` seconds and
        `min_requests` requests after the warm-up; a Poisson draw short of requests is
        lengthened to the min_requests-th arrival (same seed, so the same draw: one pass over
        that draw counts to it, holding nothing). `window` given: exactly that."""
        s = self.settings
        if window is None:
            nth = schedule.nth_after(s.arrival, rate, s.seed, s.burstiness, s.warmup,
                                     s.min_requests)
            window = max(s.duration, nth - s.warmup + 1e-9)
        return schedule.arrivals(s.arrival, rate, s.warmup + window, s.seed, s.burstiness), window

    def point(self, rate: float, window: float | None = None) -> tuple[LoadPoint, list[client.Outcome]]:
        """One open-loop point at `rate` requests/s: (summary, outcomes)."""
        s = self.settings
        times, window = self.schedule(rate, window)
        with self._scraper() as scraper, resources.ServerSampler(self.server_pid) as sampler:
            outcomes = client.run_open(self.target, times, self.bodies, s.timeout)
        point = summary.summarize(outcomes, warmup=s.warmup, window=window, offered_rate=rate,
                                  terms=s.terms, generation=s.generation)
        point = self._scraped(point, scraper)
        self.cache_bytes = scraper.gauge(soak.CACHE_GAUGE)
        # the sampler started ~0.05 s (the client's lead) before t0: close enough for windows
        used = resources.summary(sampler.between(s.warmup, s.warmup + window))
        point = point.model_copy(update={"resources": used})
        self.samples = sampler.samples
        if self.on_point:
            self.on_point(point)
        return point, outcomes

    def at(self, rate: float) -> LoadPoint:
        """One open-loop point at `rate` requests/s (its summary only)."""
        return self.point(rate)[0]

    def closed(self, users: int) -> LoadPoint:
        s = self.settings
        with self._scraper() as scraper, resources.ServerSampler(self.server_pid) as sampler:
            outcomes = client.run_closed(self.target, users, s.warmup + s.duration, self.bodies,
                                         s.timeout)
        point = summary.summarize(outcomes, warmup=s.warmup, window=s.duration,
                                  offered_rate=float(users), terms=s.terms,
                                  generation=s.generation)
        point = self._scraped(point, scraper)
        point = point.model_copy(update={
            "concurrency": users,
            "offered_rate": point.scheduled_rate,  # closed loop offers what it gets back
            "resources": resources.summary(sampler.between(s.warmup, s.warmup + s.duration))})
        if self.on_point:
            self.on_point(point)
        return point

    def probe_rate(self) -> float:
        """A first rate for the capacity search (requests/s): see probe()."""
        return probe(self, warmup=1.0, least=0.1)

    def soak(self, rate: float, count: int, threshold: float) -> tuple[LoadPoint, Soak]:
        """A point as long as `duration`, cut into `count` windows: (point, soak)."""
        s = self.settings
        point, outcomes = self.point(rate, window=s.duration)
        wins = soak.windows(outcomes, self.samples, start=s.warmup, end=s.warmup + s.duration,
                            count=count, cache_bytes=self.cache_bytes)
        return point, Soak(windows=wins, verdict=soak.verdict(wins, threshold))


def probe(test, warmup: float, least: float) -> float:
    """What one closed-loop user of `test` (a LoadTest, or task_loadtest's TaskLoadTest) gets
    over 3 s after `warmup` s, without the SLO and not printed; at least `least`: a first rate
    for the capacity search."""
    from dataclasses import replace

    saved, on_point = test.settings, test.on_point
    test.settings, test.on_point = replace(saved, duration=3.0, warmup=warmup, terms=()), None
    try:
        point = test.closed(1)
    finally:
        test.settings, test.on_point = saved, on_point
    return max(point.achieved_rate, least)
