"""What `pipeline load --tasks` does: the recipe's multi-turn chat tasks (tasks.py) sent to
the served model (open loop at --rate tasks/s, closed loop at --concurrency task-users, a
--sweep, or the capacity search at --slo ttft=...,tpot=...[,task=...]), the result written
as load-<engine>-<name>.json (name `tasks` unless --name says otherwise, so a single-request
load result of the same engine stays) with a LoadResult whose `tasks` holds the points."""

from __future__ import annotations

import tempfile
from pathlib import Path

from pipeline.artifacts.serving import Capacity, LoadResult, TaskPoint
from pipeline.core.errors import StageFailed
from pipeline.loadgen.command import (
    Request,
    check_engine,
    client_info,
    mode_of,
    print_outcome,
    reach,
)

DEFAULT_NAME = "tasks"


def run(req: Request) -> None:
    from pipeline.core import deps
    from pipeline.core.ui import console
    from pipeline.loadgen import artifact, schedule, slo, tasks
    from pipeline.loadgen.loadtest import Settings
    from pipeline.loadgen.task_client import Pace
    from pipeline.loadgen.task_loadtest import TaskLoadTest
    from pipeline.store import folder_names as folders
    from pipeline.store.recipe_folder import Store, now

    mode = mode_of(req)
    recipe = folders.load(req.recipe, (), req.engines_dir)
    work = tasks.load(recipe)  # InputError, before any server starts, when it has no tasks
    terms = slo.parse(req.slo, generation=True, tasks=True)
    check_engine(req, recipe)
    folder = folders.folder_name(recipe)
    least, why = (req.min_tasks, "--min-tasks") if req.min_tasks else \
        tasks.min_tasks(terms, work.turns[0])
    settings = Settings(arrival=req.arrival, burstiness=req.burstiness, duration=req.duration,
                        warmup=req.warmup, min_requests=least, timeout=req.timeout,
                        seed=req.seed, terms=terms, generation=True)
    logs = Path(tempfile.mkdtemp(prefix="pipeline-load-"))
    with reach(req, recipe, "chat", logs) as got:
        console.print(f"load: {got.headline()}; {len(work.scripts)} tasks of {work.turns[0]}-"
                      f"{work.turns[1]} turns from {work.source}; at least {least} tasks a point "
                      f"({why})")
        test = TaskLoadTest(got.target, work.scripts, settings,
                            Pace(work.answer_tokens, req.think_time, req.timeout), got.pid,
                            batch1=batch1_answers(Store(req.engines_dir, folder), got.engine),
                            on_point=lambda p: console.print(line(p)))
        points, found = _measure(test, mode, req)
    _refuse_all_failed(points)
    name = req.name or DEFAULT_NAME
    result = LoadResult.model_validate({
        "points": [], "schema": 1, "recipe": folder, "engine": got.engine, "name": name,
        "created": now(), "url": got.target.endpoint, "mode": mode,
        "arrival": schedule.describe(req.arrival, req.burstiness), "burstiness": req.burstiness,
        "seed": req.seed, "slo": slo.text(terms) or None, "device": deps.device(),
        "requests": {"source": work.source, "requests": len(work.scripts),
                     "protocol": "OpenAI /v1/chat/completions, streamed, greedy; multi-turn tasks"},
        "client": {**client_info(req), "min_tasks": least, "think_time_s": req.think_time},
        "server": got.record(req, "OpenAI /v1/chat/completions", test.metrics_why),
        "tasks": {"source": work.source, "scripts": len(work.scripts),
                  "turns_per_task": list(work.turns), "answer_tokens": work.answer_tokens,
                  "min_tasks": least, "min_tasks_why": why, "points": points,
                  **({"capacity": found} if found else {})},
    })
    from pipeline import workloads
    from pipeline.loadgen import plots

    png = plots.tasks_png(logs / "plot.png", points, f"{folder} ({got.engine}): tasks, {mode}")
    # a Store read now: the server's own record at its stop (serve-start-*.json) is in it
    path = artifact.write(result, png, Store(req.engines_dir, folder), workloads.of(recipe))
    if found:
        console.print(f"capacity: {found.capacity} tasks/s (bracket {found.bracket}; {found.why})")
    print_outcome(result, path)


def _measure(test, mode: str, req: Request) -> tuple[list[TaskPoint], Capacity | None]:
    if mode == "closed":
        return [test.closed(req.concurrency)], None
    if mode == "rate":
        return [test.point(req.rate)], None
    if mode == "sweep":
        return test.sweep(req.sweep), None
    found, points = test.capacity(req.start_rate or test.probe_rate(), req.max_points,
                                  req.tolerance)
    return points, found


def batch1_answers(store, engine: str) -> dict[int, tuple[str, bool]] | None:
    """The engine's own batch-1 answers from report.json's task score (question id ->
    (reply, right)), or None when the folder has no report or the report has none."""
    if "report.json" not in store.file_names():
        return None
    report = store.read_json("report.json")
    entry = next((e for e in report.get("engines", []) if e.get("target") == engine), None)
    score = ((entry or {}).get("generation") or {}).get("score") or {}
    answers = score.get("answers")
    if not answers:
        return None
    return {a["id"]: (a["reply"].strip(), bool(a["correct"])) for a in answers}


def _refuse_all_failed(points: list[TaskPoint]) -> None:
    """StageFailed (exit 4) when no measured task of any point completed: nothing written."""
    if any(p.tasks_ok for p in points):
        return
    examples = sorted({e for p in points for e in p.error_examples})[:2]
    raise StageFailed(f"every one of the {sum(p.tasks for p in points)} measured tasks failed "
                      f"({'; '.join(examples)[:300] or 'no turn was answered'}); nothing written",
                      "check the server's log, the URL and --model")


def line(p: TaskPoint) -> str:
    """One point as `pipeline load` prints it."""
    q = lambda x: "—" if x.value is None else f"{x.value / 1e3:.2f}"  # noqa: E731
    ms = lambda x: "—" if x.value is None else f"{x.value:.0f}"  # noqa: E731
    who = f"{p.concurrency} task-users" if p.concurrency else f"{p.offered_rate:.3g} tasks/s offered"
    verdict = "" if p.passed is None else ("  pass" if p.passed else "  FAIL")
    t = p.turn_timings
    return (f"  {who}: {p.tasks} tasks ({p.tasks - p.tasks_ok} failed), completed "
            f"{p.achieved_rate:.3g}/s, goodput {p.goodput:.3g}/s ({p.goodput_share:.0%}); time per "
            f"task p50 {q(p.time_per_task_ms['p50'])} s, p99 {q(p.time_per_task_ms['p99'])} s; "
            f"turn TTFT p99 {ms(t.ttft_ms['p99'])} ms, TPOT p99 {ms(t.tpot_ms['p99'])} ms; "
            f"answers right {p.answers.right}/{p.answers.of}{verdict}")
