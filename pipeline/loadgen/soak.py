"""Soak: one long open-loop point cut into time windows, reporting drift (p99 and server
memory per window) and a leak verdict.

The verdict regresses the server's memory (the mean RSS of each window) on time: a least-
squares slope in MiB per hour with a 95% t-interval over the windows. A server that says what
its caches hold by design (this project's `pipeline:prefix_cache_bytes`: finished
conversations' keys and values, kept up to the KV budget) is judged on the memory those do not
explain (RSS less the cache, per window): a prefix cache filling towards its budget is growth,
not a leak (measured, an hour of SmolLM2 chat: the cache filled to 433 MiB in its first 10
minutes, then held). The raw RSS slope is kept beside it. Windows, not raw
samples: samples half a second apart are strongly correlated, and a regression over them
would claim a far narrower interval than the data hold. "leak" only when the whole interval
lies above the threshold (a steady growth the run resolves), "no leak" when the whole
interval lies below it, else "inconclusive" (run longer). The latency p99 gets the same
slope (ms per hour) as drift, without a verdict.
"""

from __future__ import annotations

import numpy as np

from pipeline.artifacts.serving import Slope, SoakVerdict, SoakWindow
from pipeline.loadgen.client import Outcome
from pipeline.loadgen.summary import quantile, tpot_ms

LEAK_MIB_PER_HOUR = 10.0
MIN_WINDOWS = 4
CACHE_GAUGE = "pipeline:prefix_cache_bytes"  # serving/metrics.py: bytes held by design


def slope(t_s: np.ndarray, y: np.ndarray) -> Slope | None:
    """Least-squares slope of y on t per hour, 95% t-interval; None under 3 points."""
    from scipy import stats

    t_s, y = np.asarray(t_s, dtype=np.float64), np.asarray(y, dtype=np.float64)
    keep = np.isfinite(t_s) & np.isfinite(y)
    t_s, y = t_s[keep], y[keep]
    if t_s.size < 3 or np.ptp(t_s) == 0:
        return None
    fit = stats.linregress(t_s / 3600.0, y)
    half = stats.t.ppf(0.975, t_s.size - 2) * fit.stderr
    return Slope(per_hour=float(fit.slope), ci95=[float(fit.slope - half), float(fit.slope + half)],
                 points=int(t_s.size))


def windows(outcomes: list[Outcome], samples: list[tuple[float, float, float]], *, start: float,
            end: float, count: int, sampler_offset: float = 0.0,
            cache_bytes: list[tuple[float, float]] = ()) -> list[SoakWindow]:
    """`count` equal windows of [start, end) by scheduled time: requests, p99 (interval),
    failures, and the server's mean CPU and RSS (samples: (t, cpu %, rss MiB), their t
    shifted by sampler_offset onto the client's clock) and the mean bytes its caches held
    (cache_bytes: (t, bytes) from its /metrics; None where it said nothing in the window)."""
    edges = np.linspace(start, end, count + 1)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        mine = [o for o in outcomes if lo <= o.due < hi]
        lat = [o.latency * 1e3 for o in mine]
        res = [s for s in samples if lo <= s[0] - sampler_offset < hi]
        held = [b for t, b in cache_bytes if lo <= t - sampler_offset < hi]
        streamed = any(o.chunks for o in mine)  # a generation engine's token stream
        ttft = [(o.chunks[0] - o.due) * 1e3 if o.status == "ok" and o.chunks else np.inf for o in mine]
        tpot = [t for t in (tpot_ms(o) if o.status == "ok" else np.inf for o in mine) if not np.isnan(t)]
        out.append(SoakWindow(start_s=float(lo), end_s=float(hi), requests=len(mine),
                              failures=sum(o.status != "ok" for o in mine),
                              p99_ms=quantile(lat, 0.99),
                              ttft_p99_ms=quantile(ttft, 0.99) if streamed else None,
                              tpot_p99_ms=quantile(tpot, 0.99) if streamed else None,
                              rss_mib=float(np.mean([s[2] for s in res])) if res else None,
                              cpu_pct=float(np.mean([s[1] for s in res])) if res else None,
                              cache_mib=float(np.mean(held)) / 2**20 if held else None))
    return out


def verdict(wins: list[SoakWindow], threshold: float = LEAK_MIB_PER_HOUR) -> SoakVerdict:
    mid = np.asarray([(w.start_s + w.end_s) / 2 for w in wins])
    rss = np.asarray([np.nan if w.rss_mib is None else w.rss_mib for w in wins])
    memory, latency = slope(mid, rss), slope(mid, _values(wins, "p99_ms"))
    streamed = all(w.ttft_p99_ms is not None for w in wins)
    cached = all(w.cache_mib is not None for w in wins)
    unexplained = slope(mid, rss - np.asarray([w.cache_mib for w in wins], np.float64)) if cached and wins else None
    judged, what = (unexplained, "memory its caches do not hold") if unexplained is not None else (memory, "memory")
    if judged is None or len(wins) < MIN_WINDOWS:
        leak = "inconclusive"
        why = f"fewer than {MIN_WINDOWS} windows with memory samples"
    elif judged.ci95[0] > threshold:
        leak, why = "leak", f"{what} grows faster than {threshold:g} MiB/h over the whole 95% interval"
    elif judged.ci95[1] < threshold:
        leak, why = "no leak", f"{what} grows below {threshold:g} MiB/h over the whole 95% interval"
    else:
        leak, why = "inconclusive", f"the 95% interval of the slope of {what} straddles {threshold:g} MiB/h; run longer"
    return SoakVerdict(memory_slope_mib_per_hour=memory, uncached_slope_mib_per_hour=unexplained,
                       p99_slope_ms_per_hour=latency,
                       ttft_p99_slope_ms_per_hour=slope(mid, _values(wins, "ttft_p99_ms")) if streamed else None,
                       tpot_p99_slope_ms_per_hour=slope(mid, _values(wins, "tpot_p99_ms")) if streamed else None,
                       threshold_mib_per_hour=threshold, leak=leak, why=why)


def _values(wins: list[SoakWindow], field: str) -> np.ndarray:
    """Each window's quantile `field` (p99_ms, ttft_p99_ms, ...), NaN where unknown or unbounded
    (a window whose p99 is a failed request's inf carries no slope)."""
    values = [getattr(w, field).value if getattr(w, field) is not None else None for w in wins]
    return np.asarray([np.nan if v is None or not np.isfinite(v) else v for v in values], dtype=np.float64)
