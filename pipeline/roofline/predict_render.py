"""`pipeline predict`'s output: per engine, a table of its floors at the workload's points
(with this machine's measured figures beside them when the device is this machine), what
would not run on the device as built and how we know, and, apart, the efficiency measured
here (never applied to another device's floors). markdown() is the same as a report section."""

from __future__ import annotations

from rich.table import Table

from pipeline.core.text import escape
from pipeline.roofline.predict import EnginePrediction, PointFloor, Prediction


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.3f} ms" if value < 10 else f"{value:,.1f} ms"


def _si(value: float) -> str:
    """1.6 M, 35.9 G: operations or bytes at a glance."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:,.3g} {prefix}"
    return f"{value:,.0f}"


def _what(p: PointFloor) -> str:
    if p.phase == "prefill":
        return f"{p.label} (TTFT)"
    if p.phase == "decode":
        return f"{p.label} (TPOT)" if p.batch == 1 else f"{p.label} ({p.batch / (p.floor_ms / 1e3):,.0f} tokens/s)"
    return p.label


def _largest(p: PointFloor) -> str:
    if not p.categories:
        return "-"
    cat, ms = max(p.categories.items(), key=lambda kv: kv[1])
    return f"{cat} {_ms(ms)}"


def rows(engine: EnginePrediction, here: bool) -> list[list[str]]:
    out = []
    for p in engine.points:
        row = [_what(p), _ms(p.floor_ms), f"{p.compute_bound_share:.0%} compute", _si(p.flops),
               f"{_si(p.bytes)}B", _largest(p)]
        if here:
            row += [_ms(p.measured_ms), f"{p.efficiency:.2f}" if p.efficiency else "-"]
        out.append(row)
    if engine.task_ms is not None:
        row = ["task (script at batch 1)", _ms(engine.task_ms), "", "", "", ""]
        if here:
            eff = engine.task_ms / engine.task_measured_ms if engine.task_measured_ms else None
            row += [_ms(engine.task_measured_ms), f"{eff:.2f}" if eff else "-"]
        out.append(row)
    return out


COLUMNS = ["point", "floor", "bound (share of floor)", "FLOPs", "bytes moved", "largest category"]
HERE_COLUMNS = ["measured p50 here", "floor / measured"]


def header(pred: Prediction) -> list[str]:
    return [f"{escape(pred.recipe)} on {pred.device} ({escape(pred.title)}): {pred.label}",
            f"source: {escape(pred.source)}",
            f"memory {pred.bandwidth_bytes_per_s / 1e9:,.1f} GB/s (DRAM); each node max(FLOPs / peak of its type, "
            "bytes / bandwidth), summed in graph order"]


def support_lines(engine: EnginePrediction, esc=escape) -> list[str]:
    """What would not run on the device as built, how we know; the engine's notes. `esc`:
    rich markup escaping for the terminal (str for markdown)."""
    lines = []
    for sup in engine.support:
        if not sup.unsupported:
            lines.append(f"{sup.runtime}: every op has a kernel ({esc(sup.how)})")
            continue
        lines.append(f"{sup.runtime}: would not run as built ({esc(sup.how)}):")
        lines += [f"  {esc(u.op)} x{u.nodes}: {esc(u.why)}" for u in sup.unsupported]
    return lines + [f"note: {esc(n)}" for n in engine.notes]


def tables(pred: Prediction) -> list:
    here = pred.provenance == "measured"
    parts: list = []
    for engine in pred.engines:
        table = Table(title=f"{escape(engine.target)} ({escape(engine.kind)}: {escape(engine.graph)}"
                            + (f", {engine.threads} threads" if engine.threads else "") + ")")
        for col in COLUMNS + (HERE_COLUMNS if here else []):
            table.add_column(col, justify="left" if col in ("point", "largest category") else "right")
        for row in rows(engine, here):
            table.add_row(*[escape(c) for c in row])
        parts += [table, *support_lines(engine), *(furthest_lines(engine) if here else [])]
    return parts


def furthest_lines(engine: EnginePrediction, esc=escape) -> list[str]:
    """Where to look: the categories furthest above their floors in the report's profile."""
    if not engine.furthest:
        return []
    return ["furthest from their floors on this machine (the report's profile):",
            *[f"  {esc(f)}" for f in engine.furthest]]


def efficiency_lines(here: Prediction) -> list[str]:
    """This machine's floor / measured per engine and point: how far runtimes stay from the
    floor here. Shown beside another device's floors, never applied to them."""
    lines = ["efficiency measured on this machine (floor / measured p50; not applied to the floors above):"]
    for engine in here.engines:
        parts = [f"{p.label} {p.efficiency:.2f}" for p in engine.points if p.efficiency]
        if engine.task_ms and engine.task_measured_ms:
            parts.append(f"task {engine.task_ms / engine.task_measured_ms:.2f}")
        lines.append(f"  {escape(engine.target)}: {', '.join(parts) if parts else 'no measured point'}")
        lines += [f"    furthest from its floor here: {escape(f)}" for f in engine.furthest[:1]]
    return lines


def markdown(pred: Prediction) -> str:
    """The same as a report.md section (a renderer for render/report_markdown.py to call)."""
    here = pred.provenance == "measured"
    out = [f"### {pred.recipe} on {pred.device}: {pred.label}", "",
           f"- source: {pred.source}", f"- memory {pred.bandwidth_bytes_per_s / 1e9:,.1f} GB/s (DRAM)", ""]
    for engine in pred.engines:
        cols = COLUMNS + (HERE_COLUMNS if here else [])
        out += [f"#### {engine.target} ({engine.graph})", "", "| " + " | ".join(cols) + " |",
                "|" + "---|" * len(cols)]
        out += ["| " + " | ".join(row) + " |" for row in rows(engine, here)]
        out += ["", *[f"- {line.strip()}" for line in support_lines(engine, str) + furthest_lines(engine, str)], ""]
    return "\n".join(out)


def serve_parts(target: str, got) -> list:
    """`predict --serve` for one engine: its decode curve and the `serve:` lines to paste, or
    why there is none (`got`: a ServeSuggestion or a reason)."""
    if isinstance(got, str):
        return [f"{escape(target)}: no serve suggestion: {escape(got)}"]
    from pipeline.roofline import serve_suggestion

    table = Table(title=f"{escape(target)}: decode step floor by batch on {escape(got.device)} "
                        f"(context {got.context}; a model, not a measurement)")
    for col in ("sequences", "step floor", "tokens/s", "compute-bound share", "tokens/s vs previous"):
        table.add_column(col, justify="right")
    for p in got.curve:
        mark = " ◀" if p.batch == got.max_running_sequences else ""
        table.add_row(f"{p.batch}{mark}", _ms(p.step_ms), f"{p.tokens_per_s:,.0f}", f"{p.compute_bound_share:.0%}",
                      f"{p.gain:.2f}x" if p.gain else "-")
    return [table, *[escape(line) for line in serve_suggestion.yaml_lines(got, target)]]
