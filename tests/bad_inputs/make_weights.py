"""Writes the small .safetensors files of the bad-input corpus (numpy only; rerun to recreate).

    python tests/bad_inputs/make_weights.py
"""

from pathlib import Path

import numpy as np
from safetensors.numpy import save, save_file

HERE = Path(__file__).resolve().parent

# tiny GLM names: embed.weight [512, 64], blocks.0.attn_norm.weight [64] (float32)
save_file({"encoder.embed.weight": np.zeros((4, 4), np.float32)}, HERE / "wrong_keys.safetensors")
save_file({"embed.weight": np.zeros((3, 3), np.float32)}, HERE / "wrong_shape.safetensors")
save_file({"blocks.0.attn_norm.weight": np.zeros(64, np.int32)}, HERE / "wrong_dtype.safetensors")
whole = save({"embed.weight": np.zeros((16, 16), np.float32)})
(HERE / "truncated.safetensors").write_bytes(whole[: len(whole) // 2])
(HERE / "garbage.safetensors").write_bytes(b"PK\x03\x04 not a safetensors file, a zip header and text\n")
