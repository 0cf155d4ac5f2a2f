"""Timers: how one block of requests is timed, on the host or on a GPU stream.

A timer times `n` back-to-back requests and returns their latencies in ns ([n] int64):

- HostTimer: `perf_counter_ns` around each `infer` call. Runners return host arrays, so a
  request has finished (device included) when `infer` returns.
- CudaEventTimer: a pair of CUDA events recorded on the runner's stream around each
  request; one synchronize after the block, then `elapsed_time` per pair. This times the
  device work of the request on that stream without host jitter in the measurement.

`timer_for(runner)` takes CUDA events when the runner exposes a `stream` (a torch.cuda.Stream
or a raw cudaStream_t handle) and torch sees a GPU; otherwise the host timer.
"""

from __future__ import annotations

import time

import numpy as np


class HostTimer:
    name = "perf_counter_ns"

    def block(self, infer, feed, n: int) -> np.ndarray:
        clock = time.perf_counter_ns
        out = np.empty(n, dtype=np.int64)
        for j in range(n):
            t0 = clock()
            infer(feed, check_inputs=False)
            out[j] = clock() - t0
        return out


class CudaEventTimer:
    name = "cuda-events"

    def __init__(self, stream):
        import torch

        self.torch = torch
        # A raw cudaStream_t (int) from TensorRT / cuda-python becomes a torch stream object.
        self.stream = stream if isinstance(stream, torch.cuda.Stream) else \
            torch.cuda.ExternalStream(int(stream))

    def block(self, infer, feed, n: int) -> np.ndarray:
        event = self.torch.cuda.Event
        pairs = [(event(enable_timing=True), event(enable_timing=True)) for _ in range(n)]
        for start, end in pairs:
            start.record(self.stream)
            infer(feed, check_inputs=False)
            end.record(self.stream)
        self.stream.synchronize()
        # elapsed_time is in ms with ~0.5 us resolution
        return np.array([round(s.elapsed_time(e) * 1e6) for s, e in pairs], dtype=np.int64)


def timer_for(runner) -> HostTimer | CudaEventTimer:
    stream = getattr(runner, "stream", None)
    if stream is None:
        return HostTimer()
    import torch

    if not torch.cuda.is_available():
        return HostTimer()
    return CudaEventTimer(stream)
