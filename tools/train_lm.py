"""Train the tiny GLM (pipeline/zoo/glm.py, size `tiny`) as a byte-level causal LM on
Shakespeare (data/shakespeare/train.txt, public domain) and store its weights as safetensors.

Why: perplexity only means something for a model that has learned language, and no small
pretrained causal LM ships offline. A byte-level tokenizer (token id = UTF-8 byte, 0..255;
the tiny GLM's vocabulary is 512, ids 256..511 are never used) is honest and needs no files.

    nice -n 10 python tools/train_lm.py --seconds 300      # ~5 min on 2 CPU cores

The recipes `lm-*` load the result with model.zoo: glm, kwargs {size: tiny},
weights: data/lm/glm-tiny-shakespeare.safetensors. Held-out loss is printed at the end
(on data/shakespeare/validation.jsonl, which the training text does not contain).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.zoo.glm import build

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "data/shakespeare/train.txt"
HELD_OUT = ROOT / "data/shakespeare/validation.jsonl"
OUT = ROOT / "data/lm/glm-tiny-shakespeare.safetensors"


def batches(ids: np.ndarray, batch: int, length: int, rng: np.random.Generator):
    """Random windows [B, T+1] of the byte stream: input ids and next-byte targets."""
    while True:
        start = rng.integers(0, ids.size - length - 1, size=batch)
        window = np.stack([ids[s:s + length + 1] for s in start])  # [B, T+1]
        yield torch.from_numpy(window[:, :-1]), torch.from_numpy(window[:, 1:])


@torch.no_grad()
def held_out_loss(model) -> float:
    """Mean next-byte NLL (nats) over the held-out passages, as validate.task perplexity does."""
    total, count = 0.0, 0
    for line in HELD_OUT.read_text(encoding="utf-8").splitlines():
        ids = torch.tensor([list(json.loads(line)["text"].encode())[:128]])
        logits = model(ids)[0, :-1]  # [T-1, vocab]
        total += float(F.cross_entropy(logits, ids[0, 1:], reduction="sum"))
        count += ids.shape[1] - 1
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    ids = np.frombuffer(TRAIN.read_bytes(), dtype=np.uint8).astype(np.int64)
    model = build(size="tiny", seed=0).train()
    with torch.no_grad():  # the zoo's N(0, 1) head suits random-weight tests, not training
        model.head.weight.mul_(0.02)
        model.embed.weight.mul_(0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    data = batches(ids, args.batch, args.length, np.random.default_rng(0))
    t0, step, smooth = time.perf_counter(), 0, None
    while (elapsed := time.perf_counter() - t0) < args.seconds:
        # cosine decay over the time budget, short warm-up
        lr = args.lr * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * elapsed / args.seconds))
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = next(data)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        smooth = float(loss) if smooth is None else 0.98 * smooth + 0.02 * float(loss)
        if step % 200 == 0:
            print(f"step {step:5d}  {elapsed:6.0f} s  train loss {smooth:.3f}", flush=True)
        step += 1
    model.eval()
    held = held_out_loss(model)
    from safetensors.torch import save_file

    OUT.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(OUT), metadata={
        "model": "pipeline.zoo.glm size=tiny", "tokenizer": "bytes (UTF-8, ids 0..255)",
        "data": "data/shakespeare/train.txt", "steps": str(step), "seconds": f"{elapsed:.0f}",
        "held_out_nll": f"{held:.4f}"})
    print(f"{step} steps in {elapsed:.0f} s; held-out NLL {held:.3f} nats/byte "
          f"(perplexity {math.exp(held):.2f}); wrote {OUT.relative_to(ROOT)} "
          f"({OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
