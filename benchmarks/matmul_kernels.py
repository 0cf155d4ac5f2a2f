"""Which ONNX Runtime CPU kernel multiplies a batch of rows fastest (issues 36 and 38: the decode
step at 8 and 16 running sequences is what a served chat engine's throughput rests on).

One op alone per session, SmolLM2-135M's matrix shapes [K -> N], rows M = 1, 8, 16, 2 threads:

    MatMulNBits 4-bit, symmetric (no zero points)       the requantized RTN route
    MatMulNBits 4-bit, uint8 zero points                 hqq_uint8 and gptq
    MatMulNBits 8-bit, uint8 zero points                 the checkpoint's Q8_0 LM head
    DynamicQuantizeMatMul (int8 weights, per tensor)     precision int8 dynamic
    MatMul fp32                                          float

all MatMulNBits with block 32 and accuracy_level 4 (activations quantized to int8 per block of
each row: MLAS' integer path). Random weights and inputs (the kernels' speed does not depend on
the values). Per round every (shape, kernel, M) in turn, in a shuffled order; per cell the
median over rounds of the mean of `--calls` calls after 20 warm-up calls; the workers do not spin
between calls (25 sessions take turns, each with its own thread pool). The weights stay in
cache between calls for all but the LM head, so these are compute rates, not the bandwidth a
whole decode step sees. A benchmark, not a test: its timings are this machine's.

    PYTHONPATH=. .venv/bin/python benchmarks/matmul_kernels.py --out benchmarks/results/matmul-kernels-DATE
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

import numpy as np

SHAPES = {"q|k|v": (576, 960), "o": (576, 576), "gate|up": (576, 3072), "down": (1536, 576),
          "lm head": (576, 49152)}
KERNELS = ("nbits4-sym", "nbits4-zp", "nbits8-zp", "dynamic-int8", "fp32")
ROWS = (1, 8, 16)
BLOCK = 32


def session(kind: str, k: int, n: int):
    """A one-node ONNX Runtime session computing X [M, k] @ W [k, n] with `kind`'s kernel."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    if kind.startswith("nbits"):
        bits = int(kind[5])
        blocks = k // BLOCK
        inits = [numpy_helper.from_array(rng.integers(0, 256, (n, blocks, BLOCK * bits // 8), dtype=np.uint8), "B"),
                 numpy_helper.from_array((rng.random(n * blocks, dtype=np.float32) * 0.01), "S")]
        if kind.endswith("zp"):  # 4-bit zero points pack two to a byte
            count = n * ((blocks * bits + 7) // 8)
            inits.append(numpy_helper.from_array(np.full(count, 0x88 if bits == 4 else 128, np.uint8), "Z"))
        node = helper.make_node("MatMulNBits", ["X", *(i.name for i in inits)], ["Y"], domain="com.microsoft",
                                K=k, N=n, bits=bits, block_size=BLOCK, accuracy_level=4)
    elif kind == "dynamic-int8":
        inits = [numpy_helper.from_array(rng.integers(-127, 128, (k, n), dtype=np.int8), "B"),
                 numpy_helper.from_array(np.array(0.01, np.float32), "S"),
                 numpy_helper.from_array(np.array(0, np.int8), "Z")]
        node = helper.make_node("DynamicQuantizeMatMul", ["X", "B", "S", "Z"], ["Y"], domain="com.microsoft")
    else:
        inits = [numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "B")]
        node = helper.make_node("MatMul", ["X", "B"], ["Y"])
    graph = helper.make_graph([node], kind, [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    # 25 sessions take turns here: a session's workers spinning after its call would take the
    # cores from the next one's
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def mean_call_us(sess, x: np.ndarray, calls: int) -> float:
    for _ in range(20):
        sess.run(None, {"X": x})
    t0 = time.perf_counter()
    for _ in range(calls):
        sess.run(None, {"X": x})
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    args = parser.parse_args()
    import onnxruntime as ort

    sessions = {(s, kind): session(kind, *SHAPES[s]) for s in SHAPES for kind in KERNELS}
    inputs = {(s, m): np.random.default_rng(m).standard_normal((m, SHAPES[s][0]), dtype=np.float32)
              for s in SHAPES for m in ROWS}
    cells = [(s, kind, m) for s in SHAPES for kind in KERNELS for m in ROWS]
    times: dict[tuple, list[float]] = {c: [] for c in cells}
    order = random.Random(0)
    for r in range(args.rounds):
        order.shuffle(cells)
        for s, kind, m in cells:
            times[(s, kind, m)].append(mean_call_us(sessions[(s, kind)], inputs[(s, m)], args.calls))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    rows = []
    for s, (k, n) in SHAPES.items():
        for kind in KERNELS:
            for m in ROWS:
                us = statistics.median(times[(s, kind, m)])
                rows.append({"shape": s, "k": k, "n": n, "kernel": kind, "rows": m, "us": round(us, 1),
                             "gops": round(2 * m * k * n / us / 1e3, 1),
                             "us_rounds": [round(t, 1) for t in times[(s, kind, m)]]})
    result = {"onnxruntime": ort.__version__, "machine": platform.processor() or platform.machine(),
              "rounds": args.rounds, "calls": args.calls, "threads": 2, "rows": rows}
    print(markdown(result))
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
        args.out.with_suffix(".md").write_text(markdown(result))


def markdown(result: dict) -> str:
    lines = [f"# ONNX Runtime {result['onnxruntime']} CPU kernels on SmolLM2's matrices, 2 threads",
             "", f"How: benchmarks/matmul_kernels.py; {result['rounds']} rounds, every cell in turn "
             f"(shuffled), the median over rounds of the mean of {result['calls']} calls. GOP/s = "
             "2 M K N / time.", "",
             "| shape [K -> N] | kernel | " + " | ".join(f"M={m} µs (GOP/s)" for m in ROWS) + " |",
             "|---|---|" + "---|" * len(ROWS)]
    by = {(r["shape"], r["kernel"], r["rows"]): r for r in result["rows"]}
    for s, (k, n) in SHAPES.items():
        for kind in KERNELS:
            cells = [by[(s, kind, m)] for m in ROWS]
            lines.append(f"| {s} [{k} -> {n}] | {kind} | "
                         + " | ".join(f"{c['us']:,.0f} ({c['gops']:.0f})" for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
