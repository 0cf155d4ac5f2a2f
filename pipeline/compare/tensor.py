"""How the forward workload's recipes are compared (`pipeline compare`,
commands/compare_recipes.py), with verdicts and explanations:

0. The first recipe's timing feed must fit every other recipe's inputs (check_comparable:
   exit 2 otherwise, before anything is built).
1. Each recipe was run up to its report by the command. Up front: each model's
   parameters and opt shape; where a recipe's model is not the first's (parameters 2x
   apart, another opt shape), compare says so and ranks that first among the causes.
2. Speed: every engine the recipes share (by target id), and each recipe's PyTorch baseline,
   timed interleaved in one process at the first recipe's opt shape; each other recipe is
   compared with the first (B time / A time, 95% interval over the interleaved rounds, verdict).
3. Where the time went: ONNX Runtime per-node profiles of each recipe's first engine that is
   an ONNX graph (its backend's ENGINE_IS_ONNX: onnxruntime),
   grouped into categories; the per-category delta to the first recipe, and tags naming the
   likely causes (explain.causes). The profiled totals are stated beside the measured p50s:
   the profiler adds a cost per node, so it inflates graphs of many small nodes.
4. Where the error came from: for a recipe with a precision stage, intermediate tensors of
   its typed graph against the float graph it was made from (explain.layers).

Writes engines/compare/<A>-vs-<B>.../compare.{json,md,html} and PNG plots.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from pipeline import backends, data
from pipeline.artifacts.comparison import CompareMethod, ModelInfo
from pipeline.artifacts.latency import ColdStart
from pipeline.backends import engine_name
from pipeline.backends.openers import baseline_opener, engine_opener, timing_feed
from pipeline.bench import ab, protocol, sweep
from pipeline.core import stats
from pipeline.core.json_object import JsonObject
from pipeline.explain import causes, layers, profile
from pipeline.explain.causes import EffectiveBar
from pipeline.explain.layers import LayerErrors
from pipeline.recipe import Recipe
from pipeline.store.folder_names import folder_name
from pipeline.store.recipe_folder import Store, now
from pipeline.workloads.base import Compared, built, compare_folder, shared_targets

Differences = dict[str, str]  # recipe -> why its model is not the first recipe's
ModelsInfo = dict[str, ModelInfo]  # recipe -> its exported model's size and opt shape
ErrorsExplained = dict[str, LayerErrors]  # recipe (with a precision stage) -> its layer errors

SCHEMA = 2  # 2: models / models_differ; versus: measured, profiled_total_us


def _profiled(report: JsonObject) -> JsonObject | None:
    """The recipe's engine ONNX Runtime's profiler can read: the first built one (its entry
    in report.json) whose backend's engine is an ONNX graph."""
    return next((e for e in built(report).values()
                 if getattr(backends.lookup(e.get("kind")), "ENGINE_IS_ONNX", False)), None)


def _graph_before_precision(store: Store) -> tuple[Path, Path] | None:
    """(float graph, typed graph) when the recipe ran a precision stage, else None."""
    from pipeline.run.execute import GRAPH_STAGES

    stages = store.manifest.stages
    if "precision" not in stages:
        return None
    earlier = [s for s in GRAPH_STAGES[: GRAPH_STAGES.index("precision")] if s in stages]
    before = stages[earlier[-1]].outputs[0]
    return store.dir / before, store.dir / stages["precision"].outputs[0]


# The effective-precision bar of the "float fallback" tag when the recipe sets none.
DEFAULT_EFFECTIVE_BAR = 0.9
# Parameter counts further apart than this make A and B different models, not variants.
MODEL_SIZE_RATIO = 2.0


def _effective(entry: JsonObject, recipe: Recipe) -> EffectiveBar | None:
    """Effective precision of B's engine against the bar the "float fallback" tag uses: the
    recipe's require_effective_precision on the share its gate judges (attention products
    included), else DEFAULT_EFFECTIVE_BAR on the projections' share (attention products are
    never quantized, so they are no fallback), each saying which it is."""
    eff = entry.get("ort_flop_shares")
    spec = getattr(recipe, "precision", None)
    if not eff:
        return None
    required = getattr(spec, "require_effective_precision", None)
    if required is not None:
        return EffectiveBar(share=eff["integer_share"], required=required,
                            scope="matrix-multiply FLOPs (attention products included)"
                                  if "attention" in eff["mflops"] else "MatMul/Gemm FLOPs",
                            bar="the recipe's precision.require_effective_precision",
                            precision=entry.get("precision"))
    m = eff["mflops"]
    projections = m["integer"] + m["fake_quantized"] + m["float"]
    return EffectiveBar(share=m["integer"] / projections if projections else 0.0,
                        required=DEFAULT_EFFECTIVE_BAR,
                        scope="projection MatMul/Gemm FLOPs (attention products excluded)",
                        bar=f"compare's default bar: `{recipe.name}` sets no "
                            "precision.require_effective_precision",
                        precision=entry.get("precision"))


def models(recipes: list[Recipe], root: Path) -> ModelsInfo:
    """Per recipe: parameters of its exported model (ONNX initializer elements) and its own
    opt shape (the dims it is tuned for)."""
    from pipeline.model import onnx_info

    out = {}
    for r in recipes:
        store = Store(root, folder_name(r))
        export = store.stage_record("export")
        params = None
        if export:
            params = onnx_info.describe(store.dir / export.outputs[0]).parameters
        out[r.name] = ModelInfo(parameters=params, opt_dims=sweep.opt_dims(r),
                                description=r.description)
    return out


def model_differences(recipes: list[Recipe], info: ModelsInfo) -> Differences:
    """recipe -> why it is not the same model as the first one at the timed shape (only
    recipes that differ): parameters MODEL_SIZE_RATIO or more apart, or another opt shape."""
    first = recipes[0].name
    a = info[first]
    out = {}
    for r in recipes[1:]:
        b = info[r.name]
        why = []
        pa, pb = a.parameters, b.parameters
        if pa and pb and max(pa, pb) / min(pa, pb) >= MODEL_SIZE_RATIO:
            why.append(f"`{r.name}`'s model has {pb / pa:.1f}x the parameters of `{first}`'s "
                       f"({pb:,} vs {pa:,}, initializer elements of the exported ONNX)")
        if b.opt_dims != a.opt_dims:
            why.append(f"both are timed at `{first}`'s opt shape ({sweep.label(a.opt_dims)}); "
                       f"`{r.name}` is tuned for {sweep.label(b.opt_dims)}")
        if why:
            out[r.name] = "; ".join(why)
    return out


def measure(recipes: list[Recipe], reports: dict[str, dict],
            root: Path) -> tuple[protocol.Timings, dict[str, ColdStart], dict, list[str]]:
    """Interleaved timing of the shared engines and the baselines; (timings, cold starts,
    samples, shared)."""
    first = recipes[0]
    for other in recipes[1:]:
        ab.check_compatible(first, other)
    shared = shared_targets(recipes, reports)
    openers, pairs = {}, []
    for r in recipes:
        targets = {t.id: t for t in r.targets}
        openers[f"{r.name}/{ab.BASELINE}"] = baseline_opener(r)
        store = Store(root, folder_name(r))
        for tid in shared:
            # the file timed must be the file validated: its sha256 is checked again here
            path = store.verify(engine_name(targets[tid])).path
            openers[f"{r.name}/{tid}"] = engine_opener(r, targets[tid], path)
    for other in recipes[1:]:
        for tid in [ab.BASELINE, *shared]:
            pairs.append((f"{first.name}/{tid}", f"{other.name}/{tid}"))
    feed = timing_feed(first)
    with contextlib.ExitStack() as stack:
        runners, cold = protocol.open_all(stack, openers, feed)
        result, samples = protocol.measure(runners, sweep.shapes(first, feed)[:1],
                                           first.validate_.latency, pairs=pairs)
    return result, cold, samples, shared


@dataclass(frozen=True)
class MeasuredPair:
    """The interleaved timing of the two profiled engines: p50s, B time / A time, verdict."""

    a_p50_ms: float
    b_p50_ms: float
    time_ratio: float
    ci95: list[float]
    verdict: str

    def dump(self) -> JsonObject:
        return asdict(self)


def _measured(timed: protocol.Timings, a: str, b: str) -> MeasuredPair | None:
    """The interleaved timing's p50s and ratio of runners a and b (no profiler attached)."""
    shape = timed.shapes[0]
    c = next((c for c in shape.comparisons if c.a == a and c.b == b), None)
    lat = shape.latency_ms
    if c is None or a not in lat or b not in lat:
        return None
    return MeasuredPair(lat[a].p50, lat[b].p50, c.time_ratio, c.ci95, c.verdict)


@dataclass(frozen=True)
class VersusExplained:
    """Where B's time went against A's: category deltas, both profiled totals beside the
    measured p50s, whether the models differ, the cause tags."""

    verdict: str | None
    deltas: list[dict]
    profiled_total_us: tuple[float, float]  # A's, B's
    measured: MeasuredPair | None
    models_differ: str | None
    tags: list[dict]

    def dump(self) -> JsonObject:
        a, b = self.profiled_total_us
        return {"verdict": self.verdict, "deltas": self.deltas, "profiled_total_us": {"a": a, "b": b},
                "measured": self.measured.dump() if self.measured else None,
                "models_differ": self.models_differ, "tags": self.tags}


@dataclass
class TimeExplained:
    """compare.json's `time_explained`: the profiled engines' kind, each recipe's profile,
    each other recipe against the first."""

    engine_kind: str | None
    profiles: profile.Profiles
    versus: dict[str, VersusExplained]

    def dump(self) -> JsonObject:
        return {"engine_kind": self.engine_kind,
                "profiles": {name: {"total_us": p.total_us,
                                    "categories": {c: v.dump() for c, v in p.categories.items()},
                                    "top_nodes": [n.dump() for n in p.nodes[:10]], "method": p.method}
                             for name, p in self.profiles.items()},
                "versus": {name: v.dump() for name, v in self.versus.items()}}


def explain_time(recipes: list[Recipe], reports: dict[str, JsonObject], timed: protocol.Timings,
                 differ: Differences | None = None) -> TimeExplained:
    """Profiles of each recipe's ONNX-graph engine (taking turns); deltas and tags vs the
    first recipe, beside the interleaved timing of the same engines (`timed`). `differ`:
    recipe -> why its model is not the first's (model_differences)."""
    from pipeline.precision import effective

    first = recipes[0]
    entries = {r.name: _profiled(reports[r.name]) for r in recipes}
    entries = {k: v for k, v in entries.items() if v is not None}
    kinds = sorted({e["kind"] for e in entries.values()})
    out = TimeExplained(", ".join(kinds) or None, {}, {})
    if not entries:
        return out
    fp8 = {k: {"session.disable_quant_qdq": "1"} for k, e in entries.items() if e.get("precision") == "fp8"}
    profiles = profile.profile_sessions({k: Path(e["path"]) for k, e in entries.items()},
                                        timing_feed(first), threads=first.validate_.threads,
                                        session_config=fp8)
    ops = {k: causes.op_histogram(Path(e["path"])) for k, e in entries.items()}
    nbits = {k: effective.accuracy_levels(Path(e["path"])) for k, e in entries.items()}
    out.profiles = profiles
    if first.name not in profiles:
        return out
    for r in recipes[1:]:
        if r.name not in profiles:
            continue
        deltas = causes.category_deltas(profiles[first.name], profiles[r.name])
        measured = _measured(timed, f"{first.name}/{entries[first.name]['target']}",
                             f"{r.name}/{entries[r.name]['target']}")
        out.versus[r.name] = VersusExplained(
            verdict=measured.verdict if measured else None, deltas=deltas,
            profiled_total_us=(profiles[first.name].total_us, profiles[r.name].total_us),
            measured=measured, models_differ=(differ or {}).get(r.name),
            tags=causes.tags(deltas, ops[first.name], ops[r.name], _effective(entries[r.name], r),
                             nbits_b=nbits[r.name], models_differ=(differ or {}).get(r.name)))
    return out


def explain_error(recipes: list[Recipe], root: Path) -> ErrorsExplained:
    out = {}
    for r in recipes:
        store = Store(root, folder_name(r))
        graphs = _graph_before_precision(store)
        if graphs is None:
            continue
        feeds, _ = data.load_feeds(store.dir / "baseline.npz")
        errors = layers.layer_errors(*graphs, feeds[:2])
        out[r.name] = replace(errors, float_graph=graphs[0].name, typed_graph=graphs[1].name,
                              tensors=errors.tensors[-40:])  # the report keeps the tail only
    return out


def side_by_side(recipes: list[Recipe], reports: dict[str, dict], timed: protocol.Timings,
                 root: Path) -> list[dict]:
    rows = []
    opt = timed.shapes[0]
    for r in recipes:
        store = Store(root, folder_name(r))
        for e in reports[r.name]["engines"]:
            key = f"{r.name}/{e['target']}"
            acc = e.get("accuracy") or {}
            rows.append({
                "recipe": r.name, "target": e["target"], "status": e["status"],
                "reason": e.get("reason"), "precision": e.get("precision"),
                "cosine": min((m["cosine"] for m in acc.values()), default=None),
                "top1": min((m["top1_agreement"] for m in acc.values()
                             if m.get("top1_agreement") is not None), default=None),
                "p50_ms": getattr(opt.latency_ms.get(key), "p50", None),
                "p99_ms": getattr(opt.latency_ms.get(key), "p99", None),
                "throughput_per_s": getattr(opt.latency_ms.get(key), "throughput_per_s", None),
                "peak_rss_mb": ((e.get("resources") or {}).get("peak_rss_mb")),
                "engine_mb": e["bytes"] / 2**20 if e.get("bytes") else None,
                "build_s": getattr(store.stage_record(f"build:{e['target']}"), "seconds", None),
            })
    return rows


def check_comparable(recipes: list[Recipe]) -> None:
    """Before anything is built: one feed is timed on every engine."""
    for other in recipes[1:]:
        ab.check_compatible(recipes[0], other)


def compare(recipes: list[Recipe], reports: dict[str, dict], root: Path, progress) -> Compared:
    """`reports`: each recipe's report.json, built (check_comparable ran before)."""
    from pipeline.artifacts import dump
    from pipeline.artifacts.comparison import ForwardCompare
    from pipeline.compare import render

    names = [r.name for r in recipes]
    info = models(recipes, root)
    differ = model_differences(recipes, info)
    with progress.stage("compare: timing"):
        timed, cold, samples, shared = measure(recipes, reports, root)
    with progress.stage("compare: profiles"):
        time_explained = explain_time(recipes, reports, timed, differ)
    with progress.stage("compare: layer errors"):
        error_explained = explain_error(recipes, root)
    folder = compare_folder(root, recipes)
    result = ForwardCompare.model_validate({
        "schema": SCHEMA, "workload": "forward", "created": now(), "recipes": names,
        "shared_targets": shared, "reference": names[0],
        "models": info, "models_differ": differ,
        "engines": side_by_side(recipes, reports, timed, root),
        "timing": {**timed.dump(), "cold_start_ms": {n: dump(c) for n, c in cold.items()}},
        "time_explained": time_explained.dump(),
        "error_explained": {name: e.dump() for name, e in error_explained.items()},
        "method": CompareMethod(
            timing="every shared engine and each recipe's PyTorch baseline in one process, "
                   f"interleaved in blocks of {recipes[0].validate_.latency.block} at "
                   f"{timed.shapes[0].shape}; B vs A as a speed-up, A time / B time (JSON "
                   "time_ratio: B time / A time): "
                   + stats.ratio_method(recipes[0].validate_.latency.noise_threshold),
            profiles=next((p.method for p in time_explained.profiles.values()), None)),
    })
    written = dump(result)  # what compare.json holds, rendered as the tables and pages
    return Compared(result, folder, printed=render.tables(written),
                    files=render.write_all(written, samples, folder))
