"""A recipe's decoder as every generation caller needs it: its end-of-sequence id, its model
config, the context a sequence may hold, the workload's requests, and the genai_config.json an
engine deploys with. Validation, compare, serving and the load generator read these here."""

from __future__ import annotations

from pathlib import Path

from pipeline.generation import chat, genai_config
from pipeline.generation.timed_requests import requests
from pipeline.model import sources as models
from pipeline.recipe import Recipe
from pipeline.recipe.gguf_header import HfConfig
from pipeline.recipe.workload import decoder_shape


def eos_token(recipe: Recipe) -> int:
    """workload.eos_token_id, else the model's own (its config's eos_token_id), else the last
    vocabulary id (a model without one, e.g. the byte-level GLM)."""
    if recipe.workload.eos_token_id is not None:
        return recipe.workload.eos_token_id
    own = model_config(recipe).get("eos_token_id")
    if isinstance(own, list) and own:
        own = own[0]
    return own if isinstance(own, int) else decoder_shape(recipe.model).vocab - 1


def model_config(recipe: Recipe) -> HfConfig:
    """The transformers model's config (its bos/eos/pad ids); {} for other sources."""
    from pipeline.artifacts import json_file

    hf = recipe.model.transformers
    if hf is None:
        return {}
    if hf.config is not None:
        return dict(hf.config)
    folder = models.transformers_dir(hf, recipe.where)
    found = json_file.loads((folder / "config.json").read_bytes())
    return found if isinstance(found, dict) else {}


def prompt_vocab(recipe: Recipe) -> int:
    """Prompt tokens are drawn below the input_ids range's end (a byte-level LM: 256), within
    the model's vocabulary."""
    high = recipe.inputs[0].range[1] if recipe.inputs[0].range else decoder_shape(recipe.model).vocab
    return min(int(high), decoder_shape(recipe.model).vocab)


def workload_requests(recipe: Recipe):
    text = None
    if recipe.workload.chat is not None:  # prompts of real text
        from pipeline.generation.timed_requests import prompt_tokens

        text = chat.text_ids(chat.chat_tokenizer(recipe), recipe.workload.chat.text,
                             prompt_tokens(recipe.workload), decoder_shape(recipe.model).vocab)
    return requests(recipe.workload, prompt_vocab(recipe), eos_token(recipe), text)


def context_length(recipe: Recipe) -> int:
    """Tokens a sequence may hold: the workload's longest context, plus the token a turn
    carries over."""
    return recipe.workload.context_max() + 1


def deployed_config(recipe: Recipe, engine: Path) -> tuple[dict, list[Path]]:
    """genai_config.json for the engine file, and the tokenizer files to ship beside it (the
    model's own: bos/eos/pad ids from its config)."""
    shape, own = decoder_shape(recipe.model), model_config(recipe)
    hf = recipe.model.transformers
    folder = models.transformers_dir(hf, recipe.where) if hf is not None else None
    ids = {k: own.get(k) if isinstance(own.get(k), int) else None for k in ("bos_token_id", "pad_token_id")}
    cfg = genai_config.config(layers=shape.layers, kv_heads=shape.kv_heads, heads=shape.heads,
                              head_dim=shape.head_dim, hidden=shape.hidden, vocab=shape.vocab,
                              eos_token_id=eos_token(recipe), context_length=context_length(recipe),
                              filename=engine.name, threads=recipe.validate_.threads,
                              in_place=genai_config.in_place_cache(engine), **ids)
    return cfg, genai_config.tokenizer_files(folder)
