"""The zoo GLM with a KV cache: one graph for prefill and decode, past length dynamic.

    input_ids       [B, T]          int64   the new tokens (prompt at prefill, one at decode)
    attention_mask  [B, P + T]      int64   1 for every real token of past and new ones
    past_key_values.{i}.key/value   [B, KV, P, hd] float32, P = 0 at the first prefill
 -> logits          [B, T, vocab]
    present.{i}.key/value           [B, KV, P + T, hd]  (past with the new tokens appended)

The names and layouts are the ones onnxruntime-genai's decoder expects (genai_config.json
maps them), and the cache stays grouped (KV heads, not query heads). The wrapper reuses the
GLM's own modules and weights (no copy), so a flash variant's pruned FFN and its sparse
attention pattern are what the cached graph computes: the mask is written over absolute
positions (past + new), matching the GLM's full-sequence forward token for token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.zoo.glm import GLM


def rope_tables(inv_freq: torch.Tensor, start: torch.Tensor | int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [1, 1, T, hd] for absolute positions start..start+T-1 (Llama form)."""
    positions = torch.arange(t, device=inv_freq.device).float() + start  # [T]
    freqs = positions[:, None] * inv_freq[None, :].float()  # [T, hd/2]
    angles = torch.cat((freqs, freqs), dim=-1)  # [T, hd]
    return angles.cos()[None, None], angles.sin()[None, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def cached_mask(cfg, past: torch.Tensor | int, t: int, attention_mask: torch.Tensor) -> torch.Tensor:
    """Boolean [B, 1, T, P + T] (True = may attend): causal over absolute positions, the
    variant's sparse pattern, and the padding mask."""
    total = attention_mask.shape[1]
    q = torch.arange(t, device=attention_mask.device)[:, None] + past  # absolute query positions
    k = torch.arange(total, device=attention_mask.device)[None, :]
    allowed = k <= q
    if cfg.attention == "sliding_window":
        allowed = allowed & (q - k < cfg.window)
    elif cfg.attention == "block_sparse":
        qb, kb = q // cfg.block, k // cfg.block
        allowed = allowed & ((kb == qb) | (kb == qb - 1) | (kb == 0))
    return allowed[None, None] & attention_mask[:, None, None, :].bool()


def decode_layers(glm: GLM, input_ids: torch.Tensor, past_len, attention_mask: torch.Tensor, extend):
    """The GLM's blocks over new tokens at absolute positions past_len..; `extend(i, k, v)` adds
    layer i's new keys/values [B, KV, T, hd] to its cache and returns the whole cache
    [B, KV, P + T, hd]. Returns the logits [B, T, vocab]."""
    b, t = input_ids.shape
    x = glm.embed(input_ids)  # [B, T, d]
    cos, sin = rope_tables(glm.blocks[0].attn.inv_freq, past_len, t)
    # additive float mask [B, 1, T, P + T]: the form SDPA-to-attention fusions match
    mask = torch.zeros((), dtype=torch.float32).masked_fill(
        ~cached_mask(glm.cfg, past_len, t, attention_mask), torch.finfo(torch.float32).min)
    for i, block in enumerate(glm.blocks):
        a = block.attn
        h = block.attn_norm(x)
        q = a.q(h).view(b, t, a.heads, a.head_dim).transpose(1, 2)  # [B, H, T, hd]
        k = a.k(h).view(b, t, a.kv_heads, a.head_dim).transpose(1, 2)  # [B, KV, T, hd]
        v = a.v(h).view(b, t, a.kv_heads, a.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = extend(i, k, v)  # [B, KV, P + T, hd]
        # GQA: the cache stays grouped; each group of heads // kv_heads query heads shares
        # one key/value head (exported at opset 23 as ONNX Attention with kv_num_heads)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        x = x + a.o(out.transpose(1, 2).reshape(b, t, -1))
        x = x + block.ffn(block.ffn_norm(x))
    return glm.head(glm.norm(x))


class GLMWithPast(nn.Module):
    """(input_ids, attention_mask, *past) -> (logits, *present), past as key, value per layer:
    the graph that is exported (the cache grows by concatenation)."""

    def __init__(self, glm: GLM):
        super().__init__()
        self.glm = glm
        first = glm.blocks[0].attn
        self.layers, self.kv_heads, self.head_dim = len(glm.blocks), first.kv_heads, first.head_dim

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *past: torch.Tensor):
        presents: list[torch.Tensor] = []

        def extend(i, k, v):
            k, v = torch.cat((past[2 * i], k), dim=2), torch.cat((past[2 * i + 1], v), dim=2)
            presents.extend((k, v))
            return k, v

        logits = decode_layers(self.glm, input_ids, past[0].shape[2], attention_mask, extend)
        return (logits, *presents)


class StaticCacheGLM:
    """The PyTorch baseline's decoder: the GLM over a static KV cache, preallocated for the
    longest context and written in place (no reallocation per token, as transformers'
    StaticCache). `reset(batch)` empties it; `__call__(ids)` appends ids and returns logits."""

    def __init__(self, glm: GLM, max_len: int):
        first = glm.blocks[0].attn
        self.glm, self.max_len = glm, max_len
        self.shape = (len(glm.blocks), first.kv_heads, first.head_dim)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.length = 0

    def reset(self, batch: int) -> None:
        layers, kv_heads, head_dim = self.shape
        if not self.keys or self.keys[0].shape[0] != batch:
            self.keys = [torch.zeros(batch, kv_heads, self.max_len, head_dim) for _ in range(layers)]
            self.values = [torch.zeros_like(k) for k in self.keys]
        self.length = 0

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        p, t = self.length, input_ids.shape[1]
        if p + t > self.max_len:
            raise ValueError(f"context {p + t} exceeds the static cache ({self.max_len} tokens)")

        def extend(i, k, v):
            self.keys[i][:, :, p:p + t] = k
            self.values[i][:, :, p:p + t] = v
            return self.keys[i][:, :, :p + t], self.values[i][:, :, :p + t]

        mask = torch.ones(input_ids.shape[0], p + t, dtype=torch.int64)
        logits = decode_layers(self.glm, input_ids, p, mask, extend)
        self.length = p + t
        return logits[:, -1]  # [B, vocab]: the next token's
