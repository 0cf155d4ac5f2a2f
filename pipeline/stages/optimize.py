"""optimize: the exported graph -> optimized.onnx, through the recipe's ordered graph passes.

Each pass (pipeline/passes) gets a copy of the last good graph. Its output is checked
against that input graph on the same feeds (the profile's min, opt and max shapes) in real
ONNX Runtime sessions: a pass that crashes, writes an invalid model or moves any output
beyond `optimize.tolerance` is rejected, with the pass, the output and the worst difference
named, and the chain goes on from the last good graph (`strict: true` stops the run).
Finally the optimized graph and the exported one are timed interleaved in one process.
"""

from __future__ import annotations

import time
from pathlib import Path

from pipeline import data, passes
from pipeline.bench import stats, timing
from pipeline.errors import RecipeError, StageFailed
from pipeline.metrics import accuracy as metrics
from pipeline.passes import check
from pipeline.recipe import LatencySpec, Recipe
from pipeline.stages import Produced
from pipeline.text import speedup

NAME = "optimize"
SECTIONS = ("optimize", "inputs", "outputs", "data")
CHECK_POINTS = ("min", "opt", "max")
# Enough to see a fusion's effect beyond noise on small models without slowing every run.
DEFAULT_LATENCY = LatencySpec(warmup=20, iterations=200, min_seconds=0.25, block=20)


def enabled(recipe: Recipe) -> bool:
    return bool(recipe.optimize.passes)


def preflight(recipe: Recipe) -> None:
    """No user error of its own to find early: its passes and options are checked by the recipe schema."""


def spec(recipe: Recipe) -> dict:
    return recipe.section(*SECTIONS)


def check_feeds(recipe: Recipe) -> list[data.Feed]:
    """One feed per profile point, from a stream no other stage draws from."""
    import numpy as np

    rng = np.random.default_rng([recipe.data.seed, 97])
    return [data.random_feed(recipe.inputs, point, rng) for point in CHECK_POINTS]


def _apply(name: str, model, options: dict):
    """Run one pass on a copy of `model`: (new model or None, info, error or None, seconds)."""
    import onnx

    work = onnx.ModelProto()
    work.CopyFrom(model)
    t0 = time.perf_counter()
    try:
        out = passes.load(name)(work, **options)
    except RecipeError:  # the options are wrong, not the graph: the user's to fix
        raise
    except Exception as e:  # a pass may fail in any way on a graph it does not fit
        first = (str(e).strip().splitlines() or [""])[0][:300]
        return None, {}, f"the pass failed: {type(e).__name__}: {first}", time.perf_counter() - t0
    model_out, info = out if isinstance(out, tuple) else (out, {})
    return model_out, info, None, time.perf_counter() - t0


def run(recipe: Recipe, graph, workdir: Path, verbose: bool = False) -> Produced:
    import onnx

    spec = recipe.optimize
    exported = onnx.load(str(graph.path))
    feeds = check_feeds(recipe)
    first_reference = reference = check.run(exported.SerializeToString(), feeds, recipe.outputs)
    current, records = exported, []
    for name in spec.passes:
        before = passes.histogram(current)
        candidate, info, error, seconds = _apply(name, current, spec.options.get(name, {}))
        if error is None:
            verdict = check.judge(candidate, feeds, recipe.outputs, reference,
                                  spec.tolerance.max_abs, spec.tolerance.cosine_min)
            error = verdict.reason
        after = passes.histogram(candidate) if candidate is not None else {}
        records.append({
            "name": name, "summary": passes.PASSES[name].summary,
            "status": "accepted" if error is None else "rejected", "reason": error,
            "seconds": round(seconds, 3),
            "nodes_before": sum(before.values()), "nodes_after": sum(after.values()) if after else None,
            "ops_before": before, "ops_after": after or None,
            "fused": passes.fusions(before, after) if after else {},
            "bytes_before": current.ByteSize(),
            "bytes_after": candidate.ByteSize() if candidate is not None else None,
            "check": verdict.accuracy if candidate is not None else {},
            "info": info,
        })
        if error is None:
            current, reference = candidate, verdict.outputs
        elif spec.strict:
            raise StageFailed(f"optimize: pass `{name}` rejected: {error}",
                              "remove the pass from optimize.passes, or set optimize.strict: false")

    out_path = workdir / "optimized.onnx"
    onnx.save(current, str(out_path))
    accepted = [r["name"] for r in records if r["status"] == "accepted"]
    ops_before, ops_after = passes.histogram(exported), passes.histogram(current)
    drift = metrics.compare(first_reference, reference, top1_outputs=[])  # final vs exported
    return Produced({"optimized.onnx": out_path}, {
        "passes": records,
        "accepted": accepted,
        "rejected": [r["name"] for r in records if r["status"] == "rejected"],
        "nodes_before": sum(ops_before.values()), "nodes_after": sum(ops_after.values()),
        "ops_before": ops_before, "ops_after": ops_after,
        "fused": passes.fusions(ops_before, ops_after),
        "bytes_before": exported.ByteSize(), "bytes_after": current.ByteSize(),
        "tolerance": spec.tolerance.model_dump(),
        "check_feeds": {p: {k: list(v.shape) for k, v in f.items()} for p, f in zip(CHECK_POINTS, feeds)},
        "drift_vs_export": {k: {"max_abs": m["max_abs"], "cosine": m["cosine"]} for k, m in drift.items()},
        "latency": _latency(recipe, exported, current) if accepted else None,
    })


def _latency(recipe: Recipe, exported, optimized) -> dict:
    """Exported vs optimized graph, interleaved in one process (ORT CPU, its own optimizer on)."""
    spec = recipe.optimize.latency or DEFAULT_LATENCY
    feed = data.feeds(recipe, "export")[0]  # the opt point, as validation times engines
    runners = [check.Timed(m.SerializeToString(), recipe.outputs, None, spec.spin)
               for m in (exported, optimized)]
    base_blocks, opt_blocks = timing.time_interleaved(runners, feed, spec)
    return {
        "exported_ms": stats.summary(base_blocks),
        "optimized_ms": stats.summary(opt_blocks),
        "speedup": stats.speedup(base_blocks, opt_blocks, noise=spec.noise_threshold),
        "method": f"ONNX Runtime CPU sessions (graph optimization `extended`, as the default "
                  f"engine build) on the opt-shape feed; {spec.warmup} warm-up requests, then "
                  f"blocks of {spec.block} interleaved in one process, >= {spec.iterations} "
                  f"requests each; speedup: {stats.ratio_method(spec.noise_threshold)}",
    }


def summary(meta: dict) -> str:
    """One line for the terminal (rich markup): nodes, fusions and rejected passes."""
    from pipeline.text import escape  # markup and control characters

    fused = ", ".join(f"{op} x{n}" for op, n in meta["fused"].items()) or "no fusions"
    line = f"{meta['nodes_before']} -> {meta['nodes_after']} nodes; {fused}"
    for r in meta["passes"]:
        if r["status"] == "rejected":
            line += f"; [yellow]rejected {r['name']}[/]: {escape(r['reason'])}"
    lat = meta.get("latency")
    if lat:
        s = lat["speedup"]
        line += f"; optimized vs exported, {speedup(s['ratio'])} ({s['verdict']})"
    return line
