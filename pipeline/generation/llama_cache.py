"""transformers causal LMs of the Llama family with a KV cache, in the pipeline's layouts.

LlamaWithPast: the graph that is exported, (input_ids, attention_mask, *past) -> (logits,
*present) with past/present [B, KV, P, hd] per layer (transformers' own cache layout, kept
grouped): the flat tensors are wrapped into a DynamicCache for the model and unwrapped after.
StaticCacheLlama: the PyTorch baseline, transformers' StaticCache (preallocated, written in
place), greedy next-token logits.
"""

from __future__ import annotations

import torch
from torch import nn


class LlamaWithPast(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *past: torch.Tensor):
        from transformers import DynamicCache

        pairs = [(past[2 * i], past[2 * i + 1]) for i in range(len(past) // 2)]
        cache = DynamicCache(pairs, config=self.model.config)
        p = past[0].shape[2]
        # [B, T]: one row per sequence (ONNX RotaryEmbedding takes cos/sin of x's batch, no broadcast)
        positions = (torch.arange(input_ids.shape[1], device=input_ids.device)[None] + p).expand(
            input_ids.shape[0], -1)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, cache=cache,
                         position_ids=positions, use_cache=True)
        presents = []
        for layer in out.cache.layers:
            presents += [layer.keys, layer.values]
        return (out.logits, *presents)


class StaticCacheLlama:
    """reset(batch) empties the cache; __call__(ids [B, T]) appends and returns next logits [B, V]."""

    def __init__(self, model: nn.Module, max_len: int):
        self.model, self.max_len = model, max_len
        self.cache, self.batch = None, None
        self.length = 0

    def reset(self, batch: int) -> None:
        from transformers import StaticCache

        if self.cache is None or batch != self.batch:  # its buffers take the first batch's size
            self.cache, self.batch = StaticCache(config=self.model.config, max_cache_len=self.max_len), batch
        else:
            with torch.inference_mode():  # its tensors were made under the runner's inference mode
                self.cache.reset()  # zeroed in place, no reallocation
        self.length = 0

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        position = torch.arange(self.length, self.length + t)
        out = self.model(input_ids=input_ids, cache=self.cache, cache_position=position,
                         position_ids=position[None].expand(input_ids.shape[0], -1), use_cache=True)
        self.length += t
        return out.logits[:, -1]
