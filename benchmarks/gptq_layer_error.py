"""Does GPTQ's lower layer error carry over to text it was not calibrated on? Per linear layer
of a float graph, the output error tr(D H D^T) / tr(W H W^T) of round-to-nearest (asymmetric,
min/max, blocks of 32) and of GPTQ calibrated on each text, measured with the Hessian H of each
text's inputs (the float graph's, one run per feed); the median over layers is printed last.

Used for benchmarks/results/float-int4-2026-12-07.md (the 2026-12-08 section):

    python - <<'PY'   # the judged scripts' questions as chats (a diagnostic only: never calibration)
    import json
    qs = {json.loads(l)["id"]: json.loads(l)["question"] for l in open("data/chat/questions.jsonl")}
    with open("/tmp/judge-prompts.jsonl", "w") as f:
        for l in open("data/chat/tasks.jsonl"):
            t = json.loads(l); f.write(json.dumps({"id": t["id"], "turns": [qs[i] for i in t["turns"]]}) + "\\n")
    PY
    .venv/bin/python benchmarks/chat_calibration.py smollm2-int4 /tmp/judge-prompts.jsonl /tmp/judge-chats.jsonl --max-tokens 24
    PIPELINE_DATA_DIRS=/tmp .venv/bin/python benchmarks/gptq_layer_error.py smollm2-float-int4-gptq \
        --graph engines/smollm2-float-int4-gptq@a44f4ab7/optimized.onnx --calibrate data/sentences/calibration-chatml.jsonl data/chat/calibration-replies.jsonl \
        --measure /tmp/judge-chats.jsonl data/shakespeare/calibration-chunks.jsonl --every 4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import onnx
    from onnx import numpy_helper

    from pipeline.precision import calibrate, gptq
    from pipeline.precision.int4 import untranspose_weights
    from pipeline.recipe import load

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", help="the recipe whose calibration feeds are made (its tokenizer, template)")
    parser.add_argument("--graph", type=Path, help="the float graph (default: engines/RECIPE/optimized.onnx)")
    parser.add_argument("--calibrate", nargs="+", required=True, help="texts GPTQ is calibrated on")
    parser.add_argument("--measure", nargs="*", default=[], help="further texts the error is measured on")
    parser.add_argument("--every", type=int, default=1, help="every n-th layer (and the last)")
    args = parser.parse_args()

    model = onnx.load(str(args.graph or Path("engines") / args.recipe / "optimized.onnx"))
    untranspose_weights(model)
    inits = {i.name: i for i in model.graph.initializer}
    weights = {n.name: n.input[1] for n in model.graph.node
               if n.op_type == "MatMul" and n.input[1] in inits and len(inits[n.input[1]].dims) == 2}
    hess = {}
    for text in [*args.calibrate, *args.measure]:
        feeds = calibrate.feeds(load(args.recipe, [f"data.calibration.text={text}"]))
        hess[text], tokens, _ = gptq.hessians(model, weights, feeds)
        print(f"{text}: {tokens} tokens", file=sys.stderr, flush=True)
    names = list(weights.values())
    rows = []
    for name in names[::args.every] + ([names[-1]] if (len(names) - 1) % args.every else []):
        w = numpy_helper.to_array(inits[name]).astype(np.float64)
        approx = {"rtn": gptq.weight_of(*gptq.round_to_nearest(w, 32), w.shape)}
        for text in args.calibrate:
            approx[f"gptq on {Path(text).name}"] = gptq.weight_of(*gptq.quantize(w, hess[text][name], 32), w.shape)
        row = {}
        for measured, h in hess.items():
            for label, a in approx.items():
                d = a - w
                row[label, Path(measured).name] = (((h[name] @ d) * d).sum() / ((h[name] @ w) * w).sum()) ** 0.5
        rows.append(row)
    texts = [Path(t).name for t in hess]
    print("| weights | " + " | ".join(f"on {t}" for t in texts) + " |")
    print("|---|" + "---|" * len(texts))
    for label in approx:
        print(f"| {label} | " + " | ".join(f"{np.median([r[label, t] for r in rows]):.4f}" for t in texts) + " |")
    print(f"\nmedian over {len(rows)} layers; relative output error sqrt(tr(D H D^T) / tr(W H W^T))")


if __name__ == "__main__":
    main()
