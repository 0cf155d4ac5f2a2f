"""report: report.json (the source of truth, schema 1), report.md and the terminal table.

Markdown and the table are rendered from the JSON alone, never recomputed, so what a
person reads is what CI and `compare` read.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from pipeline import deps
from pipeline.recipe import Recipe
from pipeline.store import now

VERSION = 1
SCHEMA = 1


def assemble(recipe: Recipe, baseline: dict | None, graph_stages: dict[str, dict],
             engines: list[dict]) -> dict:
    """graph_stages: the meta of each graph stage that ran (export, ...), by stage name."""
    return {
        "schema": SCHEMA,
        "recipe": recipe.name,
        "recipe_sha256": recipe.digest,
        "description": recipe.description,
        "created": now(),
        "device": deps.device(),
        "versions": deps.versions(),
        **graph_stages,
        "baseline": baseline,
        "engines": engines,
    }


def write(report: dict, workdir: Path) -> dict[str, Path]:
    json_path = workdir / "report.json"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    md_path = workdir / "report.md"
    md_path.write_text(markdown(report))
    return {"report.json": json_path, "report.md": md_path}


# ------------------------------------------------------------------------ rendering
def _fmt(value, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def _speedup(engine: dict) -> str:
    s = engine.get("speedup_vs_baseline")
    if not s:
        return "—"
    lo, hi = s["ci95"]
    return f"{s['ratio']:.2f}x [{lo:.2f}, {hi:.2f}]"


def _worst(engine: dict, key: str, pick=min):
    values = [m[key] for m in (engine.get("accuracy") or {}).values() if m.get(key) is not None]
    return pick(values) if values else None


def _gates(engine: dict) -> str:
    gates = engine.get("gates") or []
    if engine["status"] != "built":
        return engine["status"]
    failed = [g["name"] for g in gates if not g["passed"]]
    return "pass" if not failed else "FAIL: " + ", ".join(failed)


def rows(report: dict) -> list[list[str]]:
    out = []
    for e in report["engines"]:
        if e["status"] != "built":
            out.append([e["target"], e["status"], "—", "—", "—", "—", "—", e.get("reason") or ""])
            continue
        out.append([
            e["target"], e["precision"] + (" (emulated)" if e.get("latency_note") else ""),
            _fmt(_worst(e, "cosine"), ".6f"),
            _fmt(_worst(e, "top1_agreement"), ".4f"),
            _fmt(_worst(e, "max_abs", max), ".2e"),
            _fmt(e["latency_ms"]["p50"]) + " / " + _fmt(e["latency_ms"]["p99"]),
            _speedup(e),
            _gates(e),
        ])
    return out


HEADERS = ["engine", "precision", "cosine (worst)", "top-1", "max |err|", "p50 / p99 ms",
           "speedup vs torch [95% CI]", "gates"]


def table(report: dict) -> Table:
    base = report.get("baseline") or {}
    lat = base.get("latency_ms") or {}
    caption = (f"baseline {base.get('runner', '?')} {base.get('precision', '')}: "
               f"p50 {_fmt(lat.get('p50'))} ms, p99 {_fmt(lat.get('p99'))} ms") if lat else None
    t = Table(title=f"{report['recipe']}: engines vs PyTorch", caption=caption)
    for h in HEADERS:
        t.add_column(h, overflow="fold")
    for r in rows(report):
        style = "red" if r[-1].startswith(("FAIL", "failed")) else None
        t.add_row(*r, style=style)
    return t


def markdown(report: dict) -> str:
    base = report.get("baseline") or {}
    lat = base.get("latency_ms") or {}
    lines = [
        f"# {report['recipe']}",
        "",
        report.get("description") or "",
        "",
        f"- created: {report['created']}",
        f"- recipe sha256: `{report['recipe_sha256'][:16]}…`",
        f"- device: {report['device']['cpu']}"
        + (f", GPU {report['device']['gpu']} (sm {report['device']['compute_capability']})"
           if report["device"].get("gpu") else ", no GPU"),
        "- versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v),
        "",
        "## Engines",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows(report)]
    if lat:
        lines += [
            "",
            f"Baseline: {base['runner']} ({base['precision']}, {base.get('device', '')}), "
            f"p50 {lat['p50']:.3f} ms, p90 {lat['p90']:.3f} ms, p99 {lat['p99']:.3f} ms "
            f"over {lat['n']} requests.",
        ]
    export = report.get("export") or {}
    if export:
        lines += ["", "## Export", "",
                  f"{export.get('exporter')} exporter, opset {export.get('opset')}, "
                  f"{export.get('nodes')} nodes, {export.get('export_seconds', 0):.1f} s; parity vs "
                  "PyTorch at the opt and max shapes: "
                  + ", ".join(f"`{k}` max_abs {v['max_abs']:.2e}, cosine {v['cosine']:.6f}"
                              for k, v in (export.get("parity") or {}).items())]
    if report.get("precision"):
        from pipeline.precision.report import markdown as precision_markdown

        lines += precision_markdown(report["precision"])
    for e in report["engines"]:
        if e["status"] != "built":
            continue
        lines += ["", f"## {e['target']}", "", f"- engine: `{e['path']}` ({e['bytes']:,} bytes), "
                  f"sha256 `{e['sha256'][:16]}…`"]
        lines += ["", "| output | max abs | mean abs | max rel | cosine (worst feed) | top-1 |",
                  "|---|---|---|---|---|---|"]
        for name, m in e["accuracy"].items():
            lines.append(f"| {name} | {m['max_abs']:.3e} | {m['mean_abs']:.3e} | {m['max_rel']:.3e} "
                         f"| {m['cosine']:.6f} | {_fmt(m['top1_agreement'], '.4f')} |")
        el, bl = e["latency_ms"], e["baseline_latency_ms"]
        lines += ["", "| runner | p50 ms | p90 ms | p99 ms | mean ms | CoV | n |", "|---|---|---|---|---|---|---|"]
        for label, x in ((e["target"], el), ("torch-eager (interleaved)", bl)):
            lines.append(f"| {label} | {x['p50']:.3f} | {x['p90']:.3f} | {x['p99']:.3f} | "
                         f"{x['mean']:.3f} | {x['cov']:.2f} | {x['n']} |")
        if e.get("latency_note"):
            lines += ["", f"**Latency not meaningful here:** {e['latency_note']}."]
        if e.get("effective_precision"):
            from pipeline.precision.report import effective_markdown

            lines += effective_markdown(e["effective_precision"])
        s = e["speedup_vs_baseline"]
        lines += ["", f"Speedup vs PyTorch: **{s['ratio']:.2f}x** (95% CI {s['ci95'][0]:.2f}–"
                  f"{s['ci95'][1]:.2f}, {s['verdict']}). How: {e['latency_method']}.", "",
                  "Gates: " + "; ".join(f"{'✓' if g['passed'] else '✗'} {g['name']} ({g['detail']})"
                                       for g in e["gates"])]
    return "\n".join(lines) + "\n"
