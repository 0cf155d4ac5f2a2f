"""compare.json -> compare.md, a self-contained compare.html (plots embedded), PNG plots,
and the terminal tables. Everything here reads the JSON; nothing is measured again."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import numpy as np
from rich.table import Table

from pipeline.bench import plots
from pipeline.core.safe_files import write_atomic, write_atomic_with
from pipeline.core.text import fmt, time_ratio_speedup
from pipeline.explain.profile import CATEGORY_ORDER

# ------------------------------------------------------------------ tables as rows
ENGINE_HEADERS = ["recipe", "engine", "status", "precision", "cosine (worst)", "top-1",
                  "p50 ms", "p99 ms", "req/s (1000/p50, 1 stream)", "peak RSS MiB (validate process)",
                  "engine MiB", "build s"]
ENGINE_NOTE = ("Accuracy: each engine against its own recipe's PyTorch baseline (validation feeds). "
               "p50, p99: the interleaved run below; req/s = 1000 / p50, one request at a time "
               "(single stream, no batching of requests). Peak RSS: the whole validate process of "
               "that engine (PyTorch baseline, engine session and the harness together), MiB. "
               "Engine: the engine file, MiB.")


def engine_rows(result: dict) -> list[list[str]]:
    return [[e["recipe"], e["target"], e["status"], e["precision"] or "—", fmt(e["cosine"], ".6f"),
             fmt(e["top1"], ".4f"), fmt(e["p50_ms"]), fmt(e["p99_ms"]), fmt(e["throughput_per_s"], ".0f"),
             fmt(e["peak_rss_mb"], ".0f"), fmt(e["engine_mb"], ".2f"), fmt(e["build_s"], ".1f")]
            for e in result["engines"]]


VERDICT_HEADERS = ["A", "B", "B vs A [95% CI]", "verdict for B", "block pairs"]


def verdict_rows(result: dict) -> list[list[str]]:
    rows = []
    for c in result["timing"]["shapes"][0]["comparisons"]:
        rows.append([c["a"], c["b"], time_ratio_speedup(c["time_ratio"], c["ci95"]),
                     _verdict_words(c), str(c["blocks"])])
    return rows


def _verdict_words(c: dict) -> str:
    if c["verdict"] == "slower":
        return f"SLOWER ({time_ratio_speedup(c['time_ratio'])})"
    if c["verdict"] == "faster":
        return f"faster ({time_ratio_speedup(c['time_ratio'])})"
    return "indistinguishable"


DELTA_HEADERS = ["category", "A us/request", "B us/request", "B - A us", "% of A total", "nodes A -> B"]


def delta_rows(versus: dict) -> list[list[str]]:
    return [[d["category"], f"{d['a_us']:.0f}", f"{d['b_us']:.0f}", f"{d['delta_us']:+.0f}",
             f"{d['delta_share_of_a']:+.1%}", f"{d['a_nodes']} -> {d['b_nodes']}"]
            for d in versus["deltas"]]


LAYER_HEADERS = ["node", "op", "module", "rel. error", "inputs' error"]


def layer_rows(explained: dict) -> list[list[str]]:
    return [[j["node"], j["op"], j["module"] or "—", f"{j['rel_error']:.2e}", f"{j['input_error']:.2e}"]
            for j in explained["jumps"]]


def cause_line(versus: dict) -> str:
    """One line: the likely causes when B is slower; what grew anyway when it is not."""
    if versus.get("models_differ"):
        rest = "; ".join(t["tag"] for t in versus["tags"] if t.get("secondary"))
        return (f"{versus.get('verdict')}, but A and B are different models (first tag): the "
                "difference in time is first the models' own, not evidence about precision"
                + (f"; secondary, what else grew: {rest}" if rest else ""))
    tags = "; ".join(t["tag"] for t in versus["tags"])
    if versus.get("verdict") == "slower":
        return f"slower, likely causes: {tags or 'no single category grew by 5% of the total'}"
    if not tags:
        return f"not slower ({versus.get('verdict')}); no category grew by 5% of the total"
    return f"not slower ({versus.get('verdict')}), though these grew: {tags}"


def profile_vs_measured(versus: dict) -> str | None:
    """The profiled totals beside the measured p50s: they differ, and the reader must know."""
    total = versus.get("profiled_total_us")
    if not total:
        return None
    a, b = total["a"], total["b"]
    line = (f"Profiled totals (kernel time summed over nodes, ORT profiler on): A {a:.0f} us, "
            f"B {b:.0f} us per request ({b / a if a else float('nan'):.2f}x)")
    m = versus.get("measured")
    if m:
        line += (f"; measured without the profiler (interleaved p50s above): A {m['a_p50_ms']:.3f} ms, "
                 f"B {m['b_p50_ms']:.3f} ms, B vs A {time_ratio_speedup(m['time_ratio'], m['ci95'])}")
    return (line + ". Profiling adds a cost to every node, so it inflates graphs of many small "
            "nodes more (see the node counts): read the categories as where the time goes, and "
            "the speed from the measured ratio.")


def models_line(result: dict) -> str | None:
    """Each model's size and opt shape, one line (compare.json schema 2)."""
    info = result.get("models")
    if not info:
        return None
    return "Models: " + "; ".join(
        f"`{name}` {m['parameters']:,} parameters, opt {' '.join(f'{k}={v}' for k, v in m['opt_dims'].items())}"
        if m.get("parameters") else f"`{name}` parameters unknown"
        for name, m in info.items()) + "."


# ------------------------------------------------------------------ terminal
def tables(result: dict) -> list[Table]:
    def table(title, headers, rows, caption=None):
        t = Table(title=title, caption=caption)
        for h in headers:
            t.add_column(h, overflow="fold")
        for r in rows:
            t.add_row(*r, style="red" if any("SLOWER" in c for c in r) else None)
        return t

    ref = result["reference"]
    out = [table("engines side by side", ENGINE_HEADERS, engine_rows(result),
                 caption=" ".join(x for x in (models_line(result), *_differ_lines(result)) if x)),
           table(f"speed vs {ref} (interleaved, one process)", VERDICT_HEADERS, verdict_rows(result))]
    for name, v in result["time_explained"]["versus"].items():
        out.append(table(f"where the time went: {name} vs {ref} (ONNX Runtime profile)",
                         DELTA_HEADERS, delta_rows(v),
                         caption=" ".join(x for x in (cause_line(v), profile_vs_measured(v)) if x)))
    for name, e in result["error_explained"].items():
        out.append(table(f"where the error came from: {name} (first diverging layers)",
                         LAYER_HEADERS, layer_rows(e)))
    return out


# ------------------------------------------------------------------ plots
def categories_png(path: Path, result: dict) -> Path | None:
    profiles = result["time_explained"]["profiles"]
    if not profiles:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(profiles)
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.6 * len(names)), dpi=100)
    left = np.zeros(len(names))
    for cat in CATEGORY_ORDER:
        values = np.array([profiles[n]["categories"][cat]["us"] for n in names])
        if values.sum() == 0:
            continue
        ax.barh(names, values, left=left, label=cat)
        left += values
    ax.set(xlabel="microseconds per request (ONNX Runtime profiler, kernel time)",
           title="where the time goes, by category")
    ax.invert_yaxis()
    # Beside the bars, not under them: an offset below the axes depends on the figure's
    # height, and with two recipes it covered the x label.
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    try:
        write_atomic_with(path, lambda f: fig.savefig(f, format="png", bbox_inches="tight"))
    finally:
        plt.close(fig)
    return path


# ------------------------------------------------------------------ markdown / html
def _md_table(headers, rows) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(r) + " |" for r in rows)]


def _differ_lines(result: dict) -> list[str]:
    return [f"NOT THE SAME MODEL: {name} vs {result['reference']}: {why}; its slowdown or speedup "
            "is first the model's size, not its precision or graph."
            for name, why in (result.get("models_differ") or {}).items()]


def markdown(result: dict, images: dict[str, str]) -> str:
    ref = result["reference"]
    lines = [f"# compare: {' vs '.join(result['recipes'])}", "", f"created {result['created']}; "
             f"reference (A) = `{ref}`; shared engines: {', '.join(result['shared_targets']) or 'none'}", ""]
    lines += [x for line in (models_line(result), *_differ_lines(result)) if line
              for x in (f"**{line}**" if line.startswith("NOT") else line, "")]
    lines += ["## Engines side by side", "", *_md_table(ENGINE_HEADERS, engine_rows(result)), "",
              ENGINE_NOTE, "",
             f"## Speed vs {ref}", "", *_md_table(VERDICT_HEADERS, verdict_rows(result)), "",
             f"How: {result['method']['timing']}.", ""]
    if "latency" in images:
        lines += [f"![latency distributions]({images['latency']})", ""]
    for name, v in result["time_explained"]["versus"].items():
        lines += [f"## Where the time went: {name} vs {ref}", "", *_md_table(DELTA_HEADERS, delta_rows(v)), ""]
        if profile_vs_measured(v):
            lines += [profile_vs_measured(v), ""]
        lines += [f"**{cause_line(v)}**", ""]
        lines += [f"- **{t['tag']}**{' (secondary)' if t.get('secondary') else ''}: {t['evidence']}"
                  for t in v["tags"]]
        lines += ["", f"How: {result['method']['profiles']}.", ""]
    if "categories" in images:
        lines += [f"![time by category]({images['categories']})", ""]
    for name, e in result["error_explained"].items():
        lines += [f"## Where the error came from: {name}", "",
                  f"`{e['typed_graph']}` against `{e['float_graph']}`; first nodes whose output error "
                  "jumps above their inputs' error:", "", *_md_table(LAYER_HEADERS, layer_rows(e)), "",
                  f"How: {e['method']}.", ""]
    return "\n".join(lines) + "\n"


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}th,td{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f0f0f0}tr.slower td{background:#fde8e8}img{max-width:100%;border:1px solid #ddd}
.tag{font-weight:600}.how{color:#555;font-size:13px}"""


def _html_table(headers, rows, table_id) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        f"<tr class=\"{'slower' if any('SLOWER' in c for c in r) else ''}\">"
        + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def page(result: dict, pngs: dict[str, Path]) -> str:
    ref = result["reference"]
    img = {k: "data:image/png;base64," + base64.b64encode(p.read_bytes()).decode() for k, p in pngs.items()}
    parts = [f"<h1>compare: {html.escape(' vs '.join(result['recipes']))}</h1>",
             f"<p class=how>created {result['created']}; reference (A) = {html.escape(ref)}</p>",
             *(f"<p class=how>{html.escape(x)}</p>" for x in (models_line(result),) if x),
             *(f"<p class=tag>{html.escape(x)}</p>" for x in _differ_lines(result)),
             "<h2>Engines side by side</h2>", _html_table(ENGINE_HEADERS, engine_rows(result), "engines"),
             f"<p class=how>{html.escape(ENGINE_NOTE)}</p>",
             f"<h2>Speed vs {html.escape(ref)}</h2>", _html_table(VERDICT_HEADERS, verdict_rows(result), "verdicts"),
             f"<p class=how>{html.escape(result['method']['timing'])}</p>"]
    if "latency" in img:
        parts.append(f'<img id="latency-plot" alt="latency distributions" src="{img["latency"]}">')
    for name, v in result["time_explained"]["versus"].items():
        parts += [f"<h2>Where the time went: {html.escape(name)} vs {html.escape(ref)}</h2>",
                  _html_table(DELTA_HEADERS, delta_rows(v), f"delta-{html.escape(name)}"),
                  *(f"<p class=how>{html.escape(x)}</p>" for x in (profile_vs_measured(v),) if x),
                  f"<p class=tag>{html.escape(cause_line(v))}</p><ul>"]
        parts += [f"<li><span class=tag>{html.escape(t['tag'])}</span>"
                  f"{' (secondary)' if t.get('secondary') else ''}: {html.escape(t['evidence'])}</li>"
                  for t in v["tags"]]
        parts.append("</ul>")
    if "categories" in img:
        parts.append(f'<img id="categories-plot" alt="time by category" src="{img["categories"]}">')
    for name, e in result["error_explained"].items():
        parts += [f"<h2>Where the error came from: {html.escape(name)}</h2>",
                  _html_table(LAYER_HEADERS, layer_rows(e), f"layers-{html.escape(name)}"),
                  f"<p class=how>{html.escape(e['method'])}</p>"]
    return (f"<!doctype html><html><head><meta charset=utf-8><title>compare</title>"
            f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>\n")


def write_all(result: dict, samples: dict, folder: Path) -> list[Path]:
    """compare.json (`result`: the ForwardCompare's dump), .md and .html with the plots;
    returns the files a person opens."""
    pngs = {"latency": plots.latency_png(folder / "latency.png", samples,
                                         "compare: " + " vs ".join(result["recipes"]))}
    cats = categories_png(folder / "categories.png", result)
    if cats is not None:
        pngs["categories"] = cats
    write_atomic(folder / "compare.json", json.dumps(result, indent=2, default=str) + "\n")
    write_atomic(folder / "compare.md", markdown(result, {k: p.name for k, p in pngs.items()}))
    write_atomic(folder / "compare.html", page(result, pngs))
    return [folder / "compare.md", folder / "compare.html"]
