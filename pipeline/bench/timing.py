"""The timing protocol: warm-up, enough requests for long enough, optional interleaving.

Runners follow Polygraphy's interface (`infer(feed, check_inputs=False)`) and return host
arrays, so a request is complete (device synchronized) when `infer` returns. Timestamps are
`time.perf_counter_ns`, taken around each request.
"""

from __future__ import annotations

import time

import numpy as np

from pipeline.recipe import LatencySpec


def _warm(runner, feed, n: int) -> None:
    for _ in range(n):
        runner.infer(feed, check_inputs=False)


def time_runner(runner, feed, spec: LatencySpec) -> np.ndarray:
    """Per-request latency in ns: `warmup` untimed, then >= iterations and >= min_seconds."""
    _warm(runner, feed, spec.warmup)
    clock = time.perf_counter_ns
    infer = runner.infer
    samples: list[int] = []
    deadline = clock() + int(spec.min_seconds * 1e9)
    while len(samples) < spec.iterations or clock() < deadline:
        t0 = clock()
        infer(feed, check_inputs=False)
        samples.append(clock() - t0)
    return np.asarray(samples, dtype=np.int64)


def time_interleaved(runners: list, feed, spec: LatencySpec) -> list[np.ndarray]:
    """Time several runners in alternating blocks; per runner an array [blocks, block] in ns.

    The order within a round alternates (AB, BA, AB, ...) so neither runner always runs
    right after the other; slow drifts of the machine then hit both alike.
    """
    for runner in runners:
        _warm(runner, feed, spec.warmup)
    clock = time.perf_counter_ns
    blocks: list[list[np.ndarray]] = [[] for _ in runners]
    deadline = clock() + int(spec.min_seconds * 1e9) * len(runners)
    rounds = 0
    while rounds * spec.block < spec.iterations or clock() < deadline:
        order = range(len(runners)) if rounds % 2 == 0 else reversed(range(len(runners)))
        for i in order:
            infer = runners[i].infer
            block = np.empty(spec.block, dtype=np.int64)
            for j in range(spec.block):
                t0 = clock()
                infer(feed, check_inputs=False)
                block[j] = clock() - t0
            blocks[i].append(block)
        rounds += 1
    return [np.stack(b) for b in blocks]
