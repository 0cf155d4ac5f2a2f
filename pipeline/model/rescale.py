"""A float checkpoint that was never 4-bit: a Llama-family model's weights moved off their grid,
the function kept.

A GGUF checkpoint de-quantized to float holds at most 16 values in each block of 32 (Q4_1's
d * q + m), and a 4-bit method with float zero points can find those blocks again: HQQ put
99.9% of de-quantized SmolLM2's blocks back on its grid (benchmarks/results/
int4-grid-2026-12-07.md), so on such weights a 4-bit method re-finds the grid instead of being
judged. `rescale_channels(model, spread)` multiplies each linear layer's input channel j by a
seeded factor s_j = exp(spread * N(0, 1)) and divides the same factor out where that channel
is made. The model computes the same function (up to float rounding) with weights that sit on
no 4-bit grid: AWQ's equivalence transform, with random factors instead of searched ones.

    input_layernorm.weight / s            q, k, v_proj.weight[:, j] * s_j   (RMSNorm's gain is per channel)
    post_attention_layernorm.weight / s   gate, up_proj.weight[:, j] * s_j
    v_proj.weight[k*D + d, :] / t[k, d]   o_proj.weight[:, h*D + d] * t[kv(h), d]
                                          (attention is linear in V; q head h reads kv head kv(h))
    up_proj.weight[j, :] / u_j            down_proj.weight[:, j] * u_j       (silu(gate) * up is linear in up)

q and k rows stay (the rotary embedding mixes pairs of them); the token embedding, the final
norm and the LM head tied to the embedding stay.
"""

from __future__ import annotations

from pipeline.core.errors import RecipeError

METHOD = "awq-eq1"  # in the converted folder's name: a change of the transform converts again
SEED = 0


def scale_columns(linear, s) -> None:
    """weight [out, in] * s [in]: the linear's input channels scaled."""
    linear.weight.mul_(s.to(linear.weight.dtype))


def divide_rows(module, s) -> None:
    """weight [out, ...] / s [out]: the channels the module makes, divided."""
    shape = (-1,) + (1,) * (module.weight.dim() - 1)
    module.weight.div_(s.to(module.weight.dtype).reshape(shape))


def fold(maker, consumers, s) -> None:
    """The equivalence both transforms rest on: the consumers' input channels times s, the
    maker's output channels (a norm's gain, a linear's rows) over s; the function is unchanged."""
    for linear in consumers:
        scale_columns(linear, s)
    divide_rows(maker, s)


def rescale_channels(model, spread: float, seed: int = SEED) -> int:
    """Rescale every decoder layer of a Llama-family causal LM in place; returns the number of
    weight matrices moved off their grid."""
    import torch

    if not 0 < spread <= 1:
        raise RecipeError(f"model.transformers.rescale_channels: {spread} must be in (0, 1] "
                          "(the standard deviation of the log of each channel's factor)")
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    generator = torch.Generator().manual_seed(seed)

    def factors(*shape: int) -> torch.Tensor:
        return torch.exp(spread * torch.randn(*shape, generator=generator))

    moved = 0
    with torch.no_grad():
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            if any(getattr(m, "bias", None) is not None for m in (attn.v_proj, mlp.up_proj)):
                raise RecipeError("model.transformers.rescale_channels: v_proj or up_proj has a bias; "
                                  "the transform divides their rows and supports bias-free layers only")
            fold(layer.input_layernorm, (attn.q_proj, attn.k_proj, attn.v_proj), factors(config.hidden_size))
            t = factors(kv_heads, head_dim)  # the attention output's channels, per kv head
            divide_rows(attn.v_proj, t.reshape(-1))
            group = heads // kv_heads
            scale_columns(attn.o_proj, t.repeat_interleave(group, dim=0).reshape(-1))  # [heads * D]
            fold(layer.post_attention_layernorm, (mlp.gate_proj, mlp.up_proj), factors(config.hidden_size))
            fold(mlp.up_proj, (mlp.down_proj,), factors(mlp.down_proj.weight.shape[1]))  # the FFN's channels
            moved += 7
    return moved
