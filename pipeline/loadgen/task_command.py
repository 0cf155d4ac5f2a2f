"""What `pipeline load --tasks` does: the recipe's multi-turn chat tasks (tasks.py) sent to
the served model (open loop at --rate tasks/s, closed loop at --concurrency task-users, a
--sweep, or the capacity search at --slo ttft=...,tpot=...[,task=...]), the result written
as load-<engine>-<name>.json (name `tasks` unless --name says otherwise, so a single-request
load result of the same engine stays) with a LoadResult whose `tasks` holds the points."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pipeline.artifacts.serving import LoadResult, TaskPoint
from pipeline.core.errors import StageFailed
from pipeline.loadgen.command import (
    Reached,
    Request,
    check_engine,
    client_info,
    mode_of,
    plan,
    print_outcome,
    reach,
)

DEFAULT_NAME = "tasks"


def run(req: Request) -> None:
    from pipeline.loadgen import turns

    side = TaskRun.prepare(req)
    logs = Path(tempfile.mkdtemp(prefix="pipeline-load-"))
    with reach(req, side.recipe, "chat", logs) as got:
        side.start(got)
        measured = turns.alone(side.plan())
    side.write(measured, got, logs)


@dataclass
class TaskRun:
    """One recipe's load run of chat tasks: as command.RequestRun, for --tasks."""

    req: Request
    mode: str
    recipe: object
    folder: str
    work: object        # tasks.Tasks
    least: int          # measured tasks per point
    least_why: str
    settings: object    # loadtest.Settings
    label: str = ""
    api: str = "chat"
    test: object = None
    default_name: ClassVar[str | None] = DEFAULT_NAME  # the result's name without --name

    @classmethod
    def prepare(cls, req: Request, label: str = "") -> TaskRun:
        from pipeline.loadgen import slo, tasks
        from pipeline.loadgen.loadtest import Settings
        from pipeline.store import folder_names as folders

        mode = mode_of(req)
        recipe = folders.load(req.recipe, (), req.engines_dir)
        work = tasks.load(recipe)  # InputError, before any server starts, when it has no tasks
        terms = slo.parse(req.slo, generation=True, tasks=True)
        check_engine(req, recipe)
        least, why = (req.min_tasks, "--min-tasks") if req.min_tasks else \
            tasks.min_tasks(terms, work.turns[0])
        settings = Settings(arrival=req.arrival, burstiness=req.burstiness, duration=req.duration,
                            warmup=req.warmup, min_requests=least, timeout=req.timeout,
                            seed=req.seed, terms=terms, generation=True)
        return cls(req, mode, recipe, folders.folder_name(recipe), work, least, why, settings, label)

    def start(self, got: Reached) -> None:
        from pipeline.core.ui import console
        from pipeline.loadgen.task_client import Pace
        from pipeline.loadgen.task_loadtest import TaskLoadTest
        from pipeline.store.recipe_folder import Store

        work, req = self.work, self.req
        console.print(f"load{self.label}: {got.headline()}; {len(work.scripts)} tasks of "
                      f"{work.turns[0]}-{work.turns[1]} turns from {work.source}; at least "
                      f"{self.least} tasks a point ({self.least_why})")
        # distinct tasks' first questions carry a tag: their replies are not batch 1's to compare
        batch1 = None if req.distinct_tasks else batch1_answers(Store(req.engines_dir, self.folder),
                                                                got.engine)
        self.test = TaskLoadTest(got.target, work.scripts, self.settings,
                                 Pace(work.answer_tokens, req.think_time, req.timeout,
                                      req.distinct_tasks), got.pid, batch1=batch1,
                                 on_point=lambda p: console.print(self.label + line(p)))

    def plan(self):
        return plan(self.test, self.mode, self.req)

    def write(self, measured, got: Reached, logs: Path, interleaved_with: str | None = None) -> Path:
        from pipeline import workloads
        from pipeline.core import deps
        from pipeline.core.ui import console
        from pipeline.loadgen import artifact, plots, schedule, slo
        from pipeline.store.recipe_folder import Store, now

        req, work, terms = self.req, self.work, self.settings.terms
        points, found = measured.points, measured.capacity
        _refuse_all_failed(points)
        result = LoadResult.model_validate({
            "points": [], "schema": 1, "recipe": self.folder, "engine": got.engine,
            "name": req.name or DEFAULT_NAME, "created": now(), "url": got.target.endpoint,
            "mode": self.mode, "arrival": schedule.describe(req.arrival, req.burstiness),
            "burstiness": req.burstiness, "seed": req.seed, "slo": slo.text(terms) or None,
            "device": deps.device(),
            "requests": {"source": work.source, "requests": len(work.scripts),
                         "protocol": "OpenAI /v1/chat/completions, streamed, greedy; multi-turn tasks"},
            "client": {**client_info(req, interleaved_with), "min_tasks": self.least,
                       "think_time_s": req.think_time, "distinct_tasks": req.distinct_tasks},
            "server": got.record(req, "OpenAI /v1/chat/completions", self.test.metrics_why),
            "tasks": {"source": work.source, "scripts": len(work.scripts),
                      "turns_per_task": list(work.turns), "answer_tokens": work.answer_tokens,
                      "min_tasks": self.least, "min_tasks_why": self.least_why, "points": points,
                      **({"capacity": found} if found else {})},
        })
        png = plots.tasks_png(logs / "plot.png", points,
                              f"{self.folder} ({got.engine}): tasks, {self.mode}")
        # a Store read now: the server's own record at its stop (serve-start-*.json) is in it
        path = artifact.write(result, png, Store(req.engines_dir, self.folder), workloads.of(self.recipe))
        if found:
            console.print(f"capacity{self.label}: {found.capacity} tasks/s (bracket {found.bracket}; "
                          f"{found.why})")
        print_outcome(result, path)
        return path


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
