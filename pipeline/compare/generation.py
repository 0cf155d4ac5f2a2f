"""`pipeline compare A B` for generation recipes: time per task, and where the time went.

1. Each recipe is run up to its report (cached stages are reused); their workloads must be
   the same script (else the comparison is refused: exit 2).
2. The task is timed on every onnxruntime engine the recipes share, interleaved in one
   process (the IOBinding loop: the task has turns). B against A: time per task, and per
   phase, prefill (every turn's) and decode (every step), each a time ratio with a 95%
   interval over the rounds and a verdict.
3. Then by op category: ONNX Runtime per-node profiles of each engine on a prefill feed and
   on a decode feed (a one-token step over a cache as long as the task's context), sessions
   taking turns, grouped into categories (explain.profile).

Writes engines/compare/<A>-vs-<B>/compare-generation.{json,md}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline import backends
from pipeline.artifacts.comparison import CompareMethod
from pipeline.backends import engine_name
from pipeline.compare import generation_scores
from pipeline.core import safe_files, stats
from pipeline.core.errors import RecipeError
from pipeline.data.feeds import Feed
from pipeline.explain.profile import CategoryTimes
from pipeline.generation import figures as gm
from pipeline.generation.decoder import eos_token, workload_requests
from pipeline.generation.runners import OrtLoopRunner
from pipeline.generation.timed_requests import measure
from pipeline.recipe import Recipe
from pipeline.recipe.workload import decoder_shape, kv_names
from pipeline.store.folder_names import folder_name
from pipeline.store.recipe_folder import Store, now
from pipeline.workloads.base import Compared, compare_folder, shared_targets

SCHEMA = 1
PHASES = ("task", "prefill", "decode")
PhaseFeeds = dict[str, Feed]  # a profiled phase (prefill, decode) -> its feed
# phase -> engine -> its profiled time by op category
PhaseProfiles = dict[str, dict[str, CategoryTimes]]


def check_comparable(recipes: list[Recipe]) -> None:
    """Before anything is built (the command checked they are all generation recipes): the
    same script of requests and the same vocabulary."""
    first = recipes[0]
    for other in recipes[1:]:
        mine = first.workload.model_dump(exclude={"rounds", "warmup"})
        theirs = other.workload.model_dump(exclude={"rounds", "warmup"})
        if mine != theirs:
            raise RecipeError(f"compare: `{other.name}` runs another workload than `{first.name}`",
                              "give both recipes the same workload: section")
        if decoder_shape(first.model).vocab != decoder_shape(other.model).vocab:
            raise RecipeError(f"compare: `{other.name}` has another vocabulary than `{first.name}`")


@dataclass(frozen=True)
class PhaseBlocks:
    """Per round ns of one runner: the whole request, its prefills, its decode steps."""

    task: np.ndarray
    prefill: np.ndarray
    decode: np.ndarray


def _phase_blocks(traces) -> PhaseBlocks:
    return PhaseBlocks(task=gm.total_blocks(traces),
                       prefill=np.array([[sum(t.ttft_ns)] for t in traces], dtype=np.float64),
                       decode=np.array([[sum(map(sum, t.step_ns))] for t in traces], dtype=np.float64))


def _profile_feeds(recipe: Recipe, context: int) -> PhaseFeeds:
    shape = decoder_shape(recipe.model)
    rng = np.random.default_rng([recipe.data.seed, 5])
    prompt = recipe.workload.task[0].prompt
    names, _ = kv_names(shape.layers)

    def feed(t: int, p: int) -> Feed:
        return {"input_ids": rng.integers(0, shape.vocab - 1, size=(1, t), dtype=np.int64),
                "attention_mask": np.ones((1, p + t), np.int64),
                **{n: rng.standard_normal((1, shape.kv_heads, p, shape.head_dim)).astype(np.float32)
                   for n in names}}

    return {"prefill": feed(prompt, 0), "decode": feed(1, context)}


def _loop_runs(entry: dict) -> bool:
    """The IOBinding loop drives engines that are ONNX graphs (the backend says so)."""
    return bool(getattr(backends.lookup(entry["kind"]), "ENGINE_IS_ONNX", False))


def compare(recipes: list[Recipe], reports: dict[str, dict], root: Path, progress) -> Compared:
    """reports: each recipe's report.json, built (check_comparable ran before)."""
    from pipeline.artifacts import dump
    from pipeline.artifacts.comparison import GenerationCompare

    first, spec = recipes[0], recipes[0].workload
    shared = shared_targets(recipes, reports, _loop_runs)
    if not shared:
        raise RecipeError("compare: the recipes share no built engine that is an ONNX graph")
    # the task (turns, short prompts) and, when the workload has one, the long point
    points = [r for r in workload_requests(first) if r.kind in ("task", "long")]
    noise = first.validate_.latency.noise_threshold
    engines, versus, profiles = {"task": {}, "long": {}}, {"task": [], "long": []}, {}
    for tid in shared:
        paths, runners = _engines_of(recipes, root, tid)
        for request in points:
            with progress.stage(f"compare: {request.label} on {tid}"):
                traces = measure(runners, request, spec)
            blocks = {k: _phase_blocks(v) for k, v in traces.items()}
            for key, v in traces.items():
                engines[request.kind][key] = dump(gm.summarize(request, v))
            a = f"{first.name}/{tid}"
            for other in recipes[1:]:
                b = f"{other.name}/{tid}"
                versus[request.kind].append({"a": a, "b": b, **{
                    phase: stats.compare(getattr(blocks[a], phase), getattr(blocks[b], phase), noise=noise)
                    for phase in PHASES}})
        with progress.stage(f"compare: profiles of {tid}"):
            profiles[tid] = _profiles(first, paths)
    folder = compare_folder(root, recipes)
    result = GenerationCompare.model_validate({
        "schema": SCHEMA, "workload": "generation", "created": now(), "recipes": [r.name for r in recipes],
        "reference": first.name, "shared_targets": shared, "task": [t.model_dump() for t in spec.task],
        "engines": engines["task"], "versus": versus["task"], "profiles": profiles,
        "long": {"prompt": spec.long.prompt, "new_tokens": spec.long.new_tokens,
                 "engines": engines["long"], "versus": versus["long"]} if spec.long else None,
        "scores": generation_scores.scores([r.name for r in recipes], reports, shared),
        "reports": {r.name: {e["target"]: (e.get("generation") or {}).get("time_per_task_s")
                             for e in reports[r.name]["engines"]} for r in recipes},
        "method": _method(spec, noise),
    })
    written = dump(result)
    safe_files.write_atomic(folder / "compare-generation.json", json.dumps(written, indent=2) + "\n")
    safe_files.write_atomic(folder / "compare-generation.md", markdown(written))
    return Compared(result, folder, printed=lines(written), files=[folder / "compare-generation.md"])


def _engines_of(recipes: list[Recipe], root: Path, tid: str) -> tuple[dict, dict]:
    """Target `tid`'s verified engine of each recipe: ({recipe: path}, {"recipe/tid": its
    IOBinding loop runner})."""
    paths, runners = {}, {}
    for r in recipes:
        target = next(t for t in r.targets if t.id == tid)
        paths[r.name] = Store(root, folder_name(r)).verify(engine_name(target)).path
        runners[f"{r.name}/{tid}"] = OrtLoopRunner(paths[r.name], eos_token(r), r.validate_.threads)
    return paths, runners


def _profiles(first: Recipe, paths: dict[str, Path]) -> PhaseProfiles:
    """Per phase (prefill, decode) and engine, its time by op category (explain.profile)."""
    from pipeline.explain import profile

    feeds = _profile_feeds(first, first.workload.context_max() - 1)
    return {phase: {name: p.category_times() for name, p in profile.profile_sessions(
        paths, feed, runs=20, warmup=3, threads=first.validate_.threads).items()}
        for phase, feed in feeds.items()}


def _method(spec, noise: float) -> CompareMethod:
    """How the timing and the profiles were measured, in words (the result's `method`)."""
    return CompareMethod(
        timing=f"the task ({len(spec.task)} turns)"
               + (f" and the long point ({spec.long.prompt}-token prompt of held-out text)"
                  if spec.long else "")
               + f" on each engine through the IOBinding loop, {spec.warmup} warm-up, "
               f"{spec.rounds} rounds taking turns in one process; ratio = B time / A "
               "time: " + stats.ratio_method(noise),
        profiles="ONNX Runtime profiler per node, sessions taking turns, median of 20 "
                 "runs after 3 warm-up, on one prefill feed (the task's first prompt, "
                 "empty cache) and one decode feed (one token over the workload's "
                 "longest context)")


def _words(c: dict) -> str:
    lo, hi = c["ci95"]
    return f"{c['time_ratio']:.2f}x (95% CI {lo:.2f}-{hi:.2f}, {c['verdict']})"


def lines(result: dict) -> list[str]:
    """The verdicts, one line each: time per task, then per phase; the long point's the same."""
    out = []
    for v in result["versus"]:
        out.append(f"{v['b']} vs {v['a']}: time per task {_words(v['task'])}; "
                   f"prefill {_words(v['prefill'])}; decode {_words(v['decode'])}")
    long = result.get("long")
    for v in (long or {}).get("versus", []):
        out.append(f"{v['b']} vs {v['a']}, long point ({long['prompt']}-token prompt + "
                   f"{long['new_tokens']}): whole request {_words(v['task'])}; prefill "
                   f"{_words(v['prefill'])}; decode {_words(v['decode'])}")
    return out + generation_scores.lines(result.get("scores") or {})


def markdown(result: dict) -> str:
    md = [f"# Generation: {' vs '.join(result['recipes'])}", "", f"- created: {result['created']}",
          f"- timing: {result['method']['timing']}", f"- profiles: {result['method']['profiles']}", "",
          "## Time per task and at the long point (B time / A time; > 1: B is slower)", ""]
    md += [f"- {line}" for line in lines(result)]
    md += generation_scores.markdown(result.get("scores") or {})
    md += ["", "| engine | time per task s | prefill s | decode s | TTFT p50 ms | TPOT p50 ms |",
           "|---|---|---|---|---|---|"]
    long = result.get("long") or {}
    for point, by_engine in (("task", result["engines"]), ("long", long.get("engines", {}))):
        for name, e in by_engine.items():
            label = name if point == "task" else f"{name}, long point"
            md.append(f"| {label} | {e['time_s']:.4f} | {e['phases_s']['prefill']:.4f} | "
                      f"{e['phases_s']['decode']:.4f} | {e['ttft_ms']['p50']:.3f} | {e['tpot_ms']['p50']:.3f} |")
    for tid, phases in result["profiles"].items():
        for phase, by_engine in phases.items():
            cats = sorted({c for p in by_engine.values() for c in p if c != "total_us"})
            md += ["", f"### {tid}, {phase}: profiled microseconds per request by op category", "",
                   "| engine | total | " + " | ".join(cats) + " |", "|---" * (len(cats) + 2) + "|"]
            for name, p in by_engine.items():
                md.append(f"| {name} | {p['total_us']:.0f} | " + " | ".join(f"{p.get(c, 0):.0f}" for c in cats) + " |")
    return "\n".join(md) + "\n"
