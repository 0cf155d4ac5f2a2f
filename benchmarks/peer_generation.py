"""This pipeline's KV-cache engine vs onnxruntime-genai's own model builder, same model, one process.

    PYTHONPATH=. python benchmarks/peer_generation.py [--size small|issue] [--rounds N] [--threads T]

1. A Llama-family causal LM with random weights (seeded) is saved with save_pretrained,
   with a word-level tokenizer (the builder wants one in the folder; none is downloaded).
   `--size issue` is the issue's 48M-parameter model (d=512, 6 layers, GQA 8/2, vocab 32000).
2. The peer: `python -m onnxruntime_genai.models.builder -i DIR -o OUT -p fp32|int4 -e cpu`,
   the route a user would pick.
3. This pipeline: a generation recipe on the same folder (model.transformers.pretrained),
   `pipeline build` (KV-cache export at opset 23, attention_with_past, ...), fp32 and int4.
4. All engines (through onnxruntime-genai) and the PyTorch baseline (static KV cache) generate
   greedily, batch 1, prompt 128, 64 new tokens, EOS suppressed; warm-up, then `--rounds`
   rounds taking turns in this one process (order alternating). TTFT and TPOT with 95%
   intervals over rounds (core.stats), and greedy token agreement with PyTorch.
Results go to benchmarks/results/peer-generation-<size>.json/.md. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SIZES = {  # hidden, layers, heads, kv heads, intermediate, vocab
    "small": (256, 4, 8, 2, 704, 4096),
    "issue": (512, 6, 8, 2, 1408, 32000),
}
PROMPT, NEW = 128, 64


def save_model(folder: Path, size: str) -> int:
    """A seeded random Llama + a word-level tokenizer in `folder`; returns the parameter count."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    d, layers, heads, kv, inter, vocab = SIZES[size]
    config = transformers.LlamaConfig(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                                      num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
                                      max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                                bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def builder(src: Path, out: Path, precision: str) -> float:
    import time

    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(src),
                           "-o", str(out), "-p", precision, "-e", "cpu", "-c", str(out / "cache")],
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"builder {precision} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0


RECIPE = """description: peer benchmark model, this pipeline's KV-cache engine
model:
  transformers: {{pretrained: model, task: logits}}
inputs:
  - name: input_ids
    dtype: int64
    shape:
      - {{name: batch, min: 1, opt: 1, max: 2}}
      - {{name: sequence, min: 1, opt: {prompt}, max: {prompt}}}
    range: [0, {vocab}]
outputs: [logits]
export: {{parity: {{max_abs: 1.0e-2, cosine_min: 0.9999}}}}
optimize: {{passes: [fold_constants, attention_with_past, ort_fusions, pack_matmuls, group_query_attention]}}
precision: {{mode: {precision}, block_size: 32}}
data: {{calibration: null}}
targets: [{{kind: onnxruntime}}]
workload:
  kind: generation
  prompt_lengths: [{prompt}]
  new_tokens: {new}
  batch_sizes: [1]
  task: [{{prompt: {prompt}, new_tokens: {new}}}]
"""


def pipeline_engine(work: Path, precision: str, vocab: int) -> Path:
    name = f"peer-{precision}"
    (work / f"{name}.yaml").write_text(RECIPE.format(prompt=PROMPT, new=NEW, vocab=vocab, precision=precision))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "pipeline", "build", f"{name}.yaml"], cwd=work, env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"pipeline build {name} failed:\n{proc.stderr[-3000:]}")
    return work / "engines" / name / "onnxruntime.onnx"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None,
                        help="Keep the models and engines in this folder (default: a temporary one).")
    args = parser.parse_args()

    from pipeline.artifacts import dump
    from pipeline.core import deps, stats
    from pipeline.generation import figures as gm
    from pipeline.generation import genai_config, runners
    from pipeline.generation.llama_cache import StaticCacheLlama
    from pipeline.generation.timed_requests import Request, measure
    from pipeline.recipe.workload import WorkloadSpec
    from pipeline.store.recipe_folder import now

    d, layers, heads, kv, _, vocab = SIZES[args.size]
    eos = 2
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work.resolve() if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        params = save_model(work / "model", args.size)
        seconds = {p: builder(work / "model", work / f"builder-{p}", p) for p in ("fp32", "int4")}
        engines = {p: pipeline_engine(work, p, vocab) for p in ("fp32", "int4")}
        context = PROMPT + NEW + 1

        def cfg(engine: Path) -> dict:
            return genai_config.config(layers=layers, kv_heads=kv, heads=heads, head_dim=d // heads, hidden=d,
                                       vocab=vocab, eos_token_id=eos, context_length=context, threads=args.threads,
                                       filename=engine.name, in_place=genai_config.in_place_cache(engine))

        folders = {f"pipeline-{p}": genai_config.write_folder(work / f"genai-{p}", e, cfg(e)) for p, e in engines.items()}
        for p in ("fp32", "int4"):  # the builder's own folders, context length set to the same
            c = json.loads((work / f"builder-{p}" / "genai_config.json").read_text())
            c["model"]["context_length"] = context
            c["search"]["max_length"] = context
            c["model"]["decoder"]["session_options"]["intra_op_num_threads"] = args.threads
            (work / f"builder-{p}" / "genai_config.json").write_text(json.dumps(c))
            folders[f"builder-{p}"] = work / f"builder-{p}"

        graphs = {name: ops(Path(folder) / "model.onnx") for name, folder in folders.items()}

        import torch
        import transformers

        torch.set_num_threads(args.threads)
        hf = transformers.AutoModelForCausalLM.from_pretrained(work / "model").eval()
        all_runners = {"torch-static-cache": runners.TorchStaticRunner(StaticCacheLlama(hf, context), eos)}
        all_runners.update({name: runners.GenaiRunner(folder, context) for name, folder in folders.items()})
        rng = np.random.default_rng(0)
        prompt = rng.integers(3, vocab, size=(1, PROMPT), dtype=np.int64)
        request = Request("b1", "point", 1, ((prompt, NEW),))
        spec = WorkloadSpec(kind="generation", rounds=max(6, args.rounds), warmup=1)
        traces = measure(all_runners, request, spec)

    base = traces["torch-static-cache"]
    noise = 0.02
    figures = {}
    for name, t in traces.items():
        s = gm.summarize(request, t)
        figures[name] = {"ttft_ms": dump(s.ttft_ms), "tpot_ms": dump(s.tpot_ms),
                         "token_agreement": dump(gm.agreement(base[0].tokens, t[0].tokens))}
        if name != "torch-static-cache":
            figures[name]["speedup_vs_torch"] = dump(gm.speedups(base, t, noise))
    versus = {p: {"tpot": stats.compare(gm.tpot_blocks(traces[f"builder-{p}"]), gm.tpot_blocks(traces[f"pipeline-{p}"]), noise=noise),
                  "ttft": stats.compare(gm.ttft_blocks(traces[f"builder-{p}"]), gm.ttft_blocks(traces[f"pipeline-{p}"]), noise=noise)}
              for p in ("fp32", "int4")}
    # INT4 weight-only against FP32, each route's own pair (time ratio int4 / fp32)
    int4_vs_fp32 = {route: {phase: stats.compare(blocks(traces[f"{route}-fp32"]), blocks(traces[f"{route}-int4"]),
                                                 noise=noise)
                            for phase, blocks in (("tpot", gm.tpot_blocks), ("ttft", gm.ttft_blocks))}
                    for route in ("pipeline", "builder")}
    result = {
        "created": now(), "machine": platform.processor() or platform.machine(),
        "avx512_vnni": "avx512_vnni" in Path("/proc/cpuinfo").read_text(),
        "versions": deps.versions() | {"onnxruntime-genai": deps.version("onnxruntime-genai")},
        "model": {"size": args.size, "parameters": params, "hidden": d, "layers": layers,
                  "heads": heads, "kv_heads": kv, "vocab": vocab, "weights": "random (seed 0)"},
        "workload": {"batch": 1, "prompt": PROMPT, "new_tokens": NEW, "threads": args.threads,
                     "rounds": spec.rounds, "greedy": True, "eos": "suppressed"},
        "builder_seconds": seconds, "runners": figures, "graphs": graphs,
        "pipeline_vs_builder": versus, "int4_vs_fp32": int4_vs_fp32,
        "method": "one process; warm-up 1 generation per runner, then rounds taking turns (order "
                  "alternating); ratios: " + stats.ratio_method(noise),
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"peer-generation-{args.size}"
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


def ops(path: Path) -> dict:
    """Node count by op type of a graph (the engine file a runner loads)."""
    from collections import Counter

    import onnx

    model = onnx.load(str(path.resolve()), load_external_data=False)
    counts = Counter(n.op_type for n in model.graph.node)
    return {"nodes": sum(counts.values()), "ops": dict(counts.most_common())}


def markdown(r: dict) -> str:
    m = r["model"]
    md = [f"# Peer: this pipeline vs onnxruntime-genai's model builder ({r['created']})", "",
          f"- model: Llama, {m['parameters'] / 1e6:.1f}M parameters (d={m['hidden']}, {m['layers']} layers, "
          f"GQA {m['heads']}/{m['kv_heads']}, vocab {m['vocab']}), {m['weights']}",
          f"- workload: batch 1, prompt {r['workload']['prompt']}, {r['workload']['new_tokens']} new tokens, "
          f"{r['workload']['threads']} threads, {r['workload']['rounds']} rounds; {r['method']}",
          f"- machine: {r['machine']}, avx512_vnni {r['avx512_vnni']}; versions: "
          + ", ".join(f"{k} {v}" for k, v in r["versions"].items() if v), "",
          "| runner | TTFT p50 ms | TPOT p50 ms | TPOT p90 ms | TPOT speedup vs PyTorch (95% CI) | tokens = PyTorch |",
          "|---|---|---|---|---|---|"]
    for name, f in r["runners"].items():
        s = f.get("speedup_vs_torch", {}).get("tpot")
        sp = f"{s['ratio']:.2f}x ({s['ci95'][0]:.2f}-{s['ci95'][1]:.2f}, {s['verdict']})" if s else "—"
        a = f["token_agreement"]
        md.append(f"| {name} | {f['ttft_ms']['p50']:.2f} | {f['tpot_ms']['p50']:.3f} | {f['tpot_ms']['p90']:.3f} | "
                  f"{sp} | {a['share'] * a['tokens']:.0f}/{a['tokens']} (first divergence {a['first_divergence']}) |")
    if r.get("graphs"):
        md += ["", "Graphs (nodes by op type of the file each runner loads):", ""]
        md += [f"- {name}: {g['nodes']} nodes: " + ", ".join(f"{op} {n}" for op, n in g["ops"].items())
               for name, g in r["graphs"].items()]
    md += _ratio_lines("This pipeline's engine vs the builder's (time ratio pipeline / builder; < 1: the "
                       "pipeline is faster):", r["pipeline_vs_builder"], "pipeline")
    md += _ratio_lines("INT4 weight-only vs FP32 of the same route (time ratio int4 / fp32; < 1: INT4 is "
                       "faster):", r["int4_vs_fp32"], "int4")
    return "\n".join(md) + "\n"


def _ratio_lines(title: str, comparisons: dict, judged: str) -> list[str]:
    """A titled list of TPOT and TTFT time ratios with their intervals, one per comparison."""
    lines = ["", title, ""]
    for name, v in comparisons.items():
        for phase in ("tpot", "ttft"):
            c = v[phase]
            lines.append(f"- {name} {phase.upper()}: {c['time_ratio']:.2f}x (95% CI {c['ci95'][0]:.2f}-"
                         f"{c['ci95'][1]:.2f}, {judged} {c['verdict']})")
    return lines


if __name__ == "__main__":
    main()
