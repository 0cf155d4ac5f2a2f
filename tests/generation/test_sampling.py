"""SamplingParams and next_token: greedy, EOS masked or ending the sequence, temperature,
top-k, top-p, seeded draws, and the one-line errors a server turns into HTTP 400."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.generation.sampling import (
    InvalidSampling,
    SamplingParams,
    check_vocab,
    ends_sequence,
    next_token,
)

EOS = 3


def _logits(*peaks: tuple[int, float], vocab: int = 16) -> np.ndarray:
    logits = np.zeros(vocab, np.float32)
    for token, value in peaks:
        logits[token] = value
    return logits


def test_greedy_takes_the_argmax_and_ignore_eos_masks_eos_out():
    logits = _logits((EOS, 9.0), (7, 5.0))
    rng = np.random.default_rng(0)
    assert next_token(logits, SamplingParams(4), rng, EOS) == EOS
    assert next_token(logits, SamplingParams(4, ignore_eos=True), rng, EOS) == 7
    assert logits[EOS] == 9.0  # the caller's logits are not changed


def test_eos_and_stop_ids_end_a_sequence_unless_eos_is_ignored():
    assert ends_sequence(EOS, SamplingParams(4), EOS)
    assert not ends_sequence(EOS, SamplingParams(4, ignore_eos=True), EOS)
    assert ends_sequence(9, SamplingParams(4, ignore_eos=True, stop_token_ids=(9,)), EOS)
    assert not ends_sequence(8, SamplingParams(4, stop_token_ids=(9,)), EOS)
    assert not ends_sequence(EOS, SamplingParams(4), None)


def test_top_k_1_and_a_tiny_top_p_are_greedy_at_any_temperature():
    logits = _logits((5, 3.0), (6, 2.9))
    for seed in range(20):
        rng = np.random.default_rng(seed)
        assert next_token(logits, SamplingParams(4, temperature=5.0, top_k=1), rng, EOS) == 5
        assert next_token(logits, SamplingParams(4, temperature=5.0, top_p=0.01), rng, EOS) == 5


def test_top_k_and_top_p_keep_only_their_candidates():
    logits = _logits((5, 4.0), (6, 4.0), (7, 4.0), vocab=64)
    rng = np.random.default_rng(0)
    drawn = {next_token(logits, SamplingParams(4, temperature=1.0, top_k=3), rng, EOS) for _ in range(200)}
    assert drawn == {5, 6, 7}
    # the three peaks hold ~0.76 of the mass: top_p 0.5 keeps two or three of them, never the rest
    drawn = {next_token(logits, SamplingParams(4, temperature=1.0, top_p=0.5), rng, EOS) for _ in range(200)}
    assert drawn <= {5, 6, 7} and len(drawn) >= 2


def test_a_seed_repeats_its_draws_and_temperature_spreads_them():
    logits = np.random.default_rng(1).standard_normal(100).astype(np.float32)
    params = SamplingParams(4, temperature=1.0, seed=42)
    first = [next_token(logits, params, rng, EOS) for rng in [params.generator()] for _ in range(30)]
    again = [next_token(logits, params, rng, EOS) for rng in [params.generator()] for _ in range(30)]
    assert first == again and len(set(first)) > 5


@pytest.mark.parametrize("fields, named", [
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"max_new_tokens": 2.0}, "max_new_tokens"),
    ({"max_new_tokens": True}, "max_new_tokens"), ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"), ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"), ({"top_k": -1}, "top_k"), ({"seed": -2}, "seed"),
    ({"seed": "7"}, "seed"), ({"ignore_eos": 1}, "ignore_eos"),
    ({"stop_token_ids": [4]}, "stop_token_ids"), ({"stop_token_ids": (-1,)}, "stop_token_ids"),
])
def test_invalid_fields_raise_one_line_naming_the_field(fields, named):
    with pytest.raises(InvalidSampling, match=named) as error:
        SamplingParams(**{"max_new_tokens": 4, **fields})
    assert isinstance(error.value, ValueError) and "\n" not in str(error.value)


def test_stop_ids_outside_the_vocabulary_are_refused():
    check_vocab(SamplingParams(4, stop_token_ids=(15,)), 16)
    check_vocab(SamplingParams(4, stop_token_ids=(99,)), None)
    with pytest.raises(InvalidSampling, match="vocabulary"):
        check_vocab(SamplingParams(4, stop_token_ids=(16,)), 16)
