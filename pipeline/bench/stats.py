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


def median_ci_halfwidth(ns: np.ndarray) -> float:
    """Half the width of a 95% interval of the median, relative to the median.

    Distribution-free (order statistics: ranks n/2 +- 1.96 sqrt(n)/2); it treats requests as
    independent, so it is a stopping rule, not the A/B interval (that one is by blocks).
    """
    x = np.sort(np.asarray(ns, dtype=np.float64).ravel())
    n = x.size
    if n < 10:
        return float("inf")
    half = 1.96 * np.sqrt(n) / 2
    lo, hi = int(np.floor(n / 2 - half)), min(int(np.ceil(n / 2 + half)), n - 1)
    median = float(np.median(x))
    return float((x[hi] - x[lo]) / 2 / median) if median else float("inf")


def time_verdict(lo: float, hi: float) -> Verdict:
    """For a time-ratio interval (B time / A time): is B slower, faster, or can't we tell?
    (The same question as `verdict`, asked of B's speedup interval [1/hi, 1/lo].)"""
    return verdict(1.0 / hi, 1.0 / lo)


def compare(a_blocks: np.ndarray, b_blocks: np.ndarray, seed: int = 0) -> dict:
    """B against A, timed interleaved: time ratio median(B) / median(A) with its 95% CI.

    ratio 1.2 = B takes 20% longer than A; verdict is B's: slower, faster or indistinguishable.
    """
    ratio, lo, hi = ratio_of_medians(b_blocks, a_blocks, seed=seed)
    return {"time_ratio": ratio, "ci95": [lo, hi], "verdict": time_verdict(lo, hi),
            "blocks": int(np.asarray(a_blocks).shape[0])}
