"""Latency distributions as PNG: a histogram and a CDF per runner, side by side.

Drawn from the very samples that were summarized (ns per request), with matplotlib's
non-interactive Agg backend (no display needed). The histogram's x axis stops at the
largest p99.5 so one stray request does not squash the picture; the CDF shows everything.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.core import safe_files


def latency_png(path: Path, samples: dict[str, np.ndarray], title: str) -> Path:
    """samples: runner name -> latencies in ns. Writes `path` (atomically, through an
    exclusive temporary file: safe_files) and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = {name: np.sort(np.asarray(ns, dtype=np.float64).ravel() / 1e6) for name, ns in samples.items()}
    hi = max(np.percentile(v, 99.5) for v in ms.values())
    lo = min(v[0] for v in ms.values())
    bins = np.linspace(lo, hi, 60)
    fig, (ax_h, ax_c) = plt.subplots(1, 2, figsize=(11, 4), dpi=100)
    for name, v in ms.items():
        p50, p99 = np.percentile(v, [50, 99])
        label = f"{name}: p50 {p50:.3f} ms, p99 {p99:.3f} ms (n={v.size})"
        (line,) = ax_c.plot(v, np.arange(1, v.size + 1) / v.size, label=label)
        ax_h.hist(v[v <= hi], bins=bins, alpha=0.5, color=line.get_color(), label=name)
        ax_h.axvline(p50, color=line.get_color(), linestyle="--", linewidth=1)
    ax_h.set(xlabel="latency (ms)", ylabel="requests", title="histogram (dashed: median; up to p99.5)")
    ax_c.set(xlabel="latency (ms)", ylabel="share of requests <= x", title="CDF (all requests)",
             ylim=(0, 1.01))
    if max(v[-1] for v in ms.values()) / lo > 20:  # heavy tail or runners far apart
        ax_c.set_xscale("log")
        ax_c.set_xlabel("latency (ms, log scale)")
    ax_c.axhline(0.99, color="grey", linewidth=0.5, linestyle=":")
    ax_h.legend(fontsize=8)
    ax_c.legend(fontsize=8, loc="lower right")
    for ax in (ax_h, ax_c):
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    try:
        safe_files.write_atomic_with(path, lambda f: fig.savefig(f, format="png"))
    finally:
        plt.close(fig)
    return path
