"""Sensitivity: the accuracy cost of quantizing each node alone, and auto-exclusion.

Each candidate node is quantized on its own (everything else stays float) and the graph
is compared with the FP32 graph on calibration feeds (never the validation feeds, which
judge the engine later). Nodes are ranked most harmful first. With `auto_exclude`, the
k most sensitive nodes stay in float for the smallest k at which the fully quantized rest
meets the budget; k is found by bisection (errors grow with the number of quantized
nodes, so the prefix test is monotone in practice), log2(n) quantizations instead of n.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipeline.precision import evaluate

Quantize = Callable[..., Path]
Score = Callable[[Path], dict]


def analyse(quantize: Quantize, candidates: list[str], excluded: list[str], score: Score,
            spec) -> dict:
    ranking = []
    for name in candidates:
        result = score(quantize(excluded, only=[name]))
        ranking.append({"node": name, "cosine": result["cosine"],
                        "top1_agreement": result["top1_agreement"]})
    # Most harmful first: lowest cosine, then lowest top-1 agreement.
    ranking.sort(key=lambda r: (r["cosine"], r["top1_agreement"] if r["top1_agreement"] is not None else 1.0))
    budget = spec.budget
    order = [r["node"] for r in ranking]

    trials: dict[int, dict] = {}

    def trial(k: int) -> dict:
        if k not in trials:
            trials[k] = score(quantize(excluded + order[:k]))
        return trials[k]

    full = trial(0)
    k = 0
    if spec.auto_exclude and not evaluate.meets(full, budget.cosine_min, budget.top1_min):
        lo, hi = 0, len(order)  # invariant: trial(lo) fails, trial(hi) meets (all float meets)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if evaluate.meets(trial(mid), budget.cosine_min, budget.top1_min):
                hi = mid
            else:
                lo = mid
        k = hi
    reached = trial(k)
    return {
        "measured_on": "calibration feeds, against the FP32 graph",
        "budget": budget.model_dump(),
        "ranking": ranking,
        "fully_quantized": full,
        "auto_excluded": order[:k],
        "reached": reached,
        "met": evaluate.meets(reached, budget.cosine_min, budget.top1_min),
        "trials": len(trials) + len(ranking),
    }
