"""Memory of the generation runners, each measured in a fresh process of its own.

In the process that times them, every runner is loaded at once: the process's peak (VmHWM)
cannot tell them apart once the first has set it, resetting it (/proc/self/clear_refs) is
refused in many containers, and RSS growth is blurred by what the others already made
resident (both runners showed one 4.4 GB peak with no growth, one runner a 0 MB load). So
`isolated` makes each runner in a spawned child that holds nothing else: RSS before the
runner (the interpreter and the libraries it imports), the growth to after its first token
(loading: weights that are memory-mapped, safetensors or ONNX external data, become resident
only when touched), then a sampler thread reads the resident set every few milliseconds
while it generates the request: its peak and growth are its own.
"""

from __future__ import annotations

import multiprocessing
import threading
from dataclasses import dataclass

import numpy as np

from pipeline.bench import monitor
from pipeline.generation.timed_requests import Request, generate

INTERVAL_S = 0.002


def rss() -> int:
    return monitor.rss_bytes() or 0


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


def first_token(vocab: int) -> Request:
    """The smallest request (one token in, two out): touches every weight once."""
    return Request("load", "point", 1, ((np.zeros((1, 1), np.int64) + min(1, vocab - 1), 2),))


@dataclass(frozen=True)
class RunnerMemory:
    """One runner in a process of its own (bytes of RSS): before it was made, what making it
    and its first token added, the peak while it generated the request, its growth then."""

    before_runner_bytes: int
    load_rss_bytes: int
    peak_rss_bytes: int
    growth_bytes: int


def _in_child(make, args: tuple, first: Request, request: Request) -> RunnerMemory:
    before = rss()
    runner = make(*args)
    generate(runner, first)
    loaded = rss()
    with Sampler() as s:
        generate(runner, request)
    return RunnerMemory(before_runner_bytes=before, load_rss_bytes=max(0, loaded - before),
                        peak_rss_bytes=s.peak, growth_bytes=max(0, s.peak - s.start))


RunnersMemory = dict[str, RunnerMemory]  # a runner's name -> its memory


def isolated(makers: dict[str, tuple], first: Request, request: Request) -> RunnersMemory:
    """{name: (make, args)}: each runner `make(*args)` (picklable: module-level callables) made
    in a spawned process of its own, its first token generated, then `request` generated alone
    under the sampler. Per runner: RSS before it, its load, its peak and its growth."""
    ctx = multiprocessing.get_context("spawn")  # fork would share the parent's resident pages
    out = {}
    for name, (make, args) in makers.items():
        with ctx.Pool(1) as pool:
            out[name] = pool.apply(_in_child, (make, args, first, request))
    return out
