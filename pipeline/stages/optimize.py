"""optimize: the exported graph -> optimized.onnx, through the recipe's ordered graph passes.

Each pass (pipeline/passes) gets a copy of the last good graph. Its output is checked
against that input graph on the same feeds (the profile's min, opt and max shapes) in real
ONNX Runtime sessions: a pass that crashes, writes an invalid model or moves any output
beyond `optimize.tolerance` is rejected, with the pass, the output and the worst difference
named, and the chain goes on from the last good graph (`strict: true` stops the run).
Finally the optimized graph and the exported one are timed interleaved in one process.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline import data, passes
from pipeline.bench import timing
from pipeline.core import stats
from pipeline.core.errors import RecipeError, StageFailed
from pipeline.core.json_object import JsonObject
from pipeline.core.text import speedup
from pipeline.metrics import accuracy as metrics
from pipeline.metrics import graph_check
from pipeline.recipe import LatencySpec, Recipe
from pipeline.stages import Produced

FeedsByPoint = dict[str, data.Feed]  # profile point (min, opt, max) -> its feed

NAME = "optimize"
SECTIONS = ("optimize", "inputs", "outputs")
CHECK_POINTS = ("min", "opt", "max")
# Enough to see a fusion's effect beyond noise on small models without slowing every run.
DEFAULT_LATENCY = LatencySpec(warmup=20, iterations=200, min_seconds=0.25, block=20)
NO_MATCH = "no match: the pass found nothing to rewrite (graph unchanged)"


def spec(recipe: Recipe) -> JsonObject:
    """The cache key's recipe part: the check and timing feeds are random from the data seed
    (and take the generation forms for a generation workload); the rest of `data` is not
    read here, so recipes that differ only there share one optimized graph."""
    return {**recipe.section(*SECTIONS), "data_seed": recipe.data.seed,
            "workload_kind": recipe.workload.kind}


def enabled(recipe: Recipe) -> bool:
    return bool(recipe.optimize.passes)


def preflight(recipe: Recipe) -> None:
    """The options of the recipe's passes, as far as the schema cannot check them (which
    fusions onnxscript knows): a wrong name stops the run before the export."""
    for name in recipe.optimize.passes:
        passes.check_options(name, recipe.optimize.options.get(name, {}))


def check_feeds(recipe: Recipe) -> FeedsByPoint:
    """One feed per profile point, from a stream no other stage draws from.

    A generation recipe's graph is run in two forms only: a prefill (empty past, any batch) or
    a decode step (one token), and at batch 1 a turn that appends several tokens to a kept
    context. A point that is none of these (batch > 1, several new tokens over a past) is
    checked as its prefill and its decode step instead: ORT's GroupQueryAttention, like the
    genai builder's graphs, refuses that form, and no runner feeds it. So is a point longer
    than the workload's longest context (the profile's largest past with its largest prompt:
    for SmolLM2 at 5,120 tokens a 10,272-token attention that no runner reaches, whose check
    needed 22.8 GB), its decode step over at most that context."""
    import numpy as np

    rng = np.random.default_rng([recipe.data.seed, 97])
    feeds = {point: data.random_feed(recipe.inputs, point, rng) for point in CHECK_POINTS}
    if not recipe.workload.kv_cache:
        return feeds
    out, context = {}, recipe.workload.context_max()
    for point, feed in feeds.items():
        ids, mask = feed["input_ids"], feed["attention_mask"]
        b, t = ids.shape
        past = mask.shape[1] - t
        if t == 1 or past == 0 or (b == 1 and past + t <= context):
            out[point] = feed
            continue
        past = min(past, context - 1)
        pasts = {k: v[:, :, :past] for k, v in feed.items() if k not in ("input_ids", "attention_mask")}
        out[f"{point}:prefill"] = {"input_ids": ids, "attention_mask": mask[:, :t],
                                   **{k: v[:, :, :0] for k, v in pasts.items()}}
        out[f"{point}:decode"] = {"input_ids": ids[:, :1], "attention_mask": mask[:, :past + 1], **pasts}
    return out


def _apply(name: str, model: Path, options: dict):
    """Run one pass on a copy of the graph at `model`: (new model or None, info, error or None,
    seconds)."""
    import onnx

    work = onnx.load(str(model))
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


def trimmed_outputs(recipe: Recipe) -> list[str]:
    """The outputs checked at their last positions only (graph_check.last_positions): a
    generation graph's logits; its presents, and every output of other graphs, whole."""
    if not recipe.workload.kv_cache:
        return []
    return [o for o in recipe.outputs if not o.startswith("present")]


def run(recipe: Recipe, graph, workdir: Path, verbose: bool = False) -> Produced:
    import onnx

    spec = recipe.optimize
    # Build memory (issue 37): the last good graph and the candidate wait on disk, not in
    # memory, while a check runs (ONNX Runtime reads them from their files); a generation
    # graph's long logits are cut and its checks run without ORT's arena.
    current, candidate_path = workdir / "current.onnx", workdir / "candidate.onnx"
    exported = onnx.load(str(graph.path))  # external data, if the export wrote any, read in
    data = exported.SerializeToString()
    before = ops_before = passes.histogram(exported)
    del exported
    current.write_bytes(data)
    digest, exported_size = hashlib.sha256(data).digest(), len(data)
    del data
    named, trim = check_feeds(recipe), trimmed_outputs(recipe)
    feeds, arena = list(named.values()), not trim
    first_reference = reference = graph_check.run(str(current), feeds, recipe.outputs, trim=trim,
                                                  arena=arena)
    records = []
    for name in spec.passes:
        candidate, info, error, seconds = _apply(name, current, spec.options.get(name, {}))
        after, size, new_digest = {}, None, None
        if candidate is not None:
            after, data = passes.histogram(candidate), candidate.SerializeToString()
            del candidate
            size, new_digest = len(data), hashlib.sha256(data).digest()
            candidate_path.write_bytes(data)
            del data
        unchanged = error is None and new_digest == digest
        if unchanged:  # found nothing to rewrite: said so, never "accepted" (nothing to check)
            error = NO_MATCH
        elif error is None:
            verdict = graph_check.judge(str(candidate_path), feeds, recipe.outputs, reference,
                                        spec.tolerance.max_abs, spec.tolerance.cosine_min, trim, arena)
            error = verdict.reason
        records.append({
            "name": name, "summary": passes.PASSES[name].summary,
            "status": "accepted" if error is None else "no match" if unchanged else "rejected",
            "reason": error,
            "seconds": round(seconds, 3),
            "nodes_before": sum(before.values()), "nodes_after": sum(after.values()) if after else None,
            "ops_before": before, "ops_after": after or None,
            "fused": passes.fusions(before, after) if after else {},
            "bytes_before": current.stat().st_size,
            "bytes_after": size,
            "check": verdict.accuracy if size is not None and not unchanged else {},
            "info": info,
        })
        if error is None:
            candidate_path.replace(current)
            digest, reference, before = new_digest, verdict.outputs, after
        if error is not None and spec.strict and not unchanged:
            raise StageFailed(f"optimize: pass `{name}` rejected: {error}",
                              "remove the pass from optimize.passes, or set optimize.strict: false")
    candidate_path.unlink(missing_ok=True)

    out_path = workdir / "optimized.onnx"
    current.replace(out_path)
    accepted = [r["name"] for r in records if r["status"] == "accepted"]
    ops_after = before  # the last good graph's
    drift = metrics.compare(first_reference, reference, top1_outputs=[])  # final vs exported
    del reference, first_reference
    return Produced({"optimized.onnx": out_path}, {
        "passes": records,
        "accepted": accepted,
        "rejected": [r["name"] for r in records if r["status"] == "rejected"],
        "no_match": [r["name"] for r in records if r["status"] == "no match"],
        "nodes_before": sum(ops_before.values()), "nodes_after": sum(ops_after.values()),
        "ops_before": ops_before, "ops_after": ops_after,
        "fused": passes.fusions(ops_before, ops_after),
        "bytes_before": exported_size, "bytes_after": out_path.stat().st_size,
        "tolerance": spec.tolerance.model_dump(),
        "check_feeds": {p: {k: list(v.shape) for k, v in f.items()} for p, f in named.items()},
        "checked_last_positions": ({"outputs": trim, "positions": graph_check.LAST_POSITIONS}
                                   if trim else None),
        "drift_vs_export": {k: d.dump() for k, d in metrics.drifts(drift).items()},
        "latency": _latency(recipe, str(graph.path), str(out_path)).dump() if accepted else None,
    })


@dataclass(frozen=True)
class GraphLatency:
    """The exported and the optimized graph timed interleaved: each one's latency, the
    optimized one's speed-up, how it was measured."""

    exported_ms: stats.Summary
    optimized_ms: stats.Summary
    speedup: stats.SpeedupEstimate
    method: str

    def dump(self) -> JsonObject:
        return {"exported_ms": self.exported_ms.dump(), "optimized_ms": self.optimized_ms.dump(),
                "speedup": self.speedup.dump(), "method": self.method}


def _latency(recipe: Recipe, exported: str, optimized: str) -> GraphLatency:
    """Exported vs optimized graph (their files), interleaved in one process (ORT CPU, its own
    optimizer on)."""
    spec = recipe.optimize.latency or DEFAULT_LATENCY
    feed = data.feeds(recipe, "export")[0]  # the opt point, as validation times engines
    runners = [graph_check.Timed(m, recipe.outputs, None, spec.spin) for m in (exported, optimized)]
    base_blocks, opt_blocks = timing.time_interleaved(runners, feed, spec)
    return GraphLatency(
        exported_ms=stats.summary(base_blocks), optimized_ms=stats.summary(opt_blocks),
        speedup=stats.speedup(base_blocks, opt_blocks, noise=spec.noise_threshold),
        method=f"ONNX Runtime CPU sessions (graph optimization `extended`, as the default "
               f"engine build) on the opt-shape feed; {spec.warmup} warm-up requests, then "
               f"blocks of {spec.block} interleaved in one process, >= {spec.iterations} "
               f"requests each; speedup: {stats.ratio_method(spec.noise_threshold)}")


def summary(meta: dict) -> str:
    """One line for the terminal (rich markup): nodes, fusions and rejected passes."""
    from pipeline.core.text import escape  # markup and control characters

    fused = ", ".join(f"{op} x{n}" for op, n in meta["fused"].items()) or "no fusions"
    line = f"{meta['nodes_before']} -> {meta['nodes_after']} nodes; {fused}"
    for r in meta["passes"]:
        if r["status"] == "rejected":
            line += f"; [yellow]rejected {r['name']}[/]: {escape(r['reason'])}"
        elif r["status"] == "no match":
            line += f"; {r['name']}: no match"
    lat = meta.get("latency")
    if lat:
        s = lat["speedup"]
        line += f"; optimized vs exported, {speedup(s['ratio'])} ({s['verdict']})"
    return line
