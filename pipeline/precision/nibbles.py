"""MatMulNBits' 4-bit layout: two values a byte, the even-indexed one in the low nibble.

Codes [N, K/block, block] become [N, K/block, block/2] bytes; 4-bit zero points [N, blocks]
become [N, ceil(blocks/2)] bytes, an odd count padded with a zero nibble.
"""

from __future__ import annotations

import numpy as np


def pack_nibbles(values: np.ndarray) -> np.ndarray:
    """[..., n] values in 0..15 -> [..., ceil(n/2)] uint8 (element 2j low nibble, 2j+1 high)."""
    values = np.asarray(values, np.uint8)
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros((*values.shape[:-1], 1), np.uint8)], axis=-1)
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(packed: np.ndarray, count: int) -> np.ndarray:
    """pack_nibbles' inverse: [..., ceil(count/2)] uint8 -> [..., count] values in 0..15."""
    values = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    return values[..., :count]
