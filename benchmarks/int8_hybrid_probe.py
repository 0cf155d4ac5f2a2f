"""Probe (2026-12-01): MiniLM's dynamic INT8 with its FFN-output MatMuls (GELU-fed, the nodes
`pipeline tune` keeps in float) as MatMulNBits 8-bit, accuracy_level 4 (int8 weights per
block of `block` along K, activations quantized to int8 per block of each row at run time),
instead of float. Per-tensor dynamic activations lose those MatMuls' accuracy (a few tokens
set the range); per-block ones keep it, at some of the integer kernels' speed.

    HF_HUB_OFFLINE=1 PYTHONPATH=. python benchmarks/int8_hybrid_probe.py

Needs the FP32 graph of `pipeline run minilm` (engines/minilm/optimized.onnx); EXTRA='{"label":
"path/engine.onnx", ...}' adds built engines to the comparison. Accuracy and timing as in
peer_int8.py (96 held-out sentences, 8 x 128 and 1 x 32, one process, interleaved, 2 threads).
The probe behind `precision.fallback: blockwise` (results: benchmarks/results/int8-hybrid-probe-2026-12-01.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks import minilm_sentences as sentences  # noqa: E402
from benchmarks.peer_int8 import OUT, THREADS, PeerRunner, peer_models  # noqa: E402
from pipeline import backends  # noqa: E402
from pipeline import recipe as recipe_mod  # noqa: E402
from pipeline.backends import onnxruntime as ort_backend  # noqa: E402
from pipeline.backends.openers import baseline_runner  # noqa: E402
from pipeline.bench import timing  # noqa: E402
from pipeline.core import stats
from pipeline.metrics.budget import row_cosines  # noqa: E402
from pipeline.model import sources as models
from pipeline.recipe import LatencySpec  # noqa: E402
from pipeline.recipe.precision import PrecisionSpec  # noqa: E402
from pipeline.stages import precision as precision_stage  # noqa: E402

GRAPH = Path("engines/minilm/optimized.onnx")
DYNAMIC = {"mode": "int8", "scheme": "dynamic", "op_types": ["MatMul", "Attention"]}
SENSITIVE = ["node_MatMul_122", "node_MatMul_254"]  # what `pipeline tune minilm` kept float


def ffn_outputs(graph: onnx.GraphProto) -> list[str]:
    """The MatMuls that read a GELU's output (the FFN's second projection, one per layer)."""
    producer = {o: n for n in graph.node for o in n.output}
    return [n.name for n in graph.node if n.op_type == "MatMul" and n.input[0] in producer
            and producer[n.input[0]].op_type in ("BiasGelu", "Gelu", "FastGelu")]


def hybrid(recipe, precision: dict, blockwise: list[str], block: int, work: Path) -> Path:
    """Dynamic INT8 with `blockwise` excluded, then those as MatMulNBits 8-bit; the engine."""
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    (work / "precision").mkdir(parents=True)
    spec = recipe.model_copy(update={"precision": PrecisionSpec(**{**precision, "exclude": blockwise})})
    outputs = precision_stage.run(spec, SimpleNamespace(path=GRAPH), work / "precision").files
    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(outputs["typed.onnx"])), bits=8, block_size=block, is_symmetric=True,
        accuracy_level=4, quant_format=QuantFormat.QOperator, op_types_to_quantize=("MatMul",),
        nodes_to_include=blockwise)
    quantizer.process()
    graph = work / "hybrid.onnx"
    quantizer.model.save_model_to_file(str(graph))
    engine, _ = ort_backend.build(graph, recipe.targets[0], spec, work)
    return engine


def main() -> None:
    import torch

    recipe = recipe_mod.load("minilm")
    every = ffn_outputs(onnx.load(str(GRAPH)).graph)
    smooth = {**DYNAMIC, "per_channel": True, "smoothing": {"alpha": 0.5}}
    plain = {**DYNAMIC, "per_channel": True}
    combos = {  # label -> (dynamic settings, MatMuls made blockwise, block)
        "pc s.5 + 6 ffn-out nb8": (smooth, every, 128),
        "pc s.5 + 2 ffn-out nb8": (smooth, SENSITIVE, 128),
        "pc + 2 ffn-out nb8": (plain, SENSITIVE, 128),
        "pc + 6 ffn-out nb8": (plain, every, 128),
    }
    tmp = Path(tempfile.mkdtemp())
    engines = {label: hybrid(recipe, p, nodes, block, tmp / str(i))
               for i, (label, (p, nodes, block)) in enumerate(combos.items())}
    engines.update(json.loads(os.environ.get("EXTRA", "{}")))
    torch.set_num_threads(THREADS)
    with contextlib.ExitStack() as stack:
        opened = {"eager": stack.enter_context(baseline_runner(recipe, models.load(recipe)))}
        for label, path in engines.items():
            opened[label] = stack.enter_context(backends.get("onnxruntime").open(
                Path(path), recipe.targets[0], recipe, threads=THREADS, spin=False))
        for label, path in peer_models(tmp).items():
            if "per-tensor" in label:
                opened["peer per-tensor"] = PeerRunner(path, label)
        names = list(opened)
        for shape, feeds in (("1x32", sentences.heldout_short()), ("8x128", sentences.heldout())):
            outs = {n: [dict(r.infer(f, check_inputs=False)) for f in feeds] for n, r in opened.items()}
            cos = {n: row_cosines([{OUT: o[OUT]} for o in outs["eager"]], [{OUT: o[OUT]} for o in outs[n]])
                   for n in names[1:]}
            spec = LatencySpec(warmup=5, iterations=60 if shape == "1x32" else 30, min_seconds=1.0, block=5)
            for round_ in range(int(os.environ.get("ROUNDS", 3))):
                timed = timing.time_interleaved([opened[n] for n in names], feeds[0], spec)
                print(f"{shape} round {round_ + 1}: load {os.getloadavg()[0]:.1f}")
                for n, blocks in zip(names[1:], timed.blocks[1:]):
                    c = stats.compare(timed.blocks[0], blocks, noise=0.0)
                    print(f"  {n:26s} speed-up {1 / c['time_ratio']:.2f}x [{1 / c['ci95'][1]:.2f}, "
                          f"{1 / c['ci95'][0]:.2f}]  worst cos {cos[n].min():.4f}  mean {cos[n].mean():.5f}",
                          flush=True)


if __name__ == "__main__":
    main()
