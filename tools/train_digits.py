"""Train recipes/digits_model.py's MLP on scikit-learn's digits (offline, 1797 8x8 images)
and write the shipped data: data/digits/{calibration,validation}.npz and mlp.safetensors.

Split (seeded shuffle): 1157 images train, 128 calibration, 512 validation; the three are
disjoint. Pixels are scaled from 0..16 to [0, 1]. Runs in seconds on a CPU:

    python tools/train_digits.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from sklearn.datasets import load_digits

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data/digits"
sys.path.insert(0, str(ROOT / "recipes"))
from digits_model import build  # noqa: E402


def main() -> None:
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)  # [1797, 64]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    train, calib, valid = order[:1157], order[1157:1285], order[1285:]
    torch.manual_seed(0)
    model = build().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    xt, yt = torch.from_numpy(x[train]), torch.from_numpy(y[train])
    for _epoch in range(60):
        for idx in torch.randperm(len(train)).split(64):
            loss = F.cross_entropy(model(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(torch.from_numpy(x[valid])).argmax(1).numpy() == y[valid]).mean()
    OUT.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(OUT / "mlp.safetensors"),
              metadata={"data": "sklearn.datasets.load_digits, 1157 training images",
                        "validation_accuracy": f"{acc:.4f}"})
    np.savez(OUT / "calibration.npz", pixels=x[calib], labels=y[calib])
    np.savez(OUT / "validation.npz", pixels=x[valid], labels=y[valid])
    print(f"validation accuracy {acc:.4f} on {len(valid)} images; wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
