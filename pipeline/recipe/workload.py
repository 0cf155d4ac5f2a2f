"""The `workload:` section: what one request is, and the KV-cache graph signature it implies.

`forward` (the default) times one forward pass at the inputs' shapes. `generation` times a
decoder the way a chat model is used: prefill of a prompt, then token-by-token decode with a
growing KV cache, at several prompt lengths and batch sizes, plus a task (a fixed script of
turns whose context is kept) and a long point. The recipe then declares only `input_ids`
(its batch and sequence dims); the KV-cache inputs and outputs are derived from the model
(`kv_signature`), so a zoo size or a transformers config is all that changes between models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, NamedTuple

from pydantic import Field, model_validator

from pipeline.core import user_code
from pipeline.core.cache_io import PAST, PRESENT
from pipeline.recipe.base import Dim, Strict
from pipeline.recipe.gguf_header import HfConfig

Positive = Annotated[int, Field(ge=1)]


class TurnSpec(Strict):
    prompt: Positive = Field(description="Tokens appended to the context at this turn (the user's message).")
    new_tokens: Positive = Field(description="Tokens generated greedily at this turn (the reply).")


class LongSpec(Strict):
    prompt: Positive = Field(128, description="Prompt tokens of the long generation.")
    new_tokens: Positive = Field(512, description="Tokens generated in one sequence: TPOT is "
                                 "reported as a function of the context length along the way.")
    bins: Positive = Field(4, description="Context-length bins TPOT is summarized in.")


class ChatSpec(Strict):
    """Real text for a generation workload: prompts, a task score and perplexity."""

    questions: Path = Field(
        Path("data/chat/questions.jsonl"), strict=False,
        description="Questions with accepted answers ({id, question, answers}): each engine and "
        "PyTorch answer them through the chat template, greedy, stopping at end of sequence; "
        "the share answered right is the task score (data/chat/README.md).")
    tasks: Path = Field(
        Path("data/chat/tasks.jsonl"), strict=False,
        description="Multi-turn scripts ({id, turns: [question ids]}): the questions asked one "
        "after another in one conversation (the context kept); every question in one script.")
    text: Path = Field(
        Path("data/shakespeare/validation.jsonl"), strict=False,
        description="Held-out plain text (.jsonl rows with `text`, or .txt): perplexity, and "
        "the prompts of the timed points, the task and the long point (instead of random ids).")
    tokenizer: str | None = Field(
        None, description="`bytes` for a byte-level model (plain `Question:/Answer:` prompts); "
        "default: the model's own tokenizer and chat template.")
    scripts: Positive | None = Field(None, description="Use the first N scripts (default: all).")
    answer_tokens: Positive = Field(32, description="Most tokens an answer may take.")
    max_context: Positive = Field(1024, description="Longest conversation (tokens) a script may reach.")
    perplexity_tokens: Positive = Field(2048, description="Held-out tokens scored for perplexity.")
    window: Positive = Field(512, description="Tokens per perplexity window (each from an empty cache).")


# What the graph of each kind is, read before (and without) any workload code runs: the
# export stage, the model checks and the recipe's signature. True: the graph wraps the model
# in a KV cache (past keys/values in, presents out) and the model itself takes input_ids.
# A new kind adds its line; what it measures lives in pipeline/workloads.
KV_CACHE_GRAPH = {"forward": False, "generation": True}
# How one request of each kind is served (pipeline/serving, pipeline/loadgen): `infer`, one
# tensor feed in and its outputs back; `generate`, a prompt in and a stream of tokens back.
SERVED_AS = {"forward": "infer", "generation": "generate"}


class WorkloadSpec(Strict):
    """One request of the validation: a forward pass, or generation (prefill + decode)."""

    kind: Literal["forward", "generation"] = Field(
        "forward", description="`forward`: one forward pass at the inputs' shapes (latency). "
        "`generation`: prefill + greedy decode with a KV cache (TTFT, TPOT, tokens/s, time per "
        "task); the export then writes a KV-cache graph.")
    prompt_lengths: list[Positive] = Field(
        [32], min_length=1, description="Prompt lengths timed (each a prefill + decode point).")
    new_tokens: Positive = Field(16, description="Tokens generated per point (TPOT over them).")
    batch_sizes: list[Positive] = Field(
        [1, 4], min_length=1, description="Sequences generated together (batch 1 and batch N: "
        "per-sequence and aggregate tokens/s).")
    task: list[TurnSpec] = Field(
        default_factory=lambda: [TurnSpec(prompt=32, new_tokens=16), TurnSpec(prompt=16, new_tokens=16)],
        min_length=1, description="A fixed script of turns at batch 1: each turn's prompt is "
        "appended to the context, its reply generated, the context (KV cache) kept.")
    long: LongSpec | None = Field(
        None, description="A long generation (TPOT vs context length, peak memory); null: none.")
    chat: ChatSpec | None = Field(
        None, description="Real text and a task score (answer accuracy, perplexity); null: "
        "random prompt ids and no score.")
    rounds: Annotated[int, Field(ge=6)] = Field(
        6, description="Interleaved rounds per runner and point (>= 6: a 95% sign-test interval).")
    warmup: Annotated[int, Field(ge=0)] = Field(1, description="Untimed generations per runner and point.")
    seed: int = Field(0, ge=0, description="Seed of the prompt tokens.")
    eos_token_id: int | None = Field(
        None, ge=0, description="End-of-sequence token, suppressed in the timed points so every "
        "runner generates exactly the asked tokens; answers (chat) stop at it (default: the "
        "model's eos_token_id, else the last vocabulary id).")

    @model_validator(mode="after")
    def _batch_one(self) -> WorkloadSpec:
        if self.kv_cache and 1 not in self.batch_sizes:
            raise ValueError("batch_sizes needs 1: TTFT and TPOT are reported at batch 1 (add N for batch N)")
        return self

    @property
    def kv_cache(self) -> bool:
        """The exported graph carries a KV cache around the model (KV_CACHE_GRAPH)."""
        return KV_CACHE_GRAPH[self.kind]

    @property
    def served_as(self) -> Literal["infer", "generate"]:
        """The HTTP route one request of this kind takes when served (SERVED_AS)."""
        return SERVED_AS[self.kind]

    def context_max(self) -> int:
        """The longest context any point reaches (prompt + generated tokens)."""
        points = [p + self.new_tokens for p in self.prompt_lengths]
        points.append(sum(t.prompt + t.new_tokens for t in self.task))
        if self.long is not None:
            points.append(self.long.prompt + self.long.new_tokens)
        if self.chat is not None:
            points.append(self.chat.max_context)
        return max(points)

    def prefill_max(self) -> int:
        """The longest prefill (prompt tokens in one forward, +1 for the token a turn carries over)."""
        turns = [t.prompt + 1 for t in self.task]
        chat = [self.chat.window, self.chat.max_context] if self.chat else []  # perplexity windows; a restarted conversation
        return max([*self.prompt_lengths, *turns, self.long.prompt if self.long else 1, *chat])


# ----------------------------------------------------------------------------- KV signature
class DecoderShape(NamedTuple):
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    heads: int
    hidden: int


def decoder_shape(model) -> DecoderShape:
    """The recipe's decoder's sizes, without importing torch."""
    if model.zoo == "glm":
        from pipeline.zoo.glm_config import SIZES

        d, layers, heads, kv_heads, _, vocab = SIZES[model.kwargs["size"]]
        return DecoderShape(layers, kv_heads, d // heads, vocab, heads, d)
    if model.transformers is not None:
        spec = model.transformers
        if spec.task != "logits":
            raise ValueError(f"workload.kind generation needs a decoder: a causal LM "
                             f"(model.transformers.task: logits), not task `{spec.task}`")
        if spec.config is not None:
            config = dict(spec.config)
        elif spec.gguf is not None:  # the file's header: no conversion to load a recipe
            from pipeline.recipe.gguf_header import header_config

            config = header_config(spec.gguf, "model")
        else:
            config = _pretrained_config(spec.pretrained)
        heads = config.get("num_attention_heads", 32)
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        return DecoderShape(config["num_hidden_layers"], config.get("num_key_value_heads", heads),
                            head_dim, config["vocab_size"], heads, config["hidden_size"])
    raise ValueError("workload.kind generation needs a decoder: model.zoo glm or a "
                     "model.transformers causal LM (Llama family)")


def _pretrained_config(ref: str) -> HfConfig:
    if user_code.is_function_ref(ref):  # module:function returning the directory, as model/ reads it
        ref = user_code.call_ref(ref, "model.transformers.pretrained", "a model directory")
    path = Path(ref) / "config.json"
    if not path.is_file():
        raise ValueError(f"workload.kind generation needs the decoder's config.json in {ref}")
    return json.loads(path.read_text())


def kv_names(layers: int) -> tuple[list[str], list[str]]:
    """Past input names and present output names, in graph order (key, value per layer)."""
    past = [f"{PAST}{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    return past, [f"{PRESENT}{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def kv_signature(recipe_inputs: list, model, workload: WorkloadSpec, input_spec_cls) -> tuple[list, list[str]]:
    """The KV-cache graph's (inputs, outputs) from the declared `input_ids` [batch, sequence].

    The past dim runs from 1 to the longest context; `total` (attention mask, presents) is
    past + sequence at every profile point, so a feed drawn at one point is consistent.
    """
    ids = next((i for i in recipe_inputs if i.name == "input_ids"), None)
    if ids is None or len(ids.shape) != 2 or not all(isinstance(d, Dim) for d in ids.shape):
        raise ValueError("workload.kind generation needs an input `input_ids` with dynamic "
                         "[batch, sequence] dims")
    layers, kv_heads, head_dim = decoder_shape(model)[:3]
    batch, seq = ids.shape
    batch = Dim(name=batch.name or "batch", min=batch.min, opt=batch.opt,
                max=max(batch.max, *workload.batch_sizes))
    seq = Dim(name=seq.name or "sequence", min=seq.min, opt=seq.opt,
              max=max(seq.max, workload.prefill_max()))
    past = Dim(name="past_sequence", min=1, opt=max(1, min(seq.opt, workload.context_max())),
               max=workload.context_max())
    total = Dim(name="total_sequence", min=seq.min + past.min, opt=seq.opt + past.opt,
                max=seq.max + past.max)
    past_names, present_names = kv_names(layers)
    inputs = [
        input_spec_cls(name="input_ids", dtype=ids.dtype, shape=[batch, seq], range=ids.range),
        input_spec_cls(name="attention_mask", dtype="int64", shape=[batch, total], range=(1.0, 2.0)),
        *(input_spec_cls(name=n, dtype="float32", shape=[batch, kv_heads, past, head_dim])
          for n in past_names),
    ]
    return inputs, ["logits", *present_names]


