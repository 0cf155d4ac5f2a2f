"""Predicted against measured on this machine: each engine's roofline floor per op category
beside ONNX Runtime's profiled kernel time, at the workload's points, across recipes.

    PYTHONPATH=. python benchmarks/roofline.py --engines /work/after/engines \
        lm-fp32 standard-int8 smollm2-int4 --long smollm2-int4=5120 --out benchmarks/results/roofline-DATE.md
    PYTHONPATH=. python benchmarks/roofline.py --all --engines /work/after/engines --engines /tmp/engines \
        --skip flash-base="..." --out benchmarks/results/roofline-all-DATE.md

For each built ONNX Runtime engine of each recipe (the first --engines folder that holds the
recipe's folder; verified against its manifest; a folder `pipeline build` made without a report
is read from its manifest): the points `pipeline predict` costs (generation: prefill at the
first prompt length, a decode step at batch 1 in the middle of its generation, and with
--long RECIPE=N a prefill of N tokens; forward: the batch dim's min/opt/max), each profiled
(explain/profile.py: kernel time per node, median over requests, sessions at the engine's
threads) and costed on this machine's hardware entry (`pipeline hw`, cached). Efficiency =
floor / measured; nothing is calibrated. The report's own p50 (TTFT, TPOT, latency), wall-clock
with the runtime's overhead and taken at build time, is shown beside the profile where there is
a report. Load averages are printed with every point: other processes slow measured times,
never the floors. A recipe not built (or skipped with --skip) is listed with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LONG_RUNS = (1, 3)  # warm-up, profiled requests of a long prefill (~15 s each on 2 cores)
RUNS = (2, 10)


@dataclass
class Row:
    """One point's median profile beside its floor, and how it was taken."""

    check: object  # roofline.measured.PointCheck
    recipe: str
    report_p50_ms: float | None
    profiles_ms: list[float]
    load: list[float]
    seconds: float


@dataclass
class Engine:
    """A built ONNX Runtime engine to profile: its file, threads, the report entry if any."""

    target: str
    path: Path
    threads: int | None
    entry: object | None  # artifacts EngineResult, where the folder has a report


def _points(recipe, long: int | None):
    """The points each build profiles (the workload's, roofline/points.py), every forward batch
    (min/opt/max), and a prefill of `long` tokens."""
    from pipeline import workloads
    from pipeline.roofline import points

    found = [p for p in workloads.of(recipe).roofline_points(recipe).points if p.profiled or p.phase == "forward"]
    if long:
        found.append(points.Point(f"prefill {long}", "prefill", points.prefill_dims(long)))
    return found


def _report_p50(entry, point) -> float | None:
    from pipeline.roofline.predict import _measured

    return _measured(entry, point) if entry is not None else None


def find(name: str, roots: list[Path]):
    """(recipe, its folder's Store) from the first engines root that built it; None if none did."""
    from pipeline.store import folder_names
    from pipeline.store.recipe_folder import Store

    for root in roots:
        recipe = folder_names.load(name, (), root)
        store = Store(root, folder_names.folder_name(recipe))
        if (store.dir / "manifest.json").is_file():
            return recipe, store
    return None


def engines_of(recipe, store) -> list[Engine]:
    """The built ONNX Runtime engines: the report's entries, else the manifest's target files."""
    from pipeline.artifacts import recorded

    files = store.manifest.files
    if "report.json" in files:
        report = recorded.report(store.read_json("report.json"))
        return [Engine(e.target, store.verify(Path(e.path).name).path, e.threads or recipe.validate_.threads, e)
                for e in report.engines if e.status == "built" and e.kind == "onnxruntime"]
    return [Engine(t.id, store.verify(f"{t.id}.onnx").path, recipe.validate_.threads, None)
            for t in recipe.targets if t.kind == "onnxruntime" and f"{t.id}.onnx" in files]


def measure_point(recipe, engine: Engine, point, here, repeat: int) -> Row:
    from pipeline.roofline import measured

    warmup, runs = LONG_RUNS if point.dims.get("sequence", 0) > 1024 else RUNS
    tries, loads, t0 = [], [], time.time()
    for _ in range(1 if warmup == LONG_RUNS[0] else repeat):  # a long prefill: one whole profile
        loads.append(os.getloadavg()[0])
        tries += measured.check(recipe, engine.target, engine.path, here, [point], engine.threads, runs, warmup)
        print(f"  {tries[-1].engine} {point.label}: profile {tries[-1].measured_us / 1e3:.3f} ms "
              f"(load {loads[-1]:.2f})", flush=True)
    check = sorted(tries, key=lambda c: c.measured_us)[len(tries) // 2]  # the median profile
    print(f"{check.engine} {check.point}: floor {check.floor_us / 1e3:.3f} ms, median profile "
          f"{check.measured_us / 1e3:.3f} ms, efficiency {check.efficiency:.2f}", flush=True)
    return Row(check, recipe.name, _report_p50(engine.entry, point), [c.measured_us / 1e3 for c in tries], loads,
               time.time() - t0)


def measure(roots: list[Path], names: list[str], longs: dict[str, int], repeat: int,
            skipped: dict[str, str]) -> list[Row]:
    """Every point of every built engine; a recipe without one is added to `skipped`, why."""
    from pipeline.hardware import database

    here = database.this_machine().entry
    rows = []
    for name in names:
        if name in skipped:
            continue
        found = find(name, roots)
        if found is None:
            skipped[name] = f"not built in {', '.join(map(str, roots))}"
            continue
        recipe, store = found
        engines = engines_of(recipe, store)
        if not engines:
            skipped[name] = f"no ONNX Runtime engine in {store.dir} (targets: {[t.kind for t in recipe.targets]})"
        for engine in engines:
            for point in _points(recipe, longs.get(name)):
                try:
                    rows.append(measure_point(recipe, engine, point, here, repeat))
                except Exception as e:  # noqa: BLE001  (one graph the model cannot cost: said, the rest go on)
                    skipped[f"{name} {point.label}"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return rows


def _whole_steps(rows: list[Row]) -> list[str]:
    lines = ["| engine | point | threads | floor | profile (kernel sum, median) | floor / profile | "
             "profiles (each) | report p50 (wall) | floor / report | 1-min load avg at each |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for r in rows:
        c, wall = r.check, r.report_p50_ms
        lines.append(f"| {c.engine} | {c.point} | {c.threads or 'default'} | {c.floor_us / 1e3:,.3f} ms | "
                     f"{c.measured_us / 1e3:,.3f} ms | {c.efficiency:.2f} | "
                     f"{', '.join(f'{x:,.1f}' for x in r.profiles_ms)} | "
                     f"{f'{wall:,.3f} ms' if wall else '-'} | {f'{c.floor_us / 1e3 / wall:.2f}' if wall else '-'} | "
                     f"{', '.join(f'{x:.2f}' for x in r.load)} |")
    return lines


def _furthest(rows: list[Row]) -> list[str]:
    """Per point, the category with the most time above its floor (measured - floor)."""
    lines = []
    for r in rows:
        c = r.check
        worst = max(c.categories, key=lambda k: k.measured_us - k.floor_us)
        eff = f"{worst.efficiency:.2f}" if worst.efficiency is not None else "-"
        lines.append(f"- {c.engine} {c.point}: **{worst.category}**, {(worst.measured_us - worst.floor_us) / 1e3:,.3f} "
                     f"ms above its floor (efficiency {eff}, {worst.bound}-bound floor)")
    return lines


def _per_recipe(rows: list[Row]) -> list[str]:
    """Per recipe: its points' whole-step efficiencies, their median and worst."""
    import numpy as np

    lines = ["| recipe | points | median floor / measured | worst | best |", "|---|---:|---:|---:|---:|"]
    for name in dict.fromkeys(r.recipe for r in rows):
        eff = sorted(r.check.efficiency for r in rows if r.recipe == name)
        lines.append(f"| {name} | {len(eff)} | {float(np.median(eff)):.2f} | {eff[0]:.2f} | {eff[-1]:.2f} |")
    return lines


def _spread_lines(rows: list[Row], skipped: dict[str, str]) -> list[str]:
    from pipeline.roofline import measured

    checks = [r.check for r in rows]
    median, worst = measured.spread(checks)
    best = max(c.efficiency for c in checks)
    loads = [x for r in rows for x in r.load]
    recipes = len({r.recipe for r in rows})
    out = [f"**Spread over {len(checks)} points of {recipes} recipes: median whole-step floor / measured "
           f"{median:.2f} (measured {1 / median:.1f}x the floor), worst {worst:.2f} ({1 / worst:.1f}x), best "
           f"{best:.2f}.** 1-minute load average while profiling: {min(loads):.2f}-{max(loads):.2f} "
           f"(median {sorted(loads)[len(loads) // 2]:.2f}) on {os.cpu_count()} cores.", "",
           "## Per recipe", "", *_per_recipe(rows), ""]
    if skipped:
        out += ["## Not measured", "", *(f"- {k}: {v}" for k, v in skipped.items()), ""]
    return out


def markdown(rows: list[Row], roots: list[Path], skipped: dict[str, str]) -> str:
    import onnxruntime as ort

    from pipeline.core import deps
    from pipeline.hardware import database
    from pipeline.roofline import measured

    entry = database.this_machine().entry
    peaks = ", ".join(f"{p.dtype} {p.ops_per_s / 1e9:,.0f} G/s ({p.isa}, {p.threads} thr)"
                      for p in entry.peaks if p.present)
    mem = ", ".join(f"{b.level} {b.bytes_per_s / 1e9:,.0f} GB/s ({b.threads} thr)" for b in entry.bandwidth)
    return "\n".join([
        f"# Roofline floors against ONNX Runtime profiles, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
        f"Machine: {deps.device_line(deps.device())}; onnxruntime {ort.__version__}. Engines: "
        f"{', '.join(map(str, roots))} (built earlier; folders verified against their manifests).", "",
        f"Hardware entry (`pipeline hw`, measured {entry.source.date}; {entry.source.notes}): peaks {peaks}; "
        f"bandwidth {mem}.", "",
        "How: `PYTHONPATH=. python benchmarks/roofline.py` (this file's command line is in its docstring). "
        "Floor per node = max(FLOPs / the peak of its type at the engine's threads, bytes / DRAM bandwidth), "
        "summed (pipeline/roofline). Measured = ONNX Runtime's profiler, kernel time per node summed per "
        f"category, median over requests ({RUNS[1]} after {RUNS[0]} warm-up; a prefill over 1,024 tokens "
        f"{LONG_RUNS[1]} after {LONG_RUNS[0]}, one profile), the graph as saved, the engine's intra-op threads; "
        "each point profiled again in whole --repeat times and the median profile kept (the profiles column "
        "lists each). Efficiency = floor / measured: 1 would be the roofline; nothing is calibrated.", "",
        *_spread_lines(rows, skipped),
        "## Whole steps", "", *_whole_steps(rows), "",
        "## Where to look: the category furthest above its floor", "", *_furthest(rows), "",
        "## Per category", "", measured.markdown([r.check for r in rows]), ""])


def sections(roots: list[Path], names: list[str]) -> str:
    """Each engine's report section ("where the time goes against the floor") as the validate
    stage now writes it, made on the built folders (those built before it have none)."""
    from pipeline import workloads
    from pipeline.render import roofline_markdown
    from pipeline.roofline import report_section

    out = [f"# The report's roofline section on built engines, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
           "", "roofline/report_section.py on each folder's ONNX Runtime engine (what `pipeline run` now writes "
           "into report.json and report.md); the p50 beside each point is the folder's report, where it has one.", ""]
    for name in names:
        found = find(name, roots)
        if found is None:
            out += [f"## {name}", "", "not built", ""]
            continue
        recipe, store = found
        for engine in engines_of(recipe, store):
            e, t0 = engine.entry, time.time()
            section = report_section.check(recipe, workloads.of(recipe), "onnxruntime", engine.path,
                                           e.device if e else "cpu",
                                           engine.threads, e.generation if e else None,
                                           e.latency_ms.p50 if e and e.latency_ms else None)
            out += [f"## {name}/{engine.target} ({store.dir})", "",
                    f"Made in {time.time() - t0:.1f} s; 1-minute load {os.getloadavg()[0]:.2f}",
                    *roofline_markdown.markdown(section.model_dump(mode="json")), ""]
    return "\n".join(out)


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        if "=" not in v:
            raise SystemExit(f"{what} {v!r}: expected RECIPE=VALUE")
        k, _, rest = v.partition("=")
        out[k] = rest
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipes", nargs="*")
    parser.add_argument("--all", action="store_true", help="Every recipes/*.yaml.")
    parser.add_argument("--engines", type=Path, action="append", help="Engines folder (repeatable; first wins).")
    parser.add_argument("--long", action="append", default=[], help="RECIPE=TOKENS: also profile that prefill.")
    parser.add_argument("--skip", action="append", default=[], help="RECIPE=REASON: not measured, and why.")
    parser.add_argument("--repeat", type=int, default=3, help="Whole profiles per point (the median is kept).")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sections", type=Path, help="Also write each engine's report section into this file.")
    parser.add_argument("--section-recipes", default="", help="Comma-separated: the sections of these only.")
    args = parser.parse_args()
    roots = args.engines or [Path("engines")]
    names = sorted(p.stem for p in Path("recipes").glob("*.yaml")) if args.all else args.recipes
    skipped = _pairs(args.skip, "--skip")
    longs = {k: int(v) for k, v in _pairs(args.long, "--long").items()}
    t0, load0 = time.time(), os.getloadavg()
    rows = measure(roots, names, longs, args.repeat, skipped)
    args.out.write_text(markdown(rows, roots, skipped) + f"\nTook {time.time() - t0:,.0f} s; load averages "
                        f"(1/5/15 min) {' / '.join(f'{x:.2f}' for x in load0)} at the start, "
                        f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())} at the end.\n")
    args.out.with_suffix(".json").write_text(json.dumps(
        {"rows": [{**{k: v for k, v in asdict(r).items() if k != "check"}, "check": asdict(r.check)} for r in rows],
         "skipped": skipped}, indent=1))
    if args.sections:
        chosen = [n for n in args.section_recipes.split(",") if n] or [n for n in names if n not in skipped]
        args.sections.write_text(sections(roots, chosen))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
