"""The server's Prometheus `/metrics` over a load point: scraped once before it, every
`every` seconds while it runs (from a thread, like resources.ServerSampler), and once after,
when the server says nothing runs any more (up to SETTLE_S). The point's ServerMetrics keeps
what moved: counters' increase, gauges before / highest during / after, histograms' gain.

The families kept are the serving ones: Triton's `nv_inference_*` (tensor models), this
project's `pipeline:*` (its batch-size histogram and the generation scheduler's running
sequences and KV-cache tokens), vLLM's `vllm:*` and llama.cpp's `llamacpp:*`, so an external
server's figures land beside ours. A server without /metrics (404, not Prometheus text)
is not scraped, and the load result says why.
"""

from __future__ import annotations

import math
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from pipeline.artifacts.serving import GaugeMove, HistogramMove, ServerMetrics

PREFIXES = ("nv_inference_", "pipeline:", "vllm:", "llamacpp:")
# batch size per engine call (tensor), sequences per decode step (generation)
BATCH_HISTOGRAMS = ("pipeline:inference_batch_size", "pipeline:decode_step_sequences")
RUNNING = ("pipeline:num_requests_running", "vllm:num_requests_running",
           "llamacpp:requests_processing")
SETTLE_S = 5.0
MAX_BYTES = 4 << 20  # a metrics page is tens of KB; read no more than this of one


@dataclass
class Histogram:
    count: float = 0.0
    sum: float = 0.0
    buckets: dict[str, float] = field(default_factory=dict)


@dataclass
class Snapshot:
    """One scrape, each family summed over its label sets (one model per server)."""

    counters: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)


def parse(text: str) -> Snapshot:
    """Prometheus text -> Snapshot of the serving families; non-finite values are skipped."""
    from prometheus_client.parser import text_string_to_metric_families

    snap = Snapshot()
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIXES):
            continue
        for sample in family.samples:
            if not math.isfinite(sample.value):
                continue
            _add(snap, family.type, family.name, sample)
    return snap


def _add(snap: Snapshot, kind: str, name: str, sample) -> None:
    value = sample.value
    if kind == "counter" and not sample.name.endswith("_created"):
        snap.counters[name] = snap.counters.get(name, 0.0) + value
    elif kind == "gauge":
        snap.gauges[name] = snap.gauges.get(name, 0.0) + value
    elif kind == "histogram":
        h = snap.histograms.setdefault(name, Histogram())
        if sample.name.endswith("_bucket"):
            le = sample.labels.get("le", "")
            h.buckets[le] = h.buckets.get(le, 0.0) + value
        elif sample.name.endswith("_count"):
            h.count += value
        elif sample.name.endswith("_sum"):
            h.sum += value


def fetch(url: str, timeout: float = 5.0) -> tuple[Snapshot | None, str | None]:
    """(the scrape, None) or (None, why not)."""
    try:
        import prometheus_client  # noqa: F401 - the parser; the serving extras install it
    except ImportError:
        return None, "prometheus-client is not installed (pip install prometheus-client)"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read(MAX_BYTES).decode("utf-8", errors="replace")
    except urllib.error.HTTPError as e:
        return None, f"GET {url}: HTTP {e.code}"
    except Exception as e:  # refused, reset, not HTTP: the server has no metrics for us
        return None, f"GET {url}: {type(e).__name__}: {str(e)[:120]}"
    try:
        return parse(text), None
    except Exception as e:  # not Prometheus' text format
        return None, f"GET {url}: not Prometheus metrics ({type(e).__name__}: {str(e)[:80]})"


class MetricsScraper:
    """Context manager around a point: `.movement()` afterwards, or `.why` it has none."""

    def __init__(self, base: str | None, every: float = 0.25):
        self.url = f"{base}/metrics" if base else None
        self.every = every
        self.before: Snapshot | None = None
        self.after: Snapshot | None = None
        self.during: list[Snapshot] = []
        self.times: list[float] = []  # each of `during`'s, seconds since the scraper started
        self.why: str | None = None if base else "no server URL"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> MetricsScraper:
        self._t0 = time.perf_counter()
        if self.url is not None:
            self.before, self.why = fetch(self.url)
        if self.before is not None:
            self._thread = threading.Thread(target=self._run, name="metrics-scraper", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is None:
            return
        self._thread.join()
        self.after = self._settled()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            snap, _ = fetch(self.url)
            if snap is not None:
                self.during.append(snap)
                self.times.append(time.perf_counter() - self._t0)

    def gauge(self, name: str) -> list[tuple[float, float]]:
        """(seconds since the start, value) of gauge `name` in each scrape during the point."""
        return [(t, s.gauges[name]) for t, s in zip(self.times, self.during) if name in s.gauges]

    def _settled(self) -> Snapshot | None:
        """The scrape after the point, once no request runs there (a server updates its
        gauges a step after it answers the last token), at most SETTLE_S later."""
        end = time.monotonic() + SETTLE_S
        while True:
            snap, why = fetch(self.url)
            running = sum((snap.gauges.get(n, 0.0) for n in RUNNING), 0.0) if snap else 0.0
            if snap is None or running == 0 or time.monotonic() > end:
                self.why = why
                return snap
            time.sleep(0.1)

    def movement(self) -> ServerMetrics | None:
        if self.before is None or self.after is None:
            return None
        return movement(self.url, self.before, self.during, self.after)


def movement(url: str, before: Snapshot, during: list[Snapshot], after: Snapshot) -> ServerMetrics:
    counters = {n: v - before.counters.get(n, 0.0) for n, v in after.counters.items()}
    gauges = {}
    for name in sorted(set(before.gauges) | set(after.gauges)):
        seen = [s.gauges[name] for s in (*during, after) if name in s.gauges]
        gauges[name] = GaugeMove(before=before.gauges.get(name), peak=max(seen, default=None),
                                 after=after.gauges.get(name))
    histograms = {}
    for name, h in after.histograms.items():
        was = before.histograms.get(name, Histogram())
        histograms[name] = HistogramMove(
            count=h.count - was.count, sum=h.sum - was.sum,
            buckets={le: n - was.buckets.get(le, 0.0) for le, n in h.buckets.items()})
    batch = next((n for n in BATCH_HISTOGRAMS if histograms.get(n) and histograms[n].count > 0),
                 None)
    mean = histograms[batch].sum / histograms[batch].count if batch else None
    return ServerMetrics(url=url, scrapes=len(during), counters=counters, gauges=gauges,
                         histograms=histograms, batch_histogram=batch, mean_batch=mean)
