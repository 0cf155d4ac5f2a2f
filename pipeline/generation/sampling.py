"""How one generated token is chosen from the model's logits: a request's SamplingParams and
the pure numpy `next_token` every server path calls per row (greedy, temperature, top-k,
top-p, seeded), with EOS masked out when the request asks for exactly max_new_tokens.

    params = SamplingParams(max_new_tokens=64, temperature=0.7, top_p=0.9, seed=1)
    rng = params.generator()                     # one per request: its own stream of draws
    token = next_token(logits, params, rng, eos)  # logits [V] -> a token id

A request's tokens depend only on its own logits, params and generator, never on the other
rows of a batch (the server's "results do not depend on batch-mates" rests on it).
Invalid values raise InvalidSampling, a ValueError: HTTP 400 wherever a server maps it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


class InvalidSampling(ValueError):
    """A SamplingParams field out of range: one line naming the field (HTTP 400)."""


@dataclass(frozen=True)
class SamplingParams:
    """One request's generation settings (OpenAI's names where they exist).

    max_new_tokens  tokens to generate at most (OpenAI `max_tokens`)
    temperature     0: greedy (argmax); > 0: softmax(logits / temperature) sampled
    top_p           nucleus: sample among the most likely tokens whose probabilities sum to
                    top_p (1.0: off)
    top_k           sample among the k most likely tokens (0: off)
    seed            the request's generator seed (None: fresh entropy); same seed, same
                    params, same prompt -> the same tokens
    ignore_eos      True: EOS is masked out and exactly max_new_tokens come (the old
                    `/generate` route, `pipeline load` and the workload's timing rely on it)
    stop_token_ids  ids that end the sequence like EOS does (finish_reason "stop"; the stop
                    token itself is not returned)
    """

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self) -> np.random.Generator:
        """The request's own random stream (unused by greedy decoding)."""
        return np.random.default_rng(self.seed)


def _is_int(value) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)


def _check(p: SamplingParams) -> None:
    """Each field's type and range; InvalidSampling names the first one that is wrong."""
    if not _is_int(p.max_new_tokens) or p.max_new_tokens < 1:
        raise InvalidSampling(f"max_new_tokens must be an integer >= 1 (got {p.max_new_tokens!r})")
    if not _is_number(p.temperature) or not math.isfinite(p.temperature) or p.temperature < 0:
        raise InvalidSampling(f"temperature must be a finite number >= 0 (got {p.temperature!r})")
    if not _is_number(p.top_p) or not 0 < p.top_p <= 1:
        raise InvalidSampling(f"top_p must be in (0, 1] (got {p.top_p!r})")
    if not _is_int(p.top_k) or p.top_k < 0:
        raise InvalidSampling(f"top_k must be an integer >= 0, 0 = off (got {p.top_k!r})")
    if p.seed is not None and (not _is_int(p.seed) or p.seed < 0):
        raise InvalidSampling(f"seed must be an integer >= 0 or null (got {p.seed!r})")
    if not isinstance(p.ignore_eos, bool):
        raise InvalidSampling(f"ignore_eos must be true or false (got {p.ignore_eos!r})")
    if not isinstance(p.stop_token_ids, tuple) or not all(_is_int(t) and t >= 0 for t in p.stop_token_ids):
        raise InvalidSampling("stop_token_ids must be a tuple of token ids >= 0 "
                              f"(got {p.stop_token_ids!r})")


def check_vocab(params: SamplingParams, vocab: int | None) -> None:
    """The stop token ids are within the model's vocabulary [0, vocab) (None: unknown)."""
    if vocab is None:
        return
    outside = [t for t in params.stop_token_ids if t >= vocab]
    if outside:
        raise InvalidSampling(f"stop_token_ids {outside} are outside the vocabulary [0, {vocab})")


def ends_sequence(token: int, params: SamplingParams, eos: int | None) -> bool:
    """Whether `token` ends the sequence (finish_reason "stop"): EOS unless it is ignored, or
    one of the request's stop ids. Such a token is not returned to the client."""
    return (token == eos and not params.ignore_eos) or token in params.stop_token_ids


def next_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator,
               eos: int | None) -> int:
    """logits [V] (one row, float) -> the chosen token id. ignore_eos: EOS can never be chosen."""
    scores = np.asarray(logits, dtype=np.float64)
    if params.ignore_eos and eos is not None:
        scores = scores.copy()
        scores[eos] = -np.inf
    if params.greedy:
        return int(np.argmax(scores))
    scores = scores / params.temperature
    candidates = np.arange(scores.shape[0])
    if params.top_k and params.top_k < scores.shape[0]:
        candidates = np.argpartition(-scores, params.top_k - 1)[:params.top_k]  # unordered
    scores = scores[candidates]
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        # keep the smallest prefix whose mass reaches top_p (the most likely token always)
        cut = int(np.searchsorted(np.cumsum(probs[order]), params.top_p)) + 1
        keep = order[:cut]
        candidates, probs = candidates[keep], probs[keep] / probs[keep].sum()
    return int(candidates[rng.choice(len(candidates), p=probs)])
