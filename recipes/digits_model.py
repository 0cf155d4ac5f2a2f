"""The classifier of recipes/digits.yaml: a small MLP over scikit-learn's 8x8 digit images.

Found by `model.factory: digits_model:build` because a factory module beside the recipe is
importable (the recipe's folder is searched first). Weights: data/digits/mlp.safetensors,
trained by tools/train_digits.py.
"""

from torch import nn


class DigitsMLP(nn.Module):
    """pixels [B, 64] float32 in [0, 1] (8x8 image, row-major) -> logits [B, 10]."""

    def __init__(self, hidden: int = 64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                  nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, pixels):
        return self.body(pixels)


def build(hidden: int = 64) -> DigitsMLP:
    return DigitsMLP(hidden).eval()
