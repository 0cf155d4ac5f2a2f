"""MLPerf LoadGen's early-stopping rule for a tail-latency bound (its Server scenario).

A run of n requests, t of them over the latency bound, shows that the p-th percentile
(p = 0.99) holds with confidence c (0.99) when, if the true share of requests over the bound
were as large as 1 - p, seeing t or fewer over it in n would be unlikely:

    P(Binomial(n, 1 - p + d) <= t) <= 1 - c          (d: tolerance, 0 in LoadGen)

LoadGen (mlcommons/inference, loadgen/early_stopping.cc, results.cc) computes the left side as
BetaRegularized[p - d, h, 1 + t] with h = n - t requests within the bound, and searches the
smallest passing h (MinPassingQueriesFinder); a Server run is valid when n >= h + t and its
p99 itself is within the bound. The same tail probability here comes from scipy's binomial
CDF (tests/loadgen/test_statistics.py checks the two against each other and against the closed
form for t = 0: h = ceil(log(1 - c) / log(p - d)), 459 for p = c = 0.99).

It is what makes a pass statistically sound: a plain sample p99 under the bound on a few
hundred requests passes by luck far more often than 1% of the time.
"""

from __future__ import annotations

import math

PERCENTILE = 0.99
CONFIDENCE = 0.99
TOLERANCE = 0.0


def tail_probability(n: int, over: int, p: float = PERCENTILE, d: float = TOLERANCE) -> float:
    """P(at most `over` of `n` requests over the bound | the share over it is exactly 1-p+d)."""
    from scipy.stats import binom  # lazily: `import pipeline` stays light

    return float(binom.cdf(over, n, 1.0 - p + d))


def holds(n: int, over: int, p: float = PERCENTILE, c: float = CONFIDENCE,
          d: float = TOLERANCE) -> bool:
    """Does the p-th percentile hold at confidence c, with `over` of `n` over the bound?"""
    if n <= 0:
        return False
    return tail_probability(n, over, p, d) <= 1.0 - c


def min_passing(over: int, p: float = PERCENTILE, c: float = CONFIDENCE, d: float = TOLERANCE) -> int:
    """The fewest requests within the bound (h) that let `over` requests over it pass: the
    smallest h with P(Binomial(h + over, 1 - p + d) <= over) <= 1 - c (LoadGen's
    MinPassingQueriesFinder). The CDF falls as h grows, so a doubling then a bisection."""
    lo = math.ceil(math.log(1.0 - c) / math.log(p - d))  # the answer for over = 0: a floor
    if holds(lo + over, over, p, c, d):
        return lo
    hi = max(2 * lo, 1)
    while not holds(hi + over, over, p, c, d):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # holds(hi) and not holds(lo)
        mid = (lo + hi) // 2
        if holds(mid + over, over, p, c, d):
            hi = mid
        else:
            lo = mid
    return hi


def min_requests(p: float = PERCENTILE, c: float = CONFIDENCE, d: float = TOLERANCE) -> int:
    """The fewest requests a point can pass with at all (none over the bound)."""
    return min_passing(0, p, c, d)


def more_needed(n: int, over: int, p: float = PERCENTILE, c: float = CONFIDENCE,
                d: float = TOLERANCE) -> int:
    """How many more requests, every one within the bound, the point would need to pass
    (0 when it passes): LoadGen's "Would need to run at least N more queries"."""
    return max(0, min_passing(over, p, c, d) + over - n)
