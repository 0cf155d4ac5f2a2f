"""`pipeline load --tasks`: the recipe's multi-turn chat tasks against the real server
(`pipeline serve` of the tiny byte-level chat model, a Ray of its own per server) over real
HTTP, each `pipeline load` a real subprocess. A task's turns carry the growing conversation
(the server's own usage counts more prompt tokens at every turn), closed and open loop write
typed results that report.md shows, the capacity search ends with a bracket, and bad flags
give one line and exit 2. The tiny model ends every reply at once (an empty answer), as at
batch 1: its answers under load are compared with report.json's, reply for reply.

The arithmetic (early stopping's task count, the Wilson interval, TPOT's sample) is checked
without a server at the end."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from pipeline.artifacts.serving import LoadResult
from pipeline.generation.chat import Question
from pipeline.loadgen import early_stopping, slo, task_summary, tasks
from pipeline.loadgen.outcome import Outcome
from pipeline.loadgen.task_client import TaskOutcome
from pipeline.loadgen.tasks import Script
from tests.conftest import Project, shared_build

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="ray[serve] is not installed (the cpu/gpu extras install it)")


def _chat_build(tmp_path_factory) -> tuple[Project, str]:
    """A copy of the tiny chat model's build (the OpenAI API tests' one, built once a
    session): every --serve run records its cold start in the folder, so each gets its own."""
    from tests.serving.test_openai_api import BUILD

    project = shared_build(tmp_path_factory, "lm-gen-chat-openai", *BUILD)
    return project, project.built.name


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`pipeline serve` of the tiny chat model in its own process (its own Ray), for the
    --url tests of this module."""
    from pipeline.loadgen.server import ServeProcess

    project, name = _chat_build(tmp_path_factory)
    log = project.path / "serve.log"
    with ServeProcess(name, "chat", (), project.engines, None, log) as server:
        yield project, name, server.url


def _result(project: Project, name: str, file: str = "load-onnxruntime-tasks.json") -> LoadResult:
    return LoadResult.model_validate_json((project.engines / name / file).read_text())


@pytest.mark.slow
@needs_ray
def test_closed_loop_tasks_carry_the_growing_conversation(tmp_path_factory):
    project, name = _chat_build(tmp_path_factory)
    run = project.run("load", name, "--serve", "--tasks", "--concurrency", "2", "--duration", "3",
                      "--warmup", "0.5", "--timeout", "60", timeout=900)
    assert run.code == 0, run.err
    loaded = _result(project, name)
    assert loaded.points == [] and loaded.mode == "closed" and loaded.name == "tasks"
    point = loaded.tasks.points[0]
    assert point.concurrency == 2 and point.tasks_ok == point.tasks > 0, point.error_examples
    assert point.turns == point.turns_ok == 3 * point.tasks  # 3 turns a task, all answered
    # the server's usage: every turn's prompt holds more tokens than any earlier turn's
    turns = point.per_turn
    assert [t.turn for t in turns] == [1, 2, 3] and all(t.turns == point.tasks for t in turns)
    for before, after in zip(turns, turns[1:]):
        assert before.prompt_tokens_max < after.prompt_tokens_min
    # and said how many of them its prefix cache held (usage.prompt_tokens_details)
    assert all(t.cached_tokens_mean is not None and t.cached_tokens_mean <= t.prompt_tokens_mean
               for t in turns)
    assert point.time_per_task_ms["p50"].value > point.turn_timings.ttft_ms["p50"].value > 0
    # answers under load are the batch-1 answers, reply for reply
    answers = point.answers
    assert answers.of == point.turns_ok and answers.compared == answers.of
    assert answers.identical_to_batch1 == answers.of
    assert answers.batch1_share is not None and answers.share == answers.batch1_share
    report = (project.engines / name / "report.md").read_text()
    assert "chat tasks, closed" in report and "![tasks](load-onnxruntime-tasks.png)" in report
    verified = project.run("verify", str(project.engines / name))  # the server's record kept
    assert verified.code == 0, verified.out + verified.err


@pytest.mark.slow
@needs_ray
def test_open_loop_tasks_arrive_on_the_seeded_schedule(served):
    project, name, url = served
    run = project.run("load", name, "--url", url, "--tasks", "--rate", "10", "--min-tasks", "30",
                      "--duration", "1", "--warmup", "0.5", "--think-time", "0.01",
                      "--arrival", "gamma", "--burstiness", "2", "--name", "open", timeout=600)
    assert run.code == 0, run.err
    loaded = _result(project, name, "load-onnxruntime-open.json")
    point = loaded.tasks.points[0]
    assert loaded.mode == "rate" and point.offered_rate == 10 and point.concurrency is None
    assert point.tasks >= 30 and point.tasks_ok == point.tasks, point.error_examples
    assert point.think_time_s == 0.01 and point.warmup_tasks >= 1
    # a task's turns, each after the last one's answer and the think time, take longer
    # than its first turn alone
    assert point.time_per_task_ms["p50"].value > point.per_turn[0].ttft_ms["p50"].value + 20
    assert loaded.arrival.startswith("gamma") and point.passed is None


@pytest.mark.slow
@needs_ray
def test_task_loads_in_turns_compare_time_per_task(served):
    """`--tasks --versus`: two serving variants' task points measured in turns (here both
    names on the one server: the path, not a difference, is under test) and compared in
    tasks/s with the time per task's p99."""
    project, name, url = served
    run = project.run("load", name, "--url", url, "--tasks", "--name", "a", "--versus", f"{name}:b",
                      "--versus-url", url, "--sweep", "4,6", "--min-tasks", "6", "--duration", "1",
                      "--warmup", "0.3", "--timeout", "60", timeout=600)
    assert run.code == 0, run.err
    a = _result(project, name, "load-onnxruntime-a.json")
    b = _result(project, name, "load-onnxruntime-b.json")
    assert a.client["interleaved_with"] == f"{name}:b" and b.client["interleaved_with"] == f"{name}:a"
    for result in (a, b):
        assert [p.offered_rate for p in result.tasks.points] == [4, 6]
        assert all(p.tasks_ok == p.tasks >= 6 for p in result.tasks.points)
    compared = json.loads((project.engines / "compare" / f"{name}-a-vs-{name}-b" /
                           "compare-load.json").read_text())
    assert compared["unit"] == "tasks/s" and compared["figure"] == "time per task p99"
    assert compared["in_turns"] is True and [r["rate"] for r in compared["same_rate"]] == [4, 6]
    assert all(r["ratio"] > 0 for r in compared["same_rate"])


@pytest.mark.slow
@needs_ray
def test_distinct_tasks_share_no_prefix_beyond_the_system_prompt(served):
    """--distinct-tasks: every task's first question carries a tag of its own, kept through its
    later turns (the conversation carried), so no two tasks' conversations repeat."""
    from tests.loadgen_server import Behaviour, FakeServer

    project, name, _ = served
    with FakeServer(Behaviour(tokens=3), model=name.split("@")[0]) as fake:  # the recipe's name
        run = project.run("load", name, "--url", fake.url, "--tasks", "--distinct-tasks", "--rate",
                          "20", "--min-tasks", "8", "--duration", "0.5", "--warmup", "0",
                          "--name", "distinct", timeout=300)
        assert run.code == 0, run.err
        bodies = [json.loads(b) for b in fake.behaviour.bodies]
    firsts = [b["messages"][0]["content"] for b in bodies]
    tags = [first.split(" ", 1)[0] for first in firsts]
    assert all(t.startswith("[#") and t.endswith("]") for t in tags)
    opening = [b for b in bodies if len(b["messages"]) == 1]  # each task's first turn
    assert len({b["messages"][0]["content"] for b in opening}) == len(opening) >= 8
    assert len(set(tags)) == len(opening)  # later turns carry their task's tag, no new ones
    loaded = _result(project, name, "load-onnxruntime-distinct.json")
    assert loaded.client["distinct_tasks"] is True
    assert loaded.tasks.points[0].answers.compared is None  # not batch 1's questions


@pytest.mark.slow
@needs_ray
def test_task_capacity_search_ends_with_a_bracket(served):
    """Doubling from 8 tasks/s: a rate the tiny model holds at a 5 s TTFT, then one no
    2-core server (or client) keeps up with; one bisection (tolerance 100%) at most."""
    project, name, url = served
    run = project.run("load", name, "--url", url, "--tasks", "--slo", "ttft=5s", "--start-rate", "8",
                      "--tolerance", "1", "--max-points", "9", "--warmup", "0.5", "--duration", "1",
                      "--timeout", "10", "--name", "capacity", timeout=1800)
    assert run.code == 0, run.err
    loaded = _result(project, name, "load-onnxruntime-capacity.json")
    found = loaded.tasks.capacity
    assert found.capacity is not None and found.bracket[1] is not None, found.why
    assert found.bracket[0] == found.capacity < found.bracket[1]
    by_rate = {p.offered_rate: p for p in loaded.tasks.points}
    good, bad = by_rate[found.bracket[0]], by_rate[found.bracket[1]]
    assert good.passed and not bad.passed
    # early stopping passed on the TTFT of at least 459 turns (153 tasks of 3 turns)
    assert good.tasks >= 153 and good.slo[0].early_stopping and good.slo[0].metric == "ttft"
    assert loaded.tasks.min_tasks == 153
    assert f"capacity: {found.capacity} tasks/s (bracket" in run.err
    assert "Capacity at the SLO" in (project.engines / name / "report.md").read_text()


@pytest.mark.parametrize("args,says", [
    (("digits", "--serve", "--tasks", "--concurrency", "1"), "is a tensor model"),
    (("lm-gen", "--serve", "--tasks", "--concurrency", "1"), "has no chat workload"),
    (("no-tasks", "--serve", "--tasks", "--concurrency", "1"), "does not exist"),
    (("lm-gen", "--serve", "--tasks", "--soak", "--rate", "1"), "--soak with --tasks"),
    (("lm-gen", "--serve", "--tasks", "--api", "completions", "--rate", "1"), "tasks are chats"),
    (("lm-gen", "--serve", "--think-time", "1", "--rate", "1"), "--think-time needs --tasks"),
    (("smollm2-int4", "--serve", "--tasks", "--slo", "p99=1s"), "with --tasks, bound ttft"),
    (("lm-gen", "--serve", "--slo", "task=1s"), "needs --tasks"),
])
def test_bad_task_flags_say_one_line_and_exit_2(tmp_path, args, says):
    project = Project(tmp_path)
    project.write("recipes/no-tasks.yaml", "extends: lm-gen.yaml\nworkload:\n"
                  "  chat: {tokenizer: bytes, tasks: data/chat/missing.jsonl}\n")
    before = project.snapshot()
    run = project.run(*("load", *args), timeout=120)
    assert run.code == 2, run.out + run.err
    lines = [x for x in run.err.splitlines() if x.strip()]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in run.err, run.err
    assert project.snapshot() == before  # nothing written, no server started


# ------------------------------------------------------------------ arithmetic, no server
def test_a_point_needs_the_tasks_early_stopping_needs():
    least = early_stopping.min_requests()  # 459: none over the bound, p99 at 99%
    terms = slo.parse("ttft=1s,tpot=50ms", generation=True, tasks=True)
    assert tasks.min_tasks(terms, 3)[0] == math.ceil(least / 3) == 153
    with_task = slo.parse("ttft=1s,task=20s", generation=True, tasks=True)
    assert tasks.min_tasks(with_task, 3)[0] == least
    # 152 tasks (456 turns) with none over cannot pass; 153 (459) can
    assert not early_stopping.holds(152 * 3, 0) and early_stopping.holds(153 * 3, 0)


def test_the_wilson_interval_holds_the_share_and_matches_its_closed_form():
    lo, hi = task_summary.wilson(45, 100)
    assert lo < 0.45 < hi and (lo, hi) == pytest.approx((0.3561, 0.5475), abs=1e-4)
    assert task_summary.wilson(0, 459) == pytest.approx([0.0, 0.00829], abs=1e-4)


def _turn(due: float, chunks: list[float], tokens: int) -> Outcome:
    return Outcome(due=due, sent=due, done=(chunks or [due + 0.01])[-1], status="ok",
                   chunks=chunks, completion_tokens=tokens, ended=due + 0.01, text=["x"] if chunks else [])


def test_tpot_is_judged_on_the_turns_that_have_one_and_a_failed_turn_fails_its_task():
    q = Question(0, "Q?", ("x",))
    script = Script(0, (q, q))
    slow = TaskOutcome(script, 0.0, [_turn(0.0, [0.1, 0.3], 2), _turn(0.4, [], 0)])  # 200 ms TPOT
    failed = TaskOutcome(script, 1.0, [Outcome(due=1.0, sent=1.0, done=1.5, status="error",
                                               error="HTTP 500")])
    fine = [TaskOutcome(script, 2.0 + i, [_turn(2.0 + i, [2.1 + i, 2.11 + i], 2)] * 2)
            for i in range(3)]
    terms = slo.parse("ttft=1s,tpot=100ms", generation=True, tasks=True)
    point = task_summary.summarize([slow, failed, *fine], warmup=0.0, window=10.0,
                                   offered_rate=0.5, think=0.0, terms=terms)
    ttft, tpot = point.slo
    assert ttft.over == 1  # the failed turn; the empty reply's TTFT is its stream's end
    # TPOT's sample: the 7 turns with two tokens, plus the failed turn, over the bound
    assert tpot.over == 2 and tpot.more_needed > 0
    assert point.tasks == 5 and point.tasks_ok == 4 and point.goodput_share == pytest.approx(3 / 5)
    assert point.answers.right == point.answers.of - 1  # the empty reply is wrong
    assert np.isinf(task_summary.ttft_ms(failed.turns[0])) and point.passed is False


def test_turn_bodies_carry_the_conversation():
    import json

    from pipeline.loadgen.protocol import Target

    chat = [{"role": "user", "content": "A?"}, {"role": "assistant", "content": "a"},
            {"role": "user", "content": "B?"}]
    body = json.loads(tasks.turn_body(Target("http://h", "m", "chat"), chat, 7).data)
    assert body["messages"] == chat and body["max_tokens"] == 7 and body["temperature"] == 0
    assert body["stream"] and body["stream_options"] == {"include_usage": True}


def test_the_tasks_are_the_ones_the_batch1_score_asks():
    from pipeline.recipe.loader import load

    recipe = load(Path("recipes/smollm2-int4.yaml"))  # workload.chat.scripts: its first 6
    work = tasks.load(recipe)
    assert work.turns == (3, 3) and len(work.scripts) == recipe.workload.chat.scripts == 6
    assert [q.id for q in work.scripts[1].questions] == [1, 44, 87]  # data/chat/tasks.jsonl
    assert work.answer_tokens == recipe.workload.chat.answer_tokens
