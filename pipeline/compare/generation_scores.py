"""The task score side of `pipeline compare` for generation recipes (workload.chat).

Each recipe's report holds, per engine, which questions it answered right and its
perplexity, and the PyTorch baseline's own figures. Recipes that asked the same questions
are compared question by question: B's accuracy minus A's with a paired-bootstrap
interval, and a verdict (worse / better when the interval excludes 0, else
indistinguishable), next to each engine's agreement with its own PyTorch baseline.
"""

from __future__ import annotations

import numpy as np

from pipeline.core.json_object import JsonObject
from pipeline.metrics import task as task_metrics


def _verdict(lo: float, hi: float, higher_is_better: bool) -> str:
    if lo > 0:
        return "better" if higher_is_better else "worse"
    if hi < 0:
        return "worse" if higher_is_better else "better"
    return "indistinguishable"


def scores(names: list[str], reports: dict[str, JsonObject], targets: list[str]) -> JsonObject:
    """compare-generation.json's `scores` (JSON built from the reports' JSON): {"recipes":
    {recipe: {"baseline": {...}, target: {...}}}, "versus": [B-vs-A answer verdicts]}."""
    table, correct = {}, {}
    for name in names:
        report = reports[name]
        base = ((report.get("baseline") or {}).get("generation") or {}).get("score")
        row = {"baseline": {k: base[k] for k in ("answer_accuracy", "answer_accuracy_ci95", "correct",
                                                 "questions", "perplexity")} if base else None}
        for e in report["engines"]:
            s = (e.get("generation") or {}).get("score")
            if e["target"] not in targets or not s:
                continue
            a, p = s["answer_accuracy"], s["perplexity"]
            row[e["target"]] = {"answer_accuracy": a["engine"], "answer_accuracy_ci95": a["engine_ci95"],
                                "correct": a["correct"], "questions": a["questions"],
                                "perplexity": p["engine"], "perplexity_ratio_vs_pytorch": p["ratio"],
                                "identical_to_pytorch": s["identical_answers"]["share"],
                                "tpot_ms_p50": e["generation"]["tpot_ms"]["p50"],
                                "time_per_task_s": e["generation"]["time_per_task_s"]}
            correct[(name, e["target"])] = {r["id"]: r["correct"] for r in s.get("answers") or []}
        table[name] = row
    versus = []
    first = names[0]
    for other in names[1:]:
        for tid in targets:
            a, b = correct.get((first, tid)), correct.get((other, tid))
            if not a or not b or set(a) != set(b):
                continue  # not scored, or on other questions: no paired comparison
            ids = sorted(a)
            va, vb = (np.array([d[i] for i in ids], float) for d in (a, b))
            lo, hi = task_metrics.paired_bootstrap(
                lambda idx, va=va, vb=vb: (va[idx].mean(), vb[idx].mean()), len(ids))
            versus.append({"a": f"{first}/{tid}", "b": f"{other}/{tid}", "questions": len(ids),
                           "accuracy_a": float(va.mean()), "accuracy_b": float(vb.mean()),
                           "delta": float(vb.mean() - va.mean()), "ci95": [lo, hi],
                           "verdict": _verdict(lo, hi, higher_is_better=True)})
    return {"recipes": table, "versus": versus}


def lines(result: dict) -> list[str]:
    """One verdict line per pair: answer accuracy, B minus A."""
    return [f"{v['b']} vs {v['a']}: answers right {v['accuracy_b']:.1%} vs {v['accuracy_a']:.1%} "
            f"({v['questions']} questions), delta {v['delta']:+.1%} (95% CI {v['ci95'][0]:+.1%} to "
            f"{v['ci95'][1]:+.1%}, {v['verdict']})" for v in (result.get("versus") or [])]


def markdown(result: dict) -> list[str]:
    if not result or not result.get("recipes"):
        return []
    md = ["", "## Task score (each recipe's report; PyTorch = that recipe's own baseline)", "",
          "| recipe | runner | answers right [95% CI] | perplexity | x PyTorch | answers identical "
          "to PyTorch | TPOT p50 ms | time per task s |", "|---|---|---|---|---|---|---|---|"]
    for name, row in result["recipes"].items():
        for runner, s in row.items():
            if not s:
                continue
            lo, hi = s["answer_accuracy_ci95"]
            md.append(f"| {name} | {'PyTorch' if runner == 'baseline' else runner} | {s['correct']}/"
                      f"{s['questions']} = {s['answer_accuracy']:.1%} [{lo:.1%}, {hi:.1%}] | "
                      f"{s['perplexity']:.3f} | {s.get('perplexity_ratio_vs_pytorch', 1.0):.4f} | "
                      f"{_share(s.get('identical_to_pytorch'))} | {_num(s.get('tpot_ms_p50'))} | "
                      f"{_num(s.get('time_per_task_s'))} |")
    return md + [""] + [f"- {line}" for line in lines(result)]


def _share(x) -> str:
    return "—" if x is None else f"{x:.0%}"


def _num(x) -> str:
    return "—" if x is None else f"{x:.2f}"
