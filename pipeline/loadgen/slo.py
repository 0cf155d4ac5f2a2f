"""A service-level objective: `--slo p99=50ms` (end-to-end latency at a percentile) and,
for generation, `ttft=500ms` / `tpot=80ms` (p99 of time to first token / per output token);
with `--tasks`, also `task=20s` (p99 of time per task: a whole multi-turn conversation).

Each term is judged the way MLPerf LoadGen's Server scenario judges its latency target
(early_stopping.py): the sample percentile within the bound, and the early-stopping rule
passing at 99% confidence on the count over the bound. Requests that failed, were rejected
or timed out are over every bound.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.core.errors import InputError

_TERM = re.compile(r"^(p\d+(?:\.\d+)?|ttft|tpot|task)=(\d+(?:\.\d+)?)(ms|s)$")
HINT = "write e.g. --slo p99=50ms, or for generation --slo ttft=500ms,tpot=100ms"


@dataclass(frozen=True)
class Term:
    metric: str         # "latency", "ttft", "tpot" or "task" (time per task)
    percentile: float   # 0.99 for p99
    bound_ms: float

    @property
    def label(self) -> str:
        name = {"latency": "latency", "task": "time per task"}.get(self.metric, self.metric.upper())
        return f"{name} p{self.percentile * 100:g} <= {self.bound_ms:g} ms"


def parse(text: str | None, generation: bool = False, tasks: bool = False) -> tuple[Term, ...]:
    """`p99=50ms[,ttft=...,tpot=...,task=...]` -> terms; InputError naming the bad part.
    With `tasks` (chat tasks): ttft, tpot and task only (a task's turns have no one latency)."""
    if not text:
        return ()
    terms = []
    for part in (p.strip() for p in text.split(",")):
        m = _TERM.match(part)
        if not m:
            raise InputError(f"--slo {text!r}: `{part}` is not METRIC=NUMBER(ms|s)", HINT)
        key, value, unit = m.groups()
        bound = float(value) * (1000.0 if unit == "s" else 1.0)
        if bound <= 0:
            raise InputError(f"--slo {text!r}: the bound of `{key}` must be > 0", HINT)
        if key == "task" and not tasks:
            raise InputError(f"--slo {text!r}: `task` (time per task) needs --tasks",
                             "add --tasks, or drop the task term")
        if tasks and key.startswith("p"):
            raise InputError(f"--slo {text!r}: with --tasks, bound ttft, tpot and task "
                             f"(time per task), not `{key}`", "e.g. --slo ttft=1s,tpot=100ms,task=20s")
        if key in ("ttft", "tpot", "task"):
            if not generation:
                raise InputError(f"--slo {text!r}: `{key}` applies to generation recipes only",
                                 "use p99=... for this recipe")
            terms.append(Term(key, 0.99, bound))
        else:
            q = float(key[1:]) / 100
            if not 0 < q < 1:
                raise InputError(f"--slo {text!r}: percentile `{key}` must be between p0 and p100", HINT)
            terms.append(Term("latency", q, bound))
    if len({t.metric for t in terms}) != len(terms):
        raise InputError(f"--slo {text!r}: a metric is named twice", HINT)
    return tuple(terms)


def text(terms: tuple[Term, ...]) -> str:
    return ", ".join(t.label for t in terms)
