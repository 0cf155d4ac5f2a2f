"""Memory of the generation runners, measured per runner in this one process.

The process's peak (VmHWM) cannot tell two runners apart once the first has set it, and
resetting it (/proc/self/clear_refs) is refused in many containers: both runners then showed
the same peak with no growth. Here a sampler thread reads the resident set every few
milliseconds while one runner generates alone, so each runner's peak and growth are its own.
Loading is the RSS growth from before a runner is made to after its first token: weights
that are memory-mapped (safetensors, ONNX external data) become resident only when touched,
so the growth at construction alone read 14 MB for a 540 MB model.
"""

from __future__ import annotations

import threading

import numpy as np

from pipeline.bench import monitor
from pipeline.generation.workload import Request, generate

INTERVAL_S = 0.002


def rss() -> int:
    return monitor._rss_bytes() or 0


class Sampler:
    """The highest RSS seen between __enter__ and __exit__ (sampled; at least the ends)."""

    def __enter__(self) -> Sampler:
        self.start = self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def load(make, first: Request) -> tuple[object, int]:
    """(runner, bytes): make() the runner and generate `first`, RSS growth across both."""
    before = rss()
    runner = make()
    generate(runner, first)
    return runner, max(0, rss() - before)


def first_token(vocab: int) -> Request:
    """The smallest request (one token in, two out): touches every weight once."""
    return Request("load", "point", 1, ((np.zeros((1, 1), np.int64) + min(1, vocab - 1), 2),))


def peaks(runners: dict, request: Request) -> dict[str, dict]:
    """Each runner generating `request` alone: its peak RSS and growth over where it began."""
    out = {}
    for name, runner in runners.items():
        with Sampler() as s:
            generate(runner, request)
        out[name] = {"peak_rss_bytes": s.peak, "growth_bytes": s.peak - s.start}
    return out
