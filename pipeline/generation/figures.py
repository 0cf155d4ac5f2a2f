"""Generation figures from timed traces: TTFT, TPOT, tokens/s, time per task, TPOT against
context length, token agreement with the baseline, and KV-cache bytes per token."""

from __future__ import annotations

import numpy as np

from pipeline.artifacts.generation import (
    Agreement,
    ContextBin,
    Phases,
    PhaseSpeedups,
    Point,
    TokensPerSecond,
    Turn,
)
from pipeline.artifacts.latency import LatencySummary, Speedup
from pipeline.core import stats
from pipeline.generation.timed_requests import Request, Trace


def _pct(ns: np.ndarray) -> LatencySummary:
    return LatencySummary(**stats.summary(ns).dump())  # p50 / p90 / p99, mean, std, cov, n, ...


def ttft_blocks(traces: list[Trace]) -> np.ndarray:
    """[rounds, 1]: the first turn's prefill of each round."""
    return np.array([[t.ttft_ns[0]] for t in traces], dtype=np.float64)


def tpot_blocks(traces: list[Trace]) -> np.ndarray:
    """[rounds, steps]: every decode step of each round."""
    return np.array([[s for turn in t.step_ns for s in turn] for t in traces], dtype=np.float64)


def total_blocks(traces: list[Trace]) -> np.ndarray:
    return np.array([[t.total_ns] for t in traces], dtype=np.float64)


def summarize(request: Request, traces: list[Trace]) -> Point:
    """The figures of one runner on one request (medians over rounds where it is one number)."""
    seconds = float(np.median(total_blocks(traces))) / 1e9
    per_sequence = request.new_tokens / seconds
    task = {}
    if request.kind == "task":
        task = {"time_per_task_s": seconds, "turns": [Turn(
            ttft_ms=float(np.median([t.ttft_ns[i] for t in traces])) / 1e6,
            tpot_ms=float(np.median([np.median(t.step_ns[i]) if t.step_ns[i] else 0
                                     for t in traces])) / 1e6) for i in range(len(request.turns))]}
    return Point(
        batch=request.batch,
        prompt_tokens=[int(p.shape[1]) for p, _ in request.turns],
        new_tokens=[n for _, n in request.turns],
        ttft_ms=_pct(ttft_blocks(traces)),
        tpot_ms=_pct(tpot_blocks(traces)),
        tokens_per_s=TokensPerSecond(per_sequence=per_sequence, aggregate=per_sequence * request.batch),
        time_s=seconds,
        # where the time went: prefill (every turn's) vs decode steps, medians over rounds
        phases_s=Phases(prefill=float(np.median([sum(t.ttft_ns) for t in traces])) / 1e9,
                        decode=float(np.median([sum(map(sum, t.step_ns)) for t in traces])) / 1e9),
        rounds=len(traces),
        **task,
    )


def tpot_vs_context(request: Request, traces: list[Trace], bins: int) -> list[ContextBin]:
    """TPOT p50 per context-length bin of a long generation (context = tokens in the cache)."""
    prompt = int(request.turns[0][0].shape[1])
    steps = tpot_blocks(traces)  # [rounds, steps]; step i runs with prompt + 1 + i tokens cached
    edges = np.linspace(0, steps.shape[1], bins + 1).astype(int)
    return [ContextBin(context=[prompt + 1 + int(lo), prompt + int(hi)],
                       tpot_ms_p50=float(np.median(steps[:, lo:hi])) / 1e6)
            for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo]


def speedups(base: list[Trace], engine: list[Trace], noise: float) -> PhaseSpeedups:
    """Engine vs baseline, per-round ratios (interleaved): TTFT, TPOT and the whole request."""
    def of(blocks):
        return Speedup(**stats.speedup(blocks(base), blocks(engine), noise=noise).dump())

    return PhaseSpeedups(ttft=of(ttft_blocks), tpot=of(tpot_blocks), total=of(total_blocks))


def agreement(reference: np.ndarray, tokens: np.ndarray) -> Agreement:
    """Share of identical greedy tokens [B, N] and the first position (any sequence) where
    they differ. After a divergence the contexts differ, so later tokens are not comparable
    one to one; the first divergence is the sharper figure."""
    same = reference == tokens
    differ = np.flatnonzero(~same.all(axis=0))
    return Agreement(share=float(same.mean()), tokens=int(same.size),
                     first_divergence=int(differ[0]) if differ.size else None)


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, itemsize: int = 4) -> int:
    """Bytes the KV cache grows by per token of context and sequence: key and value per layer."""
    return 2 * layers * kv_heads * head_dim * itemsize
