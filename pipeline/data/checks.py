"""Checks of real data (files, loaders, text) against the recipe, before any stage runs:
names, dtypes, shapes within the profile, token ids below the model's vocabulary.

The inputs' `range` is not checked here: it tells the random generator what to draw, and
real data legitimately lies outside it (a padded batch holds attention_mask 0 where the
random feeds are all ones).
"""

from __future__ import annotations

from pipeline.core.cache_io import PAST
from pipeline.core.errors import InputError
from pipeline.data.feeds import Feed, numpy_dtype
from pipeline.recipe import Dim, InputSpec

TOKEN_INPUTS = ("input_ids",)


def check_feeds(inputs: list[InputSpec], feeds: list[Feed], where: str,
                vocab: int | None = None) -> None:
    """Each feed names exactly the recipe's inputs, with their dtype and a shape in the
    profile; token ids lie in [0, vocab) when the vocabulary size is known."""
    expected = [i.name for i in inputs]
    for n, feed in enumerate(feeds):
        if sorted(feed) != sorted(expected):
            raise InputError(f"{where}: feed {n} has inputs {sorted(feed)}, the recipe declares "
                             f"{expected}", "name the arrays after the recipe's inputs")
        for spec in inputs:
            array = feed[spec.name]
            if array.dtype != numpy_dtype(spec.dtype):
                raise InputError(f"{where}: feed {n} input `{spec.name}` is {array.dtype}, the "
                                 f"recipe declares {spec.dtype}")
            if not fits(array.shape, spec.shape) and not _empty_past(spec.name, array.shape, spec.shape):
                raise InputError(f"{where}: feed {n} input `{spec.name}` has shape "
                                 f"{list(array.shape)}, outside the recipe's {describe(spec.shape)}")
            if spec.name in TOKEN_INPUTS and array.size:
                _check_ids(spec.name, array, n, where, vocab)


def _check_ids(name: str, array, n: int, where: str, vocab: int | None) -> None:
    lo, hi = int(array.min()), int(array.max())
    if lo < 0:
        raise InputError(f"{where}: feed {n} input `{name}` holds a negative token id ({lo})")
    if vocab is not None and hi >= vocab:
        raise InputError(f"{where}: feed {n} input `{name}` holds token id {hi}, beyond the "
                         f"model's vocabulary of {vocab}",
                         "tokenize with the model's own tokenizer, or set data.<split>.tokenizer")


def _empty_past(name: str, shape: tuple, dims: list) -> bool:
    """A prefill's KV cache: past length 0 (text feeds of a decoder, data/tokenize.py), which
    the profile's past dim (1 and up: a TensorRT profile) leaves out but ONNX Runtime runs."""
    return (name.startswith(PAST) and len(shape) == 4 and shape[2] == 0
            and fits(shape[:2] + (1,) + shape[3:], dims))


def fits(shape: tuple, dims: list) -> bool:
    if len(shape) != len(dims):
        return False
    return all(s == d if isinstance(d, int) else d.min <= s <= d.max for s, d in zip(shape, dims))


def describe(dims: list) -> str:
    return "[" + ", ".join(str(d) if not isinstance(d, Dim) else f"{d.min}..{d.max}" for d in dims) + "]"
