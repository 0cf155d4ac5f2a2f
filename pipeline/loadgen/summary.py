"""One load point summarized: rates, goodput, failures, percentiles with intervals, queue vs
compute, batch sizes, lateness of the client, the SLO verdict; token timings for generation.

Percentiles are order statistics of every measured request (a failed, rejected or timed-out
request is infinitely late, so it is never dropped from the tail). Their 95% intervals are
distribution-free: the count of requests below the true q-quantile is Binomial(n, q), so
the order statistics at that binomial's 2.5% and 97.5% points bound it. An upper bound past
the last request is None: the point holds too few requests to bound that percentile.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from pipeline.artifacts.serving import (
    Late,
    LoadPoint,
    Percentiles,
    Quantile,
    SloVerdict,
    Spread,
    TokenTimings,
)
from pipeline.loadgen import early_stopping
from pipeline.loadgen.client import Outcome
from pipeline.loadgen.slo import Term

QUANTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99, "p99.9": 0.999}
LATE_MS = 2.0  # sent more than this after its scheduled time: late (epoll wakes <= 1 ms late)
ERRORS_MAX = 0.001  # errors + timeouts + rejections allowed in a passing point (0.1%)
RATE_SHORTFALL = 0.02  # achieved rate may fall at most 2% short of the offered rate


def _finite(x: float | None) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def quantile(values, q: float, confidence: float = 0.95) -> Quantile:
    """The q-quantile in the values' unit (order statistic of rank ceil(q n)) and its
    distribution-free interval; inf values (failed requests) sort last."""
    from scipy.stats import binom

    x = np.sort(np.asarray(values, dtype=np.float64))
    n = x.size
    if n == 0:
        return Quantile(value=None, lo=None, hi=None)
    value = x[min(n, max(1, int(np.ceil(q * n)))) - 1]
    alpha = 1.0 - confidence
    lo_rank = int(binom.ppf(alpha / 2, n, q))        # 1-based rank of the lower bound
    hi_rank = int(binom.ppf(1 - alpha / 2, n, q)) + 1  # 1-based rank of the upper bound
    lo = x[lo_rank - 1] if lo_rank >= 1 else None
    hi = x[hi_rank - 1] if hi_rank <= n else None
    return Quantile(value=_finite(value), lo=_finite(lo), hi=_finite(hi))


def percentiles(values_ms) -> Percentiles:
    return {name: quantile(values_ms, q) for name, q in QUANTILES.items()}


def _spread(values) -> Spread | None:
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    if v.size == 0:
        return None
    p50, p99 = np.percentile(v, [50, 99])
    return Spread(mean=float(v.mean()), p50=float(p50), p99=float(p99))


def judge(terms: tuple[Term, ...], metrics_ms: dict[str, np.ndarray], n: int) -> list[SloVerdict]:
    """Each SLO term: the sample percentile within the bound, and MLPerf's early-stopping
    rule passing. metrics_ms: "latency"/"ttft"/"tpot" -> [n] ms, inf for failed requests."""
    out = []
    for t in terms:
        values = metrics_ms[t.metric]
        over = int(np.sum(~(values <= t.bound_ms)))  # NaN (no second token) counts as over
        sample = quantile(values, t.percentile).value
        within = sample is not None and sample <= t.bound_ms
        early = early_stopping.holds(n, over, p=t.percentile)
        out.append(SloVerdict(term=t.label, metric=t.metric, percentile=t.percentile,
                              bound_ms=t.bound_ms, over=over, sample_percentile_ms=sample,
                              early_stopping=early, passed=bool(within and early),
                              more_needed=early_stopping.more_needed(n, over, p=t.percentile)))
    return out


@dataclass(frozen=True)
class TokenTimes:
    """Per request [n] ms: ttft (first text chunk; inf when failed), tpot (NaN with one
    token, inf when failed); and the pooled gaps between text chunks (ITL)."""

    ttft: np.ndarray
    tpot: np.ndarray
    itl: np.ndarray


def tpot_ms(o: Outcome) -> float:
    """Time per output token after the first: the first to the last text chunk over the
    tokens between them (the usage's count when the server sends it, else the chunks), as
    vLLM's benchmark computes it; NaN with a single token."""
    if o.tokens < 2 or len(o.chunks) < 2:
        return np.nan
    return (o.chunks[-1] - o.chunks[0]) * 1e3 / (o.tokens - 1)


def _tokens(measured: list[Outcome]) -> TokenTimes:
    ttft, tpot, itl = [], [], []
    for o in measured:
        ok = o.status == "ok" and o.chunks
        ttft.append((o.chunks[0] - o.due) * 1e3 if ok else np.inf)
        tpot.append(tpot_ms(o) if ok else np.inf)  # one token: no TPOT, not a failure
        if ok:
            itl.extend((np.diff(o.chunks) * 1e3).tolist())
    return TokenTimes(np.asarray(ttft), np.asarray(tpot), np.asarray(itl))


def _token_timings(measured: list[Outcome], tokens: TokenTimes, e2e_ms: Percentiles,
                   span: float) -> TokenTimings:
    ok_tokens = [o.tokens for o in measured if o.status == "ok"]
    return TokenTimings(
        ttft_ms=percentiles(tokens.ttft), tpot_ms=percentiles(tokens.tpot[~np.isnan(tokens.tpot)]),
        itl_ms=percentiles(tokens.itl), e2e_ms=e2e_ms,
        tokens_per_s=float(sum(ok_tokens)) / span if measured else 0.0,
        mean_tokens=float(np.mean(ok_tokens)) if ok_tokens else 0.0)


def summarize(outcomes: list[Outcome], *, warmup: float, window: float, offered_rate: float,
              terms: tuple[Term, ...] = (), generation: bool = False) -> LoadPoint:
    """The measured requests are those due in [warmup, warmup + window); earlier ones warmed
    the server. window: seconds of schedule measured (closed loop: of the run)."""
    measured = [o for o in outcomes if warmup <= o.due < warmup + window]
    n = len(measured)
    statuses = Counter(o.status for o in measured)
    latency_ms = np.asarray([o.latency * 1e3 for o in measured])
    ends = [o.done for o in measured if np.isfinite(o.done)]
    span = max(window, (max(ends) - warmup) if ends else window)  # a backlog stretches it
    late_ms = np.asarray([(o.sent - o.due) * 1e3 for o in measured])
    tokens = _tokens(measured) if generation else None
    metrics = {"latency": latency_ms, **({"ttft": tokens.ttft, "tpot": tokens.tpot} if tokens else {})}
    within = np.ones(n, dtype=bool)
    for t in terms:
        within &= metrics[t.metric] <= t.bound_ms
    if not terms:
        within = latency_ms < np.inf
    latency = percentiles(latency_ms)
    point = LoadPoint(
        offered_rate=offered_rate, scheduled_rate=n / window if window else 0.0,
        achieved_rate=statuses["ok"] / span if n else 0.0,
        goodput=float(within.sum()) / span if n else 0.0,
        requests=n, warmup_requests=sum(o.due < warmup for o in outcomes), window_s=window,
        ok=statuses["ok"], rejected=statuses["rejected"], errors=statuses["error"],
        timeouts=statuses["timeout"],
        error_examples=sorted({o.error for o in measured if o.error})[:3],
        latency_ms=latency,
        latency_mean_ms=_finite(latency_ms[np.isfinite(latency_ms)].mean()) if statuses["ok"] else None,
        late=Late(share=float(np.mean(late_ms > LATE_MS)) if n else 0.0,
                  p99_ms=float(np.percentile(late_ms, 99)) if n else 0.0,
                  max_ms=float(late_ms.max()) if n else 0.0),
        queue_ms=_spread(o.queue_ms for o in measured),
        compute_ms=_spread(o.compute_ms for o in measured),
        batch_sizes={str(k): v for k, v in sorted(Counter(
            o.batch_size for o in measured if o.batch_size is not None).items())},
        slo=judge(terms, metrics, n), passed=None,
        **({"generation": _token_timings(measured, tokens, latency, span)} if tokens else {}))
    return point.model_copy(update={"passed": passed(point) if terms else None})


def passed(point: LoadPoint) -> bool:
    """The capacity criterion: every SLO term holds (sample percentile and early stopping),
    the achieved rate within 2% of the offered one, failures under 0.1%."""
    n = point.requests
    failures = n - point.ok
    return (all(v.passed for v in point.slo)
            and point.achieved_rate >= (1 - RATE_SHORTFALL) * point.scheduled_rate
            and (n > 0 and failures / n < ERRORS_MAX))
