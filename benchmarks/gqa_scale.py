"""GroupQueryAttention alone at decode: its softmax scale as an attribute vs folded into q.

Why: GQA's CPU kernel scores each head at decode as a GEMM with M = 1 and alpha = the scale;
MLAS reads K in place for an M = 1 GEMM only when alpha is 1 and otherwise packs (copies) K^T
first. Folding an exact power-of-two scale into q (scale attribute 1) would skip that copy.
This times one GQA node with SmolLM2-135M's shapes (9 query heads, 3 KV heads, head size 64)
at decode, the cache bound in place as the runners bind it (past and present one buffer), for
both attribute values, in one process, rounds taking turns.

    .venv/bin/python benchmarks/gqa_scale.py [--batches 1,8,16] [--buffers 256,2048] [--context 142]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

HEADS, KV_HEADS, HEAD = 9, 3, 64


def session(scale: float, threads: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens_k", "total"],
                            ["out", "present_k", "present_v"], domain="com.microsoft",
                            num_heads=HEADS, kv_num_heads=KV_HEADS, scale=scale)
    cache = ["B", KV_HEADS, "L", HEAD]
    graph = helper.make_graph([node], "gqa", [
        helper.make_tensor_value_info("q", f, ["B", 1, HEADS * HEAD]),
        helper.make_tensor_value_info("k", f, ["B", 1, KV_HEADS * HEAD]),
        helper.make_tensor_value_info("v", f, ["B", 1, KV_HEADS * HEAD]),
        helper.make_tensor_value_info("pk", f, cache), helper.make_tensor_value_info("pv", f, cache),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
        helper.make_tensor_value_info("total", TensorProto.INT32, [])],
        [helper.make_tensor_value_info("out", f, None), helper.make_tensor_value_info("present_k", f, cache),
         helper.make_tensor_value_info("present_v", f, cache)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def time_us(sess, batch: int, buffer: int, context: int, calls: int, rng) -> float:
    """Median µs of one decode call: `batch` rows at `context` cached tokens, a `buffer`-token cache."""
    import onnxruntime as ort

    keys, values = (ort.OrtValue.ortvalue_from_numpy(rng.standard_normal((batch, KV_HEADS, buffer, HEAD)).astype(np.float32))
                    for _ in range(2))
    binding = sess.io_binding()
    for name, width in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
        binding.bind_cpu_input(name, rng.standard_normal((batch, 1, width * HEAD)).astype(np.float32))
    binding.bind_ortvalue_input("pk", keys)
    binding.bind_ortvalue_input("pv", values)
    binding.bind_cpu_input("seqlens_k", np.full(batch, context, np.int32))
    binding.bind_cpu_input("total", np.array(context + 1, np.int32))
    binding.bind_ortvalue_output("present_k", keys)  # in place, as generation/slots.py binds it
    binding.bind_ortvalue_output("present_v", values)
    binding.bind_output("out")
    for _ in range(20):
        sess.run_with_iobinding(binding)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        sess.run_with_iobinding(binding)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,16")
    parser.add_argument("--buffers", default="256,2048")
    parser.add_argument("--context", type=int, default=142)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=150)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    sessions = {"scale 1/8 (attribute)": session(HEAD ** -0.5, args.threads), "scale 1 (folded into q)": session(1.0, args.threads)}
    print(f"| batch | cache buffer | {' | '.join(sessions)} |\n|---|---|---|---|")
    for batch in (int(b) for b in args.batches.split(",")):
        for buffer in (int(b) for b in args.buffers.split(",")):
            times = {name: [] for name in sessions}
            for r in range(args.rounds):  # taking turns, the order alternating
                for name in (list(sessions) if r % 2 == 0 else list(sessions)[::-1]):
                    times[name].append(time_us(sessions[name], batch, buffer, args.context, args.calls, rng))
            cells = " | ".join(f"{np.median(t):.1f} µs [{min(t):.1f}, {max(t):.1f}]" for t in times.values())
            print(f"| {batch} | {buffer} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
