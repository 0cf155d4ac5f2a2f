"""One task load point summarized (artifacts.serving.TaskPoint): time per task, per-turn
token timings, goodput in tasks/s, the SLO verdicts, and the answers graded.

The measured tasks are those due in [warmup, warmup + window). Their turns are pooled for
the token timings: TTFT from each turn's due time to its first text (a reply that ended at
once: to its stream's end, the first token generated being the end of sequence), TPOT as
summary.tpot_ms (turns of fewer than two tokens have none), ITL every gap between chunks.
Each SLO term is judged as summary.judge judges it (the sample p99 within the bound and
MLPerf's early-stopping rule) on its own sample: TTFT over the turns sent, TPOT over the
turns with a TPOT (failed ones over every bound), time per task over the tasks. A failed
turn fails its task; a failed task is infinitely late.

The achieved rate is completed tasks over the window, the window stretched by any backlog:
to the last task's end less the fastest task's own time (a stable server ends its last task
about one task time after the window; an overloaded one ends it much later).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from pipeline.artifacts.serving import (
    Late,
    SloVerdict,
    TaskAnswers,
    TaskPoint,
    TaskTurn,
    TokenTimings,
)
from pipeline.loadgen import summary
from pipeline.loadgen.outcome import Outcome
from pipeline.loadgen.slo import Term
from pipeline.loadgen.task_client import TaskOutcome

Batch1 = dict[int, tuple[str, bool]]  # question id -> the engine's batch-1 (reply, right)


def ttft_ms(o: Outcome) -> float:
    if o.status != "ok":
        return np.inf
    first = o.chunks[0] if o.chunks else o.ended
    return (first - o.due) * 1e3


def _timings(turns: list[Outcome], span: float) -> TokenTimings:
    ok = [o for o in turns if o.status == "ok"]
    tpot = np.asarray([summary.tpot_ms(o) if o.status == "ok" else np.inf for o in turns])
    itl = [g * 1e3 for o in ok for g in np.diff(o.chunks)]
    tokens = [o.tokens for o in ok]
    return TokenTimings(
        ttft_ms=summary.percentiles([ttft_ms(o) for o in turns]),
        tpot_ms=summary.percentiles(tpot[~np.isnan(tpot)]), itl_ms=summary.percentiles(itl),
        e2e_ms=summary.percentiles([o.latency * 1e3 for o in turns]),
        tokens_per_s=float(sum(tokens)) / span if span else 0.0,
        mean_tokens=float(np.mean(tokens)) if tokens else 0.0)


def _per_turn(tasks: list[TaskOutcome]) -> list[TaskTurn]:
    most = max((len(t.turns) for t in tasks), default=0)
    out = []
    for k in range(most):
        turns = [t.turns[k] for t in tasks if len(t.turns) > k]
        prompts = [o.prompt_tokens for o in turns if o.prompt_tokens is not None]
        cached = [o.cached_tokens for o in turns if o.cached_tokens is not None]
        out.append(TaskTurn(turn=k + 1, turns=len(turns),
                            cached_tokens_mean=float(np.mean(cached)) if cached else None,
                            prompt_tokens_mean=float(np.mean(prompts)) if prompts else None,
                            prompt_tokens_min=min(prompts) if prompts else None,
                            prompt_tokens_max=max(prompts) if prompts else None,
                            ttft_ms=summary.percentiles([ttft_ms(o) for o in turns])))
    return out


def wilson(right: int, of: int, z: float = 1.96) -> list[float]:
    """The Wilson score interval of a share (95% by default); [0, 1] with nothing asked."""
    if of == 0:
        return [0.0, 1.0]
    p = right / of
    centre = (p + z * z / (2 * of)) / (1 + z * z / of)
    half = z * np.sqrt(p * (1 - p) / of + z * z / (4 * of * of)) / (1 + z * z / of)
    return [float(max(0.0, centre - half)), float(min(1.0, centre + half))]


def answers(tasks: list[TaskOutcome], batch1: Batch1 | None) -> TaskAnswers:
    """Every answered turn's reply graded (generation.chat.correct), and against the engine's
    batch-1 answers to the same questions."""
    from pipeline.generation.chat import correct

    graded = [(q, o.reply.strip()) for t in tasks for q, o in zip(t.script.questions, t.turns)
              if o.status == "ok"]
    right = sum(correct(reply, q.answers) for q, reply in graded)
    asked = {q.id for q, _ in graded}
    known = {i: batch1[i] for i in asked if batch1 and i in batch1}
    compared = [(q, reply) for q, reply in graded if q.id in known]
    return TaskAnswers(
        right=right, of=len(graded), share=right / len(graded) if graded else 0.0,
        ci95=wilson(right, len(graded)), questions=len(asked),
        batch1_share=float(np.mean([ok for _, ok in known.values()])) if known else None,
        batch1_questions=len(known) if batch1 is not None else None,
        identical_to_batch1=sum(reply == known[q.id][0] for q, reply in compared)
        if batch1 is not None else None,
        compared=len(compared) if batch1 is not None else None)


def judge(terms: tuple[Term, ...], tasks: list[TaskOutcome], turns: list[Outcome]) -> list[SloVerdict]:
    samples = {"ttft": np.asarray([ttft_ms(o) for o in turns]),
               "task": np.asarray([t.seconds * 1e3 for t in tasks])}
    tpot = np.asarray([summary.tpot_ms(o) if o.status == "ok" else np.inf for o in turns])
    samples["tpot"] = tpot[~np.isnan(tpot)]  # a turn of < 2 tokens has no TPOT to exceed
    return [v for t in terms for v in summary.judge((t,), {t.metric: samples[t.metric]},
                                                     samples[t.metric].size)]


def _within(terms: tuple[Term, ...], task: TaskOutcome) -> bool:
    """Did every turn of this task (and the task) meet every bound?"""
    if not task.ok:
        return False
    for t in terms:
        if t.metric == "task" and task.seconds * 1e3 > t.bound_ms:
            return False
        if t.metric == "ttft" and any(ttft_ms(o) > t.bound_ms for o in task.turns):
            return False
        if t.metric == "tpot" and any(summary.tpot_ms(o) > t.bound_ms for o in task.turns):
            return False  # NaN (under two tokens) compares False: no TPOT, within
    return True


def summarize(outcomes: list[TaskOutcome], *, warmup: float, window: float, offered_rate: float,
              think: float, terms: tuple[Term, ...] = (), batch1: Batch1 | None = None) -> TaskPoint:
    tasks = [t for t in outcomes if warmup <= t.due < warmup + window]
    turns = [o for t in tasks for o in t.turns]
    ok_tasks = [t for t in tasks if t.ok]
    fastest = min((t.seconds for t in ok_tasks), default=0.0)
    ends = [t.done for t in tasks if np.isfinite(t.done)]
    span = max(window, (max(ends) - warmup - fastest) if ends else window)
    statuses = Counter(o.status for o in turns)
    late_ms = np.asarray([(t.turns[0].sent - t.due) * 1e3 for t in tasks if t.turns])
    good = sum(_within(terms, t) for t in tasks)
    n = len(tasks)
    point = TaskPoint(
        offered_rate=offered_rate, scheduled_rate=n / window if window else 0.0,
        achieved_rate=len(ok_tasks) / span if n else 0.0, goodput=good / span if n else 0.0,
        goodput_share=good / n if n else 0.0, think_time_s=think, tasks=n, tasks_ok=len(ok_tasks),
        warmup_tasks=sum(t.due < warmup for t in outcomes), window_s=window,
        turns=len(turns), turns_ok=statuses["ok"], rejected=statuses["rejected"],
        errors=statuses["error"], timeouts=statuses["timeout"],
        error_examples=sorted({o.error for o in turns if o.error})[:3],
        time_per_task_ms=summary.percentiles([t.seconds * 1e3 for t in tasks]),
        turn_timings=_timings(turns, span), per_turn=_per_turn(tasks),
        answers=answers(tasks, batch1),
        late=Late(share=float(np.mean(late_ms > summary.LATE_MS)) if late_ms.size else 0.0,
                  p99_ms=float(np.percentile(late_ms, 99)) if late_ms.size else 0.0,
                  max_ms=float(late_ms.max()) if late_ms.size else 0.0),
        slo=judge(terms, tasks, turns), passed=None)
    return point.model_copy(update={"passed": passed(point) if terms else None})


def passed(point: TaskPoint) -> bool:
    """The capacity criterion, as summary.passed for requests: every SLO term holds, the
    completed task rate within 2% of the scheduled one, under 0.1% of the tasks failed."""
    n = point.tasks
    return (all(v.passed for v in point.slo)
            and point.achieved_rate >= (1 - summary.RATE_SHORTFALL) * point.scheduled_rate
            and n > 0 and (n - point.tasks_ok) / n < summary.ERRORS_MAX)
