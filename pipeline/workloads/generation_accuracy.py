"""What a generation engine is judged on besides time: the teacher-forced accuracy feeds (a
prefill with an empty cache, then one decode step on its presents) and the outputs on them,
with the KV-cache outputs told apart from the logits; and the rows of the task score (answers,
perplexity) for PyTorch and for an engine."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline import data
from pipeline.artifacts.generation import (
    KvCacheAccuracy,
)
from pipeline.core.cache_io import PRESENT
from pipeline.generation import chat, runners, score
from pipeline.generation.decoder import (
    eos_token,
)
from pipeline.metrics.accuracy import OutputAccuracies
from pipeline.precision.kv_cache import CacheCodec
from pipeline.recipe import Recipe
from pipeline.recipe.workload import decoder_shape, kv_names

Outputs = dict[str, np.ndarray]  # graph output name -> its array


ACCURACY_PREFILL = 24


def accuracy_feeds(recipe: Recipe) -> tuple[list[dict], list[dict]]:
    """Teacher-forced feeds (prefill with an empty past, then one decode step on its presents)
    and the PyTorch KV-cache module's outputs on them."""
    import torch

    from pipeline.generation.export import kv_model

    shape = decoder_shape(recipe.model)
    module, _ = kv_model(recipe)
    if recipe.workload.chat is not None:  # held-out text, past the tokens perplexity scores
        spec = recipe.workload.chat
        text = chat.text_ids(chat.chat_tokenizer(recipe), spec.text,
                             spec.perplexity_tokens + ACCURACY_PREFILL + 1, shape.vocab)
        ids = text[None, -(ACCURACY_PREFILL + 1):]
    else:
        rng = np.random.default_rng([recipe.data.seed, 1])
        ids = rng.integers(0, shape.vocab, size=(1, ACCURACY_PREFILL + 1), dtype=np.int64)
    names, presents = kv_names(shape.layers)
    feeds, outputs = [], []
    past = _empty_past(recipe)
    for lo, hi in ((0, ACCURACY_PREFILL), (ACCURACY_PREFILL, ACCURACY_PREFILL + 1)):
        feed = {"input_ids": ids[:, lo:hi], "attention_mask": np.ones((1, hi), np.int64), **past}
        with torch.no_grad():
            out = module(*(torch.from_numpy(feed[k]) for k in feed))
        result = dict(zip(recipe.outputs, (o.numpy() for o in out)))
        feeds.append(feed)
        outputs.append(result)
        past = {n: result[p] for n, p in zip(names, presents)}
    return feeds, outputs


def _empty_past(recipe: Recipe) -> data.Feed:
    shape = decoder_shape(recipe.model)
    return {name: np.zeros((1, shape.kv_heads, 0, shape.head_dim), np.float32)
            for name in kv_names(shape.layers)[0]}


def _score(recipe: Recipe, runner, logits_of) -> tuple[list[dict], np.ndarray]:
    """Answers to the question scripts and per-token NLL of the held-out text, on one runner."""
    spec = recipe.workload.chat
    tok = chat.chat_tokenizer(recipe)
    scripts = chat.scripts(spec.tasks, chat.questions(spec.questions), spec.scripts)
    rows = score.answer(runner, tok, scripts, tok.stop_ids(eos_token(recipe)), spec.answer_tokens,
                        spec.max_context)
    text = chat.text_ids(tok, spec.text, spec.perplexity_tokens + 1, decoder_shape(recipe.model).vocab)
    return rows, score.token_losses(logits_of, text, spec.window)


def torch_score(recipe: Recipe, model) -> tuple[list[dict], np.ndarray]:
    import torch

    from pipeline.generation.export import kv_model

    module, _ = kv_model(recipe)
    past = _empty_past(recipe)

    def logits_of(ids):
        feed = [ids, np.ones_like(ids), *past.values()]
        with torch.no_grad():
            return module(*(torch.from_numpy(x) for x in feed))[0].numpy()

    decoder = runners.torch_decoder(recipe, model, recipe.workload.chat.max_context + 1)
    return _score(recipe, runners.TorchStaticRunner(decoder, None, recipe.validate_.threads), logits_of)


def engine_rows(recipe: Recipe, engine_path: Path, in_place: bool) -> tuple[list[dict], np.ndarray]:
    runner = runners.OrtLoopRunner(engine_path, None, recipe.validate_.threads, in_place)
    past = CacheCodec.of_session(runner.session).feed(_empty_past(recipe))

    def logits_of(ids):
        return runner.session.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids), **past})[0]

    try:
        return _score(recipe, runner, logits_of)
    finally:
        runner.close()


def split_cache_outputs(accuracy: OutputAccuracies) -> tuple[OutputAccuracies, KvCacheAccuracy | None]:
    """(the gated outputs: logits; one summary of the KV-cache outputs). A cache's error shows
    in the logits of the next step, which are gated; 60 cache rows at the logits threshold
    would bury the one figure that matters."""
    caches = {k: v for k, v in accuracy.items() if k.startswith(PRESENT)}
    gated = {k: v for k, v in accuracy.items() if k not in caches}
    if not caches:
        return gated, None
    worst = min(caches, key=lambda k: caches[k].cosine)
    return gated, KvCacheAccuracy(
        outputs=len(caches), worst=worst, worst_cosine=caches[worst].cosine,
        mean_cosine=float(np.mean([m.cosine for m in caches.values()])),
        max_abs=max(m.max_abs for m in caches.values()),
        nonfinite=sum(m.nonfinite for m in caches.values()), gated=False)


def run_feed(session, feed: data.Feed, names: list[str]) -> Outputs:
    """The engine's outputs on a feed of float caches (PyTorch's presents), its own cache
    type in and float32 out (precision.kv_cache)."""
    codec = CacheCodec.of_session(session)
    return codec.outputs(dict(zip(names, session.run(None, codec.feed(feed)))))
