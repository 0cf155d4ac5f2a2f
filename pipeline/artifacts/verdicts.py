"""Verdicts and gates recomputed from the recorded numbers, never taken on the file's word.

A report.json or validate-<target>.json rewritten by hand, with its sha256 rewritten in the
manifest, passes the digest check; what it cannot do is say "pass" about numbers that fail.
Two levels:

    intrinsic     (every reader, through the models' validators) a speed-up's verdict is
                  stats.verdict of its own interval and noise threshold; a passing gate whose
                  figure is NaN, or that fails the threshold written in its own detail
                  ("0.999871 >= 0.999", "needs <= 5 ms"), is refused
    recipe        (run, deploy: the recipe is trusted code, the folder is data) the accuracy
                  and expect: gates recomputed with the recipe's thresholds; a gate recorded
                  as passed that the recomputation fails is refused (run/gate_recheck.py)

A NaN never passes: every comparison below is written so that NaN makes it false.
Within one file set a consistent forgery (numbers and gates rewritten together) is beyond
any check of the files alone: that is what signed provenance (pipeline.store.provenance) is for.
"""

from __future__ import annotations

import math
import re
from typing import Any

_NUMBER = r"(-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?)"
_AT_LEAST = re.compile(r">= ?" + _NUMBER + r"x?\b", re.IGNORECASE)
_ROUNDING = 1e-5  # %g's 6 significant digits, with room to spare
_AT_MOST = re.compile(r"<= ?" + _NUMBER + r"(?: ms)?\b", re.IGNORECASE)


def speed_verdict(lo: float, hi: float, noise: float) -> str:
    """core.stats.verdict, restated here so reading an artifact imports no statistics."""
    if lo > 1.0 + noise:
        return "faster"
    if hi < 1.0 / (1.0 + noise):
        return "slower"
    return "indistinguishable"


def time_verdict(lo: float, hi: float, noise: float) -> str:
    """The verdict of a B/A time ratio: B is faster when its time ratio is low."""
    inverse = [1.0 / x if x > 0 else math.inf for x in (hi, lo)]
    return speed_verdict(inverse[0], inverse[1], noise)


def verdict_problem(recorded: str, lo: float, hi: float, noise: float, time_ratio: bool) -> str | None:
    expected = (time_verdict if time_ratio else speed_verdict)(lo, hi, noise)
    if recorded != expected:
        return (f"verdict `{recorded}` does not follow from its interval [{lo:g}, {hi:g}] and "
                f"noise threshold {noise:g} (that is `{expected}`)")
    return None


def _threshold(pattern: re.Pattern, detail: str) -> float | None:
    found = pattern.findall(detail)
    return float(found[-1]) if found else None


def _holds(value: Any, at_least: float | None = None, at_most: float | None = None) -> bool:
    """value meets the bound; NaN, None and a non-number never do."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
        return False
    # a detail prints its threshold with 6 significant digits (%g): allow that rounding
    if at_least is not None and not value >= at_least - abs(at_least) * _ROUNDING:
        return False
    return at_most is None or value <= at_most + abs(at_most) * _ROUNDING


def gate_problems(engine: Any) -> list[str]:
    """Intrinsic check of one EngineResult (a model instance): gates recorded as passed that
    its own numbers fail."""
    problems = []
    accuracy = engine.accuracy or {}
    for gate in engine.gates:
        if not gate.passed:
            continue
        output, _, metric = gate.name.rpartition(".")
        figure = accuracy.get(output)
        value, ok = None, True
        if figure is not None and metric in ("cosine", "top1_agreement"):
            value = getattr(figure, metric)
            ok = _holds(value, at_least=_threshold(_AT_LEAST, gate.detail))
        elif figure is not None and metric == "max_abs":
            value = figure.max_abs
            ok = _holds(value, at_most=_threshold(_AT_MOST, gate.detail))
        elif figure is not None and metric == "finite":
            value = figure.nonfinite
            ok = value == 0
        elif gate.name == "expect.min_speedup" and engine.speedup_vs_baseline is not None:
            value = engine.speedup_vs_baseline.ci95[0]
            ok = _holds(value, at_least=_threshold(_AT_LEAST, gate.detail))
        elif gate.name == "expect.max_p99_ms" and engine.latency_ms is not None:
            value = engine.latency_ms.p99
            ok = _holds(value, at_most=_threshold(_AT_MOST, gate.detail))
        if not ok:
            problems.append(f"gate `{gate.name}` is recorded as passed, but its recorded figure "
                            f"{value!r} fails it (its detail says {gate.detail!r})")
    return problems
