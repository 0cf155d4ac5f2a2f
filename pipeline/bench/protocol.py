"""The benchmark protocol as one call: open runners (cold start), time them interleaved on
every shape, compare pairs, watch resources, and measure the harness itself.

    with contextlib.ExitStack() as stack:
        runners, cold = open_all(stack, {"torch-eager": open_torch, "onnxruntime": open_ort}, feed)
        result, samples = measure(runners, shapes, spec, pairs=[("torch-eager", "onnxruntime")])

`result` is JSON for the report; `samples` (name -> ns array at the first shape) feeds the
plots. A comparison (A, B) is B's time over A's (bench.stats.compare): 1.2 = B is 20% slower.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import time
from collections.abc import Callable

import numpy as np

from pipeline.bench import timing
from pipeline.bench.clock import HostTimer
from pipeline.bench.monitor import ResourceMonitor, contention
from pipeline.core import stats
from pipeline.recipe import LatencySpec

Opener = Callable[[], object]  # returns a runner that is not yet entered


# Imported before any cold start is timed: a serving process has its runtime loaded before
# the first engine, and whichever runner happened to open first would otherwise carry the
# ~0.9 s `import torch` in its load time.
RUNTIMES = ("torch", "onnxruntime")


def import_runtimes() -> None:
    for name in RUNTIMES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)


def cold_start(stack: contextlib.ExitStack, opener: Opener, feed) -> tuple[object, dict]:
    """Open and enter a runner, then serve its first request; both timed (ms), once.

    `load` covers building the runner and entering it (reading the engine, creating the
    session or the model); the runtimes are imported beforehand (open_all) and not counted.
    """
    t0 = time.perf_counter_ns()
    runner = stack.enter_context(opener())
    t1 = time.perf_counter_ns()
    runner.infer(feed, check_inputs=False)
    t2 = time.perf_counter_ns()
    return runner, {"load": (t1 - t0) / 1e6, "first_request": (t2 - t1) / 1e6,
                    "total": (t2 - t0) / 1e6, "n": 1}


def open_all(stack: contextlib.ExitStack, openers: dict[str, Opener], feed) -> tuple[dict, dict]:
    import_runtimes()
    runners, cold = {}, {}
    for name, opener in openers.items():
        runners[name], cold[name] = cold_start(stack, opener, feed)
    return runners, cold


class NoopRunner:
    """Does nothing: what the harness itself costs per timed request."""

    def infer(self, feed, check_inputs=False):
        return feed


def harness_overhead(requests: int = 2000) -> dict:
    """Per-request cost of the host timer and loop around a no-op runner, in microseconds."""
    runner, timer = NoopRunner(), HostTimer()
    timing.warm(runner, {}, 100)
    ns = np.concatenate([timer.block(runner.infer, {}, 100) for _ in range(requests // 100)])
    us = ns / 1e3
    return {"p50": float(np.median(us)), "mean": float(us.mean()),
            "p99": float(np.percentile(us, 99)), "n": int(us.size),
            "method": "HostTimer around a no-op runner's infer()"}


def measure(runners: dict, shapes: list[tuple[str, dict, dict]], spec: LatencySpec,
            pairs: list[tuple[str, str]] = ()) -> tuple[dict, dict[str, np.ndarray]]:
    """Time `runners` interleaved at each shape (label, dims, feed); compare `pairs`.

    Returns (result JSON, samples in ns per runner at the first shape).
    """
    names = list(runners)
    out_shapes, samples = [], {}
    with ResourceMonitor(spec.monitor_interval) as monitor:
        for label, dims, feed in shapes:
            timed = timing.time_interleaved([runners[n] for n in names], feed, spec)
            blocks = dict(zip(names, timed.blocks))
            if not samples:
                samples = {n: b.ravel() for n, b in blocks.items()}
            out_shapes.append({
                "shape": label, "dims": dims,
                "latency_ms": {n: _summary(b) for n, b in blocks.items()},
                "comparisons": [
                    {"a": a, "b": b, **stats.compare(blocks[a], blocks[b], noise=spec.noise_threshold)}
                    for a, b in pairs],
                "stop": timed.stop, "seconds": round(timed.seconds, 3),
            })
            timers = dict(zip(names, timed.timers))
    resources = monitor.summary()
    return {
        "timers": timers,
        "shapes": out_shapes,
        "resources": resources,
        "warnings": [w for w in (contention(resources),) if w],
        "harness_overhead_us": harness_overhead(),
    }, samples


def _summary(blocks: np.ndarray) -> dict:
    s = stats.summary(blocks)
    half = stats.median_ci_halfwidth(blocks)  # relative, by order statistics
    s["p50_ci95_rel_halfwidth"] = half if np.isfinite(half) else None  # a fraction of p50, not ms
    return s


def as_speedup(comparison: dict) -> dict:
    """A (baseline) vs B (engine) time ratio -> speedup of B: A time / B time, CI inverted.
    The verdict is the comparison's own: it is already B's."""
    ratio, ci95 = stats.speedup_from_time_ratio(comparison["time_ratio"], comparison["ci95"])
    return {"ratio": ratio, "ci95": ci95,
            "verdict": comparison["verdict"], "noise_threshold": comparison["noise_threshold"],
            "blocks": comparison["blocks"]}
