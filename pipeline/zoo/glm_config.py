"""Configuration of the GLM-style decoder: sizes and the knobs "flash" variants turn.

Kept apart from the torch module so that a recipe is validated without importing torch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# size -> (d_model, layers, heads, kv_heads, ffn_hidden, vocab)
SIZES = {
    "tiny": (64, 2, 4, 2, 192, 512),  # ~0.16M parameters: tests
    "small": (256, 4, 8, 2, 704, 4096),  # ~4.9M: quick benchmarks
    "base": (1024, 12, 16, 4, 2816, 32000),  # ~201M: GPU checks
}


class GLMConfig(BaseModel):
    """A decoder-only transformer in the GLM/Llama family: RMSNorm, RoPE, SwiGLU, GQA."""

    model_config = ConfigDict(extra="forbid")

    size: Literal["tiny", "small", "base"] = Field(
        "tiny", description="Preset of width, depth, heads and vocabulary (see SIZES)."
    )
    attention: Literal["dense", "sliding_window", "block_sparse"] = Field(
        "dense",
        description="Attention pattern. `dense` is causal attention; `sliding_window` and "
        "`block_sparse` mask it the way flash variants do (the mask is built in the graph).",
    )
    window: int = Field(16, ge=1, description="Tokens each query sees with `sliding_window`.")
    block: int = Field(8, ge=1, description="Block size of `block_sparse` attention.")
    ffn_prune: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="Share of FFN channels removed by structured pruning (lowest weight norm "
        "first), applied to the standard weights so pruned and standard models stay comparable.",
    )
    seed: int = Field(0, ge=0, le=2**63 - 1, description="Seed of the random weights.")

    @model_validator(mode="after")
    def _prune_leaves_channels(self) -> GLMConfig:
        hidden = SIZES[self.size][4]
        if int(round(hidden * (1 - self.ffn_prune))) < 1:
            raise ValueError(f"ffn_prune={self.ffn_prune} leaves no FFN channel of {hidden}")
        return self
