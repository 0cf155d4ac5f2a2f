"""report.md and terminal lines of a generation workload, rendered from report.json alone.

What a reader of a chat model's report needs first: the task score (answers right, with
intervals, answers identical to PyTorch's, perplexity), then per timed point TTFT, TPOT,
tokens/s and time per task for the engine and the PyTorch static-cache baseline (interleaved,
with the engine-vs-PyTorch ratio), the long point's TPOT along the context, memory, and the
KV-cache outputs in one line.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.text import fmt, speedup

MB = 1 << 20


def _ratio(s: dict | None) -> str:
    return speedup(s["ratio"], s["ci95"]) + f" ({s['verdict']})" if s else "—"


def score_lines(g: dict) -> list[str]:
    s = g.get("score")
    if not s:
        return []
    a, p, same = s["answer_accuracy"], s["perplexity"], s["identical_answers"]
    (elo, ehi), (blo, bhi), (dlo, dhi) = a["engine_ci95"], a["baseline_ci95"], a["ci95"]
    rlo, rhi = p["ratio_ci95"]
    return ["", "**Task score** (chat template, greedy, stopping at end of sequence; 95% bootstrap "
            "intervals, paired for the deltas):", "",
            "| | engine | PyTorch | engine - PyTorch |", "|---|---|---|---|",
            f"| questions answered right | {a['correct']}/{a['questions']} = {a['engine']:.1%} "
            f"[{elo:.1%}, {ehi:.1%}] | {a['baseline_correct']}/{a['questions']} = {a['baseline']:.1%} "
            f"[{blo:.1%}, {bhi:.1%}] | {a['delta']:+.1%} [{dlo:+.1%}, {dhi:+.1%}] |",
            f"| perplexity, {p['tokens']} held-out tokens | {p['engine']:.3f} | {p['baseline']:.3f} "
            f"| x{p['ratio']:.4f} [{rlo:.4f}, {rhi:.4f}] |",
            f"| answers identical to PyTorch's (token for token) | {same['count']}/{same['of']} | — | — |",
            f"| median time per answer | {s['seconds_per_answer']['engine']:.2f} s | "
            f"{s['seconds_per_answer']['baseline']:.2f} s | (not interleaved) |"]


def point_lines(g: dict, baseline_name: str) -> list[str]:
    base = g["baseline"]["points"]
    lines = ["", f"| point | runner | TTFT p50 ms | TPOT p50 ms | tokens/s | time s | "
             f"engine vs {baseline_name}: TTFT / TPOT / whole request |", "|---|---|---|---|---|---|---|"]
    for label, p in g["points"].items():
        b = base.get(label) or {}
        prompt = "+".join(str(n) for n in p["prompt_tokens"])
        sp = p.get("speedup_vs_baseline") or {}
        for name, x, ratio in ((p.get("runner", "engine"), p, " / ".join(
                _ratio(sp.get(k)) for k in ("ttft", "tpot", "total"))), (baseline_name, b, "")):
            if not x:
                continue
            lines.append(f"| {label} (prompt {prompt}, batch {x['batch']}) | {name} | "
                         f"{x['ttft_ms']['p50']:.1f} | {x['tpot_ms']['p50']:.2f} | "
                         f"{x['tokens_per_s']['per_sequence']:.1f} | {x['time_s']:.3f} | {ratio} |")
    long, blong = g["points"].get("long"), base.get("long")
    if long and long.get("tpot_vs_context"):
        lines += ["", "TPOT p50 (ms) along the long generation's context: " + "; ".join(
            f"{c['context'][0]}-{c['context'][1]}: engine {c['tpot_ms_p50']:.2f}, PyTorch {bc['tpot_ms_p50']:.2f}"
            for c, bc in zip(long["tpot_vs_context"], (blong or {}).get("tpot_vs_context") or []))]
    return lines


def memory_lines(g: dict) -> list[str]:
    m = g.get("memory") or {}
    if not m:
        return []
    loads, before = m.get("load_rss_bytes") or {}, m.get("before_runner_bytes")
    mb = lambda v: fmt(v and v / MB, ".0f")  # noqa: E731
    runners = "; ".join(
        f"{name}: load {mb(loads.get(name))} MB, peak {mb(v.get('peak_rss_bytes'))} MB "
        f"(+{mb(v.get('growth_bytes'))} MB while generating)"
        for name, v in (m.get("peak") or {}).items())
    where = ("each runner in a fresh process of its own" if before is not None
             else "all runners in one process (a report written before they were isolated)")
    lines = ["", f"Memory (RSS, {where}; `{m.get('request')}`): {runners}."]
    if before:
        lines.append("Before the runner (Python and the libraries it imports): " + ", ".join(
            f"{name} {mb(v)} MB" for name, v in before.items()) + ".")
    lines.append(f"KV cache {m['kv_cache_bytes_per_token'] / 1024:.1f} KiB per token, "
                 f"{m['kv_cache_bytes_at_peak'] / MB:.1f} MB at that request's context.")
    return lines


def floor_lines(g: dict) -> list[str]:
    """Decode against the bandwidth floor, engine and PyTorch (generation.floor)."""
    f = g.get("floor")
    if not f:
        return []
    lines = ["", f"Decode against the memory-bandwidth floor (bytes one decode step reads: weights as "
             f"a session holds them + the KV cache at the context, over this machine's {f['bandwidth_gb_s']:.1f} GB/s "
             f"copy bandwidth; pipeline/bench/floor.py):", "",
             "| runner | point (context) | weights MB | floor ms | TPOT p50 ms | TPOT / floor |",
             "|---|---|---|---|---|---|"]
    for name, x in (("engine", f), ("PyTorch (the exported FP32 weights)", f.get("baseline"))):
        for point, e in ((x or {}).get("points") or {}).items():
            lines.append(f"| {name} | {point} ({e['context']}) | {x['weights_bytes'] / 1e6:.0f} | "
                         f"{e['floor_ms']:.2f} | {fmt(e.get('tpot_ms'), '.2f')} | "
                         f"{fmt(e.get('tpot_over_floor'), '.1f')}x |")
    return lines


def kv_cache_line(g: dict) -> list[str]:
    kv = g.get("kv_cache_accuracy")
    if not kv:
        return []
    return ["", f"KV-cache outputs ({kv['outputs']}, not gated: their error reaches the gated logits of "
            f"the next step): worst cosine {kv['worst_cosine']:.6f} (`{kv['worst']}`), mean "
            f"{kv['mean_cosine']:.6f}, max |err| {kv['max_abs']:.2e}, {kv['nonfinite']} NaN/Inf."]


def markdown(e: dict, baseline_name: str) -> list[str]:
    """The generation section of one engine in report.md."""
    g = e["generation"]
    agree = g.get("token_agreement") or {}
    lines = score_lines(g) + point_lines(g, baseline_name)
    lines += ["", f"Time per task ({'+'.join(str(n) for n in g['points']['task']['prompt_tokens'])} "
              f"prompt tokens over {len(g['points']['task']['prompt_tokens'])} turns): engine "
              f"{g['time_per_task_s']:.2f} s, {baseline_name} {g['baseline']['time_per_task_s']:.2f} s; "
              f"greedy tokens identical to PyTorch's in the timed points: "
              f"{fmt(agree.get('share'), '.1%')} (first divergence in the task at token "
              f"{agree.get('first_divergence') if agree.get('first_divergence') is not None else '—'})" + (f"; {agree['note']}" if agree.get("note") else "")
              + "."]
    if e.get("bytes"):  # what a deployment ships and loads, beside its resident memory below
        lines += ["", f"Engine file: {e['bytes'] / 1e6:.1f} MB (`{Path(e['path']).name}`)."]
    return lines + floor_lines(g) + memory_lines(g) + kv_cache_line(g)


def headline(e: dict) -> str:
    """One terminal line per engine: the score and the figures a chat user feels."""
    g = e.get("generation") or {}
    if not g:
        return ""
    s, task = g.get("score"), g["points"].get("task", {})
    parts = []
    if s:
        a, p = s["answer_accuracy"], s["perplexity"]
        lo, hi = a["ci95"]
        parts.append(f"answers {a['correct']}/{a['questions']} (PyTorch {a['baseline_correct']}, delta "
                     f"[{lo:+.1%}, {hi:+.1%}]), identical {s['identical_answers']['count']}/"
                     f"{s['identical_answers']['of']}, perplexity {p['engine']:.2f} (x{p['ratio']:.3f})")
    parts.append(f"TTFT {g['ttft_ms']['p50']:.1f} ms, TPOT {g['tpot_ms']['p50']:.2f} ms "
                 f"(PyTorch {g['baseline']['tpot_ms']['p50']:.2f}), task {task.get('time_s', 0):.3f} s")
    long = g["points"].get("long")
    if long:
        parts.append(f"long ({long['prompt_tokens'][0]} tokens): TTFT {long['ttft_ms']['p50']:.0f} ms, "
                     f"TPOT {long['tpot_ms']['p50']:.1f} ms, "
                     f"vs PyTorch {_ratio((long.get('speedup_vs_baseline') or {}).get('tpot'))}")
    return f"{e['target']}: " + "; ".join(parts)
