"""Streaming bandwidth of this machine at each memory level: L1, L2, L3 and DRAM.

The kernel is a copy (numpy's, which the compiler vectorizes), counted as bytes read plus
bytes written, the same unit a node's roofline time uses (its inputs read + outputs
written). Each level gets a working set (source + destination) of half its capacity per
thread, from the sizes caches.py reads, so the data stays in that level and not below it;
DRAM gets many times the last-level cache. A small working set is copied many times in one
call through a view whose rows all alias the same buffer (stride 0), so Python's per-call
overhead is paid once per timing, not once per copy; numpy releases the GIL while copying,
so threads stream at once, each on its own buffers. The best of several timings is kept
(a busy machine only ever slows a copy down).

What it cannot see: an L1 copy of 8 KiB per row still pays numpy's per-row loop setup, so
the L1 figure is a floor of what the core can do (its load ports), not the ports' rate.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided

from pipeline.hardware.caches import Cache
from pipeline.hardware.entry import Bandwidth

REPEATS = 5
CACHE_TRAFFIC = 1 << 31  # bytes moved per timing of a cache level (~10-40 ms here)
DRAM_MIN = 512 << 20  # DRAM working set, source + destination, at least this ...
DRAM_LLC_FACTOR = 8  # ... and this many times the last-level cache


KERNELS = ("loop", "rows")


@dataclass(frozen=True)
class _Copy:
    """One thread's buffers: a source copied `rows` times into a destination, either by a
    Python loop of whole-buffer copies (numpy's fastest path: one memcpy-like call each) or
    by one copy of stride-0 views [rows, n] (one call, but numpy's per-row loop)."""

    src: np.ndarray  # [n] float64
    dst: np.ndarray
    rows: int
    kernel: str  # one of KERNELS

    @property
    def moved(self) -> int:  # bytes read + written per call
        return 2 * self.src.nbytes * self.rows

    def __call__(self) -> None:
        if self.kernel == "loop":
            for _ in range(self.rows):
                np.copyto(self.dst, self.src)
        else:
            n = self.src.size
            np.copyto(as_strided(self.dst, (self.rows, n), (0, 8)), as_strided(self.src, (self.rows, n), (0, 8)))


def _copier(working_set: int, traffic: int, kernel: str) -> _Copy:
    n = max(working_set // 2 // 8, 1)  # float64 elements in each of source and destination
    src, dst = np.ones(n), np.empty(n)
    np.copyto(dst, src)  # touch every page: no page faults inside the timed copies
    return _Copy(src, dst, max(traffic // (2 * src.nbytes), 1), kernel)


def _timed(copies: list[_Copy]) -> float:
    """Seconds for every thread to finish its copy, all started together."""
    start = threading.Barrier(len(copies) + 1)

    def work(copy: _Copy) -> None:
        start.wait()
        copy()

    threads = [threading.Thread(target=work, args=(c,)) for c in copies]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def stream(per_thread_set: int, threads: int, traffic: int, repeats: int = REPEATS) -> float:
    """Bytes per second (read + write) of `threads` copies at once: the best kernel, each
    the best of `repeats` timings."""
    rates = []
    for kernel in KERNELS:
        copies = [_copier(per_thread_set, traffic // threads, kernel) for _ in range(threads)]
        copies[0]()  # warm: caches filled, code paths taken
        best = min(_timed(copies) for _ in range(repeats))
        rates.append(sum(c.moved for c in copies) / best)
    return max(rates)


def working_sets(caches: list[Cache], threads: int) -> dict[str, int]:
    """Per-thread working set (source + destination) for each level at `threads` threads."""
    l1, l2, l3 = (c.size_bytes for c in caches)
    sets = {"L1": l1 // 2, "L2": l2 // 2}
    l3_share = l3 // 2 // threads
    if l3_share >= 4 * l2:  # else an "L3" copy would mostly hit L2
        sets["L3"] = l3_share
    sets["DRAM"] = max(DRAM_MIN, DRAM_LLC_FACTOR * l3) // threads
    return sets


def measure(caches: list[Cache], thread_counts: list[int]) -> list[Bandwidth]:
    """Each level at each thread count (e.g. [1, cores])."""
    capacity = {f"L{c.level}": c.size_bytes for c in caches}
    try:  # the DRAM's size: this machine's physical memory
        capacity["DRAM"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    rows = []
    for level in ("L1", "L2", "L3", "DRAM"):
        for threads in thread_counts:
            size = working_sets(caches, threads).get(level)
            if size is None:
                continue
            traffic = CACHE_TRAFFIC if level != "DRAM" else 2 * size * threads
            rate = stream(size, threads, traffic)
            rows.append(Bandwidth(
                level=level, bytes_per_s=rate, capacity_bytes=capacity.get(level),
                working_set_bytes=size * threads, threads=threads,
                method=f"numpy copy (best of a loop of copies and one stride-0 copy), {size >> 10} KiB per thread (source + destination), "
                       f"{threads} thread(s) at once, read + write bytes, best of {REPEATS}"))
    return rows
