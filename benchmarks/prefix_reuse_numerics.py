"""Why the INT4 engine's replies change with conversation reuse and the fp32 graph's do not:
the last position's logits of one chat prompt (three messages through the model's template)
computed three ways through the slots (pipeline/generation/slots.py), on the recipe's fp32
graph (optimized.onnx) and its INT4 engine (onnxruntime.onnx):

  whole     the prompt prefilled at once
  split     its first --split tokens prefilled, copied out and adopted by another slot, the
            rest prefilled on top (what a reused prefix does when the prefix was a prefill)
  stepped   its first --split tokens prefilled, the rest fed one decode step at a time (how a
            reply's tokens enter the cache: a reused reply brings these keys and values)

    PYTHONPATH=. python benchmarks/prefix_reuse_numerics.py [--engines-dir /work/after/engines]
        [--recipe smollm2-int4] [--split 50] [--out benchmarks/results/prefix-reuse-numerics]

Reported: max |logits - whole's| and whether the argmax agrees. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MESSAGES = [{"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "The capital of France is Paris, a city known for its art and history."},
            {"role": "user", "content": "What is the capital of Japan?"}]


def three_ways(path: Path, prompt: np.ndarray, split: int, threads: int) -> dict:
    from pipeline.generation.runners import OrtLoopRunner
    from pipeline.generation.slots import BatchedSlots

    loop = OrtLoopRunner(path, 0, threads, in_place=True)
    slots = BatchedSlots(loop, 2, len(prompt) + 1)
    whole = slots.prefill(0, prompt)
    slots.release(0)
    slots.prefill(0, prompt[:split])
    held = slots.held(0)
    slots.release(0)
    slots.adopt(1, held, split)
    split_logits = slots.prefill(1, prompt[split:])
    slots.release(1)
    slots.prefill(0, prompt[:split])
    for token in prompt[split:-1]:
        slots.decode([0], np.array([token]))
    stepped = slots.decode([0], np.array([prompt[-1]]))[0]
    loop.close()
    return {name: {"max_abs_diff": float(np.abs(x - whole).max()), "argmax_same": int(x.argmax()) == int(whole.argmax())}
            for name, x in (("split", split_logits), ("stepped", stepped))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines-dir", type=Path, default=Path("/work/after/engines"))
    parser.add_argument("--recipe", default="smollm2-int4")
    parser.add_argument("--split", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "prefix-reuse-numerics")
    args = parser.parse_args()

    import onnxruntime

    from pipeline.data.tokenizer import Tokenizer

    folder = args.engines_dir / args.recipe
    prompt = np.asarray(Tokenizer.from_folder(folder, f"{folder}: tokenizer").conversation(MESSAGES), np.int64)
    graphs = {name: three_ways(folder / name, prompt, args.split, args.threads)
              for name in ("optimized.onnx", "onnxruntime.onnx")}
    result = {"date": datetime.date.today().isoformat(), "recipe": args.recipe, "onnxruntime": onnxruntime.__version__,
              "prompt_tokens": len(prompt), "split": args.split, "graphs": graphs}
    lines = [f"# Reused prefixes, numerically: `{args.recipe}`", "",
             f"{result['date']}, onnxruntime {result['onnxruntime']}; one chat prompt of {len(prompt)} tokens, "
             f"split at {args.split} (benchmarks/prefix_reuse_numerics.py says how). Max |logits - the whole "
             "prompt prefilled at once| at the last position:", "",
             "| graph | split prefill (adopted prefix) | the rest decoded one step at a time |", "|---|---|---|"]
    for name, r in graphs.items():
        lines.append(f"| {name} | {r['split']['max_abs_diff']:.2e} (argmax {'same' if r['split']['argmax_same'] else 'differs'}) "
                     f"| {r['stepped']['max_abs_diff']:.2e} (argmax {'same' if r['stepped']['argmax_same'] else 'differs'}) |")
    lines += ["", "An adopted prefix followed by a prefill gives the whole prefill's logits exactly; what differs is "
              "how the cache was filled: a reply's keys and values come from decode steps, and the INT4 engine's "
              "decode-step kernels round differently from its prefill's. With reuse the next turn attends to the "
              "keys and values the reply was generated with (as one process's multi-turn chat does); without, "
              "to a prefill's recomputation of them.", ""]
    stem = Path(f"{args.out}-{result['date']}")
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
