"""The timing protocol: warm-up, enough requests for long enough, runners interleaved.

Runners follow Polygraphy's interface (`infer(feed, check_inputs=False)`) and return host
arrays. Each block of requests is timed by the runner's timer (bench.clock: perf_counter_ns
on the host, CUDA events on a GPU stream); runners timed together share one kind of clock
(CUDA events only when every runner exposes a stream).

Stopping rule, per runner: at least `iterations` requests AND at least `min_seconds` of its
own timed requests, the fastest runner's too (and, when runners are compared, at least
stats.MIN_ROUNDS rounds, the fewest an A/B interval can be built from), unless `target_ci`
is set and, after `iterations` requests, the 95% interval of every runner's median is
already within +-target_ci of it (early stop).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from pipeline.bench.clock import HostTimer, timer_for
from pipeline.core import stats
from pipeline.recipe import LatencySpec


@dataclass
class Timed:
    """Samples of runners timed together: per runner an array [blocks, block] in ns."""

    blocks: list[np.ndarray]
    timers: list[str]
    stop: str  # why timing stopped: "iterations", "min_seconds", "min_rounds" or "target_ci"
    seconds: float

    def __iter__(self):
        """`a, b = time_interleaved(...)` unpacks the blocks (the earlier return value)."""
        return iter(self.blocks)


def warm(runner, feed, n: int) -> None:
    for _ in range(n):
        runner.infer(feed, check_inputs=False)


def time_interleaved(runners: list, feed, spec: LatencySpec) -> Timed:
    """Time runners in alternating blocks of `spec.block` requests.

    The order within a round alternates (AB, BA, AB, ...) so neither runner always runs
    right after the other; slow drifts of the machine then hit both alike. With one runner
    this is plain sequential timing, in blocks.
    """
    for runner in runners:
        warm(runner, feed, spec.warmup)
    timers = [timer_for(r) for r in runners]
    if len({t.name for t in timers}) > 1:
        # One clock per comparison: CUDA events for all runners, or the host clock for all.
        timers = [HostTimer() for _ in runners]
    blocks: list[list[np.ndarray]] = [[] for _ in runners]
    timed_ns = [0] * len(runners)  # each runner's own timed time, the min_seconds rule's measure
    t0 = time.perf_counter()
    min_rounds = stats.MIN_ROUNDS if len(runners) > 1 else 1
    rounds, stop = 0, "iterations"
    while True:
        order = range(len(runners)) if rounds % 2 == 0 else reversed(range(len(runners)))
        for i in order:
            blocks[i].append(timers[i].block(runners[i].infer, feed, spec.block))
            timed_ns[i] += int(blocks[i][-1].sum())
        rounds += 1
        if rounds * spec.block < spec.iterations or rounds < min_rounds:
            continue
        if spec.target_ci is not None and all(
                stats.median_ci_halfwidth(np.concatenate(b)) <= spec.target_ci for b in blocks):
            stop = "target_ci"
            break
        if min(timed_ns) >= spec.min_seconds * 1e9:
            # Which rule asked for the last round: the request count, the rounds, or the time.
            count_met_before = (rounds - 1) * spec.block >= spec.iterations
            stop = ("iterations" if not count_met_before else
                    "min_rounds" if rounds == min_rounds else "min_seconds")
            break
    return Timed([np.stack(b) for b in blocks], [t.name for t in timers], stop,
                 time.perf_counter() - t0)


def time_runner(runner, feed, spec: LatencySpec) -> np.ndarray:
    """One runner alone: per-request latency in ns, flat."""
    return time_interleaved([runner], feed, spec).blocks[0].ravel()
