"""One task load test against one server: points at offered task rates (open loop), at a
number of task-users (closed loop), a sweep, the capacity search. As loadtest.py does for
single requests: each point warms up (tasks due before `warmup` are sent and excluded), then
measures for at least `duration` seconds and at least `min_tasks` tasks (the schedule is
lengthened to hold them); the server's /metrics and its processes are sampled around it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.artifacts.serving import TaskPoint
from pipeline.loadgen import resources, schedule, scrape, task_client, task_summary
from pipeline.loadgen.loadtest import Settings, probe
from pipeline.loadgen.protocol import Target
from pipeline.loadgen.tasks import Script


@dataclass
class TaskLoadTest:
    target: Target
    scripts: list[Script]
    settings: Settings           # min_requests counts tasks here
    pace: task_client.Pace
    server_pid: int | None = None
    batch1: task_summary.Batch1 | None = None
    on_point: Callable[[TaskPoint], None] | None = None
    metrics_why: str | None = None  # why the last point has no server_metrics

    def _finish(self, point: TaskPoint, scraper: scrape.MetricsScraper, sampler,
                window: float) -> TaskPoint:
        moved = scraper.movement()
        self.metrics_why = None if moved else scraper.why
        s = self.settings
        used = resources.summary(sampler.between(s.warmup, s.warmup + window))
        point = point.model_copy(update={"server_metrics": moved, "resources": used})
        if self.on_point:
            self.on_point(point)
        return point

    def point(self, rate: float) -> TaskPoint:
        """Tasks arriving at `rate` tasks/s (the seeded schedule), open loop."""
        s = self.settings
        nth = schedule.nth_after(s.arrival, rate, s.seed, s.burstiness, s.warmup, s.min_requests)
        window = max(s.duration, nth - s.warmup + 1e-9)
        times = schedule.arrivals(s.arrival, rate, s.warmup + window, s.seed, s.burstiness)
        with scrape.MetricsScraper(self.target.base) as scraper, \
                resources.ServerSampler(self.server_pid) as sampler:
            outcomes = task_client.run_open(self.target, times, self.scripts, self.pace)
        point = task_summary.summarize(outcomes, warmup=s.warmup, window=window, offered_rate=rate,
                                       think=self.pace.think, terms=s.terms, batch1=self.batch1)
        return self._finish(point, scraper, sampler, window)

    at = point  # what a plan (command.plan) calls for one open-loop point

    def closed(self, users: int) -> TaskPoint:
        """`users` task-users for warmup + duration seconds, each task after the last."""
        s = self.settings
        with scrape.MetricsScraper(self.target.base) as scraper, \
                resources.ServerSampler(self.server_pid) as sampler:
            outcomes = task_client.run_closed(self.target, users, s.warmup + s.duration,
                                              self.scripts, self.pace)
        point = task_summary.summarize(outcomes, warmup=s.warmup, window=s.duration,
                                       offered_rate=0.0, think=self.pace.think, terms=s.terms,
                                       batch1=self.batch1)
        point = point.model_copy(update={"concurrency": users, "offered_rate": point.scheduled_rate})
        return self._finish(point, scraper, sampler, s.duration)

    def probe_rate(self) -> float:
        """A first rate for the capacity search (tasks/s): what one task-user gets in ~3 s
        (at least one task; no warm-up, a task is long): loadtest.probe()."""
        return probe(self, warmup=0.0, least=0.05)
