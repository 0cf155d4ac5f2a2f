"""The long point's decode phase of smollm2-long vs smollm2-flash-long on the IOBinding loop,
in one process, after the in-place buffer keeps room past a prompt (runners.FIRST_CAPACITY).

    PYTHONPATH=. python benchmarks/long_decode_growth.py [--rounds 6]

`pipeline compare smollm2-long smollm2-flash-long` (2026-12-02, the loop before that change)
timed flash's long-point decode 2.59x slower in total while its TPOT p50 was 0.60x: the first
decode step after a 5,120-token prompt grew the buffer 5,120 -> 10,240 tokens (a fresh
allocation and a copy), once per request, inside the decode phase. This reruns that point
with the built engines (no rebuild) and the same statistics. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--engines", type=Path, default=ROOT / "engines")
    args = parser.parse_args()

    from pipeline.artifacts import dump
    from pipeline.core import stats
    from pipeline.generation import figures as gm
    from pipeline.generation import runners
    from pipeline.generation.timed_requests import Request, measure
    from pipeline.recipe.workload import WorkloadSpec

    names = ("smollm2-long", "smollm2-flash-long")
    loops = {n: runners.OrtLoopRunner(args.engines / n / "onnxruntime.onnx", 2, 2) for n in names}
    prompt = np.random.default_rng(0).integers(3, 49000, size=(1, 5120))
    request = Request("long", "long", 1, ((prompt, 32),))
    traces = measure(loops, request, WorkloadSpec(kind="generation", warmup=1), rounds=args.rounds)
    decode = {n: np.array([[sum(map(sum, t.step_ns))] for t in traces[n]], dtype=np.float64) for n in names}
    out = {
        "capacity_after": {n: loops[n].capacity for n in names},
        "tpot_ms": {n: dump(gm.summarize(request, traces[n]).tpot_ms) for n in names},
        "decode_s": {n: float(np.median(decode[n])) / 1e9 for n in names},
        "flash decode vs standard": stats.compare(decode[names[0]], decode[names[1]], noise=0.02),
        "flash tpot vs standard": stats.compare(gm.tpot_blocks(traces[names[0]]), gm.tpot_blocks(traces[names[1]]), noise=0.02),
        "method": f"one process, 1 warm-up, {args.rounds} rounds taking turns; random 5,120-token prompt, "
                  "32 new tokens, 2 threads; ratio: " + stats.ratio_method(0.02),
    }
    print(json.dumps(out, indent=2, default=float))


if __name__ == "__main__":
    main()
