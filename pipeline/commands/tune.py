"""`pipeline tune RECIPE`: the fastest INT8 engine whose accuracy stays within a budget.

Each candidate precision (scheme static/dynamic, per-channel weights, calibration method,
SmoothQuant alpha, and sensitivity-chosen exclusions) is a real run of the recipe with --set
values (its precision section, the ONNX Runtime target), as `pipeline run RECIPE --set ...`
would make it: it builds into engines/<recipe>@<digest>/ through the ordinary stage cache,
which reuses export and optimize across candidates (same key) and keeps each candidate's
precision and build. Each engine is measured, on held-out feeds it was not calibrated on,
against the PyTorch model on each metric of the budget (metrics/budget.py).

Timing is the project's A/B protocol: each candidate is timed interleaved with the current
best (bench.timing.time_interleaved, core.stats.compare), starting from the FP32 engine;
it becomes the best only when it meets the budget and the whole 95% interval of its time
ratio lies below 1 - noise_threshold (verdict `faster`; a pair first found indistinguishable
is timed once more, EXTEND times longer, before it is called a tie). Candidates over budget are timed
too (never chosen; --within-only skips them), to show what the budget costs. A rerun builds
nothing: it measures and times. The result is a table (engines/<recipe>/tune/tune.md and
tune.json) and a recipe (extends the tuned one, sets its `precision:`) the user can keep.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.commands.tune_prediction import Predictions, gains, prediction_line
from pipeline.core import safe_files
from pipeline.core.json_object import JsonObject
from pipeline.metrics import budget as tune_metrics

FP32 = "fp32"
EXTEND = 3  # an indistinguishable pair is timed again with this many times the requests


@dataclass
class Candidate:
    name: str
    precision: dict  # the recipe's precision section for this candidate (fp32: {})
    result: dict = field(default_factory=dict)  # its entry in tune.json
    scores: tune_metrics.Scores | None = None  # its accuracy on the held-out feeds (result's `accuracy`)


def space(schemes=("dynamic", "static"), per_channel=(True, False), methods=("minmax", "percentile"),
          alphas=(None, 0.5), op_types=("MatMul",)) -> list[Candidate]:
    """The grid: dynamic x per-channel x alpha; static (per-channel only: per-tensor static
    weights lose accuracy and gain no speed on ORT's CPU kernels) x method x alpha. Dynamic
    candidates quantize the fused attention's projection too (dynamic.split_attention)."""
    out = []
    for scheme in schemes:
        for pc in (per_channel if scheme == "dynamic" else [p for p in per_channel if p] or [True]):
            for method in (methods if scheme == "static" else (None,)):
                for alpha in alphas:
                    ops = list(op_types) + (["Attention"] if scheme == "dynamic" else [])
                    p = {"mode": "int8", "scheme": scheme, "per_channel": pc, "op_types": ops}
                    if method:
                        p["calibration"] = method
                    if alpha is not None:
                        p["smoothing"] = {"alpha": alpha}
                    label = [scheme, "per-channel" if pc else "per-tensor"] + ([method] if method else [])
                    label += [f"smooth {alpha:g}"] if alpha is not None else []
                    out.append(Candidate(" ".join(label), p))
    return out


def with_exclusions(best: Candidate, budget: tune_metrics.Budget, samples: int) -> list[Candidate]:
    """The best candidate, with sensitivity analysis keeping its most harmful nodes out of the
    integer kernels until the calibration-feed cosine (a feed of unit-norm embeddings: the mean
    row cosine) meets the stricter of the budget's cosines: in float, and for a dynamic
    candidate also as blockwise int8 (precision.fallback), which costs less time."""
    p = dict(best.precision)
    p["sensitivity"] = {"enabled": True, "auto_exclude": True, "samples": samples,
                        "budget": {"cosine_min": max(budget.worst_cosine, budget.mean_cosine)}}
    out = [Candidate(best.name + " + auto-exclude", p)]
    if p.get("scheme") == "dynamic":
        out.append(Candidate(best.name + " + auto-exclude blockwise", {**p, "fallback": "blockwise"}))
    return out


def candidate_overrides(c: Candidate, target) -> list[str]:
    """The --set values that make the tuned recipe candidate `c`: its precision section (fp32:
    the default, no precision stage) and the one ONNX Runtime target every candidate is timed
    on. `pipeline run RECIPE --set ...` with them builds the same engine into the same folder."""
    compact = {"sort_keys": True, "separators": (",", ":")}  # JSON is YAML: --set parses it
    return [f"precision={json.dumps(c.precision, **compact)}",
            f"targets=[{json.dumps(target.model_dump(mode='json'), **compact)}]"]


class Search:
    def __init__(self, recipe, engines_root: Path, feeds: list[dict], budget: tune_metrics.Budget,
                 progress, verbose: bool = False, time_all: bool = True,
                 task: tune_metrics.Task | None = None, task_bound: tuple[float, bool] | None = None,
                 rank_by_prediction: bool = False):
        from pipeline.recipe import OnnxRuntimeTarget

        self.recipe, self.feeds, self.budget, self.progress, self.verbose = (
            recipe, feeds, budget, progress, verbose)
        self.task, self.task_bound = task, task_bound  # task_bound: (bound, relative to PyTorch's)
        self.target = next((t for t in recipe.targets if isinstance(t, OnnxRuntimeTarget)),
                           OnnxRuntimeTarget())
        self.engines_root = engines_root
        self.reference: list[dict] | None = None
        # a real folder, never a link (safe_files.folder): tune.json and tune.md are written here
        self.folder = safe_files.folder(Path(engines_root), recipe.name, "tune")
        self.time_all = time_all  # also time candidates over budget (never chosen): what it costs
        self.rank_by_prediction = rank_by_prediction  # build in order of predicted gain (else the grid's)
        self.predictions: Predictions | None = None

    # ---------------------------------------------------------------- one candidate
    def prepare(self) -> None:
        """PyTorch's outputs on the held-out feeds: what every candidate is measured against."""
        from pipeline.backends.openers import baseline_runner
        from pipeline.model import sources as models

        with baseline_runner(self.recipe, models.load(self.recipe)) as torch_runner:
            self.reference = [dict(torch_runner.infer(f, check_inputs=False)) for f in self.feeds]

    def candidate_recipe(self, c: Candidate):
        """The tuned recipe loaded again with its own --set values and the candidate's."""
        from pipeline.recipe import load

        return load(self.recipe.source, [*self.recipe.overrides, *candidate_overrides(c, self.target)])

    def build(self, c: Candidate) -> Path:
        """The candidate's engine, built by a run of its recipe variant into
        engines/<recipe>@<digest>/ (store/folder_names.py) through the stage cache: export and
        optimize come from a sibling folder with the same key, the precision and build stages
        are cached per candidate, so a rerun builds nothing. Its accuracy on the held-out feeds
        (in c.result) is measured on every run, against `prepare`'s PyTorch outputs."""
        from pipeline import backends
        from pipeline.run.execute import Run

        recipe = self.candidate_recipe(c)
        (target,) = recipe.targets
        outcome = Run(recipe, self.engines_root, progress=self.progress, verbose=self.verbose).execute("build")
        engine = outcome.built[target.id].path
        meta = outcome.graph_meta.get("precision", {})
        with backends.get(target.kind).open(engine, target, recipe) as runner:
            actual = [dict(runner.infer(f, check_inputs=False)) for f in self.feeds]
        c.scores = tune_metrics.measure(self.reference, actual, self.feeds, self.task)
        c.result.update({"accuracy": c.scores.dump(),  # update: the prediction made before the build stays
                         "excluded": [e["node"] for e in meta.get("excluded", [])],
                         "speed_cost_of_kept_nodes": (meta.get("sensitivity") or {}).get("speed_cost"),
                         "quantized_nodes": meta.get("quantized_nodes"),
                         "engines": outcome.store.dir.name, "engine": str(engine)})
        return engine

    # ---------------------------------------------------------------- the search
    def time_pair(self, best_engine: Path, engine: Path, feed: dict) -> JsonObject:
        """The candidate against the best so far, interleaved: tune.json's `ab` (the
        TimeRatio's JSON, `extended` when a tie got its longer look)."""
        import numpy as np

        from pipeline import backends
        from pipeline.bench import timing
        from pipeline.core import stats

        spec = self.recipe.validate_.latency
        backend = backends.get(self.target.kind)
        threads = self.recipe.validate_.threads
        with backend.open(best_engine, self.target, self.recipe, threads=threads, spin=False) as a, \
                backend.open(engine, self.target, self.recipe, threads=threads, spin=False) as b:
            blocks = timing.time_interleaved([a, b], feed, spec).blocks
            result = stats.compare(blocks[0], blocks[1], noise=spec.noise_threshold)
            pooled = [np.asarray(blocks[0]), np.asarray(blocks[1])]
            if result["verdict"] == "indistinguishable":
                # A few blocks leave an interval of several percent: two candidates that close
                # get one longer look (EXTEND times the requests, pooled with the first) before
                # they are called a tie. The verdict still needs the whole interval past noise.
                longer = spec.model_copy(update={"warmup": 0, "iterations": spec.iterations * EXTEND,
                                                 "min_seconds": spec.min_seconds * EXTEND})
                more = timing.time_interleaved([a, b], feed, longer).blocks
                pooled = [np.concatenate([blocks[0], more[0]]), np.concatenate([blocks[1], more[1]])]
                result = stats.compare(pooled[0], pooled[1], noise=spec.noise_threshold)
                result["extended"] = True
        result["median_ms"] = [float(np.median(p)) / 1e6 for p in pooled]  # [best, candidate] per request
        return result

    def run(self, candidates: list[Candidate], timing_feed: dict, exclusions: bool = True) -> JsonObject:
        """The search; its result is what tune.json holds (budget, chosen, candidates, ...)."""
        self.prepare()
        fp32 = Candidate(FP32, {})
        best, best_engine = fp32, self.build(fp32)
        if self.task is not None and self.task_bound is not None:  # PyTorch's score, as FP32's was measured
            bound, relative = self.task_bound
            baseline = fp32.result["accuracy"]["task"]["baseline"]
            self.budget.task_loss = bound * abs(baseline) if relative else bound
        fp32.result.update(vs=None, chained=1.0, within=tune_metrics.within(fp32.scores, self.budget).dump())
        self.predictions = Predictions.of(best_engine, timing_feed, self.recipe.validate_.threads, self.progress)
        self._predict(fp32, best_engine)
        done = [fp32]
        queue = self._ordered(list(candidates))
        while queue:
            c = queue.pop(0)
            with self.progress.stage(f"tune: {c.name} ({len(done)}/{len(done) + len(queue)})"):
                engine = self.build(c)
                self._predict(c, engine)
                c.result["within"] = tune_metrics.within(c.scores, self.budget).dump()
                if c.result["within"]["ok"] or self.time_all:
                    ab = self.time_pair(best_engine, engine, timing_feed)
                    c.result.update(vs=best.name, ab=ab, chained=best.result["chained"] * ab["time_ratio"])
                    if ab["verdict"] == "faster" and c.result["within"]["ok"]:
                        best, best_engine = c, engine
            self.progress.note(_candidate_note(c))
            done.append(c)
            if not queue and exclusions and not any("sensitivity" in d.precision for d in done):
                closest = _closest_over_budget(done)
                if closest is not None:
                    queue.extend(self._ordered(with_exclusions(closest, self.budget, 4)))
        return {"budget": self.budget.describe(), "chosen": best.name,
                "candidates": [{"name": c.name, "precision": c.precision, **c.result} for c in done],
                "feeds": {"samples": len(self.feeds), "shapes": sorted({str(list(v.shape)) for f in self.feeds
                                                                      for v in f.values()})},
                "timing_feed": {k: list(v.shape) for k, v in timing_feed.items()},
                "prediction": (self.predictions.summary(done, self.rank_by_prediction) if self.predictions
                               else {"reason": "no prediction: the FP32 engine could not be costed"}),
                "protocol": "each candidate timed interleaved with the current best "
                            "(bench.timing.time_interleaved, the recipe's validate.latency); best "
                            "replaced on verdict `faster` within budget only; `chained` multiplies the ratios "
                            "back to the FP32 engine (an estimate, the pairs were timed apart)"}

    def _ordered(self, candidates: list[Candidate]) -> list[Candidate]:
        """Each candidate's prediction made before its build; with rank_by_prediction, the
        candidates in order of predicted gain (ties keep the grid's order)."""
        if self.predictions is None:
            return candidates
        for c in candidates:
            c.result.update(self.predictions.before(c))
        if not self.rank_by_prediction:
            return candidates
        return sorted(candidates, key=lambda c: -(c.result.get("predicted_speedup") or 0.0))

    def _predict(self, c: Candidate, engine: Path) -> None:
        """After the build: the prediction made before it (FP32's now) and the built graph's floor."""
        if self.predictions is None:
            return
        if "predicted_ms" not in c.result:
            c.result.update(self.predictions.before(c))
        c.result["built_floor_ms"] = self.predictions.built_floor(engine)


def _candidate_note(c: Candidate) -> str:
    """One line per candidate as it is done: accuracy, time vs the best, predicted vs measured."""
    acc = c.result["accuracy"]
    text = (f"{c.name}: worst cosine {acc['worst_cosine']:.4f}, mean {acc['mean_cosine']:.5f}"
            + (f", {_task_text(acc)}" if "task" in acc else ""))
    if "ab" in c.result:
        text += f", time x{c.result['ab']['time_ratio']:.3f} vs {c.result['vs']} ({c.result['ab']['verdict']})"
    if c.result.get("predicted_speedup") and c.result.get("chained"):
        text += (f", predicted {c.result['predicted_speedup']:.2f}x vs fp32, measured "
                 f"{1 / c.result['chained']:.2f}x")
    return text + ("" if c.result["within"]["ok"] else ", over budget")


def _closest_over_budget(done: list[Candidate]) -> Candidate | None:
    """The candidate most worth rescuing with exclusions: over budget by the least (highest
    mean cosine), so the fewest nodes have to stay in float."""
    over = [c for c in done if c.precision and not c.result["within"]["ok"]]
    return max(over, key=lambda c: c.result["accuracy"]["mean_cosine"]) if over else None


def recipe_text(recipe, chosen: dict, table_lines: list[str], budget: dict | None = None) -> str:
    """A recipe that extends the tuned one with the chosen precision. Its gates hold what the
    search held the choice to: validate's cosine at the budget's worst row cosine (where the
    parent's is stricter, an FP32 bar), expect.max_task_loss at the task bound."""
    import yaml

    source = getattr(recipe, "source", None)
    parent = Path(source).name if source else f"{recipe.name}.yaml"
    precision = dict(chosen["precision"])
    if precision.pop("sensitivity", None):  # pin what the analysis chose: no rerun, same graph
        precision["exclude"] = list(chosen["excluded"])
    body = {"description": f"{recipe.name}, INT8 chosen by `pipeline tune` ({chosen['name']})",
            "extends": parent, "precision": precision}
    budget = budget or {}
    worst = budget.get("worst_cosine", {}).get("bound")
    tolerance = recipe.validate_.tolerance.cosine_min if hasattr(recipe, "validate_") else None
    if worst is not None and tolerance is not None and tolerance > worst:
        body["validate"] = {"tolerance": {"cosine_min": worst}}
    if "task_loss" in budget:  # the absolute bound the search used (a relative one resolved)
        body["expect"] = {"max_task_loss": budget["task_loss"]["bound"]}
    head = ["# Written by `pipeline tune`: the fastest candidate within the accuracy budget.", "#"]
    head += [f"# {line}" for line in table_lines]
    return "\n".join(head) + "\n" + yaml.safe_dump(body, sort_keys=False)


def table(result: dict):
    """The candidates as a rich table, the chosen one marked."""
    from rich.table import Table

    from pipeline.core.text import fmt

    t = Table(title=f"tune: fastest within budget ({', '.join(_bound_text(result['budget']))})")
    task = _task_column(result)
    for col in ("", "candidate", "vs", "time ratio [95% CI]", "verdict", "≈ vs fp32", "predicted gain",
                "measured gain", "worst cos", "mean cos", *([task] if task else []), "within budget"):
        t.add_column(col)
    for c in result["candidates"]:
        ab = c.get("ab")
        acc = c["accuracy"]
        t.add_row("★" if c["name"] == result["chosen"] else "", c["name"], c.get("vs") or "—",
                  f"{ab['time_ratio']:.3f} [{ab['ci95'][0]:.3f}, {ab['ci95'][1]:.3f}]" if ab else "—",
                  ab["verdict"] if ab else ("reference" if c["name"] == FP32 else "not timed"),
                  fmt(c.get("chained"), ".3f"), *gains(c), f"{acc['worst_cosine']:.4f}",
                  f"{acc['mean_cosine']:.5f}", *([_task_cell(acc)] if task else []),
                  "yes" if c["within"]["ok"] else "no: " + "; ".join(c["within"]["misses"]))
    t.caption = prediction_line(result)
    return t


def _task_column(result: dict) -> str | None:
    """The task column's title, `<metric> Δ [95% CI]` (engine minus PyTorch), when the
    candidates were scored on the recipe's task; None otherwise."""
    task = result["candidates"][0]["accuracy"].get("task")
    return f"{task['metric']} Δ [95% CI]" if task else None


def _task_cell(acc: dict) -> str:
    task = acc.get("task")
    if not task:
        return "—"
    lo, hi = task["ci95"]
    return f"{task['delta']:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def _task_text(acc: dict) -> str:
    return f"{acc['task']['metric']} {acc['task']['engine']:.4f} (Δ {acc['task']['delta']:+.4f})"


def _bound_text(budget: dict) -> list[str]:
    return [f"{k} {'>=' if v['kind'] == 'min' else '<='} {v['bound']:g}" for k, v in budget.items()]


def markdown_lines(result: dict) -> list[str]:
    task = _task_column(result)
    lines = ["| | candidate | vs | time ratio [95% CI] | verdict | ≈ vs fp32 | predicted gain | measured gain "
             "| worst cos | mean cos | " + (f"{task} | " if task else "") + "within |",
             "|---" * (12 if task else 11) + "|"]
    for c in result["candidates"]:
        ab, acc = c.get("ab"), c["accuracy"]
        timed = (f"{ab['time_ratio']:.3f} [{ab['ci95'][0]:.3f}, {ab['ci95'][1]:.3f}] | {ab['verdict']}" if ab
                 else "— | " + ("reference" if c["name"] == FP32 else "not timed"))
        chained = f"{c['chained']:.3f}" if c.get("chained") is not None else "—"
        lines.append(f"| {'★' if c['name'] == result['chosen'] else ''} | {c['name']} | "
                     f"{c.get('vs') or '—'} | {timed} | {chained} | {' | '.join(gains(c))} | "
                     f"{acc['worst_cosine']:.4f} | "
                     f"{acc['mean_cosine']:.5f} | " + (f"{_task_cell(acc)} | " if task else "")
                     + f"{'yes' if c['within']['ok'] else 'no'} |")
    return lines + ["", prediction_line(result)]


def command(recipe, engines_root: Path, feeds_ref: str | None, budget: tune_metrics.Budget,
            schemes, alphas, exclusions: bool, out: Path | None, verbose: bool, time_all: bool = True,
            max_task_loss: float | str | None = None, rank_by_prediction: bool = False):
    """Run the search; write tune.json/tune.md beside the engines and the chosen recipe.
    max_task_loss (default: the recipe's expect.max_task_loss) bounds the task metric."""
    from pipeline import data
    from pipeline.core.errors import RecipeError
    from pipeline.core.ui import Progress
    from pipeline.recipe.data import parse_task_loss

    if feeds_ref:  # held-out feeds from a loader: the recipe's validation split replaced by it,
        # as a --set value, so that every candidate's run (a reload with more --set) keeps it
        from pipeline.recipe import load

        split = json.dumps({"loader": feeds_ref, "samples": None})
        recipe = load(recipe.source, [*recipe.overrides, f"data.validation={split}"])
    held_out = data.split(recipe, "validation")
    feeds = held_out.feeds
    task, bound = _task(recipe, held_out), max_task_loss if max_task_loss is not None else recipe.expect.max_task_loss
    if bound is not None and task is None:
        raise RecipeError(f"tune {recipe.name}: a task-loss bound needs validate.task and held-out "
                          "data with what the metric needs (labels or pairs)",
                          "drop --max-task-loss, or use the recipe's validation split (no --feeds)")
    if recipe.data.calibration is None:
        raise RecipeError(f"tune {recipe.name}: the search calibrates static candidates; set "
                          "data.calibration (held-out feeds stay separate)")
    candidates = space(schemes=schemes, alphas=alphas)
    search = Search(recipe, engines_root, feeds, budget, Progress(verbose), verbose, time_all,
                    task, None if bound is None else parse_task_loss(bound), rank_by_prediction)
    result = search.run(candidates, feeds[0], exclusions)
    chosen = next(c for c in result["candidates"] if c["name"] == result["chosen"])
    folder = search.folder
    safe_files.write_atomic(folder / "tune.json", json.dumps(result, indent=1))
    md = markdown_lines(result)
    safe_files.write_atomic(folder / "tune.md", f"# tune {recipe.name}\n\n" + "\n".join(md) + "\n")
    written = None
    if chosen["precision"]:
        written = out or Path(recipe.source).with_name(f"{recipe.name}-tuned.yaml")
        safe_files.write_atomic(written, recipe_text(recipe, chosen, md, result["budget"]))
    return result, folder, written


def _task(recipe, held_out) -> tune_metrics.Task | None:
    """The recipe's validate.task on the held-out split, when the split has what it needs
    (perplexity: token ids and masks; accuracy and embedding similarity: labels)."""
    metric = recipe.validate_.task
    if metric is None or (metric != "perplexity" and held_out.labels is None):
        return None
    return tune_metrics.Task(metric, recipe.outputs[0], held_out.labels, held_out.masks)
