"""model/rescale.py: the same function, with weights moved off their 4-bit grid."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

BLOCK = 16  # the tiny model's blocks along the input dimension (Q4_1's are 32)


def _tiny_llama_on_a_grid():
    """A grouped-query Llama (4 heads reading 2 kv heads) whose every linear weight holds at
    most 16 values per block of BLOCK inputs, as a de-quantized Q4_1 checkpoint does."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("proj.weight"):  # w = d * q + m per block, q in 0..15
                blocks = param.reshape(param.shape[0], -1, BLOCK)
                low, high = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)
                d = (high - low) / 15
                param.copy_((((blocks - low) / d).round() * d + low).reshape(param.shape))
            elif name.endswith("layernorm.weight"):  # gains that are not all ones
                param.uniform_(0.5, 1.5)
    return model


def _values_per_block(weight: torch.Tensor) -> torch.Tensor:
    blocks = weight.reshape(weight.shape[0], -1, BLOCK)
    return torch.tensor([[len(torch.unique(b)) for b in row] for row in blocks])


def test_the_model_computes_the_same_logits_with_every_block_off_its_grid():
    from pipeline.model.rescale import rescale_channels

    model = _tiny_llama_on_a_grid()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
    layer = model.model.layers[0]
    assert _values_per_block(layer.mlp.down_proj.weight).max() <= 16
    q_rows = layer.self_attn.q_proj.weight.clone()
    assert rescale_channels(model, 0.3) == 7 * 2
    with torch.no_grad():
        after = model(ids).logits
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)
    for linear in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                   layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
        # 16 levels times BLOCK different factors: (nearly) every value of a block differs
        assert _values_per_block(linear.weight).float().mean() > 14, linear
    # columns scaled, not rows: the ratio of q_proj's new to old weights is one factor per column
    ratio = layer.self_attn.q_proj.weight / q_rows
    torch.testing.assert_close(ratio, ratio[:1].expand_as(ratio))
    assert ratio[0].std() > 0.1


def test_the_factors_are_seeded():
    from pipeline.model.rescale import rescale_channels

    a, b = _tiny_llama_on_a_grid(), _tiny_llama_on_a_grid()
    rescale_channels(a, 0.2)
    rescale_channels(b, 0.2)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_a_spread_outside_0_1_is_a_recipe_error():
    from pipeline.core.errors import RecipeError
    from pipeline.model.rescale import rescale_channels

    with pytest.raises(RecipeError, match=r"must be in \(0, 1\]"):
        rescale_channels(_tiny_llama_on_a_grid(), 1.5)


def test_the_transform_needs_a_gguf_checkpoint():
    from pydantic import ValidationError

    from pipeline.recipe.schema import TransformersSpec

    with pytest.raises(ValidationError, match="rescale_channels applies to a `gguf` checkpoint"):
        TransformersSpec(pretrained="some/dir", rescale_channels=0.1)
    assert TransformersSpec(gguf="model.gguf", rescale_channels=0.1).rescale_channels == 0.1
