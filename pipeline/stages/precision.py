"""precision: the FP32 graph -> typed.onnx with its precision in the graph (pipeline/precision).

Runs only when the recipe asks for a precision other than fp32. After the mode's own work
the typed graph is checked against its input graph on calibration-split feeds (parity: it
must stay finite; its cosine and top-1 agreement go into the report, the gates judge the
engine against PyTorch later).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline import data
from pipeline.core.errors import PipelineError, RecipeError, StageFailed
from pipeline.core.json_object import JsonObject
from pipeline.core.text import first_line
from pipeline.precision.kv_cache import CacheCodec
from pipeline.recipe import Recipe
from pipeline.stages import Produced

NAME = "precision"
SECTIONS = ("precision", "data", "inputs", "outputs")


def enabled(recipe: Recipe) -> bool:
    return recipe.precision.mode != "fp32" or recipe.precision.kv_cache != "float32"


def preflight(recipe: Recipe) -> None:
    """Before any stage runs: calibration data loads and fits the recipe's inputs."""
    p = recipe.precision
    if enabled(recipe) and (p.needs_calibration or p.sensitivity.enabled):
        data.calibration_feeds(recipe)


def spec(recipe: Recipe) -> JsonObject:
    """The cache key's recipe part: the calibration data (not the validation split), and a
    calibration file by its content."""
    key = recipe.section("precision", "inputs", "outputs")
    data_spec = recipe.section("data")["data"]
    key["calibration"] = {"seed": data_spec["seed"], "calibration": data_spec["calibration"]}
    key["calibration_files"] = data.key(recipe, "calibration")
    if recipe.precision.int4_source == "checkpoint":  # the blocks come from the file's content
        import hashlib

        from pipeline.precision.int4 import checkpoint_file

        with open(checkpoint_file(recipe), "rb") as f:
            key["checkpoint_sha256"] = hashlib.file_digest(f, "sha256").hexdigest()
    if recipe.precision.kv_cache == "int8":  # its scales come from the held-out text
        from pipeline.generation.chat import files_key

        key["kv_calibration"] = {"text": (files_key(recipe.workload.chat) or {}).get("text"),
                                 "tokens": KV_CALIBRATION_TOKENS, "sequence": KV_CALIBRATION_SEQUENCE,
                                 "forms": KV_CALIBRATION_FORMS}  # else the calibration split's
    if recipe.precision.mode == "int8" and recipe.precision.weight_range == "auto":
        from pipeline.precision import isa

        key["reduced_weight_range"] = isa.needs_reduced_range()  # the graph depends on the CPU
    return key


def summary(meta: dict) -> None:
    """Nothing to add to the stage's line (report.md holds what it did)."""


KV_CALIBRATION_TOKENS, KV_CALIBRATION_SEQUENCE = 512, 32
KV_CALIBRATION_FORMS = ("text", "chat")  # each passage as plain text and as a user's chat message


def _kv_cache(recipe: Recipe, typed: Path) -> dict:
    """The typed graph's KV cache in `precision.kv_cache`'s type (precision/kv_cache.py),
    int8 scales calibrated on held-out text past what the scores read."""
    import onnx

    from pipeline.precision import kv_cache

    if not recipe.workload.kv_cache:
        raise RecipeError(f"{recipe.where}: precision.kv_cache needs a generation workload "
                          "(a graph with a KV cache)", "drop precision.kv_cache")
    ids = _calibration_ids(recipe) if recipe.precision.kv_cache == "int8" else []
    model = onnx.load(str(typed))
    meta = kv_cache.apply(model, recipe.precision.kv_cache, ids)
    onnx.save(model, str(typed))
    return meta


def _calibration_ids(recipe: Recipe) -> list:
    """Token ids [1, T] the int8 scales are calibrated on: KV_CALIBRATION_TOKENS of
    workload.chat's held-out text after the tokens perplexity and the teacher-forced check
    read, as sequences of KV_CALIBRATION_SEQUENCE, else (a model without chat text) the
    calibration split's input_ids. Many short sequences, not one long one: a sequence's first
    tokens carry the largest keys and values (the attention sink), and one start alone set
    scales that later starts overflowed (SmolLM2's teacher-forced prefill: logits cosine 0.989
    with one 512-token sequence, 0.997 with 16 x 32, float32's cache 0.998; 2026-12-06).
    Each passage comes twice: as plain text, and as a user's message in the model's chat
    template (its system prompt, role markers and special tokens: what the chat scores and
    `pipeline serve` send). Scales from plain text alone were exceeded by chat prompts in every
    one of SmolLM2's 60 caches, by up to 2.7x (0.5% of values clipped), and smollm2-flash
    answered 78 of the 129 questions; with both forms, 85 (PyTorch 83; 2026-12-07)."""
    import numpy as np

    from pipeline.generation import chat
    from pipeline.recipe.workload import decoder_shape

    spec = recipe.workload.chat
    if spec is None:
        return [f["input_ids"] for f in data.calibration_feeds(recipe) or data.feeds(recipe, "export")]
    skip = spec.perplexity_tokens + 64  # perplexity's tokens and the teacher-forced ones (25)
    tok = chat.chat_tokenizer(recipe)
    ids = chat.text_ids(tok, spec.text, skip + KV_CALIBRATION_TOKENS, decoder_shape(recipe.model).vocab)
    passages = [ids[None, at:at + KV_CALIBRATION_SEQUENCE]
                for at in range(skip, skip + KV_CALIBRATION_TOKENS, KV_CALIBRATION_SEQUENCE)]
    if not tok.has_template:
        return passages
    as_chat = [np.array([tok.conversation([{"role": "user", "content": tok.decode(p[0].tolist())}])], np.int64)
               for p in passages]
    return passages + as_chat


def run(recipe: Recipe, graph, workdir: Path, verbose: bool = False) -> Produced:
    from pipeline import precision
    from pipeline.precision import evaluate

    workdir = workdir.resolve()  # ORT's tools run with the workdir as CWD
    try:
        if recipe.precision.mode == "fp32":  # the cache's precision alone
            out, meta = workdir / "typed.onnx", {}
            workdir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(graph.path, out)
        else:
            out, meta = precision.apply(recipe, graph.path.resolve(), workdir, verbose)
        if recipe.precision.kv_cache != "float32":
            meta.update(_kv_cache(recipe, out))
    except PipelineError:
        shutil.rmtree(workdir, ignore_errors=True)  # a user error leaves nothing behind
        raise
    # Parity of the typed graph with its FP32 input (calibration feeds, not validation ones).
    feeds = (data.calibration_feeds(recipe) or data.feeds(recipe, "export"))[:2]
    fp8 = recipe.precision.mode == "fp8"
    try:
        reference = evaluate.run(graph.path, feeds, recipe.outputs)
        codec = CacheCodec.of_graph(out)  # a float16/int8 KV cache takes the feeds' caches in its type
        typed = [codec.outputs(o) for o in evaluate.run(out, [codec.feed(f) for f in feeds], recipe.outputs, fp8)]
    except Exception as e:  # e.g. no CPU kernel for bf16
        parity = {"error": first_line(e, with_type=True)}
    else:
        measured = evaluate.compare(reference, typed, recipe.top1_outputs())
        if measured.nonfinite:
            raise StageFailed(
                f"precision {recipe.precision.mode}: the typed graph produces {measured.nonfinite} "
                "NaN/Inf values", "keep more op types in FP32 (precision.block_list / exclude)")
        parity = measured.dump()
        if recipe.workload.kv_cache:  # the feeds' caches are drawn, not computed
            parity["caveat"] = ("KV-cache inputs of these feeds are random N(0,1) values, not caches a "
                                "prompt produces: a low figure here says little; the validate stage's "
                                "teacher-forced logits and task score are the measure")
    for leftover in workdir.iterdir():  # keep only the typed graph
        if leftover != out:
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    return Produced({"typed.onnx": out}, {
        "mode": recipe.precision.mode, **meta,
        "parity_vs_fp32_graph": parity,
        "cpu_latency_meaningful": recipe.precision.mode not in precision.EMULATED_ON_CPU,
    })
