"""Sensitivity: the accuracy cost of quantizing each node alone, and auto-exclusion.

Each candidate node is quantized on its own (everything else stays float) and the graph
is compared with the FP32 graph on calibration feeds (never the validation feeds, which
judge the engine later). Nodes are ranked most harmful first. With `auto_exclude`, the
k most sensitive nodes stay in float for the smallest k at which the fully quantized rest
meets the budget; k is found by bisection (errors grow with the number of quantized
nodes, so the prefix test is monotone in practice), log2(n) quantizations instead of n.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from pipeline.core.json_object import JsonObject
from pipeline.precision import evaluate
from pipeline.precision.evaluate import Parity

Quantize = Callable[..., Path]
Score = Callable[[Path], Parity]


@dataclass(frozen=True)
class SpeedCost:
    """What the nodes kept in float cost in time (rows: node, op, kept_ms,
    integer_ms_estimate, cost_ms), their total, the feed's shapes, how it was measured."""

    nodes: list[JsonObject]
    total_ms: float
    feed_shapes: dict[str, list[int]]
    method: str

    def dump(self) -> JsonObject:
        return {"nodes": self.nodes, "total_ms": self.total_ms, "feed_shapes": self.feed_shapes,
                "method": self.method}


@dataclass(frozen=True)
class SensitivityReport:
    """Each candidate quantized alone (ranking, most harmful first), the fully quantized graph,
    the nodes auto_exclude kept in float, what that reached and whether it meets the budget."""

    measured_on: str
    budget: JsonObject
    ranking: list[JsonObject]
    fully_quantized: Parity
    auto_excluded: list[str]
    reached: Parity
    met: bool
    trials: int
    speed_cost: SpeedCost | None = None

    def dump(self) -> JsonObject:
        out = {"measured_on": self.measured_on, "budget": self.budget, "ranking": self.ranking,
               "fully_quantized": self.fully_quantized.dump(), "auto_excluded": self.auto_excluded,
               "reached": self.reached.dump(), "met": self.met, "trials": self.trials}
        if self.speed_cost is not None:
            out["speed_cost"] = self.speed_cost.dump()
        return out

    def with_speed_cost(self, cost: SpeedCost) -> SensitivityReport:
        return replace(self, speed_cost=cost)


def analyse(quantize: Quantize, candidates: list[str], excluded: list[str], score: Score,
            spec) -> SensitivityReport:
    ranking = []
    for name in candidates:
        result = score(quantize(excluded, only=[name]))
        ranking.append({"node": name, "cosine": result.cosine,
                        "top1_agreement": result.top1_agreement})
    # Most harmful first: lowest cosine, then lowest top-1 agreement.
    ranking.sort(key=lambda r: (r["cosine"], r["top1_agreement"] if r["top1_agreement"] is not None else 1.0))
    budget = spec.budget
    order = [r["node"] for r in ranking]

    trials: dict[int, Parity] = {}

    def trial(k: int) -> Parity:
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
    return SensitivityReport(
        measured_on="calibration feeds, against the FP32 graph", budget=budget.model_dump(),
        ranking=ranking, fully_quantized=full, auto_excluded=order[:k], reached=reached,
        met=evaluate.meets(reached, budget.cosine_min, budget.top1_min),
        trials=len(trials) + len(ranking))


def speed_cost(typed: Path, feed: dict, kept: list[str], workdir: Path) -> SpeedCost:
    """What each node kept out of the integer kernels costs in time, from one profiled request
    of the typed graph as ONNX Runtime optimizes it: the node's kernel time as it runs (float,
    or MatMulNBits under `fallback: blockwise`), against the same FLOPs at the rate this very
    run achieved in its integer kernels (the node quantized would run at about that rate).
    Times in ms; a node ORT fused away has no entry."""
    import onnx
    import onnxruntime as ort

    from pipeline.precision import dynamic, effective

    convs = effective.conv_params(onnx.load(str(typed), load_external_data=False).graph)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.enable_profiling = True
    options.profile_file_prefix = str(workdir / "speed-cost-profile")
    session = ort.InferenceSession(str(typed), options, providers=["CPUExecutionProvider"])
    session.run(None, feed)
    session.run(None, feed)  # the second request: no first-run allocation in the kernel times
    profile = Path(session.end_profiling())
    events = [e for e in json.loads(profile.read_text()) if e.get("cat") == "Node"
              and e.get("name", "").endswith("_kernel_time")]
    profile.unlink()
    last = {e["name"].removesuffix("_kernel_time"): e for e in events}  # the second run's
    int_us = int_flops = 0.0
    for name, e in last.items():
        args = e.get("args") or {}
        if args.get("op_name") in effective.INTEGER:
            parts = effective.node_flops(args, convs.get(name))
            int_us += e["dur"]
            int_flops += sum(f for _, f in parts)
    rate = int_flops / int_us if int_us else None  # FLOPs per microsecond, integer kernels
    rows, total = [], 0.0
    for node in kept:
        e = last.get(node) or last.get(node + dynamic.BLOCKWISE_SUFFIX)  # `fallback: blockwise`
        if e is None:
            rows.append({"node": node, "kept_ms": None, "integer_ms_estimate": None, "cost_ms": None})
            continue
        flops = sum(f for _, f in effective.node_flops(e.get("args") or {}, convs.get(node)))
        kept_ms = e["dur"] / 1e3
        int_ms = flops / rate / 1e3 if rate else None
        cost = kept_ms - int_ms if int_ms is not None else None
        total += cost or 0.0
        rows.append({"node": node, "op": (e.get("args") or {}).get("op_name"),
                     "kept_ms": round(kept_ms, 4),
                     "integer_ms_estimate": None if int_ms is None else round(int_ms, 4),
                     "cost_ms": None if cost is None else round(cost, 4)})
    return SpeedCost(nodes=rows, total_ms=round(total, 4),
                     feed_shapes={k: list(v.shape) for k, v in feed.items()},
                     method="one profiled request (ORT's optimization, the second of two): each "
                            "kept node's kernel time minus its FLOPs at this run's integer-kernel rate")
