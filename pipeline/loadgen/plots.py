"""PNGs of a load test (matplotlib, Agg: no display): the knee (latency against offered
load, with each percentile's 95% interval, the SLO bound and each point's verdict, achieved
rate beside it), the soak (p99 and server memory per window) and chat tasks (time per task
and TTFT against the offered task rate, completed tasks and goodput beside)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.artifacts.serving import LoadPoint, Quantile, SoakWindow, TaskPoint


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _q(points: list[LoadPoint], name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """value, lo, hi arrays (nan where unknown; hi nan = unbounded)."""
    def get(p, k):
        v = getattr(p.latency_ms[name], k)
        return np.nan if v is None else v
    return tuple(np.asarray([get(p, k) for p in points], dtype=float) for k in ("value", "lo", "hi"))


def knee_png(path: Path, points: list[LoadPoint], title: str, bound_ms: float | None = None) -> Path:
    plt = _plt()
    pts = sorted(points, key=lambda p: p.offered_rate)
    x = np.asarray([p.offered_rate for p in pts])
    fig, (ax, ax_r) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=100)
    finite = False
    for name, style in (("p50", "o-"), ("p99", "s-")):
        v, lo, hi = _q(pts, name)
        finite = finite or bool(np.isfinite(v).any())
        shown = np.where(np.isfinite(v), v, np.nan)
        err = np.vstack([np.clip(shown - lo, 0, None), np.clip(hi - shown, 0, None)])
        ax.errorbar(x, shown, yerr=np.nan_to_num(err), fmt=style, capsize=3, label=f"{name} (95% CI)")
    if bound_ms:
        ax.axhline(bound_ms, color="red", linestyle="--", linewidth=1, label=f"SLO {bound_ms:g} ms")
    _verdicts(ax, x, pts)
    ax.set(xlabel="offered rate (requests/s)", ylabel="latency from scheduled send (ms)",
           title="latency vs offered load (failed requests count as infinite)")
    if finite:  # a point where every request failed has no latency to draw
        ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    _throughput(ax_r, x, pts, "requests/s", "achieved", "goodput (within SLO)")
    return _save(plt, fig, path, title)


def soak_png(path: Path, windows: list[SoakWindow], title: str) -> Path:
    plt = _plt()
    mid = np.asarray([(w.start_s + w.end_s) / 2 for w in windows])
    fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
    p99 = [np.nan if w.p99_ms.value is None else w.p99_ms.value for w in windows]
    ax.plot(mid, p99, "o-", label="p99 latency (ms)")
    if windows and windows[0].ttft_p99_ms is not None:  # streamed generation
        for field, label in (("ttft_p99_ms", "TTFT p99 (ms)"), ("tpot_p99_ms", "TPOT p99 (ms)")):
            values = [getattr(w, field).value if getattr(w, field) is not None else None for w in windows]
            ax.plot(mid, [np.nan if v is None else v for v in values], ".-", label=label)
    ax.set(xlabel="time (s)", ylabel="p99 (ms)")
    ax.grid(alpha=0.3)
    ax_m = ax.twinx()
    rss = [np.nan if w.rss_mib is None else w.rss_mib for w in windows]
    ax_m.plot(mid, rss, "s--", color="tab:orange", label="server RSS (MiB)")
    if windows and all(w.cache_mib is not None for w in windows):  # what the verdict judged
        ax_m.plot(mid, [r - w.cache_mib for r, w in zip(rss, windows)], "s:", color="tab:brown",
                  label="server RSS less its prefix cache (MiB)")
    ax_m.set_ylabel("server RSS (MiB)")
    fig.legend(fontsize=8, loc="upper left")
    return _save(plt, fig, path, title)


def _verdicts(ax, x: np.ndarray, pts: list) -> None:
    """Each point's SLO verdict written under it (none where no SLO was set)."""
    for xi, p in zip(x, pts):
        if p.passed is not None:
            ax.annotate("pass" if p.passed else "fail", (xi, 0.02), xycoords=("data", "axes fraction"),
                        ha="center", fontsize=7, color="green" if p.passed else "red")


def _throughput(ax, x: np.ndarray, pts: list, unit: str, achieved: str, goodput: str) -> None:
    """Achieved rate and goodput against the offered rate (`unit`: requests/s or tasks/s)."""
    ax.plot(x, x, color="grey", linestyle=":", label=f"{achieved} = offered")
    ax.plot(x, [p.achieved_rate for p in pts], "o-", label=f"{achieved} {unit}")
    ax.plot(x, [p.goodput for p in pts], "^-", label=goodput)
    ax.set(xlabel=f"offered rate ({unit})", ylabel=unit, title="throughput")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _save(plt, fig, path: Path, title: str) -> Path:
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _values(qs: list[Quantile]) -> tuple[np.ndarray, np.ndarray]:
    """(values, [2, n] error bars) of quantiles; nan where unknown or unbounded."""
    nan = lambda x: np.nan if x is None else x  # noqa: E731
    v = np.asarray([nan(q.value) for q in qs], dtype=float)
    lo = np.asarray([nan(q.lo) for q in qs], dtype=float)
    hi = np.asarray([nan(q.hi) for q in qs], dtype=float)
    return v, np.nan_to_num(np.vstack([np.clip(v - lo, 0, None), np.clip(hi - v, 0, None)]))


def tasks_png(path: Path, points: list[TaskPoint], title: str) -> Path:
    """Time per task p50/p99 and turn TTFT p99 against the task rate; tasks/s beside."""
    plt = _plt()
    pts = sorted(points, key=lambda p: p.offered_rate)
    x = np.asarray([p.offered_rate for p in pts])
    fig, (ax, ax_r) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=100)
    lines = (("time per task p50", "o-", [p.time_per_task_ms["p50"] for p in pts]),
             ("time per task p99", "s-", [p.time_per_task_ms["p99"] for p in pts]),
             ("turn TTFT p99", "^--", [p.turn_timings.ttft_ms["p99"] for p in pts]))
    for label, style, qs in lines:
        v, err = _values(qs)
        ax.errorbar(x, v, yerr=err, fmt=style, capsize=3, label=f"{label} (95% CI)")
    _verdicts(ax, x, pts)
    ax.set(xlabel="offered task rate (tasks/s)", ylabel="ms",
           title="chat tasks: latency vs offered load (failed tasks count as infinite)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    _throughput(ax_r, x, pts, "tasks/s", "completed", "goodput (every turn within SLO)")
    return _save(plt, fig, path, title)
