"""`pipeline bench RECIPE [--vs OTHER]`: build what is needed (run.py), open the engines and
baselines (backends/openers.py), time them with bench/ab.py, write, show.

Writes engines/<RECIPE>/bench.json (bench-vs-OTHER.json with --vs) and a latency PNG beside
it; prints the runners and the comparisons with their verdicts and 95% intervals.
"""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from pipeline import backends
from pipeline.backends import openers
from pipeline.bench.protocol import Opener
from pipeline.core.text import time_ratio_speedup
from pipeline.recipe import Recipe
from pipeline.store.folder_names import folder_name

EnginePaths = dict[str, Path]  # a target id -> its verified engine file
Openers = dict[str, Opener]  # a target id -> the opener of its engine


def built_engines(recipe: Recipe, root: Path, force: bool, progress, verbose: bool,
                  only: tuple[str, ...] = ()) -> EnginePaths:
    """Build (or find cached) every target of `recipe` that can be built here (or those
    named in `only`); target id -> engine file."""
    from pipeline.backends import engine_name
    from pipeline.run.execute import Run

    run = Run(recipe, root, force=force, progress=progress, verbose=verbose, only=only)
    run.execute("build")
    return {t.id: run.store.verify(engine_name(t)).path for t in run.targets
            if backends.get(t.kind).unavailable(t) is None}


def bench(recipe: Recipe, other: Recipe | None, root: Path, force: bool, progress,
          verbose: bool, only: tuple[str, ...] = ()) -> tuple[dict, Path]:
    from pipeline.bench import ab
    from pipeline.store.recipe_folder import Store

    engines = built_engines(recipe, root, force, progress, verbose, only)
    other_engines = built_engines(other, root, force, progress, verbose, only) if other else {}
    with progress.stage("bench"):
        result, samples = ab.bench(
            recipe, openers.timing_feed(recipe), _open(recipe, engines), openers.baseline_opener(recipe),
            other, _open(other, other_engines) if other else None,
            openers.baseline_opener(other) if other else None)
    store = Store(root, folder_name(recipe))
    with store.lock():
        path, _ = ab.write(result, samples, store.dir)
    return result, path


def _open(recipe: Recipe, engines: EnginePaths) -> Openers:
    targets = {t.id: t for t in recipe.targets}
    return {tid: openers.engine_opener(recipe, targets[tid], path) for tid, path in engines.items()}


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def tables(result: dict) -> list[Table]:
    runners = Table(title=f"bench {result['recipe']}" + (f" --vs {result['vs']}" if result["vs"] else ""))
    for h in ("runner", "shape", "p50 ms", "p90 ms", "p99 ms", "CoV", "n", "load ms", "first req ms"):
        runners.add_column(h)
    for shape in result["shapes"]:
        for name, lat in shape["latency_ms"].items():
            cold = result["cold_start_ms"][name]
            runners.add_row(name, shape["shape"], _ms(lat["p50"]), _ms(lat["p90"]), _ms(lat["p99"]),
                            f"{lat['cov']:.2f}", str(lat["n"]), _ms(cold["load"]),
                            _ms(cold["first_request"]))
    comps = Table(title="A/B: B vs A, speed-up = A time / B time (interleaved rounds, 95% sign-test CI)")
    for h in ("A", "B", "shape", "B vs A [95% CI]", "verdict (B)"):
        comps.add_column(h)
    for shape in result["shapes"]:
        for c in shape["comparisons"]:
            style = {"faster": "green", "slower": "red"}.get(c["verdict"])
            comps.add_row(c["a"], c["b"], shape["shape"], time_ratio_speedup(c["time_ratio"], c["ci95"]),
                          c["verdict"], style=style)
    res, over = result["resources"], result["harness_overhead_us"]
    busy = res["system_busy_pct"]
    comps.caption = (f"harness overhead {over['p50']:.2f} us/request (no-op runner); timer "
                     f"{', '.join(sorted(set(result['timers'].values())))}; process CPU "
                     f"{res['process_cpu_pct']['mean']:.0f}% (100% = one core), machine busy "
                     f"{busy['mean']:.0f}% of {res['cores']} cores" if busy else "")
    return [runners, comps]
