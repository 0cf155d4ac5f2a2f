"""Predicted against measured on this machine: each engine's roofline floor per op category
beside ONNX Runtime's profiled kernel time, at the workload's points.

    PYTHONPATH=. python benchmarks/roofline.py --engines /work/after/engines \
        lm-fp32 standard-int8 smollm2-int4 --long 5120 --out benchmarks/results/roofline-DATE.md

For each built ONNX Runtime engine of each recipe (its folder verified against its manifest):
the points `pipeline predict` costs (generation: prefill at the first prompt length, a decode
step at batch 1 in the middle of its generation, and with --long a prefill of that many
tokens; forward: the batch dim's min/opt/max), each profiled (explain/profile.py: kernel time
per node, median over requests, sessions at the engine's threads) and costed on this machine's
hardware entry (`pipeline hw`, cached). Efficiency = floor / measured; nothing is calibrated.
The report's own p50 (TTFT, TPOT, latency), wall-clock with the runtime's overhead and taken on
another day, is shown beside the profile for the whole step. Load averages are printed with
every engine: other processes slow measured times, never the floors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LONG_RUNS = (1, 3)  # warm-up, profiled requests of a long prefill (~15 s each on 2 cores)
RUNS = (2, 10)


def _points(recipe, long: int | None):
    from pipeline.roofline import points

    if recipe.workload.kind != "generation":
        return points.forward_points(recipe)
    spec, first = recipe.workload, recipe.workload.prompt_lengths[0]
    found = [points.Point(f"prefill {first}", "prefill", points.prefill_dims(first), report_key=f"b1-p{first}"),
             points.Point(f"decode @{first + spec.new_tokens // 2}", "decode",
                          points.decode_dims(first + spec.new_tokens // 2), report_key=f"b1-p{first}")]
    if long:
        found.append(points.Point(f"prefill {long}", "prefill", points.prefill_dims(long)))
    return found


def _report_p50(entry, point) -> float | None:
    from pipeline.roofline.predict import _measured

    return _measured(entry, point)


def measure(engines: Path, names: list[str], long: int | None, repeat: int) -> list[dict]:
    from pipeline.artifacts import recorded
    from pipeline.hardware import database
    from pipeline.roofline import measured
    from pipeline.store import folder_names
    from pipeline.store.recipe_folder import Store

    here = database.this_machine().entry
    rows = []
    for name in names:
        recipe = folder_names.load(name, (), engines)
        store = Store(engines, folder_names.folder_name(recipe))
        report = recorded.report(store.read_json("report.json"))
        for entry in report.engines:
            if entry.status != "built" or entry.kind != "onnxruntime":
                continue
            path = store.verify(Path(entry.path).name).path
            threads = entry.threads or recipe.validate_.threads
            for point in _points(recipe, long):
                warmup, runs = LONG_RUNS if point.dims.get("sequence", 0) > 1024 else RUNS
                tries, loads, t0 = [], [], time.time()
                for _ in range(repeat):  # whole profiles again: a busy machine's slow one is set aside
                    loads.append(os.getloadavg()[0])
                    tries += measured.check(recipe, entry.target, path, here, [point], threads, runs, warmup)
                    print(f"  {tries[-1].engine} {point.label}: profile {tries[-1].measured_us / 1e3:.3f} ms "
                          f"(load {loads[-1]:.2f})", flush=True)
                check = sorted(tries, key=lambda c: c.measured_us)[len(tries) // 2]  # the median profile
                rows.append({"check": check, "report_p50_ms": _report_p50(entry, point),
                             "profiles_ms": [c.measured_us / 1e3 for c in tries], "load": loads,
                             "seconds": time.time() - t0})
                print(f"{check.engine} {check.point}: floor {check.floor_us / 1e3:.3f} ms, median profile "
                      f"{check.measured_us / 1e3:.3f} ms, efficiency {check.efficiency:.2f}", flush=True)
    return rows


def _whole_steps(rows: list[dict]) -> list[str]:
    lines = ["| engine | point | threads | floor | profile (kernel sum, median) | floor / profile | "
             "profiles (each) | report p50 (wall) | floor / report | 1-min load avg at each |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for r in rows:
        c, wall = r["check"], r["report_p50_ms"]
        lines.append(f"| {c.engine} | {c.point} | {c.threads or 'default'} | {c.floor_us / 1e3:,.3f} ms | "
                     f"{c.measured_us / 1e3:,.3f} ms | {c.efficiency:.2f} | "
                     f"{', '.join(f'{x:,.1f}' for x in r['profiles_ms'])} | "
                     f"{f'{wall:,.3f} ms' if wall else '-'} | {f'{c.floor_us / 1e3 / wall:.2f}' if wall else '-'} | "
                     f"{', '.join(f'{x:.2f}' for x in r['load'])} |")
    return lines


def _furthest(rows: list[dict]) -> list[str]:
    """Per point, the category with the most time above its floor (measured - floor)."""
    lines = []
    for r in rows:
        c = r["check"]
        worst = max(c.categories, key=lambda k: k.measured_us - k.floor_us)
        eff = f"{worst.efficiency:.2f}" if worst.efficiency is not None else "-"
        lines.append(f"- {c.engine} {c.point}: **{worst.category}**, {(worst.measured_us - worst.floor_us) / 1e3:,.3f} ms "
                     f"above its floor (efficiency {eff}, {worst.bound}-bound floor)")
    return lines


def markdown(rows: list[dict], engines: Path) -> str:
    import onnxruntime as ort

    from pipeline.core import deps
    from pipeline.hardware import database
    from pipeline.roofline import measured

    entry = database.this_machine().entry
    checks = [r["check"] for r in rows]
    median, worst = measured.spread(checks)
    peaks = ", ".join(f"{p.dtype} {p.ops_per_s / 1e9:,.0f} G/s ({p.isa}, {p.threads} thr)"
                      for p in entry.peaks if p.present)
    mem = ", ".join(f"{b.level} {b.bytes_per_s / 1e9:,.0f} GB/s ({b.threads} thr)" for b in entry.bandwidth)
    return "\n".join([
        f"# Roofline floors against ONNX Runtime profiles, {time.strftime('%Y-%m-%d')}", "",
        f"Machine: {deps.device_line(deps.device())}; onnxruntime {ort.__version__}. Engines: {engines} "
        "(built earlier; folders verified against their manifests).", "",
        f"Hardware entry (`pipeline hw`, measured {entry.source.date}; {entry.source.notes}): peaks {peaks}; "
        f"bandwidth {mem}.", "",
        "How: `PYTHONPATH=. python benchmarks/roofline.py` (this file's command line is in its docstring). "
        "Floor per node = max(FLOPs / the peak of its type at the engine's threads, bytes / DRAM bandwidth), "
        "summed (pipeline/roofline). Measured = ONNX Runtime's profiler, kernel time per node summed per "
        f"category, median over requests ({RUNS[1]} after {RUNS[0]} warm-up; a prefill over 1,024 tokens "
        f"{LONG_RUNS[1]} after {LONG_RUNS[0]}), the graph as saved, the engine's intra-op threads; each point "
        "profiled again in whole --repeat times and the median profile kept (the profiles column lists each). "
        "Efficiency = floor / measured: 1 would be the roofline; nothing is calibrated.", "",
        f"**Spread over the {len(checks)} points: median whole-step efficiency {median:.2f}, worst {worst:.2f}.**", "",
        "## Whole steps", "", *_whole_steps(rows), "",
        "## Where to look: the category furthest above its floor", "", *_furthest(rows), "",
        "## Per category", "", measured.markdown(checks), ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipes", nargs="+")
    parser.add_argument("--engines", type=Path, default=Path("engines"))
    parser.add_argument("--long", type=int, default=None, help="Also profile a prefill of this many tokens.")
    parser.add_argument("--repeat", type=int, default=3, help="Whole profiles per point (the median is kept).")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = measure(args.engines, args.recipes, args.long, args.repeat)
    args.out.write_text(markdown(rows, args.engines))
    args.out.with_suffix(".json").write_text(json.dumps(
        [{**{k: v for k, v in r.items() if k != "check"}, "check": asdict(r["check"])} for r in rows], indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
