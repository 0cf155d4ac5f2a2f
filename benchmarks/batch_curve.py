"""Batched decode on the in-place cache (issue 37): TPOT and aggregate tokens/s at batch 1, 2, 4,
8 and 16 against the bandwidth floor at each batch size, for engines taking turns in one process:
by default smollm2-int4 with its KV cache in float32 and in int8 (smollm2-int4-kv8);
`--compare LABEL=FOLDER,...` names others (folders under --engines).

    make engine RECIPE=smollm2-int4 && make engine RECIPE=smollm2-int4-kv8
    PYTHONPATH=. .venv/bin/python benchmarks/batch_curve.py [--rounds 3] [--out results/batch-curve-DATE]

What a serving engine's capacity rests on: one decode call for `b` running sequences (the
serving slots, generation/slots.py: rows of one preallocated cache, each at its own length),
each row holding a 128-token prompt of data/chat's held-out text (a different slice per row).
Per round and batch size: the rows prefilled (untimed), 2 decode steps of warm-up, then 24
timed decode steps (greedy). The floor per step: weights as stored read once, plus each row's
cache at its context (pipeline/bench/floor.py's bytes over the measured copy bandwidth). A
benchmark, not a test: its timings are this machine's.

    PYTHONPATH=. .venv/bin/python benchmarks/batch_curve.py --profile 16

`--profile B` instead profiles one engine's decode step at batch B (ONNX Runtime's profiler,
spinning workers as `pipeline serve` runs them, 2 threads, the same rows and steps): kernel
time per step by op type, the median over the timed steps (explain/profile.py's summarize).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PROMPT, WARMUP, STEPS = 128, 2, 24


def held_out(rows: int):
    """SmolLM2's decoder shape, and chat's held-out text as ids: enough for `rows` rows of
    PROMPT tokens, each row's slice starting 37 tokens after the one before."""
    from pipeline.generation import chat
    from pipeline.recipe.loader import load
    from pipeline.recipe.workload import decoder_shape

    recipe = load(str(ROOT / "recipes" / "smollm2-int4.yaml"))
    shape = decoder_shape(recipe.model)
    return shape, chat.text_ids(chat.chat_tokenizer(recipe), recipe.workload.chat.text, 37 * rows + PROMPT, shape.vocab)


def decode_steps_ms(slots, rows: int, text: np.ndarray) -> list[float]:
    """Prefill `rows` rows, then time STEPS decode calls over all of them (ms each)."""
    tokens = np.array([int(np.argmax(slots.prefill(r, text[r * 37:r * 37 + PROMPT]))) for r in range(rows)])
    times = []
    for i in range(WARMUP + STEPS):
        t0 = time.perf_counter()
        logits = slots.decode(list(range(rows)), tokens)
        if i >= WARMUP:
            times.append((time.perf_counter() - t0) * 1e3)
        tokens = logits.argmax(axis=-1)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", default="1,2,4,8,16")
    parser.add_argument("--engines", type=Path, default=ROOT / "engines")
    parser.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    parser.add_argument("--profile", type=int, metavar="B", help="profile the decode step at batch B")
    parser.add_argument("--engine", default="smollm2-int4", help="with --profile: the engines folder's name")
    parser.add_argument("--compare", default="float32=smollm2-int4,int8=smollm2-int4-kv8",
                        help="LABEL=FOLDER,... : the engines folders (under --engines) taking turns")
    args = parser.parse_args()
    if args.profile:
        return profile_step(args.engines / args.engine / "onnxruntime.onnx", args.profile)

    from pipeline.bench import floor
    from pipeline.generation import figures as gm
    from pipeline.generation import runners
    from pipeline.generation.slots import BatchedSlots

    batches = [int(b) for b in args.batches.split(",")]
    names = dict(item.split("=", 1) for item in args.compare.split(","))
    shape, text = held_out(max(batches))
    engines = {k: args.engines / n / "onnxruntime.onnx" for k, n in names.items()}
    loops = {k: runners.OrtLoopRunner(p, None, 2) for k, p in engines.items()}
    bw = floor.bandwidth()
    load_before = [round(x, 2) for x in os.getloadavg()]
    times: dict[str, dict[int, list[float]]] = {k: {b: [] for b in batches} for k in loops}
    for r in range(args.rounds):
        for b in batches:
            for kind in (list(loops) if (r + b) % 2 == 0 else list(loops)[::-1]):
                slots = BatchedSlots(loops[kind], b, PROMPT + WARMUP + STEPS + 1)
                times[kind][b] += decode_steps_ms(slots, b, text)
                slots.close()
        print(f"round {r + 1}/{args.rounds}: " + "; ".join(
            f"{k} b{b} {np.median(v[b]):.1f} ms" for k, v in times.items() for b in batches), flush=True)
    context = PROMPT + WARMUP + STEPS // 2
    curve = {}
    for kind, loop in loops.items():
        weights = floor.weight_bytes(engines[kind]).total
        per_token = gm.kv_bytes_per_token(shape.layers, shape.kv_heads, shape.head_dim, loop.cache_dtype.itemsize)
        curve[kind] = {}
        for b in batches:
            step = float(np.median(times[kind][b]))
            floor_ms = (weights + b * per_token * context) / bw.bytes_per_s * 1e3
            q = np.percentile(times[kind][b], [10, 90])
            curve[kind][b] = {"step_ms_p50": step, "step_ms_p10_p90": [float(q[0]), float(q[1])],
                              "tokens_per_s": b * 1e3 / step, "floor_ms": floor_ms,
                              "step_over_floor": step / floor_ms, "steps": len(times[kind][b])}
    result = {
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_average": {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]},
        "bandwidth_gb_s": bw.bytes_per_s / 1e9, "bandwidth_method": bw.method,
        "weights_mb": {k: floor.weight_bytes(p).total / 1e6 for k, p in engines.items()},
        "engines": names,
        "method": (f"one process, 2 threads, generation/slots.py BatchedSlots; {args.rounds} rounds, each batch "
                   f"size in turn, the engines taking turns (order alternating); per round {WARMUP} "
                   f"warm-up + {STEPS} timed decode steps over rows of {PROMPT}-token held-out prompts; "
                   f"floor at context {context}"),
        "curve": curve,
    }
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
        args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


def profile_step(engine: Path, batch: int) -> None:
    """Print the decode step's kernel time by op type at `batch` rows (see the docstring)."""
    import tempfile
    from collections import defaultdict

    import onnxruntime as ort

    from pipeline.explain.profile import summarize
    from pipeline.generation import runners
    from pipeline.generation.slots import BatchedSlots

    _, text = held_out(batch)
    loop = runners.OrtLoopRunner(engine, None, 2, spin=True)
    with tempfile.TemporaryDirectory() as tmp:
        options = runners.session_options(2, spin=True)  # the runner's, with the profiler on
        options.enable_profiling, options.profile_file_prefix = True, str(Path(tmp) / "decode")
        loop.session = ort.InferenceSession(str(engine), options, providers=["CPUExecutionProvider"])
        slots = BatchedSlots(loop, batch, PROMPT + WARMUP + STEPS + 1)
        wall = decode_steps_ms(slots, batch, text)
        events = json.loads(Path(loop.session.end_profiling()).read_text())
    profile = summarize(events, skip_runs=batch + WARMUP)  # the prefills and warm-up steps
    by_op, nodes = defaultdict(float), defaultdict(int)
    for node in profile.nodes:
        by_op[node.op] += node.us
        nodes[node.op] += 1
    print(f"{engine} decode step at batch {batch}: wall p50 {np.median(wall):.2f} ms, kernels "
          f"{profile.total_us / 1e3:.2f} ms (median of {profile.runs} steps, profiler on)")
    print("| op | ms a step | share | nodes |\n|---|---|---|---|")
    for op, us in sorted(by_op.items(), key=lambda kv: -kv[1]):
        print(f"| {op} | {us / 1e3:.3f} | {us / profile.total_us:.1%} | {nodes[op]} |")
    print("slowest nodes: " + "; ".join(f"{n.name} ({n.op}) {n.us / 1e3:.3f} ms" for n in profile.nodes[:4]))


def markdown(r: dict) -> str:
    engines = r.get("engines", {"float32": "smollm2-int4", "int8": "smollm2-int4-kv8"})
    lines = [f"# Batched decode curve: {', '.join(f'{k} ({v})' for k, v in engines.items())} ({r['written'][:10]})", "",
             f"How: {r['method']}. Floor: weights as stored ({', '.join(f'{k}: {v:.0f} MB' for k, v in r['weights_mb'].items())}) "
             f"read once per step + every row's cache at its context, over {r['bandwidth_gb_s']:.1f} GB/s "
             f"({r['bandwidth_method']}). Load average before/after: {r['load_average']['before']} / "
             f"{r['load_average']['after']}.", "",
             "| batch | engine | decode step p50 ms [p10, p90] | tokens/s (all rows) | floor ms | step / floor |",
             "|---|---|---|---|---|---|"]
    batches = sorted({int(b) for c in r["curve"].values() for b in c})
    for b in batches:
        for kind, c in r["curve"].items():
            p = c.get(b) or c.get(str(b))
            lines.append(f"| {b} | {kind} | {p['step_ms_p50']:.2f} [{p['step_ms_p10_p90'][0]:.2f}, "
                         f"{p['step_ms_p10_p90'][1]:.2f}] | {p['tokens_per_s']:.0f} | {p['floor_ms']:.2f} | "
                         f"{p['step_over_floor']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
