"""What `pipeline tune` holds a candidate to: metrics on held-out feeds vs PyTorch, a budget.

A metric is a pure function of (PyTorch outputs, engine outputs, feeds) -> float, registered
in METRICS with the direction that is better: the worst and the mean cosine over rows (the
last axis of each output: one sentence embedding, one token's logits). Besides them, the
recipe's own task metric (`validate.task`: perplexity, accuracy, embedding similarity, on
the held-out split's labels) as `task_loss`, how much worse than PyTorch the engine does
the task (task_metrics.loss), bounded by `expect.max_task_loss`. `Budget.bounds` maps
metric name -> (kind, bound).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from pipeline.artifacts import dump
from pipeline.artifacts.report import TaskMetric
from pipeline.core.json_object import JsonObject

Bounds = dict[str, tuple[str, float]]  # metric -> (its kind in KINDS, the bound)
BoundsTable = dict[str, JsonObject]  # metric -> {"bound", "kind"}, as tune.json writes the budget


def row_cosines(reference: list[dict], actual: list[dict]) -> np.ndarray:
    """Cosine of every row (last axis) of every output of every feed, as one flat array."""
    out = []
    for ref, act in zip(reference, actual):
        for name, r in ref.items():
            r = np.asarray(r, np.float64).reshape(-1, np.shape(r)[-1] if np.ndim(r) else 1)
            a = np.asarray(act[name], np.float64).reshape(r.shape)
            num = (r * a).sum(-1)
            den = np.linalg.norm(r, axis=-1) * np.linalg.norm(a, axis=-1)
            both_zero = den == 0
            out.append(np.where(both_zero, 1.0, num / np.where(both_zero, 1.0, den)))
    return np.concatenate(out) if out else np.array([1.0])


def worst_cosine(reference, actual, feeds) -> float:
    return float(row_cosines(reference, actual).min())


def mean_cosine(reference, actual, feeds) -> float:
    return float(row_cosines(reference, actual).mean())


# name -> (function, "min" | "max"): "min" = the value must stay >= its bound
METRICS = {"worst_cosine": (worst_cosine, "min"), "mean_cosine": (mean_cosine, "min")}
KINDS = {**{name: kind for name, (_, kind) in METRICS.items()}, "task_loss": "max"}


@dataclass
class Task:
    """The recipe's task metric on the held-out split: `metric` of `output`, with the split's
    labels (class ids, gold pair scores) and masks (1 = real token), as validate scores it."""
    metric: str
    output: str
    labels: np.ndarray | None
    masks: list[np.ndarray] | None

    def score(self, feeds: list[dict], reference: list[dict], actual: list[dict]) -> TaskScore:
        """The engine vs PyTorch on the task, and its loss."""
        from pipeline.metrics import task as task_metrics

        out = task_metrics.score(self.metric, feeds, reference, actual, self.output, self.labels, self.masks)
        return TaskScore(out, task_metrics.loss(out))


@dataclass(frozen=True)
class TaskScore:
    """The task metric (engine vs PyTorch) and its loss (task_metrics.loss: > 0 is worse)."""

    metric: TaskMetric
    loss: float

    def dump(self) -> JsonObject:
        return {**dump(self.metric), "loss": self.loss}


@dataclass
class Budget:
    worst_cosine: float = 0.99
    mean_cosine: float = 0.998
    task_loss: float | None = None  # the most task_loss allowed (absolute; None: not bounded)
    extra: dict[str, float] = field(default_factory=dict)  # other registered metrics' bounds

    @property
    def bounds(self) -> Bounds:
        b = {"worst_cosine": self.worst_cosine, "mean_cosine": self.mean_cosine, **self.extra}
        if self.task_loss is not None:
            b["task_loss"] = self.task_loss
        return {k: (KINDS[k], v) for k, v in b.items()}

    def describe(self) -> BoundsTable:
        return {k: {"bound": v, "kind": kind} for k, (kind, v) in self.bounds.items()}


@dataclass(frozen=True)
class Scores:
    """A candidate's accuracy on the held-out feeds: every registered metric (name -> value)
    and, with a task, its score."""

    values: dict[str, float]
    task: TaskScore | None = None

    def value(self, name: str) -> float | None:
        """A metric's value; `task_loss` is the task's loss."""
        if name == "task_loss":
            return self.task.loss if self.task is not None else None
        return self.values.get(name)

    def dump(self) -> JsonObject:
        """As tune.json holds it: each metric, then `task` and `task_loss` when scored."""
        out: JsonObject = dict(self.values)
        if self.task is not None:
            out.update(task=self.task.dump(), task_loss=self.task.loss)
        return out


def measure(reference: list[dict], actual: list[dict], feeds: list[dict], task: Task | None = None) -> Scores:
    """Every registered metric; with a task, its score and loss."""
    values = {name: fn(reference, actual, feeds) for name, (fn, _) in METRICS.items()}
    return Scores(values, task.score(feeds, reference, actual) if task is not None else None)


@dataclass(frozen=True)
class Within:
    """Whether a candidate is within the budget, and each bound it misses, in words."""

    ok: bool
    misses: list[str]

    def dump(self) -> JsonObject:
        return {"ok": self.ok, "misses": self.misses}


def within(scores: Scores, budget: Budget) -> Within:
    misses = []
    for name, (kind, bound) in budget.bounds.items():
        v = scores.value(name)
        ok = v is not None and np.isfinite(v) and (v >= bound if kind == "min" else v <= bound)
        if not ok:
            misses.append(f"{name} {v if v is None else round(v, 5)} {'<' if kind == 'min' else '>'} {bound:g}")
    return Within(not misses, misses)


def digest(feeds: list[dict]) -> str:
    h = hashlib.sha256()
    for feed in feeds:
        for name in sorted(feed):
            h.update(name.encode())
            h.update(str(feed[name].shape).encode())
            h.update(np.ascontiguousarray(feed[name]).tobytes())
    return h.hexdigest()
