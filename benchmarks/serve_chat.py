"""Chat serving under load: one replica of a generation engine (continuous batching,
pipeline/serving/generation_loop.py), the shipped chat questions, closed loop.

    PYTHONPATH=. python benchmarks/serve_chat.py [--recipe smollm2-int4] [--engines-dir DIR]
        [--streams 1 4 8 16] [--new-tokens 64] [--threads 2] [--variants before after]
        [--rounds 2] [--per-stream 8] [--out benchmarks/results/serve_chat-after]

At each level C, C clients each send a question (data/chat's questions through the model's
chat template and the tokenizer in the engines folder), wait for its whole reply and send the
next, until per-stream x C requests (at least 8) are answered, after one untimed warm-up
request. One replica per --variants entry, all in this process: `after` is the replica as
served (serve.prefill_tokens_per_step's default budget, decode steps back to back on the engine
thread), `before` the loop as it was (every admitted prompt prefilled before the next decode
step, one decode step per visit of the engine thread), `budget-N` the served loop with a budget
of N; `+no-prefix-cache` after any of them turns serve.prefix_cache off (every prompt prefilled
whole: the shipped questions share a 29-token system prompt). They take turns ABBA at each level for --rounds rounds; a variant's figures pool
its rounds (tokens/s: all tokens / all wall time; percentiles over all its requests), with
each round's tokens/s beside them for the spread. TTFT p99 is given over all requests and
over the steady state (each client's first request left out: those arrive together, a burst
the closed loop's start makes).
Replies are greedy with EOS ignored: exactly --new-tokens each, as the peers in
../shared/field-notes.md were measured. Reported per level: aggregate output tokens/s (all
tokens / wall time of the level), TTFT p50/p99 (from the call to the first token, at the
client), per-request TPOT p50, and the decode steps' batch sizes. Then the engine's own
batch-1 decode step (the IOBinding loop, runners.OrtLoopRunner, no server) on one question,
for comparison: the figure the issue's "within 10% at 1 stream" goal is against; it is timed
again in every round of the 1-stream level, beside the served stream, whose engine time per
decode step (slots.decode, timed on the engine thread) is reported too: TPOT less that is
what the serving path costs a token in process.
In process (Replica.generate, the path every route takes), not over HTTP: Ray's proxy and the
client are not in these figures. Results: <out>-<date>.json/.md, the CPU named. A
benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def cpu() -> dict:
    """The CPU by name, its cores and the ISA extensions that move CPU figures."""
    name, flags = platform.processor(), set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    isa = [x for x in ("avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8") if x in flags]
    return {"cpu": name, "cores": len(os.sched_getaffinity(0)), "isa": isa}


def prompts(recipe, folder: Path) -> list[list[int]]:
    """Every shipped chat question as one user turn through the model's chat template."""
    from pipeline.data.tokenizer import Tokenizer
    from pipeline.generation import chat

    tok = Tokenizer.from_folder(folder, f"{folder}: tokenizer")
    return [tok.conversation([{"role": "user", "content": q.question}])
            for q in chat.questions(recipe.workload.chat.questions).values()]


async def one(replica, prompt: list[int], params) -> dict:
    start = time.perf_counter()
    first, n = None, 0
    async for item in replica.generate(prompt, params):
        if "token" in item:
            first = first or time.perf_counter()
            n += 1
        else:
            final = item
    return {"tokens": n, "ttft_s": first - start, "e2e_s": time.perf_counter() - start,
            "tpot_ms": final["tpot_ms"], "prompt_tokens": len(prompt),
            "prefilled_tokens": len(prompt) - final["cached_tokens"]}


class DecodeTimer:
    """Times the replica's slots.decode calls on the engine thread (the engine's own time
    per step, for TPOT less it: the serving path's cost)."""

    def __init__(self, slots):
        self.slots, self.real, self.times = slots, slots.decode, []
        slots.decode = self._timed

    def _timed(self, *args):
        start = time.perf_counter()
        try:
            return self.real(*args)
        finally:
            self.times.append(time.perf_counter() - start)


async def level(replica, questions: list[list[int]], streams: int, params, per_stream: int) -> dict:
    """A closed loop of `streams` clients until per_stream x streams requests (>= 8) are answered."""
    total = max(8, per_stream * streams)
    taken = iter(range(total))
    done: list[dict] = []
    before = dict(replica.generation.steps)
    timer = replica.decode_timer
    timed_from = len(timer.times)

    async def client():
        first = True
        for i in taken:
            done.append({**await one(replica, questions[i % len(questions)], params), "first": first})
            first = False

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(streams)))
    wall = time.perf_counter() - start
    after = replica.generation.steps
    steps = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}
    return {"streams": streams, "requests": total, "wall_s": wall,
            "tokens": sum(r["tokens"] for r in done), "requests_done": done,
            "engine_decode_ms": statistics.median(timer.times[timed_from:]) * 1e3,
            "decode_step_sizes": {str(k): v for k, v in sorted(steps.items())}}


def pooled(runs: list[dict]) -> dict:
    """One variant's rounds at one level: figures over all its requests."""
    done = [r for run in runs for r in run["requests_done"]]
    ttft = [r["ttft_s"] * 1e3 for r in done]
    steady = [r["ttft_s"] * 1e3 for r in done if not r["first"]] or ttft
    steps: dict[str, int] = {}
    for run in runs:
        for k, v in run["decode_step_sizes"].items():
            steps[k] = steps.get(k, 0) + v
    return {"streams": runs[0]["streams"], "requests": len(done),
            "tokens_per_s": sum(r["tokens"] for r in runs) / sum(r["wall_s"] for r in runs),
            "round_tokens_per_s": [r["tokens"] / r["wall_s"] for r in runs],
            "ttft_ms_p50": float(np.percentile(ttft, 50)), "ttft_ms_p99": float(np.percentile(ttft, 99)),
            "ttft_ms_max": max(ttft), "steady_ttft_ms_p50": float(np.percentile(steady, 50)),
            "steady_ttft_ms_p99": float(np.percentile(steady, 99)),
            "tpot_ms_p50": statistics.median(r["tpot_ms"] for r in done),
            "tpot_ms_p99": float(np.percentile([r["tpot_ms"] for r in done], 99)),
            "engine_decode_ms_p50": statistics.median(r["engine_decode_ms"] for r in runs),
            "prefilled_tokens_mean": statistics.mean(r["prefilled_tokens"] for r in done),
            "decode_step_sizes": dict(sorted(steps.items(), key=lambda kv: int(kv[0])))}


def engine_tpot(runner, prompt: list[int], new: int) -> dict:
    """The engine alone at batch 1 (an OrtLoopRunner): prefill, then `new` - 1 decode steps,
    each timed; twice, the first warming up."""
    times, prefill = [], []
    for _ in range(2):
        runner.new(1)
        start = time.perf_counter()
        runner.prefill(np.asarray([prompt], np.int64))
        prefill.append(time.perf_counter() - start)
        for _ in range(new - 1):
            start = time.perf_counter()
            runner.step()
            times.append(time.perf_counter() - start)
    steps = times[new - 1:]
    return {"tpot_ms_p50": statistics.median(steps) * 1e3, "tokens_per_s": 1 / statistics.median(steps),
            "prefill_ms": prefill[1] * 1e3, "prompt_tokens": len(prompt)}


def variant(recipe, engines_dir: Path, threads: int, name: str):
    """The replica a --variants entry names (the module docstring says which)."""
    from pipeline.serving.replica import Replica

    base, _, cache = name.partition("+")
    update = {"before": {"prefill_tokens_per_step": 0}, "after": {}}.get(base)
    if update is None and base.startswith("budget-"):
        update = {"prefill_tokens_per_step": int(base.removeprefix("budget-"))}
    if update is None or cache not in ("", "no-prefix-cache"):
        raise SystemExit(f"unknown variant {name}: before, after or budget-N, each maybe +no-prefix-cache")
    if cache:
        update["prefix_cache"] = False
    replica = Replica(recipe, engines_dir, None, recipe.serve.model_copy(update=update), threads)
    replica.generation.back_to_back = base != "before"
    replica.decode_timer = DecodeTimer(replica.generation.slots)
    return replica


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# Chat serving: `{result['recipe']}`, one replica, continuous batching",
             "", f"{result['date']}, {m['cpu']} ({m['cores']} cores; {', '.join(m['isa'])}), "
             f"{result['threads']} engine threads, onnxruntime {result['onnxruntime']}; the "
             f"shipped chat questions through the chat template ({result['prompt_tokens_mean']:.0f} "
             f"tokens on average), {result['new_tokens']} new tokens each (EOS ignored), closed "
             f"loop, in process (Replica.generate: no HTTP). One replica per variant (before: "
             f"the loop as it was; after: as served now), ABBA at each level, {result['rounds']} rounds each, "
             f"pooled; load average {result['load_before']} before, {result['load_after']} after.", "",
             "| streams | variant | requests | output tokens/s (per round) | TTFT p50 / p99 / max ms "
             "| steady TTFT p50 / p99 ms | TPOT p50 / p99 ms | prefilled tokens | decode step sizes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["levels"]:
        rounds = ", ".join(f"{x:.0f}" for x in r["round_tokens_per_s"])
        lines.append(f"| {r['streams']} | {r['variant']} | {r['requests']} | "
                     f"{r['tokens_per_s']:.0f} ({rounds}) | {r['ttft_ms_p50']:.0f} / {r['ttft_ms_p99']:.0f} / "
                     f"{r['ttft_ms_max']:.0f} | {r['steady_ttft_ms_p50']:.0f} / {r['steady_ttft_ms_p99']:.0f} | "
                     f"{r['tpot_ms_p50']:.1f} / {r['tpot_ms_p99']:.1f} | {r['prefilled_tokens_mean']:.0f} | "
                     f"{r['decode_step_sizes']} |")
    lines += ["", "At 1 stream, per round: the engine alone (runners.OrtLoopRunner, no server) and the "
              "served stream's TPOT p50 and its engine time per decode step (slots.decode):", "",
              "| round | engine alone step ms | served: variant | TPOT p50 ms | its slots.decode p50 ms |",
              "|---|---|---|---|---|"]
    for row in result["one_stream"]:
        lines.append(f"| {row['round']} | {row['engine_alone_ms']:.2f} | {row['variant']} | "
                     f"{row['tpot_ms_p50']:.2f} | {row['engine_decode_ms']:.2f} |")
    lines.append("")
    if result.get("identical"):
        same = result["identical"]
        lines += [f"Greedy replies under batching ({same['variant']}): "
                  f"{same['identical']} of {same['requests']} questions token-identical to each served "
                  f"alone (all {same['requests']} submitted at once, decode steps {same['decode_step_sizes']}; "
                  f"first divergences at {same['first_divergences'] or 'none'}).", ""]
    return "\n".join(lines)


async def identical(replica, questions: list[list[int]], n: int, params) -> dict:
    """The first n questions served alone, then all n at once: the share of replies that are
    token-identical (a quantized engine's kernels could round differently at batch > 1)."""
    async def reply(prompt):
        return [item["token"] async for item in replica.generate(prompt, params) if "token" in item]

    alone = [await reply(p) for p in questions[:n]]
    before = dict(replica.generation.steps)
    together = await asyncio.gather(*(reply(p) for p in questions[:n]))
    after = replica.generation.steps
    divergences = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                   for a, b in zip(alone, together) if a != b]
    return {"requests": n, "identical": n - len(divergences), "first_divergences": divergences,
            "decode_step_sizes": {str(k): after[k] - before.get(k, 0) for k in sorted(after)
                                  if after[k] - before.get(k, 0)}}


async def serve_levels(replicas: dict, runner, questions, streams: list[int], params,
                       rounds: int, per_stream: int) -> tuple[list[dict], list[dict]]:
    """Each level: the replicas take turns ABBA for `rounds` rounds; at 1 stream the engine
    alone is timed in each round too."""
    for replica in replicas.values():
        await one(replica, questions[0], params)  # warm-up: first calls allocate
    budgets = list(replicas)
    levels, one_stream = [], []
    for c in streams:
        runs: dict[str, list[dict]] = {b: [] for b in budgets}
        for r in range(rounds):
            for b in budgets if r % 2 == 0 else budgets[::-1]:
                run = await level(replicas[b], questions, c, params, per_stream)
                runs[b].append(run)
                if c == 1:
                    alone = engine_tpot(runner, questions[0], params.max_new_tokens)
                    one_stream.append({"round": r, "variant": b, "engine_alone_ms": alone["tpot_ms_p50"],
                                       "tpot_ms_p50": statistics.median(x["tpot_ms"] for x in run["requests_done"]),
                                       "engine_decode_ms": run["engine_decode_ms"]})
                print(json.dumps({k: v for k, v in run.items() if k != "requests_done"} | {"variant": b}),
                      flush=True)
        for b in budgets:
            levels.append({**pooled(runs[b]), "variant": b})
    return levels, one_stream


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="smollm2-int4")
    parser.add_argument("--engines-dir", type=Path, default=ROOT / "engines")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=["before", "after"],
                        help="replicas compared: before, after, budget-N (the module docstring)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--per-stream", type=int, default=8, help="requests per stream at each level")
    parser.add_argument("--identical", type=int, default=32,
                        help="questions served alone and then at once, compared (0: skip)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "serve_chat-after")
    args = parser.parse_args()

    import onnxruntime

    from pipeline.generation.decoder import eos_token
    from pipeline.generation.runners import OrtLoopRunner
    from pipeline.generation.sampling import SamplingParams
    from pipeline.recipe import load

    recipe = load(args.recipe)
    replicas = {name: variant(recipe, args.engines_dir, args.threads, name) for name in args.variants}
    first = replicas[args.variants[-1]]
    runner = OrtLoopRunner(first.choice.path, eos_token(recipe), args.threads, in_place=True)
    questions = prompts(recipe, first.choice.path.parent)
    params = SamplingParams(args.new_tokens, ignore_eos=True)
    load_before = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    try:
        levels, one_stream = asyncio.run(serve_levels(replicas, runner, questions, args.streams, params,
                                                      args.rounds, args.per_stream))
        same = (asyncio.run(identical(first, questions, args.identical, params)) | {
            "variant": args.variants[-1]} if args.identical else None)
        stats = first.stats()["generation"]
    finally:
        for replica in replicas.values():
            replica.close()
        runner.close()
    result = {"recipe": args.recipe, "date": datetime.date.today().isoformat(), "machine": cpu(),
              "threads": args.threads, "onnxruntime": onnxruntime.__version__,
              "engine": str(first.choice.path), "sha256": first.choice.sha256,
              "new_tokens": args.new_tokens, "prompt_tokens_mean": statistics.mean(map(len, questions)),
              "rounds": args.rounds, "load_before": load_before,
              "load_after": ", ".join(f"{x:.1f}" for x in os.getloadavg()),
              "replica": {k: stats[k] for k in ("max_running_sequences", "kv_cache_tokens", "slot_tokens",
                                                "kv_bytes_per_token")},
              "levels": levels, "one_stream": one_stream, "identical": same}
    stem = Path(f"{args.out}-{result['date']}")
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
