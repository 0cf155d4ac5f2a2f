"""ONNX Runtime's worker threads asleep or spinning inside a run: decode step and prefill time
of a generation engine under both policies, in one process, taking turns.

    PYTHONPATH=. .venv/bin/python benchmarks/spin_policy.py [--engine smollm2-int4] [--rounds 6] \
        [--out benchmarks/results/spin-policy-DATE]

Policies (generation/runners.ort_session): "asleep" (`session.intra_op.allow_spinning` 0, what
serving and the generation workload used), "spin in run" (allow_spinning 1 with
`session.force_spinning_stop` 1: workers spin-wait between the parallel sections of one run and
stop when it returns). A decode step of SmolLM2 is ~500 small kernels; a worker put to sleep
after each must be woken for the next. Per round, each policy in turn (order alternating), for
each batch size: rows of 128-token held-out prompts prefilled, 2 warm-up and 24 timed decode
steps (generation/slots.py BatchedSlots, the serving slots); then 8 timed prefills of a 40-token
prompt at batch 1. Idle cost: the process's CPU time over 1 s after the last run of each policy
(spinning that outlived the run would show there). A benchmark, not a test: this machine's times.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

# the batch curve's decode steps, timed the same way
from benchmarks.batch_curve import PROMPT, ROOT, STEPS, WARMUP, decode_steps_ms

PREFILLS, PREFILL_TOKENS = 8, 40
POLICIES = {"asleep": False, "spin in run": True}


def _prefill_ms(slots, text: np.ndarray) -> list[float]:
    times = []
    for i in range(PREFILLS):
        t0 = time.perf_counter()
        slots.prefill(i, text[i * 11:i * 11 + PREFILL_TOKENS])
        times.append((time.perf_counter() - t0) * 1e3)
        slots.release(i)
    return times


def _idle_cpu_pct() -> float:
    """This process's CPU over the next second, % of one core (nothing runs meanwhile)."""
    c0, t0 = time.process_time(), time.perf_counter()
    time.sleep(1.0)
    return 100 * (time.process_time() - c0) / (time.perf_counter() - t0)


def _ratio_ci(a: list[float], b: list[float], seed: int = 0) -> tuple[float, float, float]:
    """median(b) / median(a) with a 95% bootstrap interval over each side's samples."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(a), np.asarray(b)
    boots = [np.median(rng.choice(b, b.size)) / np.median(rng.choice(a, a.size)) for _ in range(2000)]
    return float(np.median(b) / np.median(a)), *(float(x) for x in np.percentile(boots, [2.5, 97.5]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="smollm2-int4", help="engines/<name>/onnxruntime.onnx")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engines", type=Path, default=ROOT / "engines")
    parser.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    args = parser.parse_args()

    from pipeline.generation import chat, runners
    from pipeline.generation.slots import BatchedSlots
    from pipeline.recipe.loader import load
    from pipeline.recipe.workload import decoder_shape

    batches = [int(b) for b in args.batches.split(",")]
    recipe = load(str(ROOT / "recipes" / f"{args.engine}.yaml"))
    shape = decoder_shape(recipe.model)
    text = chat.text_ids(chat.chat_tokenizer(recipe), recipe.workload.chat.text, 37 * max(batches) + PROMPT, shape.vocab)
    engine = args.engines / args.engine / "onnxruntime.onnx"
    loops = {k: runners.OrtLoopRunner(engine, None, args.threads, in_place=True, spin=v) for k, v in POLICIES.items()}
    load_before = [round(x, 2) for x in os.getloadavg()]
    decode = {k: {b: [] for b in batches} for k in loops}
    prefill = {k: [] for k in loops}
    idle = {k: [] for k in loops}
    for r in range(args.rounds):
        for kind in (list(loops) if r % 2 == 0 else list(loops)[::-1]):
            for b in batches:
                slots = BatchedSlots(loops[kind], b, PROMPT + WARMUP + STEPS + 1)
                decode[kind][b] += decode_steps_ms(slots, b, text)
                slots.close()
            slots = BatchedSlots(loops[kind], PREFILLS, PREFILL_TOKENS + 1)
            prefill[kind] += _prefill_ms(slots, text)
            slots.close()
            idle[kind].append(_idle_cpu_pct())
        print(f"round {r + 1}/{args.rounds}: " + "; ".join(
            f"{k} b{b} {np.median(v[b]):.2f} ms" for k, v in decode.items() for b in batches), flush=True)
    base, other = list(loops)
    result = {
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "engine": args.engine, "threads": args.threads,
        "load_average": {"before": load_before, "after": [round(x, 2) for x in os.getloadavg()]},
        "method": (f"one process, {args.threads} threads, generation/slots.py BatchedSlots; {args.rounds} rounds, "
                   f"the policies taking turns (order alternating); per round and batch size {WARMUP} warm-up + "
                   f"{STEPS} timed decode steps over rows of {PROMPT}-token held-out prompts, then {PREFILLS} timed "
                   f"{PREFILL_TOKENS}-token prefills at batch 1; idle: process CPU over 1 s after each policy's turn"),
        "decode_ms": {k: {b: {"p50": float(np.median(v[b])), "p10_p90": [float(x) for x in np.percentile(v[b], [10, 90])],
                              "n": len(v[b])} for b in batches} for k, v in decode.items()},
        "decode_ratio": {b: _ratio_ci(decode[base][b], decode[other][b]) for b in batches},
        "prefill_ms": {k: {"p50": float(np.median(v)), "n": len(v)} for k, v in prefill.items()},
        "prefill_ratio": _ratio_ci(prefill[base], prefill[other]),
        "idle_cpu_pct": {k: float(np.median(v)) for k, v in idle.items()},
    }
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
        args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


def markdown(r: dict) -> str:
    base, other = list(r["decode_ms"])
    lines = [f"# ONNX Runtime workers asleep vs spinning inside a run: {r['engine']} ({r['written'][:10]})", "",
             f"How: {r['method']}. Load average before/after: {r['load_average']['before']} / "
             f"{r['load_average']['after']}. Ratio: {other} over {base}, medians, 95% bootstrap interval.", "",
             f"| what | {base} p50 ms | {other} p50 ms | {other} / {base} [95% CI] |", "|---|---|---|---|"]
    for b, (ratio, lo, hi) in r["decode_ratio"].items():
        lines.append(f"| decode step, batch {b} | {r['decode_ms'][base][b]['p50']:.2f} | "
                     f"{r['decode_ms'][other][b]['p50']:.2f} | {ratio:.2f}x [{lo:.2f}, {hi:.2f}] |")
    ratio, lo, hi = r["prefill_ratio"]
    lines.append(f"| prefill, {PREFILL_TOKENS} tokens | {r['prefill_ms'][base]['p50']:.2f} | "
                 f"{r['prefill_ms'][other]['p50']:.2f} | {ratio:.2f}x [{lo:.2f}, {hi:.2f}] |")
    lines += ["", "Idle after a turn (process CPU over 1 s, % of a core): " +
              ", ".join(f"{k} {v:.1f}" for k, v in r["idle_cpu_pct"].items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
