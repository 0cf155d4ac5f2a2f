"""The recipe's `expect:` gates, judged from measured results (never by measuring again).

Each gate is a Gate (name, passed, detail); the detail is the evidence a failure prints:
the measured figure, its interval and the threshold. They are appended to the engine's
accuracy gates, so `run.execute.check_gates` exits 3 on any of them.
"""

from __future__ import annotations

from pipeline.artifacts import EngineResult, Gate
from pipeline.artifacts.generation import EngineScore
from pipeline.artifacts.report import TaskMetric
from pipeline.core.text import speedup, time_ratio_speedup
from pipeline.recipe import Recipe


def _gate(name: str, passed: bool, detail: str) -> Gate:
    return Gate(name=name, passed=bool(passed), detail=detail)


def expect(recipe: Recipe, engine: EngineResult) -> list[Gate]:
    """The expect: gates of one built engine (its validate result, plus `versus` A/Bs)."""
    want = recipe.expect
    out = []
    if want.min_speedup is not None:
        s = engine.speedup_vs_baseline
        lo, hi = s.ci95
        out.append(_gate(
            "expect.min_speedup", lo >= want.min_speedup,
            f"vs torch {speedup(s.ratio, s.ci95)} (95% CI) over {s.blocks} block pairs; "
            f"needs the whole speed-up interval >= {want.min_speedup:g}x"))
    if want.max_p99_ms is not None:
        lat = engine.latency_ms
        out.append(_gate(
            "expect.max_p99_ms", lat.p99 <= want.max_p99_ms,
            f"p99 {lat.p99:.3f} ms (p50 {lat.p50:.3f}, n={lat.n}); needs <= {want.max_p99_ms:g} ms"))
    if want.max_accuracy_loss is not None:
        for name in recipe.top1_outputs():
            measured = engine.accuracy.get(name)
            agree = measured.top1_agreement if measured is not None else None
            loss = None if agree is None else 1 - agree
            out.append(_gate(
                f"expect.max_accuracy_loss.{name}",
                loss is not None and loss <= want.max_accuracy_loss,
                f"top-1 disagreement with PyTorch {'—' if loss is None else f'{loss:.4f}'}; "
                f"needs <= {want.max_accuracy_loss:g}"))
    if want.max_task_loss is not None:
        out.append(task_gate(recipe, engine.task))
    score = engine.generation.score if engine.generation is not None else None
    out += score_gates(recipe, score)
    versus = {v.other: v for v in engine.versus}
    for ref in want.faster_than:
        v = versus.get(ref)
        if v is None:
            out.append(_gate(f"expect.faster_than.{ref}", False, "not measured"))
        elif v.reason:
            out.append(_gate(f"expect.faster_than.{ref}", False, v.reason))
        else:
            c = v.comparison
            out.append(_gate(
                f"expect.faster_than.{ref}", c.verdict == "faster",
                f"vs {ref}'s {v.target}: {time_ratio_speedup(c.time_ratio, c.ci95)} (95% CI; "
                f"{c.verdict}; p50 {v.this_ms.p50:.3f} vs {v.other_ms.p50:.3f} ms, "
                f"interleaved, {c.blocks} block pairs); needs the whole interval faster than "
                f"1 + noise threshold {c.noise_threshold:g}"))
    return out


def score_gates(recipe: Recipe, score: EngineScore | None) -> list[Gate]:
    """expect.max_answer_accuracy_loss / max_perplexity_ratio on a generation engine's task
    score (pipeline/generation/score.py): a variant that answers worse fails like a slow one."""
    want, out = recipe.expect, []
    if want.max_answer_accuracy_loss is not None:
        a = score.answer_accuracy if score is not None else None
        if a is None:
            out.append(_gate("expect.max_answer_accuracy_loss", False, "no answers were scored"))
        else:
            lo, hi = a.ci95
            out.append(_gate(
                "expect.max_answer_accuracy_loss", -a.delta <= want.max_answer_accuracy_loss,
                f"answered right: PyTorch {a.baseline_correct}/{a.questions}, engine "
                f"{a.correct}/{a.questions} (delta {a.delta:+.3f}, 95% CI [{lo:+.3f}, {hi:+.3f}]); "
                f"loss needs <= {want.max_answer_accuracy_loss:g}"))
    if want.max_perplexity_ratio is not None:
        p = score.perplexity if score is not None else None
        if p is None:
            out.append(_gate("expect.max_perplexity_ratio", False, "no perplexity was measured"))
        else:
            lo, hi = p.ratio_ci95
            out.append(_gate(
                "expect.max_perplexity_ratio", p.ratio <= want.max_perplexity_ratio,
                f"perplexity PyTorch {p.baseline:.3f}, engine {p.engine:.3f} on {p.tokens} "
                f"held-out tokens: ratio {p.ratio:.4f} (95% CI [{lo:.4f}, {hi:.4f}]); needs <= "
                f"{want.max_perplexity_ratio:g}"))
    return out


def task_gate(recipe: Recipe, task: TaskMetric | None) -> Gate:
    """expect.max_task_loss on the engine's task metric (validate.task), point estimate
    against the bound; relative bounds are shares of the PyTorch baseline's figure."""
    from pipeline.metrics.task import loss
    from pipeline.recipe.schema import parse_task_loss

    bound, relative = parse_task_loss(recipe.expect.max_task_loss)
    if not task:
        return _gate("expect.max_task_loss", False, "no task metric was measured")
    lost = loss(task)
    allowed = bound * abs(task.baseline) if relative else bound
    lo, hi = task.ci95
    return _gate(
        "expect.max_task_loss", lost <= allowed,
        f"{task.metric} PyTorch {task.baseline:.4f}, engine {task.engine:.4f}, delta "
        f"{task.delta:+.4f} (95% CI [{lo:+.4f}, {hi:+.4f}]); loss {lost:.4f} needs <= "
        f"{allowed:.4f}" + (f" ({bound:.2%} of the baseline)" if relative else ""))
