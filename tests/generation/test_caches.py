"""generation/glm_cache.py and llama_cache.py: the exported KV-cache wrappers and the static-
cache baselines give the full forward's logits, prefill then decode."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("attention", ["dense", "block_sparse"])
def test_cached_glm_matches_the_full_forward(attention):
    import torch

    from pipeline.generation.glm_cache import GLMWithPast, StaticCacheGLM
    from pipeline.zoo.glm import build

    glm = build(size="tiny", attention=attention, block=4)
    ids = torch.randint(0, 512, (2, 13), generator=torch.Generator().manual_seed(0))
    full = glm(ids)
    cached = GLMWithPast(glm)
    empty = [torch.zeros(2, 2, 0, 16)] * 4
    pre = cached(ids[:, :9], torch.ones(2, 9, dtype=torch.int64), *empty)
    dec = cached(ids[:, 9:], torch.ones(2, 13, dtype=torch.int64), *pre[1:])
    assert torch.allclose(pre[0], full[:, :9], atol=1e-4)
    assert torch.allclose(dec[0], full[:, 9:], atol=1e-4)  # the sparse pattern over absolute positions
    static = StaticCacheGLM(glm, 16)
    static.reset(2)
    assert torch.allclose(static(ids[:, :9]), full[:, 8], atol=1e-4)
    for t in range(9, 13):
        assert torch.allclose(static(ids[:, t:t + 1]), full[:, t], atol=1e-4)
    with pytest.raises(ValueError, match="exceeds the static cache"):
        static(ids[:, :4])


def test_cached_llama_matches_the_full_forward():
    """transformers Llama: the exported cache wrapper and the static-cache baseline."""
    import torch
    import transformers

    from pipeline.generation.llama_cache import LlamaWithPast, StaticCacheLlama

    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    lm = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        full = lm(input_ids=ids, use_cache=False).logits
        cached = LlamaWithPast(lm)
        pre = cached(ids[:, :6], torch.ones(2, 6, dtype=torch.int64), *[torch.zeros(2, 2, 0, 8)] * 4)
        dec = cached(ids[:, 6:], torch.ones(2, 9, dtype=torch.int64), *pre[1:])
    assert torch.allclose(dec[0], full[:, 6:], atol=1e-4) and pre[1].shape == (2, 2, 6, 8)
    static = StaticCacheLlama(lm, 16)
    for _ in range(2):  # the second reset zeroes the same cache in place
        static.reset(2)
        with torch.inference_mode():
            assert torch.allclose(static(ids[:, :6]), full[:, 5], atol=1e-4)
            assert torch.allclose(static(ids[:, 6:7]), full[:, 6], atol=1e-4)
