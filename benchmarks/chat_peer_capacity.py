"""Capacity for chat tasks at one SLO: this project's server against the CPU peers, taking turns.

Issue 38's peers' table. The same servers as benchmarks/chat_peers.py (its `servers`, each with
2 threads, each behind an OpenAI endpoint), the same client (`pipeline load --tasks`): the
recipe's three-turn chat scripts (all 43 by default, benchmarks/peers/smollm2-tasks.yaml),
each turn carrying the conversation so far, each task's first message tagged so no two tasks
share a prefix (--distinct-tasks), greedy replies up to workload.chat.answer_tokens, Poisson
arrivals on the same seeded schedule for every server. For each offered rate (ascending) each
server runs one open-loop point in turn (order rotated per rate; the others SIGSTOPped; a server
that failed a rate runs no higher one), judged
by `--slo` as LoadGen judges its LLM server scenario (the p99 within the bound and the
early-stopping rule on its own sample: what decides how many tasks a point needs, 153 for
TTFT/TPOT terms). A server's capacity is the highest rate it passed with every lower rate
passed; its bracket ends at the first rate it failed.

For `pipeline serve` the point's /metrics movement splits the engine's time into its phases
(engine_decode_seconds / decode steps = the mean decode step; prefill seconds per step; the
mean sequences a step), so a TPOT behind a peer's can be read as step, prefills and the rest.

    .venv/bin/python benchmarks/chat_peer_capacity.py --only pipeline,openvino \\
        --rates 1,1.5,2,2.5 --slo ttft=1s,tpot=100ms --out benchmarks/results/chat-peer-capacity-DATE

`--variant NAME:ITEM,...` adds another `pipeline serve` (e.g. `direct:serve.ingress=replica`), as
in chat_peers.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chat_peers import (  # noqa: E402
    REPO,
    finish,
    pause,
    phases,
    rotated,
    run_load,
    servers,
    start,
    variant_server,
    versions,
)

SHAPE = REPO / "benchmarks" / "peers" / "smollm2-tasks.yaml"


def load_point(server, rate: float, args, scratch: Path) -> dict:
    """One open-loop task point at `rate` tasks/s, judged by args.slo."""
    options = ["--tasks", "--distinct-tasks", "--rate", str(rate), "--slo", args.slo, "--warmup", str(args.warmup),
               "--timeout", str(args.timeout), "--seed", str(args.seed)]
    if args.min_tasks:
        options += ["--min-tasks", str(args.min_tasks)]
    return run_load(server, SHAPE, options, scratch, f"r{rate}")


def figures(result: dict) -> dict:
    """The table's figures from a LoadResult's one task point."""
    p = result["tasks"]["points"][0]
    q = lambda d, k: ((d or {}).get(k) or {}).get("value")  # noqa: E731  (a Quantile's value)
    seconds = lambda ms: None if ms is None else ms / 1e3  # noqa: E731  (no task finished: None)
    turns = p["turn_timings"]
    answers = p.get("answers") or {}
    return {"offered": p["offered_rate"], "completed": p["achieved_rate"], "goodput": p["goodput"],
            "goodput_share": p["goodput_share"], "tasks": p["tasks"], "failed": p["errors"] + p["timeouts"] + p["rejected"],
            "task_p50_s": seconds(q(p["time_per_task_ms"], "p50")), "task_p99_s": seconds(q(p["time_per_task_ms"], "p99")),
            "ttft_p50_ms": q(turns["ttft_ms"], "p50"), "ttft_p99_ms": q(turns["ttft_ms"], "p99"),
            "tpot_p50_ms": q(turns["tpot_ms"], "p50"), "tpot_p99_ms": q(turns["tpot_ms"], "p99"),
            "answers_right": answers.get("right"), "answers_of": answers.get("of"),
            "passed": p["passed"], "slo": [{k: v[k] for k in ("term", "passed", "over", "sample_percentile_ms")}
                                           for v in p["slo"]],
            "late_share": (p.get("late") or {}).get("share"), "phases": phases(p.get("server_metrics"))}


def capacity(runs: list[dict], name: str) -> tuple[float | None, float | None]:
    """(highest rate passed with every lower one passed, the first rate failed)."""
    best = None
    for r in sorted((r for r in runs if r["server"] == name), key=lambda r: r["rate"]):
        if not r.get("passed"):
            return best, r["rate"]
        best = r["rate"]
    return best, None


def render(record: dict) -> str:
    runs, names = record["runs"], list(record["servers"])
    fmt = lambda x, d=0: "-" if x is None else f"{x:,.{d}f}"  # noqa: E731
    lines = [f"SLO: {record['settings']['slo']}; tasks of 3 turns, Poisson arrivals, seed {record['settings']['seed']}.", "",
             "| server | capacity (tasks/s) | bracket |", "|---|---|---|"]
    for name in names:
        cap, fail = capacity(runs, name)
        lines.append(f"| {name} | {fmt(cap, 2)} | [{fmt(cap, 2)}, {fmt(fail, 2) if fail else 'not reached'}] |")
    lines += ["", "| tasks/s offered | server | completed/s | goodput/s (share) | time per task p50 / p99 s | "
              "TTFT p50 / p99 ms | TPOT p50 / p99 ms | answers right | failed | verdict |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted((r for r in runs if "error" not in r), key=lambda r: (r["rate"], names.index(r["server"]))):
        verdict = "pass" if r["passed"] else "fail (" + ", ".join(t["term"] for t in r["slo"] if not t["passed"]) + ")"
        lines.append(
            f"| {r['rate']:g} | {r['server']} | {r['completed']:.2f} | {r['goodput']:.2f} ({100 * r['goodput_share']:.0f}%) | "
            f"{fmt(r['task_p50_s'], 2)} / {fmt(r['task_p99_s'], 2)} | {fmt(r['ttft_p50_ms'])} / {fmt(r['ttft_p99_ms'])} | "
            f"{fmt(r['tpot_p50_ms'], 1)} / {fmt(r['tpot_p99_ms'], 1)} | {r['answers_right']}/{r['answers_of']} | "
            f"{r['failed']} | {verdict} |")
    ours = [r for r in runs if r.get("phases")]
    if ours:
        lines += ["", "`pipeline serve`'s engine over each point (its /metrics):", "",
                  "| tasks/s offered | server | decode steps | sequences a step | decode step ms | prefill ms a step | "
                  "step + prefill ms | client TPOT p50 ms |", "|---|---|---|---|---|---|---|---|"]
        for r in sorted(ours, key=lambda r: (r["rate"], names.index(r["server"]))):
            ph = r["phases"]
            lines.append(f"| {r['rate']:g} | {r['server']} | {ph['decode_steps']:,.0f} | {ph['mean_sequences']:.2f} | {ph['step_ms']:.1f} | "
                         f"{ph['prefill_per_step_ms']:.1f} | {ph['step_ms'] + ph['prefill_per_step_ms']:.1f} | "
                         f"{fmt(r['tpot_p50_ms'], 1)} |")
    errors = [r for r in runs if "error" in r]
    if errors:
        lines += ["", f"{len(errors)} point(s) failed to run: " + "; ".join(
            f"{r['server']} at {r['rate']}: {r['error'][:200]}" for r in errors)]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers-dir", type=Path, default=Path("/work/peers"))
    ap.add_argument("--engine", default="smollm2-int4", help="the recipe `pipeline serve` serves")
    ap.add_argument("--only", default="pipeline,openvino")
    ap.add_argument("--rates", default="1,1.5,2,2.5", help="offered tasks/s, each run by every server")
    ap.add_argument("--slo", default="ttft=1s,tpot=100ms")
    ap.add_argument("--min-tasks", type=int, default=0, help="0: what the SLO's early stopping needs")
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base-port", type=int, default=8101)
    ap.add_argument("--out", type=Path, help="PATH: writes PATH.json and PATH.md")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:ITEM,...",
                    help="another `pipeline serve` taking turns (chat_peers.py's --variant)")
    ap.add_argument("--render", type=Path, help="only print the tables of this record (JSON)")
    args = ap.parse_args()
    if args.render:
        print(render(json.loads(args.render.read_text())))
        return 0
    if args.out is None:
        ap.error("--out PATH is needed")
    chosen = [s for s in servers(args.peers_dir, args.engine, args.base_port) if s.name in args.only.split(",")]
    chosen += [variant_server(v, args.engine, args.base_port + 10 + i) for i, v in enumerate(args.variant)]
    scratch = Path(tempfile.mkdtemp(prefix="chat-peer-capacity-"))
    record: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                    "versions": versions(args.peers_dir), "servers": {}, "runs": []}
    try:
        for s in chosen:  # one at a time, then each paused while the others are measured
            start(s, scratch, timeout=600)
            record["servers"][s.name] = {"argv": s.argv, "env": s.env, "ready_s": s.started_s}
            pause(s.proc.pid, True)
            print(f"{s.name} ready in {s.started_s:.0f} s", flush=True)
        failed: set[str] = set()  # servers past their capacity: no higher rate is run for them
        for k, rate in enumerate(float(r) for r in args.rates.split(",")):
            for name in rotated([s.name for s in chosen], k):
                if name in failed:
                    continue
                server = next(s for s in chosen if s.name == name)
                pause(server.proc.pid, False)
                t0 = time.monotonic()
                try:
                    figs = figures(load_point(server, rate, args, scratch))
                except RuntimeError as e:
                    figs = {"error": str(e)}
                finally:
                    pause(server.proc.pid, True)
                if not figs.get("passed"):
                    failed.add(name)
                record["runs"].append({"rate": rate, "server": name, **figs, "wall_s": time.monotonic() - t0,
                                       "loadavg_1m_after": float(open("/proc/loadavg").read().split()[0])})
                print(json.dumps(record["runs"][-1]), flush=True)
    finally:
        finish(chosen, record, args.out, ".md", render(record), scratch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
