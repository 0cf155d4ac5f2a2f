"""report.md's Serving section: what `pipeline load` measured, one table per load file
(points, capacity, generation timings, soak verdict, the plot; chat tasks: time per task,
per-turn token timings, goodput in tasks/s, answers under load)."""

from __future__ import annotations


def _num(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def _ms(q: dict | None) -> str:
    if not q or q.get("value") is None:
        return "—"
    lo, hi = q.get("lo"), q.get("hi")
    return (f"{q['value']:.1f} [{'—' if lo is None else f'{lo:.1f}'}, "
            f"{'∞' if hi is None else f'{hi:.1f}'}]")


def markdown(loads: list[dict]) -> list[str]:
    """report.md's Serving section: one table of points per load file."""
    if not loads:
        return []
    lines = ["", "## Serving", ""]
    for r in loads:
        title = f"{r['engine']}{' (' + r['name'] + ')' if r.get('name') else ''}"
        if r.get("tasks"):
            lines += _tasks(r, title)
            continue
        lines += [f"### {title}: {r['mode']} at {r['url']}", "",
                  f"{r['arrival']}, seed {r['seed']}; SLO {r['slo'] or 'none'}; requests from "
                  f"{r['requests'].get('source')}; latency from the scheduled send time, 95% "
                  "order-statistic intervals; failed requests count as infinitely late.", ""]
        lines += _capacity(r.get("capacity"), "requests/s", ".2f")
        lines += ["| offered/s | achieved/s | goodput/s | n | failed | p50 ms | p99 ms | p99.9 ms "
                  "| queue p50 ms | compute p50 ms | batch sizes | late | server CPU % | RSS MiB | SLO |",
                  "|" + "---|" * 15]
        for p in r["points"]:
            res = p.get("resources") or {}
            sizes = ", ".join(f"{k}:{v}" for k, v in p["batch_sizes"].items()) or "—"
            lines.append(
                f"| {p['offered_rate']:.2f} | {p['achieved_rate']:.2f} | {p['goodput']:.2f} | "
                f"{p['requests']} | {p['requests'] - p['ok']} | {_ms(p['latency_ms']['p50'])} | "
                f"{_ms(p['latency_ms']['p99'])} | {_ms(p['latency_ms']['p99.9'])} | "
                f"{_num((p['queue_ms'] or {}).get('p50'), '.1f')} | "
                f"{_num((p['compute_ms'] or {}).get('p50'), '.1f')} | {sizes} | "
                f"{p['late']['share']:.1%} | {_num(res.get('cpu_pct_mean'), '.0f')} | "
                f"{_num(res.get('rss_mib_peak'), '.0f')} | "
                f"{'—' if p['passed'] is None else ('pass' if p['passed'] else 'fail')} |")
        gen = [p for p in r["points"] if p.get("generation")]
        if gen:
            lines += ["", "| offered/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | ITL p99 ms | tokens/s "
                      "| server TTFT / TPOT p50 ms |", "|---|---|---|---|---|---|"]
            for p in gen:
                g = p["generation"]
                st, sp = g.get("server_ttft_ms") or {}, g.get("server_tpot_ms") or {}
                lines.append(f"| {p['offered_rate']:.2f} | {_ms(g['ttft_ms']['p50'])} / "
                             f"{_ms(g['ttft_ms']['p99'])} | {_ms(g['tpot_ms']['p50'])} / "
                             f"{_ms(g['tpot_ms']['p99'])} | {_ms(g['itl_ms']['p99'])} | "
                             f"{g['tokens_per_s']:.1f} | {_num(st.get('p50'), '.1f')} / "
                             f"{_num(sp.get('p50'), '.1f')} |")
        lines += _metrics_table(r["points"])
        if r.get("soak"):
            lines += _soak(r["soak"])
        if r.get("plot"):
            lines += ["", f"![{r['mode']}]({r['plot']})"]
        lines.append("")
    return lines


def _slope(s: dict | None, unit: str) -> str:
    return f"{s['per_hour']:+.1f} {unit}/h [{s['ci95'][0]:+.1f}, {s['ci95'][1]:+.1f}]" if s else "—"


def _soak(soak: dict) -> list[str]:
    """The leak verdict, the drift slopes and the windows (p99 with its interval)."""
    v, wins = soak["verdict"], soak["windows"]
    streamed = wins and wins[0].get("ttft_p99_ms") is not None
    cached = wins and all(w.get("cache_mib") is not None for w in wins)
    lines = ["", f"Soak: **{v['leak']}** ({v['why']}); memory slope "
             f"{_slope(v.get('memory_slope_mib_per_hour'), 'MiB')}"
             + (f", less the prefix cache {_slope(v.get('uncached_slope_mib_per_hour'), 'MiB')}" if cached else "")
             + "; drift of the p99 (no verdict): "
             f"end to end {_slope(v.get('p99_slope_ms_per_hour'), 'ms')}"
             + (f", TTFT {_slope(v.get('ttft_p99_slope_ms_per_hour'), 'ms')}, TPOT "
                f"{_slope(v.get('tpot_p99_slope_ms_per_hour'), 'ms')}" if streamed else "") + ".", "",
             "| window s | requests | failed | p99 ms [95% CI] |"
             + (" TTFT p99 ms | TPOT p99 ms |" if streamed else "") + " server RSS MiB |"
             + (" prefix cache MiB |" if cached else "") + " server CPU % |",
             "|---|---|---|---|" + ("---|---|" if streamed else "") + "---|" + ("---|" if cached else "") + "---|"]
    for w in wins:
        lines.append(f"| {w['start_s']:.0f}-{w['end_s']:.0f} | {w['requests']} | {w['failures']} | "
                     f"{_ms(w['p99_ms'])} |" + (f" {_ms(w['ttft_p99_ms'])} | {_ms(w['tpot_p99_ms'])} |"
                                                if streamed else "")
                     + f" {_num(w['rss_mib'], ',.0f')} |" + (f" {_num(w['cache_mib'], ',.0f')} |" if cached else "")
                     + f" {_num(w['cpu_pct'], '.0f')} |")
    return lines


GAUGES = ("pipeline:num_requests_running", "pipeline:kv_cache_used_tokens")


def _metrics_table(points: list[dict]) -> list[str]:
    """The server's own /metrics over each point (loadgen/scrape.py): its batch-size
    histogram's gain, and the running requests and KV-cache tokens before / peak / after."""
    scraped = [p for p in points if p.get("server_metrics")]
    if not scraped:
        return []
    lines = ["", "Server's /metrics over each point:", "",
             "| offered/s | batch histogram | batches | mean batch | running before / peak / after "
             "| KV tokens used before / peak / after |", "|---|---|---|---|---|---|"]
    for p in scraped:
        m = p["server_metrics"]
        name = m.get("batch_histogram")
        batches = (m["histograms"].get(name) or {}).get("count") if name else None
        lines.append(f"| {p['offered_rate']:.2f} | {name or '—'} | {_num(batches, '.0f')} | "
                     f"{_num(m.get('mean_batch'), '.2f')} | {_move(m, GAUGES[0])} | "
                     f"{_move(m, GAUGES[1])} |")
    return lines


def _move(metrics: dict, gauge: str) -> str:
    g = metrics["gauges"].get(gauge)
    return "—" if not g else " / ".join(_num(g.get(k), ".0f") for k in ("before", "peak", "after"))


def _cached(turn: dict) -> str:
    """` (N)`: the turn's mean prompt tokens the server took from its prefix cache, if it said."""
    cached = turn.get("cached_tokens_mean")
    return "" if cached is None else f" ({cached:.0f})"


def _capacity(cap: dict | None, unit: str, fmt: str) -> list[str]:
    """The capacity line of a load result that searched for one (none: no line)."""
    if not cap:
        return []
    lo, hi = cap["bracket"]
    value = "none found" if cap["capacity"] is None else f"**{cap['capacity']:{fmt}} {unit}**"
    return [f"Capacity at the SLO: {value} (bracket [{lo}, {hi}] {unit}; {cap['why']}).", ""]


def _tasks(r: dict, title: str) -> list[str]:
    """A `pipeline load --tasks` result: the capacity in tasks/s, one row per point (tasks,
    time per task, turn token timings, goodput, answers under load beside batch 1)."""
    t = r["tasks"]
    arrivals = "closed loop (task-users)" if r["mode"] == "closed" else f"{r['arrival']} of tasks"
    lines = [f"### {title}: chat tasks, {r['mode']} at {r['url']}", "",
             f"{t['scripts']} tasks of {t['turns_per_task'][0]}-{t['turns_per_task'][1]} turns "
             f"({t['source']}; each turn carries the conversation so far, greedy, at most "
             f"{t['answer_tokens']} tokens); {arrivals}, seed {r['seed']}; SLO "
             f"{r['slo'] or 'none'}; at least {t['min_tasks']} tasks a point ({t['min_tasks_why']}). "
             "Time per task from its scheduled start to its last token; 95% order-statistic "
             "intervals; a failed task counts as infinitely late.", ""]
    lines += _capacity(t.get("capacity"), "tasks/s", ".3g")
    lines += ["| offered tasks/s | users | tasks | failed | completed/s | goodput/s (share) "
              "| time per task p50 / p99 s | TTFT p50 / p99 ms | TPOT p99 ms | ITL p99 ms "
              "| prompt tokens by turn (from the prefix cache) | answers right (95% CI) | batch 1 "
              "| same as batch 1 | SLO |",
              "|" + "---|" * 15]
    for p in t["points"]:
        g, a = p["turn_timings"], p["answers"]
        prompts = " / ".join(_num(x.get("prompt_tokens_mean"), ".0f") + _cached(x) for x in p["per_turn"])
        same = "—" if a.get("compared") is None else f"{a['identical_to_batch1']}/{a['compared']}"
        lines.append(
            f"| {p['offered_rate']:.3g} | {p.get('concurrency') or '—'} | {p['tasks']} | "
            f"{p['tasks'] - p['tasks_ok']} | {p['achieved_rate']:.3g} | {p['goodput']:.3g} "
            f"({p['goodput_share']:.0%}) | {_s(p['time_per_task_ms']['p50'])} / "
            f"{_s(p['time_per_task_ms']['p99'])} | {_ms(g['ttft_ms']['p50'])} / "
            f"{_ms(g['ttft_ms']['p99'])} | {_ms(g['tpot_ms']['p99'])} | {_ms(g['itl_ms']['p99'])} | "
            f"{prompts} | {a['right']}/{a['of']} = {a['share']:.0%} [{a['ci95'][0]:.0%}, "
            f"{a['ci95'][1]:.0%}] | {_num(a.get('batch1_share'), '.0%')} | {same} | "
            f"{'—' if p['passed'] is None else ('pass' if p['passed'] else 'fail')} |")
    lines += _metrics_table(t["points"])
    if r.get("plot"):
        lines += ["", f"![tasks]({r['plot']})"]
    return lines + [""]


def _s(q: dict | None) -> str:
    """A quantile in ms shown in seconds with its interval."""
    if not q or q.get("value") is None:
        return "—"
    hi = q.get("hi")
    return f"{q['value'] / 1e3:.2f} [{_num(q.get('lo') and q['lo'] / 1e3, '.2f')}, " \
           f"{'∞' if hi is None else f'{hi / 1e3:.2f}'}]"
