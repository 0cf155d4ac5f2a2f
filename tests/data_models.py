"""Small models for the data and export-defect tests (`model.factory: tests.data_models:...`)."""

from __future__ import annotations


def _torch():
    import torch
    from torch import nn

    return torch, nn


def changes_when_traced():
    """x [B, 4] -> y [B, 4]. Tracing it (TorchScript export) changes the instance's later
    eager outputs, as a trace does to a transformers 5 model: only a fresh instance is a
    reference for the exported graph."""
    torch, nn = _torch()

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = nn.Linear(4, 4)
            self.drift = 0.0  # a Python float: the trace bakes in 0.0

        def forward(self, x):
            out = self.lin(x) + self.drift
            if torch.jit.is_tracing():
                self.drift = 1.0
            return out

    return Model().eval()


def query_key():
    """forward(query, key) -> query - key: the order of the inputs matters."""
    torch, nn = _torch()

    class Model(nn.Module):
        def forward(self, query, key):
            return query - 2 * key

    return Model().eval()


def fails_when_exporting():
    """Runs eagerly, fails inside torch.export the way a shadowed `triton` package did."""
    torch, nn = _torch()

    class Model(nn.Module):
        def forward(self, x):
            if torch.compiler.is_exporting():
                raise AttributeError("module 'triton' has no attribute 'language'")
            return x * 2

    return Model().eval()


def tiny_bert():
    """A transformers 5 BertModel itself (random weights, offline): forward(input_ids,
    attention_mask, ...) returns (last_hidden_state, pooler_output)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import BertConfig, BertModel

    torch, _ = _torch()
    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    return BertModel(config).eval()
