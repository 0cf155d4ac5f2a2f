"""How close each 4-bit form comes to SmolLM2's de-quantized weights (issue 37), per weight.

The "float checkpoint" the requantize route is judged on is the GGUF's Q4_1 de-quantized: each
block of 32 holds at most 16 values, d * q + m. This measures, on the precision stage's input
(ENGINE/optimized.onnx), what share of blocks ONNX Runtime's HQQ quantizer puts back on that
grid, and the relative L2 weight error of: HQQ as ORT writes it (float zero points), HQQ with
integer zero points refit (`int4_method: hqq_uint8`), asymmetric min/max round-to-nearest with
uint8 zero points (MLAS' own), and symmetric round-to-nearest (`int4_method: rtn`).

    .venv/bin/python benchmarks/int4_grid.py [--engine engines/smollm2-int4] [--out PATH]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pipeline.precision.integer_zero import integer_blocks

BLOCK = 32


def _hqq(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ORT's HQQ on one [K, N] weight -> its scales and float zero points [N * K/32]."""
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        HQQWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    k = weight.shape[0]
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "W"], ["Y"], name="mm")], "one",
                              [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weight, "W")])
    quantizer = MatMulNBitsQuantizer(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
                                     block_size=BLOCK, is_symmetric=False,
                                     algo_config=HQQWeightOnlyQuantConfig(block_size=BLOCK, bits=4))
    quantizer.process()
    (node,) = quantizer.model.model.graph.node
    arrays = {i.name: numpy_helper.to_array(i) for i in quantizer.model.model.graph.initializer}
    return arrays[node.input[2]], arrays[node.input[3]]


def _relative(rebuilt: np.ndarray, w: np.ndarray) -> float:
    return float(np.linalg.norm(rebuilt - w) / np.linalg.norm(w))


def measure(weight: np.ndarray) -> dict:
    k, n = weight.shape
    w = weight.T.reshape(n, k // BLOCK, BLOCK)  # [N, blocks, 32]
    scale, zero = _hqq(weight)
    s, z = scale.reshape(n, -1, 1), zero.reshape(n, -1, 1)
    hqq = (np.clip(np.rint(w / s + z), 0, 15) - z) * s
    per_block = np.sqrt(((hqq - w) ** 2).sum(-1) / np.maximum((w * w).sum(-1), 1e-30))
    *_, _, refit = integer_blocks(weight, scale, zero, BLOCK)
    lo, hi = np.minimum(w.min(-1, keepdims=True), 0), np.maximum(w.max(-1, keepdims=True), 0)
    step = np.where(hi > lo, (hi - lo) / 15, 1)
    zp = np.clip(np.rint(-lo / step), 0, 15)
    asym = (np.clip(np.rint(w / step + zp), 0, 15) - zp) * step
    amax = np.abs(w).max(-1, keepdims=True)
    half = np.where(amax > 0, amax / 8, 1)  # ORT's symmetric int4: codes -8..7, scale amax/8
    sym = np.clip(np.rint(w / half), -8, 7) * half
    return {"shape": [k, n], "values_per_block_max": int(max(len(np.unique(b)) for b in w.reshape(-1, BLOCK)[:4096])),
            "hqq_blocks_on_grid": float((per_block < 1e-3).mean()),
            "hqq_zero_fraction_mean": float(np.abs(z - np.rint(z)).mean()),
            "rel_l2": {"hqq_float_zero": _relative(hqq, w), "hqq_uint8": refit, "asym_rtn_uint8": _relative(asym, w),
                       "sym_rtn": _relative(sym, w)}}


def main() -> None:
    import json

    import onnx
    from onnx import numpy_helper

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="engines/smollm2-int4", help="an engines folder with optimized.onnx")
    parser.add_argument("--layers", default="0,15,29", help="decoder layers to measure")
    parser.add_argument("--out", help="write PATH.json and PATH.md")
    args = parser.parse_args()
    model = onnx.load(str(Path(args.engine) / "optimized.onnx"))
    inits = {i.name: i for i in model.graph.initializer}
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits
               and len(inits[n.input[1]].dims) == 2 and inits[n.input[1]].dims[0] % BLOCK == 0]
    per_layer = len(matmuls) // 30  # SmolLM2-135M: 30 decoder layers, packed qkv, o, packed gate/up, down
    rows = []
    for layer in (int(x) for x in args.layers.split(",")):
        for node in matmuls[layer * per_layer:(layer + 1) * per_layer]:
            weight = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
            rows.append({"layer": layer, "node": node.name, **measure(weight)})
            print(f"layer {layer} {node.name} {weight.shape}: {rows[-1]['rel_l2']}", flush=True)
    lines = ["| layer | node | [K, N] | values a block (max) | HQQ blocks back on the grid | mean frac(z) "
             "| rel. L2: HQQ float zero | HQQ uint8 refit | asym RTN uint8 | sym RTN |", "|---" * 10 + "|"]
    for r in rows:
        e = r["rel_l2"]
        lines.append(f"| {r['layer']} | {r['node']} | {r['shape']} | {r['values_per_block_max']} "
                     f"| {r['hqq_blocks_on_grid']:.4f} | {r['hqq_zero_fraction_mean']:.3f} | {e['hqq_float_zero']:.4f} "
                     f"| {e['hqq_uint8']:.4f} | {e['asym_rtn_uint8']:.4f} | {e['sym_rtn']:.4f} |")
    print("\n".join(lines))
    if args.out:
        Path(f"{args.out}.json").write_text(json.dumps({"engine": args.engine, "rows": rows}, indent=1) + "\n")
        Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
