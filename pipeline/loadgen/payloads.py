"""Request bodies from the recipe's own data: one sample per request.

Forward recipes: the rows of the validation split, one row a request, each cut to its real
length (the attention mask, or the text source's masks): for `minilm` that is the shipped
sentences (data/sentences/pairs.jsonl) tokenized by the recipe's tokenizer (pipeline/data),
so requests have the real spread of lengths a length-bucketing batcher meets. A recipe
without validation data gets its random feeds at the opt shape (said so in `source`).

Generation recipes: with a chat workload, its questions (`workload.chat.questions`, the
shipped data/chat/questions.jsonl) as chat messages; else prompts from the validation split's
rows when it is text, else the workload's own seeded prompts at batch 1
(pipeline.generation.timed_requests), as token ids; each asking for the workload's
`new_tokens`.

Bodies are encoded once in the target's protocol (protocol.py): KServe v2 tensors of batch 1
(binary or JSON), OpenAI chat or completion requests, streamed.
"""

from __future__ import annotations

import numpy as np

from pipeline.core.errors import InputError
from pipeline.loadgen.protocol import Api, Payload, Target, kserve_payload, openai_payload
from pipeline.recipe import Recipe


def is_generation(recipe: Recipe) -> bool:
    return recipe.workload.served_as == "generate"


def api_of(recipe: Recipe, asked: str | None = None) -> Api:
    """How the recipe's requests are spoken: KServe v2 for tensor models, the OpenAI chat API
    for a chat workload, OpenAI completions (token ids) for other generation recipes; `asked`
    (--api chat|completions) chooses for a generation recipe (chat needs its questions)."""
    if not is_generation(recipe):
        if asked not in (None, "kserve"):
            raise InputError(f"--api {asked}: `{recipe.name}` is a tensor model, spoken to "
                             "through KServe v2", "drop --api")
        return "kserve"
    if asked == "chat" and recipe.workload.chat is None:
        raise InputError(f"--api chat: `{recipe.name}` has no chat workload (no questions to ask)",
                         "use --api completions (its prompts as token ids)")
    if asked in ("chat", "completions"):
        return asked
    if asked == "kserve":
        raise InputError(f"--api kserve: `{recipe.name}` generates text: the OpenAI API serves it",
                         "use --api chat or --api completions")
    return "chat" if recipe.workload.chat is not None else "completions"


def _rows(recipe: Recipe) -> tuple[list[dict[str, np.ndarray]], str]:
    """Samples (name -> array [1, ...]: one row, the batch dim kept, trimmed to its real
    length) and where they came from. A recipe whose first dim is fixed sends whole feeds."""
    from pipeline import data

    split = data.split(recipe, "validation")
    if split is None:
        feeds = data.feeds(recipe, "export", 8)
        source = "random feeds at the opt shape (the recipe has no validation data)"
        masks = None
    else:
        feeds, masks = split.feeds, split.masks
        source = f"validation split: {split.provenance.source}"
    per_row = bool(recipe.inputs[0].shape) and not isinstance(recipe.inputs[0].shape[0], int)
    rows = []
    for f, feed in enumerate(feeds):
        mask = feed.get("attention_mask")
        if mask is None and masks is not None:
            mask = masks[f]
        batch = next(iter(feed.values())).shape[0] if per_row else 1
        for i in range(batch):
            row = {name: np.asarray(a[i:i + 1] if per_row else a) for name, a in feed.items()}
            if mask is not None and per_row:
                length = max(2, int(np.asarray(mask[i]).sum()))
                full = np.asarray(mask).shape[1]
                row = {k: (v[:, :length] if v.ndim >= 2 and v.shape[1] == full else v)
                       for k, v in row.items()}
            rows.append(row)
    return rows, source


def bodies(recipe: Recipe, target: Target) -> tuple[list[Payload], dict]:
    """(request bodies in the target's protocol, {source, requests, lengths: [min, max]})."""
    if target.generate:
        return _generation_bodies(recipe, target)
    rows, source = _rows(recipe)
    dtypes = {s.name: s.dtype for s in recipe.inputs}
    out = [kserve_payload(row, dtypes, target.binary) for row in rows]
    first = [next(iter(row.values())) for row in rows]
    lengths = [a.shape[1] if a.ndim >= 2 else 1 for a in first]  # [1, T]: T
    return out, {"source": source, "requests": len(out), "lengths": [min(lengths), max(lengths)],
                 "protocol": f"KServe v2 ({'binary' if target.binary else 'JSON'} tensors)"}


def _generation_bodies(recipe: Recipe, target: Target) -> tuple[list[Payload], dict]:
    spec = recipe.workload
    if target.api == "chat":
        from pipeline.generation.chat import questions

        asked = [q.question for q in questions(spec.chat.questions).values()]
        prompts: list = asked
        source = f"the chat workload's questions: {spec.chat.questions}"
        lengths = [len(q) for q in asked]  # characters: the server's tokenizer counts tokens
    else:
        prompts, source = _prompt_ids(recipe)
        lengths = [len(p) for p in prompts]
    out = [openai_payload(target, p, spec.new_tokens) for p in prompts]
    return out, {"source": source, "requests": len(out), "lengths": [min(lengths), max(lengths)],
                 "new_tokens": spec.new_tokens,
                 "protocol": f"OpenAI {'/v1/chat/completions' if target.api == 'chat' else '/v1/completions'}"
                             ", streamed, greedy"}


def _prompt_ids(recipe: Recipe) -> tuple[list[list[int]], str]:
    spec = recipe.workload
    longest = max(spec.prompt_lengths)
    from pipeline import data

    split = data.split(recipe, "validation")
    if split is not None and split.masks is not None:  # text: real prompts
        rows, source = _rows(recipe)
        return [row["input_ids"][0, :longest].tolist() for row in rows], source
    from pipeline.generation.decoder import workload_requests

    prompts = [r.turns[0][0][0].tolist() for r in workload_requests(recipe)
               if r.kind == "point" and r.batch == 1]
    return prompts, (f"the workload's seeded prompts (lengths {spec.prompt_lengths}, seed "
                     f"{spec.seed}): the recipe has no validation text")
