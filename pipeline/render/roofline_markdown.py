"""report.md's "Where the time goes against the floor" for one engine, from its `roofline`
dump (artifacts/roofline.py): per point and op category, measured time, floor, efficiency and
the floor's bound; the longest prefill's distance from its compute floor in a sentence; the
categories furthest above their floors."""

from __future__ import annotations

from pipeline.core.json_object import JsonObject

TITLE = "Where the time goes against the floor"


def _rates(r: JsonObject) -> str:
    units = {"fp32": "GFLOP/s", "bf16": "GFLOP/s", "fp16": "GFLOP/s", "int8": "GOP/s"}
    peaks = ", ".join(f"{k} {v:,.0f} {units.get(k, 'G/s')}" for k, v in r["peaks"].items())
    return f"DRAM {r['bandwidth_gb_s']:,.1f} GB/s, {peaks}"


def _table(points: list[JsonObject]) -> list[str]:
    lines = ["| point | category | measured ms | floor ms | floor / measured | bound |",
             "|---|---|---:|---:|---:|---|"]
    for p in points:
        eff = f"**{p['efficiency']:.2f}**" if p["efficiency"] is not None else "-"
        wall = f"; wall p50 {p['report_p50_ms']:,.3f} ms" if p.get("report_p50_ms") else ""
        lines.append(f"| {p['point']} | **whole step**{wall} | {p['measured_ms']:,.3f} | {p['floor_ms']:,.3f} | "
                     f"{eff} | {p['compute_bound_share']:.0%} compute |")
        for c in p["categories"]:
            ce = f"{c['efficiency']:.2f}" if c["efficiency"] is not None else "-"
            lines.append(f"| | {c['category']} | {c['measured_ms']:,.3f} | {c['floor_ms']:,.3f} | {ce} | "
                         f"{c['bound']} |")
    return lines


def _time(ms: float) -> str:
    return f"{ms / 1e3:,.2f} s" if ms >= 1000 else f"{ms:,.3g} ms"


def long_prefill_sentence(lp: JsonObject | None) -> str | None:
    """The longest prefill's distance from its floor and its compute floor, in words."""
    if not lp:
        return None
    floors = (f"its floor is {_time(lp['floor_ms'])}, {lp['compute_bound_share']:.0%} of it under compute-bound "
              f"nodes (compute floor {_time(lp['compute_floor_ms'])})")
    if lp["measured_ms"] is None:
        return f"The longest prefill ({lp['tokens']:,} tokens) was not timed here; {floors}."
    return (f"The longest prefill ({lp['tokens']:,} tokens) took {_time(lp['measured_ms'])} (p50 TTFT, wall-clock): "
            f"{lp['times_compute_floor']:.1f}x its compute floor and {lp['times_floor']:.1f}x its whole floor; "
            f"{floors}.")


def markdown(r: JsonObject | None) -> list[str]:
    if not r:
        return []
    if r.get("reason"):
        return ["", f"**{TITLE}:** {r['reason']}."]
    n = r.get("threads")
    threads = f"{n} thread{'s' if n > 1 else ''}" if n else "every core"
    lines = ["", f"### {TITLE}", "",
             f"Floors on {r['hardware']}, {r['hardware_source']}; at {threads}: {_rates(r)}. "
             "Efficiency = floor / measured (1 would be the roofline; nothing calibrated). "
             f"How: {r['method']}.", "", *_table(r["points"])]
    sentence = long_prefill_sentence(r.get("long_prefill"))
    if sentence:
        lines += ["", sentence]
    if r["furthest"]:
        lines += ["", "Furthest from their floors (where to look first):", "", *(f"- {f}" for f in r["furthest"])]
    if r["notes"]:
        lines += ["", "Notes: " + "; ".join(r["notes"]) + "."]
    return lines
