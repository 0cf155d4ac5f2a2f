"""report.md, rendered from report.json's dump alone: the engines, their measurement, data and
task figures, the graph stages, the precision, and the Serving section of `pipeline load`."""

from __future__ import annotations

from pipeline.artifacts.generation import HEADLINE_TIMED
from pipeline.core import deps
from pipeline.core.text import fmt, speedup, time_ratio_speedup
from pipeline.render.report_table import HEADERS, rows
from pipeline.render.roofline_markdown import markdown as roofline_markdown


def _engine_notes(e: dict) -> list[str]:
    """Lines for backend extras (TensorRT: CUDA Graphs, effective precision), when present."""
    notes = []
    rt = e.get("runtime") or {}
    if rt:
        why = f" ({rt['capture_failure']})" if rt.get("capture_failure") else ""
        notes.append(f"CUDA Graphs: {rt.get('cuda_graphs')}{why}; {rt.get('captures', 0)} captures, "
                     f"{rt.get('replays', 0)} replays, {rt.get('enqueues', 0)} plain enqueues.")
    eff = e.get("tensorrt_layer_shares") or {}
    shares = eff.get("time_share") or eff.get("layer_share")
    if shares:
        basis = "time" if eff.get("time_share") else "layers"
        spread = ", ".join(f"{k} {v:.0%}" for k, v in shares.items() if v)
        notes.append(f"Effective precision (share of {basis}, {eff['layers']} layers): {spread}; "
                     f"{eff['reformat_layers']} reformat layers.")
    return [n for line in notes for n in (line, "")]


def markdown(report: dict, workload=None, loads: list[dict] = ()) -> str:
    """report.md; `workload` (workloads.of(recipe), default: the forward pass) renders each
    built engine's own section; `loads` adds a Serving section per load file."""
    if workload is None:
        from pipeline.workloads import tensor as workload
    lines = _summary(report, workload)
    lines += _export_markdown(report.get("export"))
    lines += _optimize_markdown(report.get("optimize"))
    if report.get("precision"):
        from pipeline.precision.report import markdown as precision_markdown

        lines += precision_markdown(report["precision"])
    for e in report["engines"]:
        if e["status"] == "built":
            lines += _engine_section(e, workload)
    lines += _stages_markdown(report.get("stages") or {})
    if loads:
        from pipeline.render.serving_markdown import markdown as serving_markdown

        lines += serving_markdown(list(loads))
    return "\n".join(lines) + "\n"


def _summary(report: dict, workload) -> list[str]:
    """The title, the recipe's provenance, the engines table with the workload's headlines,
    the baseline stage's own timing and the warnings."""
    base = report.get("baseline") or {}
    lat = base.get("latency_ms") or {}
    lines = [
        f"# {report['recipe']}",
        "",
        report.get("description") or "",
        "",
        f"- created: {report['created']}",
        f"- recipe sha256: `{report['recipe_sha256'][:16]}…`",
        f"- device: {deps.device_line(report['device'])}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v),
        *_data_lines(report.get("data")),
        "",
        "## Engines",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows(report)]
    heads = workload.headlines(report)
    lines += ["", *(f"- {h}" for h in heads)] if heads else []
    if lat:
        # what the baseline stage timed: a generation recipe's figure is one decode step
        unit = f"{HEADLINE_TIMED}s" if base.get("generation") else "requests"
        lines += [
            "",
            f"Baseline: {base['runner']} ({base['precision']}, {base.get('device', '')}), "
            f"timed alone in the baseline stage: p50 {lat['p50']:.3f} ms, p90 {lat['p90']:.3f} ms, "
            f"p99 {lat['p99']:.3f} ms over {lat['n']} {unit}. Each speedup below uses the "
            "baseline timed interleaved with that engine.",
        ]
    if report.get("warnings"):
        lines += ["", "**Warnings** (figures below may be distorted):", ""]
        lines += [f"- {w}" for w in report["warnings"]]
    return lines


def _stages_markdown(stages: dict[str, dict]) -> list[str]:
    """Each stage's time and peak memory when it ran (a cached stage: the run that made it)."""
    if not stages:
        return []
    lines = ["", "## Stages", "",
             "Time and the run process's peak resident memory while each stage ran (VmHWM reset "
             "at the stage's start; a stage reused from the cache shows the run that made it).",
             "", "| stage | seconds | peak RSS MB | finished |", "|---|---|---|---|"]
    for sid, s in stages.items():
        lines.append(f"| {sid} | {fmt(s.get('seconds'), '.1f')} | {fmt(s.get('peak_rss_mb'), ',.0f')} "
                     f"| {s.get('finished') or '-'} |")
    return lines


def _export_markdown(export: dict | None) -> list[str]:
    """The export stage: exporter, opset, size, time and parity vs PyTorch."""
    if not export:
        return []
    return ["", "## Export", "",
            f"{export.get('exporter')} exporter, opset {export.get('opset')}, "
            f"{export.get('nodes')} nodes, {export.get('export_seconds', 0):.1f} s; parity vs "
            "PyTorch at the opt and max shapes: "
            + ", ".join(f"`{k}` max_abs {v['max_abs']:.2e}, cosine {v['cosine']:.6f}"
                        for k, v in (export.get("parity") or {}).items())]


def _engine_section(e: dict, workload) -> list[str]:
    """One built engine: its accuracy per output, task figure, latency vs the interleaved
    baseline, effective precision, speedup and gates, the workload's own lines, measurement."""
    lines = ["", f"## {e['target']}", "", f"- engine: `{e['path']}` ({e['bytes']:,} bytes), "
             f"sha256 `{e['sha256'][:16]}…`"]
    lines += ["", "| output | max abs | mean abs | max rel | cosine (worst feed) | "
              "cosine (worst sample) | top-1 |", "|---|---|---|---|---|---|---|"]
    for name, m in e["accuracy"].items():
        lines.append(f"| {name} | {m['max_abs']:.3e} | {m['mean_abs']:.3e} | {m['max_rel']:.3e} "
                     f"| {m['cosine']:.6f} | {fmt(m.get('cosine_worst_sample'), '.6f')} "
                     f"| {fmt(m['top1_agreement'], '.4f')} |")
    lines += _task_lines(e.get("task"))
    el, bl = e["latency_ms"], e["baseline_latency_ms"]
    lines += ["", "| runner | p50 ms | p90 ms | p99 ms | mean ms | CoV | n |", "|---|---|---|---|---|---|---|"]
    for label, x in ((e["target"], el), (f"{workload.BASELINE} (interleaved)", bl)):
        lines.append(f"| {label} | {x['p50']:.3f} | {x['p90']:.3f} | {x['p99']:.3f} | "
                     f"{x['mean']:.3f} | {x['cov']:.2f} | {x['n']} |")
    if e.get("latency_note"):
        lines += ["", f"**Latency not meaningful here:** {e['latency_note']}."]
    # ONNX Runtime's effective precision (FLOP shares); TensorRT's (layer/time shares)
    # is rendered by _engine_notes
    if e.get("ort_flop_shares"):
        from pipeline.precision.report import effective_markdown

        lines += effective_markdown(e["ort_flop_shares"])
    s = e["speedup_vs_baseline"]
    lines += ["", f"{e['target']} vs PyTorch: **{speedup(s['ratio'], s['ci95'])}** (95% CI; "
              f"{s['verdict']}). How: {e['latency_method']}.", "",
              *_engine_notes(e),
              "Gates: " + "; ".join(f"{'✓' if g['passed'] else '✗'} {g['name']} ({g['detail']})"
                                   for g in e["gates"])]
    lines += workload.engine_markdown(e)
    lines += roofline_markdown(e.get("roofline"))
    lines += _measurement(e)
    return lines


def _data_lines(data: dict | None) -> list[str]:
    """`- data: validation ..., calibration ...`: where every accuracy figure came from."""
    if not data:
        return []
    parts = []
    for split in ("validation", "calibration"):
        d = data.get(split)
        parts.append(f"{split} none" if d is None else
                     f"{split} {d['source']} ({d['samples']} samples, sha256 `{d['sha256'][:16]}…`)")
    return ["- data: " + "; ".join(parts)]


def _task_lines(task: dict | None) -> list[str]:
    if not task:
        return []
    lo, hi = task["ci95"]
    extra = (f"; retrieval top-1 agreement with PyTorch {task['retrieval_top1_agreement']:.4f}"
             if task.get("retrieval_top1_agreement") is not None else "")
    return ["", f"Task `{task['metric']}` on the validation data: PyTorch {task['baseline']:.4f}, "
            f"engine {task['engine']:.4f}, delta {task['delta']:+.4f} (95% paired-bootstrap CI "
            f"[{lo:+.4f}, {hi:+.4f}]){extra}."]


def _measurement(e: dict) -> list[str]:
    """A/Bs against other recipes, resources, harness overhead, plot."""
    lines = []
    for v in e.get("versus") or []:
        if v.get("reason"):
            lines += ["", f"Versus `{v['other']}`: not measured ({v['reason']})."]
            continue
        c = v["comparison"]
        lines += ["", f"Versus `{v['other_recipe']}`'s {v['target']} (interleaved): "
                  f"{time_ratio_speedup(c['time_ratio'], c['ci95'])}, {c['verdict']} "
                  f"(p50 {v['this_ms']['p50']:.3f} vs {v['other_ms']['p50']:.3f} ms)."]
    res, over = e.get("resources"), e.get("harness_overhead_us")
    if res:
        busy, gpu = res.get("system_busy_pct"), res["gpu"]
        lines += ["", f"Resources while timing: process CPU {fmt((res['process_cpu_pct'] or {}).get('mean'), '.0f')}% "
                  f"(100% = one core), machine busy {fmt((busy or {}).get('mean'), '.0f')}% of "
                  f"{res['cores']} cores, peak RSS {fmt(res['peak_rss_mb'], '.0f')} MB; GPU: "
                  + (f"{gpu['name']}, util {gpu['util_pct']['mean']:.0f}%, throttle "
                     f"{', '.join(gpu['throttle']) or 'none'}" if gpu["available"]
                     else f"unavailable ({gpu['reason']})") + "."]
    if over:
        lines += ["", f"Harness overhead: {over['p50']:.2f} us per request (p50, no-op runner, "
                  f"timer {e.get('timer')})."]
    if e.get("plot"):
        lines += ["", f"![latency distribution of {e['target']} and torch-eager]({e['plot']})"]
    return lines


def _drift(drift: dict[str, dict]) -> str:
    """Per output; a family of three or more dotted outputs (a KV cache's `present.0.key` ..
    `present.29.value`) as one entry: how many, the worst of them."""
    families: dict[str, list[str]] = {}
    for name in drift:
        families.setdefault(name.split(".")[0] if "." in name else name, []).append(name)
    parts = []
    for family, names in families.items():
        if len(names) < 3:
            parts += [f"`{k}` max abs {drift[k]['max_abs']:.2e}, cosine {drift[k]['cosine']:.7f}" for k in names]
            continue
        worst_abs = max(names, key=lambda k: drift[k]["max_abs"])
        worst_cos = min(names, key=lambda k: drift[k]["cosine"])
        parts.append(f"{len(names)} outputs `{family}.*` worst max abs {drift[worst_abs]['max_abs']:.2e} "
                     f"(`{worst_abs}`), worst cosine {drift[worst_cos]['cosine']:.7f} (`{worst_cos}`)")
    return "; ".join(parts)


def _fused(fused: dict) -> str:
    return ", ".join(f"{op} x{n}" for op, n in fused.items()) or "—"


def _ops(ops: dict | None, top: int = 6) -> str:
    if not ops:
        return "—"
    items = list(ops.items())
    more = sum(n for _, n in items[top:])
    return ", ".join(f"{op} {n}" for op, n in items[:top]) + (f", other {more}" if more else "")


def _last_positions(cut: dict | None) -> str:
    if not cut:
        return ""
    return (f" {', '.join(f'`{o}`' for o in cut['outputs'])} of a longer feed are compared at its "
            f"last {cut['positions']} positions (a long prefill's logits are 1 GB a copy).")


def _optimize_markdown(opt: dict | None) -> list[str]:
    """The optimize stage: per pass what it did and whether it was kept, then the latency."""
    if not opt:
        return []
    tol = opt["tolerance"]
    lines = ["", "## Optimize", "",
             f"{opt['nodes_before']} -> {opt['nodes_after']} nodes, "
             f"{opt['bytes_before']:,} -> {opt['bytes_after']:,} bytes; fused: {_fused(opt['fused'])}. "
             f"Each pass is checked against its input graph on the min/opt/max-shape feeds "
             f"(ONNX Runtime, its own optimizer off; max |diff| <= {tol['max_abs']:g}, cosine >= "
             f"{tol['cosine_min']:g}); a rejected pass is skipped and the chain goes on."
             + _last_positions(opt.get("checked_last_positions")), "",
             "| pass | result | nodes | fused | size (bytes) | max abs diff | time s |",
             "|---|---|---|---|---|---|---|"]
    for p in opt["passes"]:
        diff = max((m["max_abs"] for m in p["check"].values()), default=None)
        result = (p["status"] if p["status"] in ("accepted", "no match")  # no match: graph unchanged
                  else f"**rejected**: {p['reason']}")
        after = p["nodes_after"] if p["nodes_after"] is not None else "—"
        size = f"{p['bytes_before']:,} -> {p['bytes_after']:,}" if p["bytes_after"] else "—"
        lines.append(f"| {p['name']} | {result.replace('|', '/')} | {p['nodes_before']} -> {after} | "
                     f"{_fused(p['fused'])} | {size} | {fmt(diff, '.2e')} | {p['seconds']:.2f} |")
    lines += ["", f"Ops before: {_ops(opt['ops_before'])}.", "",
              f"Ops after: {_ops(opt['ops_after'])}.", "",
              "Drift of the optimized graph vs the exported one: " + _drift(opt["drift_vs_export"]) + "."]
    lat = opt.get("latency")
    if lat:
        s, a, b = lat["speedup"], lat["exported_ms"], lat["optimized_ms"]
        lines += ["", f"Latency, optimized vs exported graph: p50 {b['p50']:.3f} ms vs {a['p50']:.3f} ms, "
                  f"**{speedup(s['ratio'], s['ci95'])}** (95% CI; {s['verdict']}). "
                  f"How: {lat['method']}."]
    return lines
