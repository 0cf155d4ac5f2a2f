"""Statistics of latency samples: percentiles, and A/B ratios of interleaved rounds with
distribution-free intervals."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

from pipeline.core.json_object import JsonObject

Verdict = Literal["faster", "slower", "indistinguishable"]


@dataclass(frozen=True)
class Summary:
    """Milliseconds per timed unit (what was timed is the caller's to name): percentiles,
    mean, spread, and how many units. The fields, in order, are artifacts.LatencySummary's."""

    p50: float
    p90: float
    p99: float
    mean: float
    std: float
    min: float
    max: float
    cov: float  # std / mean
    n: int
    throughput_per_s: float | None  # 1 / p50: units per second at the median

    def dump(self) -> JsonObject:
        """The JSON object, keys in field order (as report.json has them)."""
        return asdict(self)


@dataclass(frozen=True)
class SpeedupEstimate:
    """Baseline time / engine time over interleaved rounds (above 1: the engine is faster),
    its 95% interval and the engine's verdict; artifacts.Speedup's fields, in order."""

    ratio: float
    ci95: list[float]
    verdict: Verdict
    noise_threshold: float

    def dump(self) -> JsonObject:
        return asdict(self)


@dataclass(frozen=True)
class TimeRatio:
    """B time / A time over interleaved rounds (below 1: B is faster), its 95% interval, B's
    verdict and how many rounds; artifacts.Comparison's fields without the names a and b."""

    time_ratio: float
    ci95: list[float]
    verdict: Verdict
    noise_threshold: float
    blocks: int

    def dump(self) -> JsonObject:
        return asdict(self)


def summary(ns: np.ndarray) -> Summary:
    """Latency summary in milliseconds from per-unit samples in nanoseconds."""
    ms = np.asarray(ns, dtype=np.float64).ravel() / 1e6
    mean = float(ms.mean())
    std = float(ms.std(ddof=1)) if ms.size > 1 else 0.0
    p50, p90, p99 = (float(v) for v in np.percentile(ms, [50, 90, 99]))
    return Summary(p50=p50, p90=p90, p99=p99, mean=mean, std=std,
                   min=float(ms.min()), max=float(ms.max()),
                   cov=std / mean if mean else 0.0, n=int(ms.size),
                   throughput_per_s=1e3 / p50 if p50 else None)


MIN_ROUNDS = 6  # the fewest rounds whose extremes bound the median with >= 95% (1 - 2/2**6)

# How every A/B ratio in this project is estimated; reports quote it next to the number.
PAIRED_RATIO_METHOD = ("median over rounds of the per-round ratio of medians (the two blocks of a "
                       "round run back to back), 95% sign-test interval over rounds")


def paired_ratio(a_blocks: np.ndarray, b_blocks: np.ndarray) -> tuple[float, float, float]:
    """How many times longer A takes than B, with a 95% interval: (ratio, lo, hi).

    a_blocks, b_blocks: [rounds, requests per block], block i of A timed right next to block
    i of B (bench.timing). Each round gives one ratio median(a_i) / median(b_i); a drift or a
    burst of load that hits a round hits both of its blocks, so it cancels in that round's
    ratio instead of widening the pooled medians (measured: pooled medians with a block
    bootstrap missed a planted 20% slowdown in 2 of 150 runs under bursty load; the paired
    ratio in none, and A/A intervals held 1.0 in 98.5% of 200 runs).

    The interval is distribution-free: the rounds' log ratios, sorted, between the order
    statistics a sign test puts at >= 95% coverage (binomial, exact). That needs at least
    MIN_ROUNDS rounds; bench.timing always times that many when it compares runners.
    """
    a, b = np.asarray(a_blocks, dtype=np.float64), np.asarray(b_blocks, dtype=np.float64)
    if a.shape[0] != b.shape[0]:
        raise ValueError("a and b need the same number of blocks")
    logs = np.sort(np.log(np.median(a, axis=1)) - np.log(np.median(b, axis=1)))  # [rounds]
    n, k = logs.size, _sign_test_rank(logs.size)
    if k == 0:
        raise ValueError(f"{n} rounds cannot bound a median at 95%; time at least {MIN_ROUNDS}")
    return float(np.exp(np.median(logs))), float(np.exp(logs[k - 1])), float(np.exp(logs[n - k]))


def _sign_test_rank(n: int, alpha: float = 0.05) -> int:
    """Largest k with P(Binomial(n, 1/2) < k) <= alpha/2: the k-th smallest and k-th largest of
    n samples then bound their median with probability >= 1 - alpha. 0 when n is too small."""
    from scipy.stats import binom  # lazily: `import pipeline` stays light

    # ppf: the smallest k with P(X <= k) >= alpha/2; the rank wants P(X <= k) > alpha/2.
    k = int(binom.ppf(alpha / 2, n, 0.5))
    return k + 1 if binom.cdf(k, n, 0.5) <= alpha / 2 else k


def verdict(lo: float, hi: float, *, noise: float) -> Verdict:
    """For a speedup interval (baseline time / engine time): is the engine faster, slower, or
    can't we tell?

    `faster` needs the whole interval above 1 + noise, `slower` the whole interval below
    1 / (1 + noise) (criterion.rs's noise threshold, symmetric in log space). A 95% interval
    that merely excludes 1 does so in up to 5% of A/A runs by construction, more when
    neighbouring rounds are correlated (measured here: 1.7-6.7% of A/A runs of two sessions of
    one engine file); with the threshold, none of 360 (docs/measurement.md). A difference
    smaller than the threshold is below what this protocol resolves, and is reported as such.
    """
    if lo > 1.0 + noise:
        return "faster"
    if hi < 1.0 / (1.0 + noise):
        return "slower"
    return "indistinguishable"


def ratio_method(noise: float) -> str:
    """How an A/B ratio is estimated and judged (`paired_ratio`, `verdict`), for reports."""
    return (f"{PAIRED_RATIO_METHOD}; verdict faster or slower only when the whole interval "
            f"lies beyond the noise threshold of {noise:.1%} around 1, else indistinguishable")


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


# The project's two ratios, in opposite directions, each with one name (docs/design.md):
#   speed-up    = reference (A) time / engine (B) time: above 1, B is faster.
#                 `speedup` below; Speedup.ratio in report.json.
#   time ratio  = B time / A time: below 1, B is faster.
#                 `compare` below; Comparison.time_ratio (and tune's `ab`) in the JSON.
# One is the other's reciprocal; `speedup_from_time_ratio` is the one place that turns one
# into the other (an interval's ends swap: [lo, hi] -> [1/hi, 1/lo]).


def speedup_from_time_ratio(time_ratio: float, ci95=None) -> tuple[float, list[float] | None]:
    """B's speed-up over A (A time / B time) from B's time ratio (B time / A time), with the
    95% interval turned the same way; the reverse (a speed-up to its time ratio) is the same
    reciprocal, so this is also how a `slower` speed-up is written as a factor above 1."""
    return 1.0 / time_ratio, ([1.0 / ci95[1], 1.0 / ci95[0]] if ci95 is not None else None)


def time_verdict(lo: float, hi: float, *, noise: float) -> Verdict:
    """For a time-ratio interval (B time / A time): is B slower, faster, or can't we tell?
    (The same question as `verdict`, asked of B's speed-up interval.)"""
    _, (slo, shi) = speedup_from_time_ratio(1.0, [lo, hi])
    return verdict(slo, shi, noise=noise)


def speedup(baseline_blocks: np.ndarray, engine_blocks: np.ndarray, *, noise: float) -> SpeedupEstimate:
    """The engine against the baseline, timed interleaved: its speed-up (baseline time /
    engine time, above 1: faster), with its 95% CI and the engine's verdict."""
    ratio, lo, hi = paired_ratio(baseline_blocks, engine_blocks)
    return SpeedupEstimate(ratio=ratio, ci95=[lo, hi], verdict=verdict(lo, hi, noise=noise),
                           noise_threshold=noise)


def time_ratio(a_blocks: np.ndarray, b_blocks: np.ndarray, *, noise: float) -> TimeRatio:
    """B against A, timed interleaved: B's time ratio median(B) / median(A) (below 1:
    faster; speedup_from_time_ratio gives B's speed-up) with its 95% CI.

    ratio 1.2 = B takes 20% longer than A; verdict is B's: slower, faster or indistinguishable
    (`noise`: the recipe's `validate.latency.noise_threshold`).
    """
    ratio, lo, hi = paired_ratio(b_blocks, a_blocks)
    return TimeRatio(time_ratio=ratio, ci95=[lo, hi], verdict=time_verdict(lo, hi, noise=noise),
                     noise_threshold=noise, blocks=int(np.asarray(a_blocks).shape[0]))


def compare(a_blocks: np.ndarray, b_blocks: np.ndarray, *, noise: float) -> JsonObject:
    """`time_ratio` as its JSON object, for the callers that still extend or splice it as a
    dict (commands/tune.py, compare/generation.py); new code takes the TimeRatio."""
    return time_ratio(a_blocks, b_blocks, noise=noise).dump()
