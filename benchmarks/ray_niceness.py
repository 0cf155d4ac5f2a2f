"""`pipeline serve` with its Ray workers at Ray's default niceness (15) against nice 0, under
the same chat-task load, taking turns.

Ray starts its workers at nice 15 so its driver and control plane stay responsive; a Serve
replica is a worker, so its engine threads give way to every nice-0 process on the machine
(the load generator, Ray's GCS and agents). Does that slow its decode steps under load? Per
round and setting (order alternating): `pipeline serve RECIPE` started with
RAY_worker_niceness set (Ray reads it when our node starts), one open-loop point of
`pipeline load --tasks --distinct-tasks` (the recipe's three-turn chat scripts, all 43:
benchmarks/peers/smollm2-tasks.yaml, Poisson, seed 0), the server stopped. Per point: TPOT and
TTFT from the client, goodput under the SLO, and from the server's /metrics the mean decode
step, prefill time a step and sequences a step.

    .venv/bin/python benchmarks/ray_niceness.py --rounds 2 --rate 0.75 --out benchmarks/results/ray-niceness-DATE
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chat_peer_capacity import figures, load_point  # noqa: E402
from chat_peers import pipeline_server, start, stop  # noqa: E402


def render(record: dict) -> str:
    runs = record["runs"]
    med = statistics.median
    lines = [f"{record['settings']['rate']} tasks/s offered, SLO {record['settings']['slo']}, "
             f"{len(runs)} points ({record['settings']['rounds']} rounds, order alternating).", "",
             "| Ray worker niceness | TPOT p50 / p99 ms | TTFT p50 / p99 ms | goodput share | decode step ms | "
             "sequences a step | prefill ms a step | points |", "|---|---|---|---|---|---|---|---|"]
    for nice in sorted({r["niceness"] for r in runs}):
        rs = [r for r in runs if r["niceness"] == nice and "error" not in r]
        if not rs:
            continue
        col = lambda k, rs=rs: med([r[k] for r in rs])  # noqa: E731
        ph = lambda k, rs=rs: med([r["phases"][k] for r in rs])  # noqa: E731
        lines.append(f"| {nice} | {col('tpot_p50_ms'):.1f} / {col('tpot_p99_ms'):.1f} | {col('ttft_p50_ms'):.0f} / "
                     f"{col('ttft_p99_ms'):.0f} | {100 * col('goodput_share'):.0f}% | {ph('step_ms'):.1f} | "
                     f"{ph('mean_sequences'):.2f} | {ph('prefill_per_step_ms'):.1f} | {len(rs)} |")
    lines += ["", "Each point: " + "; ".join(
        f"r{r['round']} nice {r['niceness']}: TPOT p50 {r.get('tpot_p50_ms', 0):.1f}, step {r['phases']['step_ms']:.1f} ms"
        for r in runs if "error" not in r)]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="smollm2-int4")
    ap.add_argument("--niceness", default="0,15")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rate", type=float, default=0.75)
    ap.add_argument("--slo", default="ttft=1s,tpot=100ms")
    ap.add_argument("--min-tasks", type=int, default=40)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=8121)
    ap.add_argument("--out", type=Path, required=True, help="PATH: writes PATH.json and PATH.md")
    args = ap.parse_args()
    settings = [int(n) for n in args.niceness.split(",")]
    scratch = Path(tempfile.mkdtemp(prefix="ray-niceness-"))
    record = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "runs": []}
    for rnd in range(args.rounds):
        for nice in (settings if rnd % 2 == 0 else settings[::-1]):
            s = pipeline_server(args.recipe, args.port, f"nice{nice}", {"RAY_worker_niceness": str(nice)})
            try:
                start(s, scratch, timeout=300)
                figs = figures(load_point(s, args.rate, args, scratch))
            except RuntimeError as e:
                figs = {"error": str(e)}
            finally:
                stop(s)
            record["runs"].append({"round": rnd + 1, "niceness": nice, **figs})
            print(json.dumps({k: v for k, v in record["runs"][-1].items() if k != "slo"}), flush=True)
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(render(record))
    print(render(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
