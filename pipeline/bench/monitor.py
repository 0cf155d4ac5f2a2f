"""Resource monitors: a background thread samples the machine while runners are timed.

    with ResourceMonitor(interval=0.1) as mon:
        ... timing ...
    mon.summary()   # a ResourceSummary; .dump() -> report.json `resources`

CPU: this process's utilization (CPU time / wall time, 100% = one core busy) and the whole
machine's busy share from /proc/stat; on a shared machine the latter shows when someone
else was competing for the cores. Memory: resident set size sampled, and the process's
peak RSS (VmHWM, since the process started). GPU: NVML through nvidia-ml-py, imported only
here and only when a monitor starts; where it is missing or finds no GPU, the GPU block
says `available: false` and why, never invented numbers.

Sampling reads a few /proc files every `interval` seconds (tens of microseconds), so the
thread barely competes with what it watches.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass

import numpy as np

from pipeline.core.json_object import JsonObject

_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class MeanMax:
    """A sampled quantity over the timing: its mean and its peak."""

    mean: float
    max: float


@dataclass(frozen=True)
class GpuReading:
    """One NVML sample of the GPU."""

    util_pct: float
    memory_used_mb: float
    power_w: float
    sm_clock_mhz: float
    throttle: list[str]  # the clock throttle reasons active at that moment


@dataclass(frozen=True)
class GpuSummary:
    """The GPU while timing: `available` False with the `reason` there are no samples, or its
    name, each quantity's mean and peak, and every throttle reason seen."""

    available: bool
    reason: str | None = None
    name: str | None = None
    util_pct: MeanMax | None = None
    memory_used_mb: MeanMax | None = None
    power_w: MeanMax | None = None
    sm_clock_mhz: MeanMax | None = None
    throttle: tuple[str, ...] = ()

    def dump(self) -> JsonObject:
        """report.json's `gpu` block: only `available` and `reason` when there was no GPU."""
        if not self.available:
            return {"available": False, "reason": self.reason}
        out = asdict(self)
        del out["reason"]
        out["throttle"] = list(self.throttle)
        return out


@dataclass(frozen=True)
class ResourceSummary:
    """What the machine did while runners were timed (report.json `resources`)."""

    interval_s: float
    samples: int
    cores: int  # the CPUs this process may run on
    process_cpu_pct: MeanMax | None  # 100% = one core busy
    system_busy_pct: MeanMax | None  # the whole machine, from /proc/stat
    other_cores: MeanMax | None  # cores kept busy by everything but this process
    rss_mb_max: float | None
    peak_rss_mb: float | None
    gpu: GpuSummary

    def dump(self) -> JsonObject:
        """The JSON object, keys in field order."""
        out = {f: getattr(self, f) for f in self.__dataclass_fields__ if f != "gpu"}
        out = {k: asdict(v) if isinstance(v, MeanMax) else v for k, v in out.items()}
        return {**out, "gpu": self.gpu.dump()}


def _system_cpu() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat; None where unreadable."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already inside user
    return total - idle, total


def rss_bytes() -> int | None:
    """Resident set size of this process now (/proc/self/statm), None where unreadable."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def peak_rss_bytes() -> int | None:
    """Peak resident set size of this process (VmHWM), else getrusage's maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) so a later read covers only what follows
    (Linux: writing 5 to /proc/self/clear_refs); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def children_peak_bytes() -> int:
    """The largest peak RSS of this process's ended, waited-for children (getrusage)."""
    import resource

    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


class PeakWatch:
    """The peak resident memory of a stretch of work: this process's VmHWM after a reset at
    `start`, or a child process's peak where one that ended in between went higher (a child's
    own peak shows only once it grows the largest-child figure: a smaller child is not seen)."""

    def start(self) -> PeakWatch:
        self._reset = reset_peak_rss()
        self._children = children_peak_bytes()
        return self

    def peak_mb(self) -> float | None:
        """None where this process's peak could not be reset (not Linux)."""
        if not self._reset:
            return None
        own = peak_rss_bytes() or 0
        child = children_peak_bytes()
        return max(own, child if child > self._children else 0) / 2**20


class _Nvml:
    """NVML samples of one GPU; `reason` says why there are none."""

    def __init__(self, index: int = 0):
        self.reason: str | None = None
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            self.reason = "nvidia-ml-py (pynvml) is not installed"
            return
        try:
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.name = pynvml.nvmlDeviceGetName(self.handle)
        except pynvml.NVMLError as e:
            self.reason = f"NVML found no usable GPU ({e})"
            return
        self.nv = pynvml
        self.reasons = {v: k.removeprefix("nvmlClocksThrottleReason")
                        for k, v in vars(pynvml).items()
                        if k.startswith("nvmlClocksThrottleReason") and isinstance(v, int)
                        and v and not k.endswith(("All", "None"))}

    def sample(self) -> GpuReading | None:
        """One reading; None (and `reason` set) once NVML stops answering, so a query that
        fails mid-run (e.g. one this driver does not support) ends the GPU samples, not the
        monitor thread or the measurement around it."""
        try:
            return self._read()
        except self.nv.NVMLError as e:
            self.reason = f"NVML stopped answering while sampling ({e})"
            return None

    def _read(self) -> GpuReading:
        nv, h = self.nv, self.handle
        # renamed "clocks event reasons" in newer NVML; same bits
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = reasons(h)
        return GpuReading(
            util_pct=nv.nvmlDeviceGetUtilizationRates(h).gpu,
            memory_used_mb=nv.nvmlDeviceGetMemoryInfo(h).used / 2**20,
            power_w=nv.nvmlDeviceGetPowerUsage(h) / 1000,
            sm_clock_mhz=nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            throttle=[name for bit, name in self.reasons.items() if mask & bit])


CONTENDED_CORES = 0.25  # mean load of other processes, in cores, that makes timings suspect


def contention(summary: ResourceSummary) -> str | None:
    """A warning when other processes competed for the CPUs while timing, else None.

    On a shared 2-core machine a second busy process turned a 1.6 ms eager request into
    280 ms (threads oversubscribed) and a 2x speedup into "460x": the interleaved timing
    cannot cancel that, so the result must say so rather than be read as clean."""
    other = summary.other_cores
    if not other or other.mean < CONTENDED_CORES:
        return None
    return (f"other processes kept {other.mean:.2f} cores busy on average (peak {other.max:.2f}) "
            f"while this was timed: latencies and speedups may be distorted; rerun with --force "
            f"on an idle machine")


class ResourceMonitor:
    def __init__(self, interval: float = 0.1, gpu: bool = True):
        self.interval = interval
        self.gpu = _Nvml() if gpu else None
        self.rows: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="resource-monitor", daemon=True)

    def __enter__(self) -> ResourceMonitor:
        self._last = (time.perf_counter(), sum(os.times()[:2]), _system_cpu())
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()  # the tail since the last tick

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        wall, cpu, system = time.perf_counter(), sum(os.times()[:2]), _system_cpu()
        last_wall, last_cpu, last_system = self._last
        self._last = (wall, cpu, system)
        if wall - last_wall <= 0:
            return
        row = {"process_cpu_pct": 100 * (cpu - last_cpu) / (wall - last_wall), "rss": rss_bytes()}
        if system and last_system and system[1] > last_system[1]:
            row["system_busy_pct"] = 100 * (system[0] - last_system[0]) / (system[1] - last_system[1])
        if self.gpu is not None and self.gpu.reason is None:
            gpu = self.gpu.sample()
            if gpu is not None:
                row["gpu"] = gpu
        self.rows.append(row)

    def summary(self) -> ResourceSummary:
        rows = self.rows
        rss = [r["rss"] for r in rows if r["rss"] is not None]
        peak = peak_rss_bytes()
        cores = len(os.sched_getaffinity(0))
        machine = os.cpu_count() or cores  # /proc/stat counts every CPU, not just ours
        return ResourceSummary(
            interval_s=self.interval,
            samples=len(rows),
            cores=cores,
            process_cpu_pct=_mean_max(r["process_cpu_pct"] for r in rows),
            system_busy_pct=_mean_max(r.get("system_busy_pct") for r in rows),
            # cores kept busy by everything but this process: what competed with the timing
            other_cores=_mean_max(max(0.0, r["system_busy_pct"] / 100 * machine - r["process_cpu_pct"] / 100)
                                  for r in rows if "system_busy_pct" in r),
            rss_mb_max=max(rss) / 2**20 if rss else None,
            peak_rss_mb=peak / 2**20 if peak else None,
            gpu=self._gpu_summary())

    def _gpu_summary(self) -> GpuSummary:
        if self.gpu is None or self.gpu.reason is not None:
            return GpuSummary(available=False, reason=self.gpu.reason if self.gpu else "not monitored")
        g: list[GpuReading] = [r["gpu"] for r in self.rows if "gpu" in r]
        return GpuSummary(
            available=True, name=self.gpu.name,
            **{k: _mean_max(getattr(x, k) for x in g)
               for k in ("util_pct", "memory_used_mb", "power_w", "sm_clock_mhz")},
            throttle=tuple(sorted({t for x in g for t in x.throttle})))


def _mean_max(values) -> MeanMax | None:
    """Mean and peak of the values that were read (None: not one was)."""
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    return MeanMax(mean=float(v.mean()), max=float(v.max())) if v.size else None
