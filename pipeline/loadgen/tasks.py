"""The load of `pipeline load --tasks`: the recipe's multi-turn chat scripts, the same ones
generation's task score asks at batch 1 (`workload.chat.tasks`: each script lists question
ids of `workload.chat.questions`; data/chat/README.md), and each turn's OpenAI chat body.

A turn's body carries the conversation so far: every earlier question as a user message and
the server's reply to it as an assistant message, then the new question, as the batch-1
score builds it (generation/score.py answer). Greedy, `max_tokens` the workload's
answer_tokens, streamed with the usage (its prompt_tokens show the server saw it all).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from pipeline.core.errors import InputError
from pipeline.core.json_object import JsonObject
from pipeline.generation.chat import Question
from pipeline.loadgen import early_stopping
from pipeline.loadgen.protocol import Payload, Target
from pipeline.loadgen.slo import Term
from pipeline.recipe import Recipe

TASKS_WITHOUT_SLO = 20  # measured tasks per point without an SLO: enough for a p50


@dataclass(frozen=True)
class Script:
    """One task: its id in the tasks file and its questions, asked in order."""

    id: int
    questions: tuple[Question, ...]


@dataclass(frozen=True)
class Tasks:
    scripts: list[Script]
    answer_tokens: int
    source: str

    @property
    def turns(self) -> tuple[int, int]:
        sizes = [len(s.questions) for s in self.scripts]
        return min(sizes), max(sizes)


def load(recipe: Recipe) -> Tasks:
    """The recipe's scripts (the first workload.chat.scripts when it limits them, as the
    batch-1 score does); InputError, one line, when the recipe has none."""
    from pipeline.generation import chat
    from pipeline.loadgen.payloads import is_generation

    if not is_generation(recipe):
        raise InputError(f"--tasks: `{recipe.name}` is a tensor model; tasks are multi-turn chats "
                         "for a generation recipe with a chat workload", "drop --tasks")
    spec = recipe.workload.chat
    if spec is None:
        raise InputError(f"--tasks: `{recipe.name}` has no chat workload (no tasks to send)",
                         "give the recipe workload.chat (its tasks: data/chat/tasks.jsonl), or "
                         "drop --tasks")
    for field, path in (("questions", spec.questions), ("tasks", spec.tasks)):
        if not path.is_file():
            raise InputError(f"--tasks: workload.chat.{field} {path} does not exist",
                             "run from the project folder, or point the recipe at the file")
    qs = chat.questions(spec.questions)
    scripts = [Script(i, tuple(s)) for i, s in
               enumerate(chat.scripts(spec.tasks, qs, spec.scripts))]
    if not scripts:
        raise InputError(f"--tasks: {spec.tasks} holds no tasks", "add a row {id, turns: [...]}")
    return Tasks(scripts, spec.answer_tokens, f"{spec.tasks} over {spec.questions}")


def turn_body(target: Target, conversation: list[JsonObject], max_tokens: int) -> Payload:
    """One turn: the conversation so far (user and assistant messages, the new question
    last), streamed, greedy."""
    body: JsonObject = {"model": target.model, "messages": conversation, "max_tokens": max_tokens,
                        "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    return Payload(json.dumps(body).encode(), {"Content-Type": "application/json"})


def min_tasks(terms: tuple[Term, ...], turns: int) -> tuple[int, str]:
    """Measured tasks a point needs so its SLO can pass at all: early stopping needs at
    least early_stopping.min_requests() (459) samples with none over the bound; a token term
    counts turns (`turns` per task, the fewest a script has), a task term counts tasks."""
    least = early_stopping.min_requests()
    if any(t.metric == "task" for t in terms):
        return least, f"early stopping on time per task needs {least} tasks with none over"
    if terms:
        need = math.ceil(least / turns)
        return need, (f"early stopping on TTFT/TPOT needs {least} turns with none over: "
                      f"{need} tasks of {turns} turns")
    return TASKS_WITHOUT_SLO, "no SLO: enough tasks for the median"
