"""A GLM-style decoder-only transformer with the knobs "flash" variants turn.

RMSNorm, rotary position embeddings, SwiGLU feed-forward, grouped-query attention; the
attention pattern (dense / sliding window / block sparse) and structured FFN pruning are
variant knobs. Pruning is applied to the *standard* weights of the same seed, so a flash
variant is the standard model with parts removed, and the two stay comparable.

Written for clean ONNX export: masks and rotary tables are computed from the runtime
sequence length (no fixed-size buffers to slice), shapes stay symbolic.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.zoo.glm_config import SIZES, GLMConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Written out (not F.rms_norm) so graph rewriters recognise the pattern.
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + d/2) of x [B, H, T, d] by position-dependent angles.

    Written in the Llama form (x * cos + rotate_half(x) * sin, angles from inv_freq x
    positions) so graph rewriters recognise it and fuse it into one RotaryEmbedding kernel.
    """
    b, t = x.shape[0], x.shape[-2]
    positions = torch.arange(t, device=x.device).unsqueeze(0).expand(b, -1)  # [B, T] position ids
    inv = inv_freq[None, :, None].float().expand(b, -1, 1)  # [B, d/2, 1]
    freqs = inv @ positions[:, None, :].float()  # [B, d/2, T]
    angles = torch.cat((freqs.transpose(1, 2),) * 2, dim=-1)  # [B, T, d]
    cos, sin = angles.cos().to(x.dtype)[:, None], angles.sin().to(x.dtype)[:, None]  # [B, 1, T, d]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def attention_mask(t: int, cfg: GLMConfig, device: torch.device) -> torch.Tensor | None:
    """Boolean [T, T] mask (True = may attend) for the sparse patterns; None for dense."""
    if cfg.attention == "dense":
        return None
    q = torch.arange(t, device=device)[:, None]
    k = torch.arange(t, device=device)[None, :]
    causal = k <= q
    if cfg.attention == "sliding_window":
        return causal & (q - k < cfg.window)
    # block_sparse: each query block sees itself, the previous block and the first (global) one
    qb, kb = q // cfg.block, k // cfg.block
    return causal & ((kb == qb) | (kb == qb - 1) | (kb == 0))


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, cfg: GLMConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.cfg = cfg
        self.q = nn.Linear(d, heads * self.head_dim, bias=False)
        self.k = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, d, bias=False)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)  # [B, H, T, hd]
        k = self.k(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)  # [B, KV, T, hd]
        v = self.v(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotary(q, self.inv_freq), rotary(k, self.inv_freq)
        # GQA: each group of heads // kv_heads query heads shares one key/value head.
        rep = self.heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=1)  # [B, H, T, hd]
        v = v.repeat_interleave(rep, dim=1)
        mask = attention_mask(t, self.cfg, x.device)
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o(out.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))

    @torch.no_grad()
    def prune(self, ratio: float) -> None:
        """Keep the channels whose gate, up and down weights carry the most norm."""
        hidden = self.gate.out_features
        keep = int(round(hidden * (1 - ratio)))
        score = self.gate.weight.norm(dim=1) * self.up.weight.norm(dim=1) * self.down.weight.norm(dim=0)
        idx = score.topk(keep).indices.sort().values
        for name, lin, dim in (("gate", self.gate, 0), ("up", self.up, 0), ("down", self.down, 1)):
            w = lin.weight.index_select(dim, idx)
            new = nn.Linear(w.shape[1], w.shape[0], bias=False)
            new.weight.copy_(w)
            setattr(self, name, new)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, hidden: int, cfg: GLMConfig):
        super().__init__()
        self.attn_norm = RMSNorm(d)
        self.attn = Attention(d, heads, kv_heads, cfg)
        self.ffn_norm = RMSNorm(d)
        self.ffn = SwiGLU(d, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class GLM(nn.Module):
    """input_ids [B, T] int64 -> logits [B, T, vocab] float32."""

    def __init__(self, cfg: GLMConfig):
        super().__init__()
        d, layers, heads, kv_heads, hidden, vocab = SIZES[cfg.size]
        self.cfg = cfg
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, kv_heads, hidden, cfg) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)  # [B, T, d]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # [B, T, vocab]

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Seeded, order-stable init: N(0, 1) embeddings and head, N(0, 1/fan_in) projections,
        the residual branches' output projections scaled down by sqrt(2 * layers) (GPT-2's
        scaled init) so the residual stream keeps unit scale through the depth.

        An N(0, 1) head (as if tied to the embeddings) gives logits of std sqrt(d), peaked like
        a trained model's, so top-1 agreement measures something on random weights.
        """
        gen = torch.Generator().manual_seed(seed)
        residual_scale = 1.0 / math.sqrt(2 * len(self.blocks))
        for name, p in sorted(self.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif p.dim() == 2 and not name.startswith(("embed", "head")):
                scale = residual_scale if name.endswith(("attn.o.weight", "ffn.down.weight")) else 1.0
                p.copy_(torch.randn(p.shape, generator=gen) * (scale / math.sqrt(p.shape[1])))
            else:
                p.copy_(torch.randn(p.shape, generator=gen))


def build(**kwargs) -> GLM:
    """The recipe's `model.kwargs` (validated against GLMConfig) -> a model in eval mode."""
    cfg = GLMConfig.model_validate(kwargs)
    model = GLM(cfg)
    model.init_weights(cfg.seed)
    if cfg.ffn_prune > 0:
        for block in model.blocks:
            block.ffn.prune(cfg.ffn_prune)
    return model.eval()
