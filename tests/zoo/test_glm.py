"""zoo/glm.py: the GLM's shapes, FFN pruning that keeps the standard model's weights, and
the causal sparse attention masks."""

from __future__ import annotations


def test_glm_shapes_and_pruning_keeps_standard_weights():
    import torch

    from pipeline.zoo.glm import build

    standard = build(size="tiny", seed=0)
    flash = build(size="tiny", seed=0, attention="block_sparse", block=16, ffn_prune=0.5)
    ids = torch.randint(0, 512, (2, 40))
    with torch.no_grad():
        assert standard(ids).shape == (2, 40, 512)
        assert flash(ids).shape == (2, 40, 512)
    s_ffn, f_ffn = standard.blocks[0].ffn, flash.blocks[0].ffn
    assert f_ffn.gate.out_features == s_ffn.gate.out_features // 2
    # every kept channel is a row of the standard model's weights
    rows = {tuple(r.tolist()) for r in s_ffn.gate.weight}
    assert all(tuple(r.tolist()) in rows for r in f_ffn.gate.weight)
    # attention weights are shared untouched
    assert torch.equal(standard.blocks[0].attn.q.weight, flash.blocks[0].attn.q.weight)


def test_attention_masks_are_causal_and_sparse():
    import torch

    from pipeline.zoo.glm import attention_mask
    from pipeline.zoo.glm_config import GLMConfig

    t = 40
    for cfg in (GLMConfig(attention="sliding_window", window=4), GLMConfig(attention="block_sparse", block=8)):
        mask = attention_mask(t, cfg, torch.device("cpu"))
        assert not torch.triu(mask, diagonal=1).any()  # causal
        assert mask.diagonal().all()
        assert mask.sum() < t * (t + 1) // 2  # sparser than dense causal
    assert attention_mask(t, GLMConfig(), torch.device("cpu")) is None
