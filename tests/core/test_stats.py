"""core/stats.py: the paired ratio and its sign-test interval, verdicts against the noise
threshold, robustness to bursts of load, and speed-ups and time ratios named once."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import recipe as recipe_mod
from pipeline.bench import protocol, timing
from pipeline.core import stats


def _blocks(rng, scale=1.0, blocks=40, block=25):
    drift = 1 + 0.2 * np.sin(np.linspace(0, 6, blocks))[:, None]  # a slow machine-wide drift
    return rng.lognormal(np.log(1e6), 0.15, size=(blocks, block)) * drift * scale


NOISE = recipe_mod.LatencySpec().noise_threshold  # the recipes' default


def test_paired_ratio_a_a_interval_covers_1_at_least_95_percent():
    """The sign-test interval's coverage is exact (>= 95%); over 400 A/As of identical
    distributions, the bare interval (no noise threshold) must hold 1 at that rate (binomial
    sd ~1.1%)."""
    rng = np.random.default_rng(0)
    verdicts = []
    for _ in range(400):
        a, b = _blocks(rng), _blocks(rng)
        ratio, lo, hi = stats.paired_ratio(a, b)
        assert lo <= ratio <= hi
        verdicts.append(stats.verdict(lo, hi, noise=0.0))
    assert verdicts.count("indistinguishable") / 400 >= 0.93, verdicts.count("indistinguishable")


def test_paired_ratio_finds_a_planted_slowdown():
    rng = np.random.default_rng(1)
    base, slow = _blocks(rng), _blocks(rng, scale=1.2)
    ratio, lo, hi = stats.paired_ratio(base, slow)  # speedup of `slow` over base
    assert stats.verdict(lo, hi, noise=NOISE) == "slower"
    assert lo < 1 / 1.2 < hi


@pytest.mark.parametrize("lo, hi, noise, expected", [
    (1.005, 1.015, 0.02, "indistinguishable"),  # excludes 1, but inside the noise band
    (1.005, 1.015, 0.0, "faster"),              # the bare interval
    (1.021, 1.10, 0.02, "faster"),
    (1 / 1.015, 1 / 1.005, 0.02, "indistinguishable"),
    (1 / 1.10, 1 / 1.021, 0.02, "slower"),
    (0.97, 1.03, 0.0, "indistinguishable"),
])
def test_verdict_needs_the_whole_interval_beyond_the_noise_threshold(lo, hi, noise, expected):
    assert stats.verdict(lo, hi, noise=noise) == expected
    # the time-ratio form asks the same question of the inverted interval
    assert stats.time_verdict(1 / hi, 1 / lo, noise=noise) == expected


def test_paired_ratio_keeps_a_slowdown_through_bursts_of_load():
    """Bursts of 1.3-2.5x in a third of the rounds, each hitting A, B or both: pooled medians
    smear them across both runners, per-round ratios leave the clean rounds untouched."""
    rng = np.random.default_rng(2)
    misses = 0
    for _ in range(100):
        a, b = _blocks(rng, blocks=20, block=10), _blocks(rng, scale=1.2, blocks=20, block=10)
        burst = rng.random(20) < 0.35
        hit = rng.integers(0, 3, 20)  # 0: both blocks of the round, 1: only A's, 2: only B's
        factor = rng.uniform(1.3, 2.5, 20)[:, None]
        a[burst & (hit != 2)] *= factor[burst & (hit != 2)]
        b[burst & (hit != 1)] *= factor[burst & (hit != 1)]
        misses += stats.time_ratio(a, b, noise=NOISE).verdict != "slower"
    assert misses <= 2, misses


def test_sign_test_interval_needs_six_rounds():
    assert [stats._sign_test_rank(n) for n in (5, 6, 10, 20)] == [0, 1, 2, 6]
    # thousands of rounds (a fast graph timed for min_seconds): no float overflow, and the
    # normal approximation's rank n/2 - 1.96 sqrt(n)/2
    assert abs(stats._sign_test_rank(5000) - (2500 - 1.96 * 5000**0.5 / 2)) <= 2
    five = np.ones((5, 3))
    with pytest.raises(ValueError, match="5 rounds cannot bound a median at 95%; time at least 6"):
        stats.paired_ratio(five, five)
    timed = timing.time_interleaved([protocol.NoopRunner()] * 2, {}, recipe_mod.LatencySpec(
        warmup=0, iterations=10, min_seconds=0, block=5))
    assert timed.blocks[0].shape == (stats.MIN_ROUNDS, 5) and timed.stop == "min_rounds"


def _sign_test_rank_loop(n: int, alpha: float = 0.05) -> int:
    """The hand-written binomial sum stats._sign_test_rank used before scipy: the oracle."""
    import math

    k, below = 0, 0.0
    while True:
        below += math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                          - n * math.log(2))
        if below > alpha / 2:
            return k
        k += 1


def test_sign_test_rank_from_scipy_matches_the_old_binomial_sum():
    ns = range(1, 2001)
    assert [stats._sign_test_rank(n) for n in ns] == [_sign_test_rank_loop(n) for n in ns]
    assert [stats._sign_test_rank(n, 0.01) for n in (10, 100, 1000)] == \
        [_sign_test_rank_loop(n, 0.01) for n in (10, 100, 1000)]


def test_summary_is_in_milliseconds():
    s = stats.summary(np.array([1e6, 2e6, 3e6, 4e6]))
    assert s.p50 == pytest.approx(2.5) and s.n == 4 and s.min == 1.0
    assert list(s.dump()) == ["p50", "p90", "p99", "mean", "std", "min", "max", "cov", "n",
                              "throughput_per_s"]  # report.json's order




def test_a_time_ratio_and_a_speedup_are_one_reciprocal_apart_named_once():
    """speed-up = A time / B time (Speedup.ratio), time ratio = B time / A time
    (Comparison.time_ratio): stats.speedup_from_time_ratio turns one into the other, and the
    speed-up, the comparison, as_speedup and the verdicts agree on the same blocks."""
    rng = np.random.default_rng(0)
    a = rng.uniform(1.9, 2.1, size=(12, 5))  # reference: ~2 ms requests, 12 blocks of 5
    b = rng.uniform(0.95, 1.05, size=(12, 5))  # engine: about twice as fast
    sp, cmp = stats.speedup(a, b, noise=0.05), stats.time_ratio(a, b, noise=0.05)
    ratio, ci = stats.speedup_from_time_ratio(cmp.time_ratio, cmp.ci95)
    assert 1.8 < sp.ratio < 2.2 and cmp.time_ratio < 0.6
    assert np.isclose(ratio, sp.ratio) and np.allclose(ci, sp.ci95)
    assert sp.verdict == cmp.verdict == "faster"
    assert protocol.as_speedup(cmp).ratio == ratio and protocol.as_speedup(cmp).ci95 == ci
    assert stats.compare(a, b, noise=0.05) == cmp.dump()
    assert stats.speedup_from_time_ratio(0.5) == (2.0, None)
    assert stats.time_verdict(1.5, 1.8, noise=0.05) == "slower"  # B takes 1.5-1.8x A's time
