"""Hugging Face `transformers` models as a model source, offline only.

`model.transformers.pretrained` names a local directory (sources.pretrained_dir resolves it);
`model.transformers.config` builds the architecture from a config with seeded random
weights. Nothing is ever downloaded: HF_HUB_OFFLINE=1 (core/env.py).

The wrapper fixes the calling convention the pipeline needs: positional inputs in the
recipe's order (input_ids [B, T], optional attention_mask [B, T]) and one output tensor:
  hidden_states       last_hidden_state [B, T, d]
  sentence_embedding  mean over unmasked tokens, L2-normalized [B, d] (sentence-transformers)
  logits              the LM head's logits [B, T, vocab]
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from pipeline.core import env
from pipeline.core.errors import RecipeError


class Wrapped(nn.Module):
    def __init__(self, model: nn.Module, task: str):
        super().__init__()
        self.model, self.task = model, task

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        if attention_mask is None:
            # transformers 5.x fails the TorchScript exporter (aten::diff) without an explicit
            # mask; all ones = no padding.
            attention_mask = torch.ones_like(input_ids)
        if self.task == "logits":
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.task == "hidden_states":
            return hidden  # [B, T, d]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # [B, d]
        return nn.functional.normalize(pooled, p=2, dim=1)


class IdsOnly(Wrapped):
    def forward(self, input_ids):
        return self.run(input_ids, None)


class IdsAndMask(Wrapped):
    def forward(self, input_ids, attention_mask):
        return self.run(input_ids, attention_mask)


def build(spec, input_names: list[str], pretrained: Path | None, where: str) -> nn.Module:
    """spec: the recipe's TransformersSpec; pretrained: its resolved local directory."""
    env.hf_offline()
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # "Loading weights" bars on stderr
    auto = transformers.AutoModelForCausalLM if spec.task == "logits" else transformers.AutoModel
    extra = {"attn_implementation": spec.attn_implementation} if spec.attn_implementation else {}
    if pretrained is not None:
        model = auto.from_pretrained(str(pretrained), **extra)
    else:
        config = dict(spec.config)
        try:
            cfg = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
        except (ValueError, KeyError, TypeError) as e:
            raise RecipeError(f"{where}: model.transformers.config: {e}") from None
        torch.manual_seed(spec.seed)  # from_config draws the random weights from torch's RNG
        model = auto.from_config(cfg, **extra)
    cls = IdsAndMask if len(input_names) == 2 else IdsOnly
    return cls(model.eval(), spec.task).eval()
