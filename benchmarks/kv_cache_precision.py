"""The KV cache's precision at the short and the long point (issue 37): the same engine with its
cache in float32 (smollm2-int4) and in int8 (smollm2-int4-kv8, precision.kv_cache: int8), in
one process, interleaved, on held-out text.

    make engine RECIPE=smollm2-int4 && make engine RECIPE=smollm2-int4-kv8
    PYTHONPATH=. .venv/bin/python benchmarks/kv_cache_precision.py [--rounds 6] [--out results/kv-cache-DATE]

Per point (prompt 128 and 5,120 tokens of data/chat's held-out text, 32 new tokens, greedy,
2 threads, the IOBinding loop): TPOT p50 and its ratio to float32's with an interval, the
bandwidth floor (weights as stored + the cache at the point's context, pipeline/bench/floor.py)
and TPOT over it; at the long point also what the 8 bits cost: greedy tokens equal to the
float32 cache's, and perplexity of the 256 tokens after the 5,120-token prompt (teacher-forced
through each cache). Answers and short perplexity are in each engine's report.md. A benchmark,
not a test: its timings are this machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CONTINUATION = 256  # tokens scored after the long prompt


def _nll_after(loop, text: np.ndarray, prompt: int) -> float:
    """Mean NLL of text[prompt:prompt + CONTINUATION], the prompt prefilled into the engine's own
    cache first (its precision is what is measured), then the continuation in one call."""
    from pipeline.generation.runners import run_cached

    loop.new(1)
    loop.prefill(text[None, :prompt])
    cont = text[None, prompt:prompt + CONTINUATION + 1]
    loop.length += cont.shape[1] - 1
    if loop.length > loop.capacity:
        loop._grow(loop.length)
    mask = np.ones((1, loop.length), np.int64)
    logits = run_cached(loop.session, cont[:, :-1], mask, loop.past, loop.in_place)[0].numpy()[0]  # [T, V]
    logits = logits - logits.max(axis=-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    return float(-logp[np.arange(CONTINUATION), cont[0, 1:]].mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--engines", type=Path, default=ROOT / "engines")
    parser.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    parser.add_argument("--engine", action="append", default=[], metavar="LABEL=RECIPE",
                        help="engines to compare, the first the reference (default: "
                             "float32=smollm2-int4 int8=smollm2-int4-kv8)")
    args = parser.parse_args()

    from pipeline.artifacts import dump
    from pipeline.bench import floor
    from pipeline.core import stats
    from pipeline.generation import chat, runners
    from pipeline.generation import figures as gm
    from pipeline.generation.timed_requests import Request, measure
    from pipeline.recipe.loader import load
    from pipeline.recipe.workload import WorkloadSpec, decoder_shape

    names = dict(e.split("=", 1) for e in args.engine) or {"float32": "smollm2-int4", "int8": "smollm2-int4-kv8"}
    first = next(iter(names))
    recipe = load(str(ROOT / "recipes" / "smollm2-int4.yaml"))
    shape = decoder_shape(recipe.model)
    text = chat.text_ids(chat.chat_tokenizer(recipe), recipe.workload.chat.text, 5120 + CONTINUATION + 1, shape.vocab)
    engines = {k: args.engines / n / "onnxruntime.onnx" for k, n in names.items()}
    loops = {k: runners.OrtLoopRunner(p, None, 2) for k, p in engines.items()}
    bw = floor.bandwidth()
    load_before = [round(x, 2) for x in os.getloadavg()]
    points = {}
    for label, prompt in (("short", 128), ("long", 5120)):
        request = Request(label, label, 1, ((text[None, :prompt], 32),))
        t0 = time.perf_counter()
        traces = measure(loops, request, WorkloadSpec(kind="generation", warmup=1), rounds=args.rounds)
        blocks = {k: gm.tpot_blocks(traces[k]) for k in loops}
        tokens = {k: traces[k][0].tokens[0] for k in loops}
        point = {"prompt": prompt, "seconds": time.perf_counter() - t0, "engines": {}}
        for kind, loop in loops.items():
            per_token = gm.kv_bytes_per_token(shape.layers, shape.kv_heads, shape.head_dim, loop.cache_dtype.itemsize)
            tpot = gm.summarize(request, traces[kind]).tpot_ms
            [fp] = floor.floor_points(floor.weight_bytes(engines[kind]).total, per_token, {label: prompt + 16},
                                      bw.bytes_per_s, {label: tpot.p50}).values()
            point["engines"][kind] = {
                "engine": names[kind], "tpot_ms": dump(tpot), "kv_bytes_per_token": per_token,
                "floor_ms": fp.floor_ms, "tpot_over_floor": fp.tpot_over_floor,
                "tokens_equal_first": int((tokens[kind] == tokens[first]).sum()),
                "first_divergence": int(np.argmax(tokens[kind] != tokens[first]))
                if (tokens[kind] != tokens[first]).any() else None}
        point["tpot_vs_first"] = {k: stats.time_ratio(blocks[first], blocks[k], noise=0.02).dump()
                                  for k in loops if k != first}
        if label == "long":
            for kind, loop in loops.items():
                point["engines"][kind]["nll_after_prompt"] = _nll_after(loop, text, prompt)
        points[label] = point
        print(json.dumps({label: point}, indent=1, default=float), flush=True)
    result = {
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_average": {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]},
        "bandwidth_gb_s": bw.bytes_per_s / 1e9, "bandwidth_method": bw.method,
        "method": (f"one process, 2 threads, the IOBinding loop; per point 1 warm-up generation per engine, "
                   f"then {args.rounds} rounds taking turns (order alternating); prompts: the first 128 / 5,120 "
                   f"tokens of data/chat's held-out text, 32 greedy new tokens; ratio: {stats.ratio_method(0.02)}; "
                   f"perplexity: mean NLL of the {CONTINUATION} tokens after the long prompt, teacher-forced "
                   "through each engine's own cache"),
        "engines": names,
        "points": points,
    }
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=float))
        args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


def markdown(r: dict) -> str:
    lines = [f"# KV cache precision: {', '.join(f'{k} ({v})' for k, v in r['engines'].items())} ({r['written'][:10]})", "",
             f"How: {r['method']}. Floor: bytes a decode step reads (weights as stored + the cache at the "
             f"point's context) over {r['bandwidth_gb_s']:.1f} GB/s ({r['bandwidth_method']}). "
             f"Load average before/after: {r['load_average']['before']} / {r['load_average']['after']}.", "",
             f"| point | engine | KV bytes/token | TPOT p50 ms | floor ms | TPOT / floor | greedy tokens = {next(iter(r['engines']))}'s | NLL after the prompt |",
             "|---|---|---|---|---|---|---|---|"]
    for label, p in r["points"].items():
        for kind, e in p["engines"].items():
            nll = e.get("nll_after_prompt")
            lines.append(f"| {label} ({p['prompt']}) | {kind} | {e['kv_bytes_per_token']:,} | {e['tpot_ms']['p50']:.2f} | "
                         f"{e['floor_ms']:.2f} | {e['tpot_over_floor']:.2f} | {e['tokens_equal_first']}/32 | "
                         f"{'' if nll is None else f'{nll:.4f} (ppl {np.exp(nll):.2f})'} |")
        for kind, ratio in p["tpot_vs_first"].items():
            lines.append(f"| | {kind} / {next(iter(r['engines']))} TPOT | | **{ratio['time_ratio']:.2f}x "
                         f"[{ratio['ci95'][0]:.2f}, {ratio['ci95'][1]:.2f}]** ({ratio['verdict']}) | | | | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
