"""Small models built in code for tests (recipes point at them with `model.factory`)."""

from __future__ import annotations


def tanh_gelu_mlp(width: int = 32, hidden: int = 64, seed: int = 0):
    """x [B, T, width] -> y [B, T, 8] through Linear, tanh-approximate GELU, Linear.

    Exported, the first Linear is MatMul + Add followed by Gelu(approximate="tanh"): the
    pattern ORT's transformers optimizer fuses into BiasGelu, which computes exact GELU.
    """
    import torch
    from torch import nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, 8)

        def forward(self, x):
            return self.down(nn.functional.gelu(self.up(x), approximate="tanh"))

    torch.manual_seed(seed)
    return MLP().eval()
