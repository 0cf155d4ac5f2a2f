"""The report stage: report.json (the source of truth, a pipeline.artifacts.Report at schema
3) and report.md beside it. report.md is rendered from the Report's dump alone
(pipeline/render/report_markdown.py), never recomputed, so what a person reads is what CI and
`compare` read."""

from __future__ import annotations

from pathlib import Path

from pipeline.artifacts import SCHEMA, EngineResult, Report, dump
from pipeline.artifacts.report import Baseline
from pipeline.core import deps
from pipeline.recipe import Recipe
from pipeline.render import report_markdown
from pipeline.stages import Produced
from pipeline.store.recipe_folder import now


def assemble(recipe: Recipe, baseline: dict | None, graph_stages: dict[str, dict],
             engines: list[EngineResult], costs: dict[str, dict] | None = None) -> Report:
    """graph_stages: the meta of each graph stage that ran (export, ...), by stage name;
    costs: each stage's time and peak memory (Report.stages)."""
    alone = Baseline.model_validate({k: v for k, v in baseline.items() if k != "data"}) if baseline else None
    return Report.model_validate({
        "schema": SCHEMA,
        "recipe": recipe.name,
        "recipe_sha256": recipe.digest,
        "description": recipe.description,
        "created": now(),
        "device": deps.device(),
        "versions": deps.versions(),
        **graph_stages,
        "data": (baseline or {}).get("data"),  # the data the baseline ran on, said once
        "baseline": alone,
        "engines": engines,
        "stages": costs or {},
        "warnings": warnings(alone, engines),
    })


def stage_costs(records: dict) -> dict[str, dict]:
    """Time and peak memory of every stage a folder's manifest records for the run (`records`:
    stage id -> StageRecord; a load test's and a served engine's records are measurements, not
    stages of the run, and the report is this stage)."""
    return {sid: {"seconds": r.seconds, "peak_rss_mb": r.peak_rss_mb, "finished": r.finished}
            for sid, r in records.items() if sid != "report" and not sid.startswith(("load:", "serve:"))}


def kept_entries(recipe: Recipe, chosen: list[str], previous: dict | None) -> list[dict] | None:
    """With --target, the entries of the last report (`previous`) for the recipe's targets not
    in `chosen`, in the recipe's order, so a partial run keeps them in the report. None when
    the last report was made from another version of the recipe (nothing is kept)."""
    rest = [t.id for t in recipe.targets if t.id not in chosen]
    if not rest or previous is None:
        return []
    if previous.get("recipe_sha256") != recipe.digest:
        return None
    kept = {e["target"]: e for e in previous["engines"] if e["target"] in rest}
    return [kept[t] for t in rest if t in kept]


# The same eager model timed alone (baseline stage) and interleaved with an engine (validate)
# should agree within the machine's drift; a larger gap means one of them was disturbed.
BASELINE_DRIFT = 2.0


def warnings(baseline: Baseline | None, engines: list[EngineResult]) -> list[str]:
    """What makes a figure in this report suspect, each naming where it applies."""
    out = []
    for e in engines:
        if e.status != "built":
            continue
        out += [f"{e.target}: {w}" for w in e.warnings]
        out += [f"{e.target} vs `{v.other_recipe}`: {w}" for v in e.versus for w in v.warnings]
        drift = baseline_drift(baseline, e)
        if drift:
            out.append(f"{e.target}: {drift}")
    return out


def baseline_drift(baseline: Baseline | None, engine: EngineResult) -> str | None:
    """The PyTorch baseline timed alone against the same baseline interleaved with `engine`,
    when they are more than BASELINE_DRIFT apart. Only figures of one kind are compared (what
    `timed` says each is: a request for the forward workload, a decode step at batch 1 for
    generation); a request against a decode step would differ by the decode steps a request
    holds, which says nothing about the machine."""
    if baseline is None or engine.baseline_latency_ms is None or baseline.timed != engine.timed:
        return None
    alone, together = baseline.latency_ms.p50, engine.baseline_latency_ms.p50
    if not (alone and together) or max(alone / together, together / alone) <= BASELINE_DRIFT:
        return None
    per = "" if engine.timed == "request" else f" per {engine.timed}"
    return (f"the PyTorch baseline took p50 {together:.3f} ms{per} interleaved with the engine but "
            f"{alone:.3f} ms timed alone (baseline stage), more than {BASELINE_DRIFT:g}x apart: the "
            "machine changed between or during the two; rerun with --force on an idle machine")


def write(model: Report, workdir: Path, workload=None, loads: list[dict] = ()) -> Produced:
    """report.md, rendered from what report.json will hold; the Report itself is a record
    (dumped as report.json when the stage is committed). loads: the folder's recorded
    load-*.json files (`pipeline load`), for report.md's Serving section."""
    md_path = workdir / "report.md"
    md_path.write_text(report_markdown.markdown(dump(model), workload, loads))
    return Produced({"report.md": md_path}, {}, {"report.json": model})


