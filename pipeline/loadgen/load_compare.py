"""`pipeline compare A B --load`: two recipes' load results side by side, with verdicts.

For each recipe, its recorded load files (engines/<folder>/load-*.json, verified through the
store) are pooled: the capacity from the one that searched for it, and every measured point.

- At each one's capacity: B's capacity over A's. The interval comes from the two search
  brackets ([highest passing, lowest failing] rate): [B low / A high, B high / A low].
  B "higher" when the whole interval is above 1, "lower" when below, else indistinguishable.
- At the same offered rate (points within 2% of each other): B's p99 over A's, with the
  interval from the two p99s' order-statistic intervals; B "slower" when the whole interval
  is above 1, "faster" when below.

Chat-task results (`pipeline load --tasks`) compare the same way in tasks/s, with the time
per task's p99. The table says whether the two were measured in one run taking turns point
by point (`pipeline load A --versus B`, versus.py), or in separate runs, which on a shared
machine compare its moods as much as the engines.

Writes engines/compare/<A>-vs-<B>/compare-load.md and .json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.artifacts import dump
from pipeline.artifacts.serving import Capacity, LoadResult, Quantile
from pipeline.core.errors import InputError
from pipeline.core.json_object import JsonObject

SAME_RATE = 0.02


@dataclass(frozen=True)
class CapacityLine:
    """B's capacity over A's, its interval from the two search brackets, the verdict."""

    a: Capacity
    b: Capacity
    ratio: float | None
    interval: tuple[float | None, float | None]
    verdict: str

    def dump(self) -> JsonObject:
        return {"a": dump(self.a), "b": dump(self.b), "ratio": self.ratio,
                "interval": list(self.interval), "verdict": self.verdict}


@dataclass(frozen=True)
class RateLine:
    """At one offered rate both measured: B's p99 over A's, its interval, the verdict."""

    rate: float
    a_p99: Quantile
    b_p99: Quantile
    ratio: float | None
    interval: tuple[float | None, float | None]
    verdict: str
    a_passed: bool | None
    b_passed: bool | None

    def dump(self) -> JsonObject:
        return {"rate": self.rate, "a_p99": dump(self.a_p99), "b_p99": dump(self.b_p99),
                "ratio": self.ratio, "interval": list(self.interval), "verdict": self.verdict,
                "a_passed": self.a_passed, "b_passed": self.b_passed}


@dataclass(frozen=True)
class LoadComparison:
    """compare-load.json: the two folders' names, the capacity line, the same-rate lines."""

    a: str
    b: str
    capacity: CapacityLine | None
    same_rate: list[RateLine]
    unit: str = "requests/s"          # or tasks/s: what the rates and capacities count
    figure: str = "p99 latency"       # what the same-rate lines compare
    in_turns: bool = False            # measured in one run, point by point (load --versus)

    def dump(self) -> JsonObject:
        return {"a": self.a, "b": self.b, "unit": self.unit, "figure": self.figure,
                "in_turns": self.in_turns,
                "capacity": self.capacity.dump() if self.capacity else None,
                "same_rate": [r.dump() for r in self.same_rate]}


def split_ref(ref: str) -> tuple[str, str | None]:
    """`RECIPE[:NAME]` -> (RECIPE, NAME): NAME picks the load files of one serving variant
    (`pipeline load --name NAME`); without it, the files of the unnamed one."""
    if ":" in ref and not ref.endswith((".yaml", ".yml")):
        recipe, _, name = ref.rpartition(":")
        return recipe, name or None
    return ref, None


def _loads(recipe, name: str | None, root: Path) -> list[LoadResult]:
    from pipeline.loadgen.artifact import recorded_loads
    from pipeline.store.folder_names import folder_name
    from pipeline.store.recipe_folder import Store

    store = Store(root, folder_name(recipe))
    loads = recorded_loads(store) if (store.dir / "manifest.json").is_file() else []
    loads = [LoadResult.model_validate(r) for r in loads if r.get("name") == name]
    if not loads:
        what = f"load results named {name}" if name else "load results (load-*.json)"
        raise InputError(f"{store.dir}: no {what}",
                         f"run `pipeline load {folder_name(recipe)} --serve --slo p99=...` first")
    return loads


def _ratio_interval(a: tuple, b: tuple) -> tuple[float | None, float | None, float | None]:
    """b/a with the interval [b_lo / a_hi, b_hi / a_lo]; None where a bound is unknown."""
    (av, alo, ahi), (bv, blo, bhi) = a, b
    ratio = bv / av if av and bv is not None else None
    lo = blo / ahi if blo is not None and ahi else None
    hi = bhi / alo if bhi is not None and alo else None
    return ratio, lo, hi


def _verdict(lo, hi, above: str, below: str) -> str:
    if lo is not None and lo > 1:
        return above
    if hi is not None and hi < 1:
        return below
    return "indistinguishable"


def _capacity(r: LoadResult) -> Capacity | None:
    """The result's capacity: in requests/s, or in tasks/s for chat tasks."""
    return r.tasks.capacity if r.tasks else r.capacity


def _p99s(results: list[LoadResult]) -> list[tuple[float, Quantile, bool | None]]:
    """(offered rate, p99, passed) of each open-loop point: the request latency's p99, or for
    chat tasks the time per task's."""
    return [(p.offered_rate, p.time_per_task_ms["p99"], p.passed) if r.tasks else
            (p.offered_rate, p.latency_ms["p99"], p.passed)
            for r in results for p in (r.tasks.points if r.tasks else r.points) if not p.concurrency]


def capacity_line(a: list[LoadResult], b: list[LoadResult]) -> CapacityLine | None:
    ca = next((_capacity(r) for r in a if _capacity(r)), None)
    cb = next((_capacity(r) for r in b if _capacity(r)), None)
    if not ca or not cb or ca.capacity is None or cb.capacity is None:
        return None
    ratio, lo, hi = _ratio_interval((ca.capacity, ca.bracket[0], ca.bracket[1]),
                                    (cb.capacity, cb.bracket[0], cb.bracket[1]))
    return CapacityLine(ca, cb, ratio, (lo, hi), _verdict(lo, hi, "B higher", "B lower"))


def same_rate_lines(a: list[LoadResult], b: list[LoadResult]) -> list[RateLine]:
    out = []
    pb = _p99s(b)
    for rate, qa, a_passed in _p99s(a):
        y = next((y for y in pb if abs(y[0] - rate) <= SAME_RATE * rate), None)
        if y is None:
            continue
        _, qb, b_passed = y
        ratio, lo, hi = _ratio_interval((qa.value, qa.lo, qa.hi), (qb.value, qb.lo, qb.hi))
        out.append(RateLine(rate, qa, qb, ratio, (lo, hi),
                            _verdict(lo, hi, "B slower", "B faster"), a_passed, b_passed))
    return sorted(out, key=lambda r: r.rate)


def compare_loads(refs: list[str], overrides: tuple[str, ...],
                  root: Path) -> tuple[LoadComparison, Path]:
    """refs: `RECIPE[:NAME]` each (see split_ref)."""
    from pipeline.store import folder_names as folders
    from pipeline.store.recipe_folder import write_atomic

    if len(refs) != 2:
        raise InputError(f"compare --load takes two recipes, not {len(refs)}",
                         "e.g. pipeline compare minilm minilm-int8 --load")
    parts = [split_ref(r) for r in refs]
    recipes = [folders.load(ref, overrides, root) for ref, _ in parts]
    names = [folders.folder_name(r) + (f"-{n}" if n else "") for r, (_, n) in zip(recipes, parts)]
    if names[0] == names[1]:
        raise InputError(f"compare --load {refs[0]} {refs[1]}: the same results twice",
                         "name a serving variant, e.g. minilm-int8 minilm-int8:b1")
    a, b = (_loads(r, n, root) for r, (_, n) in zip(recipes, parts))
    if any(r.tasks for r in a) != any(r.tasks for r in b):
        raise InputError(f"{names[0]} and {names[1]}: one holds chat-task results, the other "
                         "single requests; they count different things",
                         "compare results of the same kind (name them RECIPE:NAME)")
    tasks = any(r.tasks for r in a)
    ref_a, ref_b = (folders.folder_name(r) + (f":{n}" if n else "") for r, (_, n) in zip(recipes, parts))
    in_turns = all(r.client.get("interleaved_with") == ref_b for r in a) and \
        all(r.client.get("interleaved_with") == ref_a for r in b)  # every result, none pooled from elsewhere
    result = LoadComparison(names[0], names[1], capacity_line(a, b), same_rate_lines(a, b),
                            "tasks/s" if tasks else "requests/s",
                            "time per task p99" if tasks else "p99 latency", in_turns)
    if result.capacity is None and not result.same_rate:
        raise InputError(f"{names[0]} and {names[1]}: neither both capacities nor a common "
                         "offered rate to compare",
                         "run `pipeline load --slo ...` on both, or the same --rate/--sweep")
    folder = Path(root) / "compare" / "-vs-".join(names)
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / "compare-load.json", json.dumps(result.dump(), indent=2) + "\n")
    write_atomic(folder / "compare-load.md", "\n".join(lines(result)) + "\n")
    return result, folder


def _f(x, spec=".2f") -> str:
    return "—" if x is None else format(x, spec)


def _pair(bracket: list) -> str:
    return "[" + ", ".join("—" if x is None else f"{x:.2f}" for x in bracket) + "]"


def lines(result: LoadComparison) -> list[str]:
    out = [f"# Serving: {result.b} (B) against {result.a} (A)", "",
           ("Measured in one run, taking turns point by point (A, B, A, B...: `pipeline load A "
            "--versus B`): both saw the same machine." if result.in_turns else
            "Measured in separate runs: the machine may have changed between them (this "
            "machine's capacity for one engine moved 4x in 13 minutes); measure both in turns "
            "with `pipeline load A --serve --versus B`."), ""]
    c, unit = result.capacity, result.unit
    if c:
        lo, hi = c.interval
        out += [f"Capacity at the SLO: A {c.a.capacity:.3g} {unit} (bracket {_pair(c.a.bracket)}), "
                f"B {c.b.capacity:.3g} {unit} (bracket {_pair(c.b.bracket)}): B/A "
                f"**{_f(c.ratio)}x** [{_f(lo)}, {_f(hi, '.2f') if hi else '∞'}] (from the "
                f"search brackets): **{c.verdict}**.", ""]
    if result.same_rate:
        what = result.figure
        out += [f"| offered {unit} | A {what} ms [95% CI] | B {what} ms [95% CI] | B/A [interval] "
                "| verdict |", "|---|---|---|---|---|"]
        for r in result.same_rate:
            qa, qb = r.a_p99, r.b_p99
            out.append(f"| {r.rate:.2f} | {_f(qa.value, '.1f')} [{_f(qa.lo, '.1f')}, "
                       f"{_f(qa.hi, '.1f')}] | {_f(qb.value, '.1f')} [{_f(qb.lo, '.1f')}, "
                       f"{_f(qb.hi, '.1f')}] | {_f(r.ratio)} [{_f(r.interval[0])}, "
                       f"{_f(r.interval[1])}] | {r.verdict} |")
    return out


def show(refs: list[str], overrides: tuple[str, ...], root: Path) -> None:
    """compare --load: write and print."""
    from pipeline.core.ui import console, out

    result, folder = compare_loads(list(refs), overrides, root)
    for line in lines(result):
        out.print(line, markup=False)
    console.print(f"compare: {folder / 'compare-load.md'}")
