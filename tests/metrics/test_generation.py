"""generation/figures.py: token agreement and its first divergence, the KV cache's bytes per token."""

from __future__ import annotations

import numpy as np

from pipeline.generation import figures as gm


def test_agreement_names_the_first_divergence():
    ref = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    got = ref.copy()
    assert gm.agreement(ref, got).model_dump() == {"share": 1.0, "tokens": 8, "first_divergence": None}
    got[1, 2] = 0
    got[0, 3] = 0
    out = gm.agreement(ref, got)
    assert out.first_divergence == 2 and out.share == 6 / 8


def test_kv_bytes_per_token_counts_keys_and_values_of_every_layer():
    assert gm.kv_bytes_per_token(layers=2, kv_heads=2, head_dim=16) == 2 * 2 * 2 * 16 * 4
