"""Small models built in code for tests (recipes point at them with `model.factory`), shared
by the modules that build them (precision/test_int8.py, commands/test_tune.py, ...)."""

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


def tiny_cnn(seed: int = 0):
    """x [B, 3, 16, 16] -> logits [B, 10]: Conv 3->16, Conv 16->32 (ReLU), mean pool, Linear."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).eval()


def tiny_mlp(seed: int = 0):
    """x [B, T, 64] -> y [B, T, 64]: LayerNorm, Linear 64->128, GELU, Linear 128->64."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).eval()
