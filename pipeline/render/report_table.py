"""The terminal table of a report: one row per engine against PyTorch, the workload's
headlines in its caption."""

from __future__ import annotations

from rich.table import Table

from pipeline.core.text import escape, fmt, speedup


def _speedup(engine: dict) -> str:
    s = engine.get("speedup_vs_baseline")
    if not s:
        return "—"
    return speedup(s["ratio"], s["ci95"])


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
            fmt(_worst(e, "cosine"), ".6f"),
            fmt(_worst(e, "top1_agreement"), ".4f"),
            fmt(_worst(e, "max_abs", max), ".2e"),
            fmt(e["latency_ms"]["p50"]) + " / " + fmt(e["latency_ms"]["p99"]),
            _speedup(e),
            _gates(e),
        ])
    return out


HEADERS = ["engine", "precision", "cosine (worst)", "top-1", "max |err|", "p50 / p99 ms",
           "vs torch [95% CI]", "gates"]


def table(report: dict, workload=None) -> Table:
    """The terminal table; `workload` (workloads.of(recipe), default: the forward pass) adds
    its headlines to the caption."""
    if workload is None:
        from pipeline.workloads import tensor as workload
    base = report.get("baseline") or {}
    lat = base.get("latency_ms") or {}
    caption = (f"baseline {base.get('runner', '?')} {base.get('precision', '')} timed alone: "
               f"p50 {fmt(lat.get('p50'))} ms, p99 {fmt(lat.get('p99'))} ms") if lat else None
    heads = workload.headlines(report)
    if heads:
        caption = "\n".join([*([caption] if caption else []), *map(escape, heads)])
    if report.get("warnings"):
        caption = "\n".join([*([caption] if caption else []),
                              *(f"[yellow]warning: {escape(w)}[/]" for w in report["warnings"])])
    t = Table(title=f"{report['recipe']}: engines vs PyTorch", caption=caption)
    for h in HEADERS:
        t.add_column(h, overflow="fold")
    for r in rows(report):
        style = "red" if r[-1].startswith(("FAIL", "failed")) else None
        t.add_row(*(escape(c) for c in r), style=style)  # reasons may hold [brackets]
    return t
