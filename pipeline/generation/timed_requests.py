"""Generation requests and their timed runs: requests (prefill + greedy decode, possibly
several turns), run on generation runners and timed with the protocol of bench/: warm-up,
then rounds in which the runners take turns (the order alternating each round), so a drift
of the machine hits all of them alike; A/B ratios then come from per-round ratios
(core.stats.paired_ratio). (The recipe's `workload:` section is recipe/workload.py; the
workloads that measure engines are pipeline/workloads/.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from pipeline.recipe.workload import WorkloadSpec


@dataclass(frozen=True)
class Request:
    """One generation: `turns` of (prompt tokens [B, T], tokens to generate)."""

    label: str  # e.g. "b1-p32", "task", "long"
    kind: str  # point | task | long
    batch: int
    turns: tuple[tuple[np.ndarray, int], ...] = field(compare=False)

    @property
    def new_tokens(self) -> int:
        return sum(n for _, n in self.turns)


@dataclass
class Trace:
    """What one runner did on one request: times in ns, tokens [B, new tokens]."""

    ttft_ns: list[int]  # per turn: the prefill (and selecting the first token)
    step_ns: list[list[int]]  # per turn: each decode step after the first token
    tokens: np.ndarray
    total_ns: int


def _prompt(rng: np.random.Generator, batch: int, length: int, vocab: int, eos: int) -> np.ndarray:
    """Token ids below `vocab`, never the (suppressed) EOS token."""
    if eos >= vocab:
        return rng.integers(0, vocab, size=(batch, length), dtype=np.int64)
    tokens = rng.integers(0, vocab - 1, size=(batch, length), dtype=np.int64)
    return np.where(tokens >= eos, tokens + 1, tokens)


class _TextPrompts:
    """Prompts cut from real text token ids, one after another (each slice new text)."""

    def __init__(self, ids: np.ndarray):
        self.ids, self.at = ids, 0

    def __call__(self, _rng, batch: int, length: int, _vocab: int, _eos: int) -> np.ndarray:
        rows = []
        for _ in range(batch):
            if self.at + length > self.ids.size:
                self.at = 0
            rows.append(self.ids[self.at:self.at + length])
            self.at += length
        return np.stack(rows).astype(np.int64)


def prompt_tokens(spec: WorkloadSpec) -> int:
    """Tokens all prompts of the workload take together (what real text must supply)."""
    total = sum(b * p for b in spec.batch_sizes for p in spec.prompt_lengths)
    total += sum(t.prompt for t in spec.task)
    return total + (spec.long.prompt if spec.long else 0)


def requests(spec: WorkloadSpec, vocab: int, eos: int, text: np.ndarray | None = None) -> list[Request]:
    """Every point (prompt length x batch size), the task (batch 1) and the long point; the
    prompts are random ids, or slices of `text` (real text's token ids) when given."""
    rng = np.random.default_rng([spec.seed, 17])
    prompt = _prompt if text is None else _TextPrompts(text)
    out = [Request(f"b{b}-p{p}", "point", b, ((prompt(rng, b, p, vocab, eos), spec.new_tokens),))
           for b in spec.batch_sizes for p in spec.prompt_lengths]
    out.append(Request("task", "task", 1, tuple((prompt(rng, 1, t.prompt, vocab, eos), t.new_tokens)
                                             for t in spec.task)))
    if spec.long is not None:
        out.append(Request("long", "long", 1, ((prompt(rng, 1, spec.long.prompt, vocab, eos),
                                                 spec.long.new_tokens),)))
    return out


def generate(runner, request: Request) -> Trace:
    """Run one request on a runner, timing each prefill and each decode step."""
    clock = time.perf_counter_ns
    runner.new(request.batch)
    ttft, steps, tokens = [], [], []
    start = clock()
    for prompt, n in request.turns:
        t0 = clock()
        tokens.append(runner.prefill(prompt))
        ttft.append(clock() - t0)
        turn = []
        for _ in range(n - 1):
            t0 = clock()
            tokens.append(runner.step())
            turn.append(clock() - t0)
        steps.append(turn)
    return Trace(ttft, steps, np.stack(tokens, axis=1), clock() - start)


Traces = dict[str, list[Trace]]  # a runner's name -> its traces, one per round


def measure(runners: dict[str, object], request: Request, spec: WorkloadSpec,
            rounds: int | None = None) -> Traces:
    """Warm-up, then `rounds` (default `spec.rounds`) rounds of one request per runner, interleaved."""
    names = list(runners)
    for name in names:
        for _ in range(spec.warmup):
            generate(runners[name], request)
    traces: dict[str, list[Trace]] = {n: [] for n in names}
    for r in range(rounds or spec.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            traces[name].append(generate(runners[name], request))
    return traces


def can_run(runner, request: Request) -> bool:
    return len(request.turns) == 1 or getattr(runner, "turns", True)
