"""Server CPU and memory while a point runs: the server's process and all its descendants
(a Ray instance started by `pipeline serve`: GCS, raylet, the proxy and replica workers),
sampled with psutil from a thread of the load generator's process.

CPU is in percent of one core, summed over the processes (200 = both cores of this machine
busy); memory is the summed resident set (RSS, MiB; shared pages count once per process, so
it over-states a little and never under-states).
"""

from __future__ import annotations

import threading
import time

from pipeline.artifacts.serving import Resources


class ServerSampler:
    """Context manager: samples (t seconds, cpu %, rss MiB) every `every` seconds."""

    def __init__(self, pid: int | None, every: float = 0.5):
        self.pid, self.every = pid, every
        self.samples: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._procs: dict[int, object] = {}

    def __enter__(self) -> ServerSampler:
        if self.pid is not None:
            import psutil

            try:
                self._root = psutil.Process(self.pid)
            except psutil.NoSuchProcess:
                self.pid = None
                return self
            self._t0 = time.perf_counter()
            self._sample()  # primes cpu_percent (its first call says 0)
            self._thread = threading.Thread(target=self._run, name="server-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def _sample(self) -> None:
        import psutil

        try:
            procs = [self._root, *self._root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        cpu = rss = 0.0
        for p in procs:
            known = self._procs.setdefault(p.pid, p)  # the same object keeps its CPU baseline
            try:
                cpu += known.cpu_percent(None)
                rss += known.memory_info().rss / 2**20
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        self.samples.append((time.perf_counter() - self._t0, cpu, rss))

    def between(self, start: float, end: float) -> list[tuple[float, float, float]]:
        """Samples in [start, end) seconds after the sampler started."""
        return [s for s in self.samples[1:] if start <= s[0] < end]


def summary(samples: list[tuple[float, float, float]]) -> Resources | None:
    if not samples:
        return None
    cpu = [s[1] for s in samples]
    rss = [s[2] for s in samples]
    return Resources(cpu_pct_mean=sum(cpu) / len(cpu), cpu_pct_max=max(cpu),
                     rss_mib_mean=sum(rss) / len(rss), rss_mib_peak=max(rss), samples=len(samples))
