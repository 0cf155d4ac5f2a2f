"""Conversation reuse measured: the shipped three-turn chat tasks (data/chat/tasks.jsonl) on one
replica with `serve.prefix_cache` on and on one with it off, in one process, taking turns.

    PYTHONPATH=. python benchmarks/prefix_reuse.py [--recipe smollm2-int4]
        [--engines-dir /work/after/engines] [--tasks 8] [--concurrent 1 4] [--new-tokens 64]
        [--ignore-eos] [--fp32-identity] [--threads 2] [--out benchmarks/results/prefix-reuse]

A task is its three questions in order, each turn sent after the previous reply with the
conversation so far through the model's chat template (the replies' text, as a chat client
sends them), greedy, stopping at the model's end of sequence or after --new-tokens (with
--ignore-eos: exactly --new-tokens, so both sides do the same work even where an INT4 engine's
replies differ). Each concurrency C takes the next --tasks tasks (a level never meets the
conversations of another; the system prompt all tasks share is reused on the reuse side, as a
chat server would) and runs them C at a time on one side, then on the other (the side that
goes first alternates per group of C: ABBA), so both see the same machine. Per task:
time (first send to last token); per turn: TTFT at the client, prompt tokens and how many of
them the replica took from its prefix cache. The effect per task is paired (the same task on
both sides): the mean difference with a 95% t-interval. In process (Replica.generate, the path
every route takes): no HTTP. --fp32-identity: the recipe's fp32 graph (optimized.onnx, the
same GroupQueryAttention graph before INT4) through the slots' own calls, each task's turns
with and without an adopted prefix, greedy: are the replies token-identical? Results: <out>-<date>.json/.md, with the load averages before and
after. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

from benchmarks.serve_chat import cpu

ROOT = Path(__file__).resolve().parent.parent
SIDES = ("reuse", "no reuse")


async def turn(replica, prompt: list[int], params) -> dict:
    start = time.perf_counter()
    first, tokens, final = None, [], None
    async for item in replica.generate(prompt, params):
        if "token" in item:
            first = first or time.perf_counter()
            tokens.append(item["token"])
        else:
            final = item
    return {"prompt_tokens": len(prompt), "cached_tokens": final["cached_tokens"],
            "reply_tokens": len(tokens), "ttft_ms": ((first or time.perf_counter()) - start) * 1e3,
            "e2e_ms": (time.perf_counter() - start) * 1e3, "reply": tokens}


async def task(replica, tok, questions: list[str], params) -> dict:
    """One task's turns in order, each carrying the conversation so far."""
    messages, turns = [], []
    start = time.perf_counter()
    for question in questions:
        messages.append({"role": "user", "content": question})
        turns.append(await turn(replica, tok.conversation(messages), params))
        messages.append({"role": "assistant", "content": tok.decode(turns[-1]["reply"])})
    return {"task_s": time.perf_counter() - start, "turns": turns}


def fp32_identity(path: Path, eos: int, width: int, tok, scripts: list[list[str]], params, threads: int) -> dict:
    """Each task's turns on the fp32 graph through BatchedSlots, as generation_loop calls them:
    reuse adopts the longest prefix the last turn's slot held and prefills the rest; no reuse
    prefills each whole prompt. Greedy -> how many tasks reply identically, and where not,
    the (turn, token) of the first difference."""
    from pipeline.generation.runners import OrtLoopRunner
    from pipeline.generation.slots import BatchedSlots
    from pipeline.serving.prefix_cache import PrefixCache

    loop = OrtLoopRunner(path, eos, threads, in_place=True)
    replies = {}
    for reuse in (True, False):
        slots, out = BatchedSlots(loop, 1, width), []
        for script in scripts:
            cache, messages, turns = PrefixCache(), [], []
            for question in script:
                messages.append({"role": "user", "content": question})
                prompt = tok.conversation(messages)
                hit = cache.match(prompt) if reuse else None
                if hit:
                    slots.adopt(0, hit.entry.kv, hit.length)
                logits, reply = slots.prefill(0, np.asarray(prompt[hit.length if hit else 0:])), []
                while len(reply) < params.max_new_tokens:
                    token = int(np.argmax(logits))
                    if token == eos:
                        break
                    reply.append(token)
                    if len(reply) < params.max_new_tokens:
                        logits = slots.decode([0], np.array([token]))[0]
                held = slots.held(0)
                cache.insert((prompt + reply)[:held.length], held)
                slots.release(0)
                turns.append(reply)
                messages.append({"role": "assistant", "content": tok.decode(reply)})
            out.append(turns)
        replies[reuse] = out
    loop.close()
    firsts = []
    for a, b in zip(replies[True], replies[False]):
        for k, (x, y) in enumerate(zip(a, b)):
            if x != y:
                firsts.append((k + 1, next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))))
                break
    return {"graph": str(path), "tasks": len(scripts), "identical": len(scripts) - len(firsts),
            "first_differences": firsts}


async def level(replicas: dict, tok, scripts: list[list[str]], concurrent: int, params) -> dict:
    """Every task on both sides, `concurrent` at a time, the sides taking turns per group."""
    out = {side: [None] * len(scripts) for side in SIDES}
    for g, at in enumerate(range(0, len(scripts), concurrent)):
        group = range(at, min(at + concurrent, len(scripts)))
        for side in (SIDES if g % 2 == 0 else SIDES[::-1]):
            done = await asyncio.gather(*(task(replicas[side], tok, scripts[i], params) for i in group))
            for i, result in zip(group, done):
                out[side][i] = result
    return {"concurrent": concurrent, "tasks": out}


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval."""
    if len(values) < 2:
        return float(values[0]), float("nan")
    sem = statistics.stdev(values) / len(values) ** 0.5
    return statistics.mean(values), float(scipy_stats.t.ppf(0.975, len(values) - 1) * sem)


def summary(lvl: dict) -> dict:
    """Per side: time per task and TTFT per turn (means with 95% intervals), prefilled tokens;
    paired: reuse minus no reuse per task; replies identical across the sides."""
    tasks, sides = lvl["tasks"], {}
    n_turns = len(tasks[SIDES[0]][0]["turns"])
    for side in SIDES:
        rows = tasks[side]
        sides[side] = {
            "task_s": interval([t["task_s"] for t in rows]),
            "ttft_ms": [interval([t["turns"][k]["ttft_ms"] for t in rows]) for k in range(n_turns)],
            "prompt_tokens": [statistics.mean(t["turns"][k]["prompt_tokens"] for t in rows) for k in range(n_turns)],
            "prefilled_tokens": [statistics.mean(t["turns"][k]["prompt_tokens"] - t["turns"][k]["cached_tokens"]
                                                 for t in rows) for k in range(n_turns)]}
    a, b = tasks[SIDES[0]], tasks[SIDES[1]]
    same = sum(all(x["reply"] == y["reply"] for x, y in zip(s["turns"], t["turns"])) for s, t in zip(a, b))
    return {"concurrent": lvl["concurrent"], "tasks": len(a), "sides": sides,
            "task_s_difference": interval([s["task_s"] - t["task_s"] for s, t in zip(a, b)]),
            "ttft_ms_difference": [interval([s["turns"][k]["ttft_ms"] - t["turns"][k]["ttft_ms"]
                                             for s, t in zip(a, b)]) for k in range(n_turns)],
            "identical_tasks": same}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# Conversation reuse: `{result['recipe']}`, one replica per side, in one process", "",
             f"{result['date']}, {m['cpu']} ({m['cores']} cores, shared with other work), {result['threads']} "
             f"engine threads, onnxruntime {result['onnxruntime']}. The first {result['tasks']} tasks of "
             f"data/chat/tasks.jsonl (three turns each, through the chat template), greedy, EOS honoured, at "
             f"most {result['new_tokens']} new tokens a reply{' (EOS ignored: exactly that many)' if result['ignore_eos'] else ''}; the sides take turns (ABBA). Load average "
             f"(1 min) {result['load_before'][0]:.2f} before, {result['load_after'][0]:.2f} after. "
             "Means with 95% t-intervals; the difference is paired per task (reuse minus no reuse).", ""]
    for s in result["levels"]:
        lines += [f"## {s['concurrent']} task(s) at a time", "",
                  "| side | time per task s | " + " | ".join(f"TTFT turn {k + 1} ms" for k in range(len(
                      s["sides"][SIDES[0]]["ttft_ms"]))) + " | prefilled tokens per turn |",
                  "|---|---|" + "---|" * len(s["sides"][SIDES[0]]["ttft_ms"]) + "---|"]
        for side in SIDES:
            r = s["sides"][side]
            lines.append(f"| {side} | {_pm(r['task_s'], 2)} | " + " | ".join(_pm(x, 0) for x in r["ttft_ms"])
                         + " | " + " / ".join(f"{p:.0f} of {q:.0f}" for p, q in zip(r["prefilled_tokens"],
                                                                                  r["prompt_tokens"])) + " |")
        lines.append(f"| difference | {_pm(s['task_s_difference'], 2)} | "
                     + " | ".join(_pm(x, 0) for x in s["ttft_ms_difference"]) + " | |")
        lines += ["", f"Replies token-identical on both sides: {s['identical_tasks']} of {s['tasks']} tasks.", ""]
    if result.get("fp32_identity"):
        f = result["fp32_identity"]
        lines += [f"fp32 graph (`{Path(f['graph']).name}`) through the slots' calls, greedy, EOS honoured: "
                  f"{f['identical']} of {f['tasks']} tasks token-identical with and without reuse; first "
                  f"differences (turn, token): {f['first_differences'] or 'none'}.", ""]
    return "\n".join(lines)


def _pm(value: tuple[float, float], digits: int) -> str:
    mean, half = value
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="smollm2-int4")
    parser.add_argument("--engines-dir", type=Path, default=Path("/work/after/engines"))
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--concurrent", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--ignore-eos", action="store_true", help="exactly --new-tokens a reply")
    parser.add_argument("--fp32-identity", action="store_true",
                        help="also compare replies with and without reuse on the fp32 graph (optimized.onnx)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "prefix-reuse")
    args = parser.parse_args()

    import onnxruntime

    from pipeline.data.tokenizer import Tokenizer
    from pipeline.generation import chat
    from pipeline.generation.sampling import SamplingParams
    from pipeline.recipe import load
    from pipeline.recipe.serve import ServeSpec
    from pipeline.serving.replica import Replica

    recipe = load(args.recipe)
    base = recipe.serve.model_dump(exclude_unset=True)
    replicas = {side: Replica(recipe, args.engines_dir, None,
                              ServeSpec.model_validate({**base, "prefix_cache": side == "reuse"}), args.threads)
                for side in SIDES}
    folder = replicas[SIDES[0]].choice.path.parent
    tok = Tokenizer.from_folder(folder, f"{folder}: tokenizer")
    spec = recipe.workload.chat
    scripts = [[q.question for q in script] for script in chat.scripts(spec.tasks, chat.questions(spec.questions), None)]
    if len(scripts) <= args.tasks * len(args.concurrent):
        raise SystemExit(f"{len(scripts)} tasks: not enough for {args.tasks} per level and a warm-up")
    eos = replicas[SIDES[0]].generation.eos
    params = SamplingParams(args.new_tokens, ignore_eos=args.ignore_eos,
                            stop_token_ids=() if args.ignore_eos else tuple(tok.stop_ids(eos) - {eos}))
    load_before = os.getloadavg()
    try:
        async def run():
            for side in SIDES:  # warm-up: first calls allocate
                await task(replicas[side], tok, scripts[-1], params)
            n = args.tasks
            return [await level(replicas, tok, scripts[i * n:(i + 1) * n], c, params)
                    for i, c in enumerate(args.concurrent)]
        levels = asyncio.run(run())
        stats = {side: replicas[side].stats()["generation"] for side in SIDES}
    finally:
        for replica in replicas.values():
            replica.close()
    identity = None
    if args.fp32_identity:
        identity = fp32_identity(folder / "optimized.onnx", eos, replicas[SIDES[0]].generation.slots.width,
                                 tok, scripts[:args.tasks], params, args.threads)
    result = {"recipe": args.recipe, "date": datetime.date.today().isoformat(), "machine": cpu(),
              "threads": args.threads, "onnxruntime": onnxruntime.__version__,
              "engine": str(replicas[SIDES[0]].choice.path), "tasks": args.tasks,
              "new_tokens": args.new_tokens, "ignore_eos": args.ignore_eos, "fp32_identity": identity,
              "load_before": load_before, "load_after": os.getloadavg(),
              "levels": [summary(lvl) for lvl in levels],
              "stats": {side: {k: stats[side][k] for k in ("prefill_tokens", "prefix_cache")} for side in SIDES},
              "raw": [{"concurrent": lvl["concurrent"],
                       "tasks": {side: [{"task_s": t["task_s"], "turns": [{k: v for k, v in x.items() if k != "reply"}
                                                                          for x in t["turns"]]}
                                        for t in lvl["tasks"][side]] for side in SIDES}} for lvl in levels]}
    stem = Path(f"{args.out}-{result['date']}{'-fixed-length' if args.ignore_eos else ''}")
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
