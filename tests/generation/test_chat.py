"""A chat model end to end (issue 25): real prompts and a task score (`workload.chat`), the
deployed genai folder, gates, the report's generation figures, the memory pre-check, the
end-of-sequence default, and the GGUF model source.

The end-to-end fixture is the trained byte-level GLM (lm-gen: its greedy answers are
Shakespeare-flavoured nonsense, but PyTorch and the fp32 engine must agree on them token for
token); the real SmolLM2 model is built once, in the `slow` module fixture at the end.
"""

from __future__ import annotations

import json
import math
import mmap

import numpy as np
import pytest

from pipeline.recipe import load
from tests.conftest import Project
from tests.generation.test_run import TINY

CHAT = ("--set", "workload.chat={tokenizer: bytes, scripts: 2, answer_tokens: 4, "
        "perplexity_tokens: 96, window: 32, max_context: 192}",
        "--set", "expect.max_answer_accuracy_loss=0", "--set", "expect.max_perplexity_ratio=1.001")


# ----------------------------------------------------------------------------- pure parts
def test_an_answer_is_right_when_an_accepted_form_is_said_as_whole_words():
    from pipeline.generation.chat import correct

    assert correct("The capital of France is Paris.", ("Paris",))
    assert correct("A week has 7 days", ("seven", "7"))
    assert correct("NEW DELHI!", ("New Delhi", "Delhi"))
    assert not correct("Parisian food", ("Paris",))  # a word, not a substring
    assert not correct("seventy", ("seven",))


def test_shipped_questions_and_scripts_fit_together():
    from pipeline.generation import chat

    qs = chat.questions(load("smollm2-fp32").workload.chat.questions)
    scripts = chat.scripts(load("smollm2-fp32").workload.chat.tasks, qs, None)
    assert len(qs) >= 100
    assert sorted(q.id for s in scripts for q in s) == sorted(qs)  # every question once


def test_memory_precheck_does_not_count_the_kv_cache_as_activations():
    """Defect 3: the KV-cache inputs' bytes were multiplied by 1024 like activations."""
    from pipeline.run import limits

    r = load("lm-gen", ["workload.long={prompt: 2000, new_tokens: 2000}"])
    cache = sum(math.prod(i.dims("max")) * 4 for i in r.inputs if i.name.startswith("past_key_values."))
    tokens = sum(math.prod(i.dims("max")) * 8 for i in r.inputs if not i.name.startswith("past_key_values."))
    forward = limits.estimate(r).memory_parts["one forward pass at the max shape"]
    assert cache > 0 and forward <= 2 * cache + limits.ACTIVATIONS_PER_BYTE * tokens


def test_end_of_sequence_defaults_to_the_models_own():
    """Defect 8: the default was the last vocabulary id, not the model's eos_token_id."""
    from pipeline.generation.decoder import eos_token

    r = load("gpt2-tiny", ["workload.kind=generation", "model.transformers.task=logits",
                           "model.transformers.config={model_type: llama, vocab_size: 128, "
                           "hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2, "
                           "num_attention_heads: 4, num_key_value_heads: 2, eos_token_id: 5}"])
    assert eos_token(r) == 5
    assert eos_token(load("lm-gen")) == 511  # no eos of its own: the last id


class _Hungry:
    """A runner that holds `mb` megabytes while it generates (a stand-in with a known size)."""

    def __init__(self, mb: int):
        self.mb, self.held = mb, None

    def new(self, batch):
        self.held = None

    def prefill(self, tokens):
        # mb MiB of fresh pages from the kernel, touched: a numpy array of 16 MiB may come
        # from malloc's heap, already resident when an earlier test in this process freed
        # a bigger one (glibc raises its mmap threshold then), and the growth would read 0
        self.held = mmap.mmap(-1, self.mb << 20)
        np.frombuffer(self.held, np.uint8)[:] = 1
        return np.zeros(1, np.int64)

    def step(self):
        return np.zeros(1, np.int64)


def test_memory_is_measured_per_runner():
    """Defect 6: both runners showed the same process peak with no growth, one a 0 MB load:
    each runner is now made in a process of its own, so its load and peak are its own."""
    from pipeline.generation import memory
    from pipeline.generation.timed_requests import Request

    request = Request("p", "point", 1, ((np.zeros((1, 4), np.int64), 3),))
    figures = memory.isolated({"small": (_Hungry, (16,)), "big": (_Hungry, (96,))},
                              memory.first_token(100), request)
    small, big = figures["small"], figures["big"]
    # the first token touched the runner's buffer: that is its load
    assert 12 << 20 <= small.load_rss_bytes < 48 << 20
    assert big.load_rss_bytes >= 90 << 20
    # in one process the second runner's peak would include the first's; apart they differ
    # by what each holds (96 - 16 MB), and each began from a bare interpreter, not the other
    assert big.peak_rss_bytes - small.peak_rss_bytes >= 70 << 20
    assert small.peak_rss_bytes < big.before_runner_bytes + (48 << 20)


def test_score_compares_answers_and_perplexity_with_intervals():
    from pipeline.generation import score
    from pipeline.metrics.gates import score_gates

    rng = np.random.default_rng(0)
    base = [{"tokens": [1, 2], "correct": i % 2 == 0, "seconds": 1.0} for i in range(40)]
    worse = [{"tokens": [1, 3] if i % 4 == 0 else [1, 2], "correct": i % 4 == 2, "seconds": 0.5}
             for i in range(40)]
    nll = rng.uniform(1, 3, 640)
    s = score.compare(base, worse, nll, nll * 1.2)
    a, p = s.answer_accuracy, s.perplexity
    assert (a.baseline, a.engine) == (0.5, 0.25) and a.ci95[0] < -0.25 < a.ci95[1] < 0
    assert (s.identical_answers.share, s.identical_answers.count, s.identical_answers.of) == (0.75, 30, 40)
    assert p.ratio == pytest.approx(math.exp(0.2 * nll.mean()), rel=1e-6)
    assert p.ratio_ci95[0] <= p.ratio <= p.ratio_ci95[1]
    recipe = load("smollm2-fp32")  # expect: 0.03 points, perplexity x1.01
    assert [g.passed for g in score_gates(recipe, s)] == [False, False]
    assert [g.passed for g in score_gates(recipe, score.compare(base, base, nll, nll))] == [True, True]
    assert [g.passed for g in score_gates(recipe, None)] == [False, False]  # set, never silently skipped


def test_a_score_gate_needs_the_chat_workload(project: Project):
    res = project.run("export", "lm-gen", "--set", "expect.max_answer_accuracy_loss=0.05")
    assert res.code == 2 and len(res.error_lines) == 1
    assert "expect.max_answer_accuracy_loss" in res.error_lines[0] and "workload.chat" in res.error_lines[0]


def test_a_gguf_reference_chooses_code_so_a_folder_may_not_set_it():
    """`model.transformers.gguf: module:function` imports and calls that function: a folder's
    recorded --set values must not name one (recipe/code_keys.py)."""
    from pipeline.recipe.code_keys import naming_code

    assert naming_code(["model.transformers.gguf=os:getcwd",
                        "model={transformers: {gguf: 'os:getcwd'}}",
                        "model.transformers.prune_ffn=0.2"]) == [
        "model.transformers.gguf=os:getcwd", "model={transformers: {gguf: 'os:getcwd'}}"]


def test_a_gguf_function_that_exits_is_a_recipe_error(tmp_path, monkeypatch):
    """The `module:function` of model.transformers.gguf runs under exits_refused: its
    sys.exit is one RecipeError naming the reference, never the pipeline's own exit."""
    from pipeline.core.errors import RecipeError
    from pipeline.recipe.gguf_header import resolve

    (tmp_path / "exits_here.py").write_text("import sys\n\ndef path():\n    sys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RecipeError, match=r"model.transformers.gguf `exits_here:path`.*sys.exit\(0\)"):
        resolve("exits_here:path", "r.yaml")


def test_genai_config_names_the_engine_and_stops_at_the_models_eos(tmp_path):
    """Defect 1: it named model.onnx (the raw export), min_length = max_length, bos/pad 0."""
    from pipeline.generation.decoder import deployed_config
    from tests.generation.test_genai_config import decoder_graph

    r = load("gpt2-tiny", ["workload.kind=generation", "model.transformers.task=logits",
                           "model.transformers.config={model_type: llama, vocab_size: 128, "
                           "hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2, "
                           "num_attention_heads: 4, num_key_value_heads: 2, bos_token_id: 3, "
                           "eos_token_id: 5, pad_token_id: 4}"])
    cfg, _ = deployed_config(r, decoder_graph(tmp_path / "onnxruntime.onnx", gqa=False))
    assert cfg["model"]["decoder"]["filename"] == "onnxruntime.onnx"
    assert cfg["search"]["past_present_share_buffer"] is False  # ONNX Attention concatenates
    assert (cfg["model"]["bos_token_id"], cfg["model"]["eos_token_id"], cfg["model"]["pad_token_id"]) == (3, 5, 4)
    assert cfg["search"]["min_length"] == 0 < cfg["search"]["max_length"]


# ----------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def built_chat(tmp_path_factory) -> Project:
    proj = Project(tmp_path_factory.mktemp("chat"))
    res = proj.run("run", "lm-gen", "--target", "onnxruntime", *TINY, *CHAT)
    assert res.code == 0, res.err
    (proj.folder,) = [p for p in proj.engines.iterdir() if p.name.startswith("lm-gen")]
    proj.out = res.out
    return proj


def test_run_scores_answers_and_perplexity_against_pytorch(built_chat: Project):
    report = json.loads((built_chat.folder / "report.json").read_text())
    engine = report["engines"][0]
    s = engine["generation"]["score"]
    assert s["answer_accuracy"]["questions"] == 6  # 2 scripts of 3 turns
    assert s["identical_answers"]["count"] == 6  # fp32 engine: PyTorch's answers token for token
    assert s["perplexity"]["ratio"] == pytest.approx(1.0, abs=1e-3)
    assert 1 < s["perplexity"]["baseline"] < 256  # a trained byte model on held-out text
    assert report["baseline"]["generation"]["score"]["questions"] == 6
    names = [g["name"] for g in engine["gates"]]
    assert "expect.max_answer_accuracy_loss" in names and "expect.max_perplexity_ratio" in names
    # Defect 5: caches summarized in one record, not gated at the logits threshold
    assert not [n for n in names if "present." in n] and list(engine["accuracy"]) == ["logits"]
    assert engine["generation"]["kv_cache_accuracy"]["outputs"] == 4
    assert "note" not in engine["generation"]["token_agreement"]  # trained weights: no "random" note
    # Defect 6: the machine's load is watched while generation is timed (and warned about)
    assert engine["resources"]["cores"] >= 1 and "other_cores" in engine["resources"]


def test_report_shows_the_generation_figures(built_chat: Project):
    """Defect 2: report.md and the terminal showed no TTFT/TPOT/score; the baseline was
    labelled torch-eager."""
    md = (built_chat.folder / "report.md").read_text()
    for needle in ("Task score", "questions answered right", "perplexity", "TTFT p50 ms",
                   "TPOT p50 ms", "tokens/s", "Time per task", "torch-static-cache (interleaved)",
                   "KV-cache outputs (4"):
        assert needle in md, needle
    assert "torch-eager (interleaved)" not in md
    assert "answers 6/6" not in built_chat.out or "TPOT" in built_chat.out
    assert "TPOT" in built_chat.out and "perplexity" in built_chat.out


def test_deployed_folder_runs_under_genai_as_is(built_chat: Project):
    """The engines folder as written: genai loads the engine file it names, stops at EOS."""
    import onnxruntime_genai as og

    cfg = json.loads((built_chat.folder / "genai_config.json").read_text())
    assert (built_chat.folder / cfg["model"]["decoder"]["filename"]).name == "onnxruntime.onnx"
    model = og.Model(str(built_chat.folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=40, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(np.frombuffer(b"ROMEO:\n", np.uint8).astype(np.int32)[None])
    n = 0
    while not gen.is_done() and n < 40:
        gen.generate_next_token()
        n += 1
    assert n > 1


def test_compare_shows_each_recipes_score_and_a_paired_verdict():
    """Defect 10: the generation compare showed no accuracy, agreement or PyTorch baseline."""
    from pipeline.compare import generation_scores as compare_score

    def report(right: list[bool]) -> dict:
        answers = [{"id": i, "correct": c} for i, c in enumerate(right)]
        n, k = len(right), sum(right)
        return {"baseline": {"generation": {"score": {"answer_accuracy": 0.8, "answer_accuracy_ci95": [0.7, 0.9],
                                                      "correct": 32, "questions": n, "perplexity": 30.0}}},
                "engines": [{"target": "onnxruntime", "generation": {
                    "tpot_ms": {"p50": 20.0}, "time_per_task_s": 1.5,
                    "score": {"answer_accuracy": {"engine": k / n, "engine_ci95": [0, 1], "correct": k, "questions": n},
                              "perplexity": {"engine": 31.0, "ratio": 31 / 30},
                              "identical_answers": {"share": 0.5}, "answers": answers}}}]}

    standard = report([True] * 32 + [False] * 8)
    flash = report([True] * 12 + [False] * 28)
    result = compare_score.scores(["standard", "flash"], {"standard": standard, "flash": flash}, ["onnxruntime"])
    (v,) = result["versus"]
    assert v["delta"] == pytest.approx(-0.5) and v["ci95"][1] < 0 and v["verdict"] == "worse"
    md = "\n".join(compare_score.markdown(result))
    assert "| standard | PyTorch | 32/40" in md and "| flash | onnxruntime | 12/40" in md
    assert "worse" in compare_score.lines(result)[0]


def test_generate_streams_a_reply_from_the_built_folder(built_chat: Project):
    res = built_chat.run("generate", "lm-gen", *TINY, *CHAT, "--prompt", "ROMEO:", "--max-tokens", "12")
    assert res.code == 0, res.err
    assert 0 < len(res.out.strip()) and len(res.out.encode()) <= 12 * 4 + 1  # at most 12 byte tokens


def test_generate_without_a_built_engine_says_how(project: Project):
    res = project.run("generate", "lm-gen", "--prompt", "hi")
    assert res.code == 2 and len(res.error_lines) == 1
    assert "pipeline run" in res.error_lines[0]
    res = project.run("generate", "standard", "--prompt", "hi")
    assert res.code == 2 and "generation recipe" in res.error_lines[0]


def test_another_question_set_asks_again(built_chat: Project):
    """The baseline and validate keys hold the workload and its chat files: fewer scripts
    rerun both (their keys had neither: the old answers were reused)."""
    fewer = tuple(a.replace("scripts: 2", "scripts: 1") for a in CHAT)
    res = built_chat.run("run", "lm-gen", "--target", "onnxruntime", *TINY, *fewer)
    assert res.code == 0, res.err
    (folder,) = [p for p in built_chat.engines.iterdir() if p.name.startswith("lm-gen") and p != built_chat.folder]
    report = json.loads((folder / "report.json").read_text())
    assert report["baseline"]["generation"]["score"]["questions"] == 3
    assert report["engines"][0]["generation"]["score"]["answer_accuracy"]["questions"] == 3
