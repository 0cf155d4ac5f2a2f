"""Soak: one long open-loop point cut into time windows, reporting drift (p99 and server
memory per window) and a leak verdict.

The verdict regresses the server's memory (the mean RSS of each window) on time: a least-
squares slope in MiB per hour with a 95% t-interval over the windows. Windows, not raw
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
            end: float, count: int, sampler_offset: float = 0.0) -> list[SoakWindow]:
    """`count` equal windows of [start, end) by scheduled time: requests, p99 (interval),
    failures, and the server's mean CPU and RSS (samples: (t, cpu %, rss MiB), their t
    shifted by sampler_offset onto the client's clock)."""
    edges = np.linspace(start, end, count + 1)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        mine = [o for o in outcomes if lo <= o.due < hi]
        lat = [o.latency * 1e3 for o in mine]
        res = [s for s in samples if lo <= s[0] - sampler_offset < hi]
        streamed = any(o.chunks for o in mine)  # a generation engine's token stream
        ttft = [(o.chunks[0] - o.due) * 1e3 if o.status == "ok" and o.chunks else np.inf for o in mine]
        tpot = [t for t in (tpot_ms(o) if o.status == "ok" else np.inf for o in mine) if not np.isnan(t)]
        out.append(SoakWindow(start_s=float(lo), end_s=float(hi), requests=len(mine),
                              failures=sum(o.status != "ok" for o in mine),
                              p99_ms=quantile(lat, 0.99),
                              ttft_p99_ms=quantile(ttft, 0.99) if streamed else None,
                              tpot_p99_ms=quantile(tpot, 0.99) if streamed else None,
                              rss_mib=float(np.mean([s[2] for s in res])) if res else None,
                              cpu_pct=float(np.mean([s[1] for s in res])) if res else None))
    return out


def verdict(wins: list[SoakWindow], threshold: float = LEAK_MIB_PER_HOUR) -> SoakVerdict:
    mid = np.asarray([(w.start_s + w.end_s) / 2 for w in wins])
    rss = np.asarray([np.nan if w.rss_mib is None else w.rss_mib for w in wins])
    memory, latency = slope(mid, rss), slope(mid, _values(wins, "p99_ms"))
    streamed = all(w.ttft_p99_ms is not None for w in wins)
    if memory is None or len(wins) < MIN_WINDOWS:
        leak = "inconclusive"
        why = f"fewer than {MIN_WINDOWS} windows with memory samples"
    elif memory.ci95[0] > threshold:
        leak, why = "leak", f"memory grows faster than {threshold:g} MiB/h over the whole 95% interval"
    elif memory.ci95[1] < threshold:
        leak, why = "no leak", f"memory growth below {threshold:g} MiB/h over the whole 95% interval"
    else:
        leak, why = "inconclusive", f"the 95% interval of the memory slope straddles {threshold:g} MiB/h; run longer"
    return SoakVerdict(memory_slope_mib_per_hour=memory, p99_slope_ms_per_hour=latency,
                       ttft_p99_slope_ms_per_hour=slope(mid, _values(wins, "ttft_p99_ms")) if streamed else None,
                       tpot_p99_slope_ms_per_hour=slope(mid, _values(wins, "tpot_p99_ms")) if streamed else None,
                       threshold_mib_per_hour=threshold, leak=leak, why=why)


def _values(wins: list[SoakWindow], field: str) -> np.ndarray:
    """Each window's quantile `field` (p99_ms, ttft_p99_ms, ...), NaN where unknown or unbounded
    (a window whose p99 is a failed request's inf carries no slope)."""
    values = [getattr(w, field).value if getattr(w, field) is not None else None for w in wins]
    return np.asarray([np.nan if v is None or not np.isfinite(v) else v for v in values], dtype=np.float64)
