"""The benchmark protocol as one call: open runners (cold start), time them interleaved on
every shape, compare pairs, watch resources, and measure the harness itself.

    with contextlib.ExitStack() as stack:
        runners, cold = open_all(stack, {"torch-eager": open_torch, "onnxruntime": open_ort}, feed)
        result, samples = measure(runners, shapes, spec, pairs=[("torch-eager", "onnxruntime")])

`result` is a Timings (typed: the runners' requests per shape, their comparisons, the
resources, the harness's cost); `.dump()` is its JSON, written only by bench.json's writer.
`samples` (name -> ns array at the first shape) feeds the plots. A comparison (A, B) is B's
time over A's (core.stats.time_ratio): 1.2 = B is 20% slower.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipeline.artifacts.latency import ColdStart, LatencySummary, Speedup
from pipeline.artifacts.recorded import dump
from pipeline.artifacts.report import Comparison, HarnessOverhead
from pipeline.bench import timing
from pipeline.bench.clock import HostTimer
from pipeline.bench.monitor import ResourceMonitor, ResourceSummary, contention
from pipeline.core import stats
from pipeline.core.json_object import JsonObject
from pipeline.recipe import LatencySpec

Opener = Callable[[], object]  # returns a runner that is not yet entered


@dataclass
class ShapeTimings:
    """Every runner's requests at one shape, timed interleaved, and the pairs compared."""

    shape: str  # its label (opt, min, max, a sweep point)
    dims: dict[str, int]
    latency_ms: dict[str, LatencySummary]  # runner name -> its requests
    comparisons: list[Comparison]  # one per pair, in the order asked
    stop: str  # why timing stopped
    seconds: float

    def dump(self) -> JsonObject:
        return {"shape": self.shape, "dims": self.dims,
                "latency_ms": {n: dump(s) for n, s in self.latency_ms.items()},
                "comparisons": [dump(c) for c in self.comparisons],
                "stop": self.stop, "seconds": self.seconds}


@dataclass
class Timings:
    """The protocol's result: each shape's timings, the timer each runner used, what the
    machine did meanwhile, its warnings, and the harness's own cost per request."""

    timers: dict[str, str]  # runner name -> timer
    shapes: list[ShapeTimings]  # the first is the opt shape
    resources: ResourceSummary
    warnings: list[str]
    harness_overhead_us: HarnessOverhead

    def dump(self) -> JsonObject:
        """The JSON object bench.json and the reports hold, keys in this order."""
        return {"timers": self.timers, "shapes": [s.dump() for s in self.shapes],
                "resources": self.resources.dump(), "warnings": self.warnings,
                "harness_overhead_us": dump(self.harness_overhead_us)}


# Imported before any cold start is timed: a serving process has its runtime loaded before
# the first engine, and whichever runner happened to open first would otherwise carry the
# ~0.9 s `import torch` in its load time.
RUNTIMES = ("torch", "onnxruntime")


def import_runtimes() -> None:
    for name in RUNTIMES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)


def cold_start(stack: contextlib.ExitStack, opener: Opener, feed) -> tuple[object, ColdStart]:
    """Open and enter a runner, then serve its first request; both timed (ms), once.

    `load` covers building the runner and entering it (reading the engine, creating the
    session or the model); the runtimes are imported beforehand (open_all) and not counted.
    """
    t0 = time.perf_counter_ns()
    runner = stack.enter_context(opener())
    t1 = time.perf_counter_ns()
    runner.infer(feed, check_inputs=False)
    t2 = time.perf_counter_ns()
    return runner, ColdStart(load=(t1 - t0) / 1e6, first_request=(t2 - t1) / 1e6,
                             total=(t2 - t0) / 1e6, n=1)


def open_all(stack: contextlib.ExitStack, openers: dict[str, Opener],
             feed) -> tuple[dict[str, object], dict[str, ColdStart]]:
    """Every opener's runner, entered on `stack`, and its cold start, by name."""
    import_runtimes()
    runners, cold = {}, {}
    for name, opener in openers.items():
        runners[name], cold[name] = cold_start(stack, opener, feed)
    return runners, cold


class NoopRunner:
    """Does nothing: what the harness itself costs per timed request."""

    def infer(self, feed, check_inputs=False):
        return feed


def harness_overhead(requests: int = 2000) -> HarnessOverhead:
    """Per-request cost of the host timer and loop around a no-op runner, in microseconds."""
    runner, timer = NoopRunner(), HostTimer()
    timing.warm(runner, {}, 100)
    ns = np.concatenate([timer.block(runner.infer, {}, 100) for _ in range(requests // 100)])
    us = ns / 1e3
    return HarnessOverhead(p50=float(np.median(us)), mean=float(us.mean()),
                           p99=float(np.percentile(us, 99)), n=int(us.size),
                           method="HostTimer around a no-op runner's infer()")


def measure(runners: dict, shapes: list[tuple[str, dict, dict]], spec: LatencySpec,
            pairs: list[tuple[str, str]] = ()) -> tuple[Timings, dict[str, np.ndarray]]:
    """Time `runners` interleaved at each shape (label, dims, feed); compare `pairs`.

    Returns (the Timings, samples in ns per runner at the first shape).
    """
    names = list(runners)
    out_shapes, samples = [], {}
    with ResourceMonitor(spec.monitor_interval) as monitor:
        for label, dims, feed in shapes:
            timed = timing.time_interleaved([runners[n] for n in names], feed, spec)
            blocks = dict(zip(names, timed.blocks))
            if not samples:
                samples = {n: b.ravel() for n, b in blocks.items()}
            out_shapes.append(ShapeTimings(
                shape=label, dims=dims,
                latency_ms={n: _summary(b) for n, b in blocks.items()},
                comparisons=[Comparison(a=a, b=b, **stats.time_ratio(
                    blocks[a], blocks[b], noise=spec.noise_threshold).dump()) for a, b in pairs],
                stop=timed.stop, seconds=round(timed.seconds, 3)))
            timers = dict(zip(names, timed.timers))
    resources = monitor.summary()
    return Timings(timers=timers, shapes=out_shapes, resources=resources,
                   warnings=[w for w in (contention(resources),) if w],
                   harness_overhead_us=harness_overhead()), samples


def _summary(blocks: np.ndarray) -> LatencySummary:
    """One runner's requests, with the relative half-width of p50's interval."""
    half = stats.median_ci_halfwidth(blocks)  # relative, by order statistics
    return LatencySummary(**stats.summary(blocks).dump(),  # a fraction of p50, not ms
                          p50_ci95_rel_halfwidth=half if np.isfinite(half) else None)


def as_speedup(comparison: Comparison | stats.TimeRatio) -> Speedup:
    """A (baseline) vs B (engine) time ratio -> speedup of B: A time / B time, CI inverted.
    The verdict is the comparison's own: it is already B's."""
    ratio, ci95 = stats.speedup_from_time_ratio(comparison.time_ratio, comparison.ci95)
    return Speedup(ratio=ratio, ci95=ci95, verdict=comparison.verdict,
                   noise_threshold=comparison.noise_threshold, blocks=comparison.blocks)
