"""What the HTTP serving path costs one stream (issue 36: "at 1, tokens/s within 10% of the
engine's own batch-1 decode").

Two sides, the same work, taking turns in one run (ABBA, --rounds rounds, the questions in
turn): the same question through the model's chat template, greedy, exactly --new-tokens
tokens (EOS ignored on both sides).

    engine   the engine alone in this process: runners.OrtLoopRunner (the IOBinding loop,
             in-place KV cache), prefill then new-tokens - 1 decode steps, --threads threads
    served   `pipeline serve RECIPE` in its own process (Ray Serve, the separate ingress, the
             OpenAI API, continuous batching; the same --threads; no prefix cache, so it
             prefills the whole prompt as the engine alone does), one streamed
             /v1/chat/completions request by the `openai` client with ignore_eos

Per request: tokens/s = tokens / (end - start), start at the call (engine: the prefill's
start; served: the request's send) and end at the last token; TPOT = (last - first token) /
(tokens - 1). The ratio served / engine per round (paired), its mean with a t interval over
rounds. The server's process tree is SIGSTOPped while the engine runs alone (its idle Ray
takes ~9% of a core) and resumed after, then warmed with one request before it is timed.

    .venv/bin/python benchmarks/serving_path_http.py --recipe smollm2-int4 --rounds 12 \
        --out benchmarks/results/serving-path-http

A benchmark, not a test: results in <out>-<date>.{json,md}, the CPU named.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.chat_peers import pause  # noqa: E402  (SIGSTOP/SIGCONT a server's process tree)
from benchmarks.serve_chat import cpu, prompts  # noqa: E402  (the CPU line, the questions)


def engine_alone(runner, prompt: list[int], new: int) -> dict:
    start = time.perf_counter()
    runner.new(1)
    runner.prefill(np.asarray([prompt], np.int64))
    first = time.perf_counter()
    for _ in range(new - 1):
        runner.step()
    end = time.perf_counter()
    return {"tokens": new, "tokens_per_s": new / (end - start), "ttft_ms": (first - start) * 1e3,
            "tpot_ms": (end - first) * 1e3 / (new - 1)}


def served(client, model: str, question: str, new: int) -> dict:
    start = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], max_tokens=new,
        temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True})
    first = last = None
    tokens = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    assert tokens == new, f"the server generated {tokens} tokens, not {new}"
    return {"tokens": tokens, "tokens_per_s": tokens / (last - start), "ttft_ms": (first - start) * 1e3,
            "tpot_ms": (last - first) * 1e3 / (tokens - 1)}


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): Student's t, 95%."""
    from scipy import stats

    mean = statistics.mean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="smollm2-int4")
    parser.add_argument("--engines-dir", type=Path, default=ROOT / "engines")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "serving-path-http")
    args = parser.parse_args()

    import onnxruntime
    import openai

    from pipeline.generation import chat
    from pipeline.generation.runners import OrtLoopRunner
    from pipeline.loadgen.server import ServeProcess
    from pipeline.serving.engine import choose
    from pipeline.store.folder_names import folder_name, load

    recipe = load(args.recipe, (), args.engines_dir)
    choice = choose(recipe, args.engines_dir, None)
    runner = OrtLoopRunner(choice.path, None, args.threads, in_place=True)  # EOS ignored
    questions = [q.question for q in chat.questions(recipe.workload.chat.questions).values()]
    ids = prompts(recipe, choice.path.parent)
    log = Path(tempfile.mkdtemp(prefix="serving-path-")) / "serve.log"
    rows: list[dict] = []
    load_before = os.getloadavg()
    # no prefix cache: the served side prefills every prompt whole, as the engine alone does
    overrides = (f"serve.threads={args.threads}", "serve.prefix_cache=false")
    with ServeProcess(folder_name(recipe), "chat", overrides,
                      args.engines_dir, None, log) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                               timeout=300)
        model = recipe.name
        served(client, model, questions[0], args.new_tokens)  # warm
        engine_alone(runner, ids[0], args.new_tokens)
        for r in range(args.rounds):
            i = r % len(questions)
            order = ("engine", "served") if r % 2 == 0 else ("served", "engine")
            row = {"round": r, "question": i}
            for side in order:
                if side == "engine":
                    pause(server.pid, True)
                    try:
                        row["engine"] = engine_alone(runner, ids[i], args.new_tokens)
                    finally:
                        pause(server.pid, False)
                    served(client, model, questions[(i + 1) % len(questions)], 4)  # wake it
                else:
                    row["served"] = served(client, model, questions[i], args.new_tokens)
            row["ratio"] = row["served"]["tokens_per_s"] / row["engine"]["tokens_per_s"]
            rows.append(row)
            print(f"round {r}: engine {row['engine']['tokens_per_s']:.1f} tok/s (TPOT "
                  f"{row['engine']['tpot_ms']:.2f} ms), served {row['served']['tokens_per_s']:.1f} "
                  f"(TPOT {row['served']['tpot_ms']:.2f} ms): {row['ratio']:.3f}", flush=True)
    ratio = t_interval([r["ratio"] for r in rows])
    summary = {side: {k: statistics.median(r[side][k] for r in rows)
                      for k in ("tokens_per_s", "ttft_ms", "tpot_ms")} for side in ("engine", "served")}
    date = datetime.date.today().isoformat()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    result = {"recipe": recipe.name, "engine": str(choice.path.relative_to(args.engines_dir)),
              "threads": args.threads, "new_tokens": args.new_tokens, "rounds": args.rounds,
              "machine": cpu(), "onnxruntime": onnxruntime.__version__, "commit": commit,
              "load_before": load_before, "load_after": os.getloadavg(),
              "median": summary, "ratio_mean_ci95": ratio, "rows": rows}
    out = args.out.with_name(f"{args.out.name}-{date}")
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    m, lo, hi = ratio
    md = [f"# The HTTP serving path against the engine alone, one stream ({recipe.name}), {date}", "",
          "`benchmarks/serving_path_http.py` (its docstring says how): the same chat question, "
          f"greedy, exactly {args.new_tokens} tokens (EOS ignored), {args.threads} threads both "
          f"sides, {args.rounds} rounds ABBA; the server paused while the engine ran alone; "
          "the server's prefix cache off (both prefill the whole prompt).", "",
          f"Machine: {result['machine']['cpu']}, {result['machine']['cores']} cores "
          f"({', '.join(result['machine']['isa'])}); onnxruntime {onnxruntime.__version__}; commit "
          f"{commit}; load average before {load_before[0]:.1f}, after {result['load_after'][0]:.1f}.", "",
          "| side | tokens/s (median) | TTFT ms (median) | TPOT ms (median) |", "|---|---|---|---|"]
    for side in ("engine", "served"):
        s = summary[side]
        md.append(f"| {side} | {s['tokens_per_s']:.1f} | {s['ttft_ms']:.1f} | {s['tpot_ms']:.2f} |")
    md += ["", f"Served / engine tokens/s, paired per round: **{m:.3f}** [{lo:.3f}, {hi:.3f}] "
           "(mean, 95% t interval). The goal (within 10%): "
           f"**{'met' if lo >= 0.9 else ('not met' if hi < 0.9 else 'not shown either way')}**.", ""]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
