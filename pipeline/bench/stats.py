"""Statistics of latency samples: percentiles, and A/B ratios with bootstrap intervals."""

from __future__ import annotations

from typing import Literal

import numpy as np

Verdict = Literal["faster", "slower", "indistinguishable"]


def summary(ns: np.ndarray) -> dict:
    """Latency summary in milliseconds from per-request samples in nanoseconds."""
    ms = np.asarray(ns, dtype=np.float64).ravel() / 1e6
    mean = float(ms.mean())
    std = float(ms.std(ddof=1)) if ms.size > 1 else 0.0
    p50, p90, p99 = (float(v) for v in np.percentile(ms, [50, 90, 99]))
    return {
        "p50": p50, "p90": p90, "p99": p99, "mean": mean, "std": std,
        "min": float(ms.min()), "max": float(ms.max()),
        "cov": std / mean if mean else 0.0,
        "n": int(ms.size),
        "throughput_per_s": 1e3 / p50 if p50 else None,
    }


def ratio_of_medians(
    a_blocks: np.ndarray, b_blocks: np.ndarray, n_boot: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """median(a) / median(b) with a 95% paired-block bootstrap interval.

    a_blocks, b_blocks: [blocks, requests per block], block i of a timed right next to
    block i of b. Resampling whole block pairs (not single requests) keeps the drift and
    autocorrelation of a real machine inside the interval, so an A/A comparison is
    "indistinguishable" as often as a 95% interval promises.
    """
    a, b = np.asarray(a_blocks, dtype=np.float64), np.asarray(b_blocks, dtype=np.float64)
    if a.shape[0] != b.shape[0]:
        raise ValueError("a and b need the same number of blocks")
    ratio = float(np.median(a) / np.median(b))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.shape[0], size=(n_boot, a.shape[0]))  # [n_boot, blocks]
    ra = np.median(a[idx].reshape(n_boot, -1), axis=1)
    rb = np.median(b[idx].reshape(n_boot, -1), axis=1)
    lo, hi = np.percentile(ra / rb, [2.5, 97.5])
    return ratio, float(lo), float(hi)


def verdict(lo: float, hi: float) -> Verdict:
    """For a speedup interval (baseline time / engine time): does it exclude 1?"""
    if lo > 1.0:
        return "faster"
    if hi < 1.0:
        return "slower"
    return "indistinguishable"
