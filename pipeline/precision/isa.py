"""The CPU's integer dot-product instructions, which decide how int8 weights may be used.

On x86 ONNX Runtime multiplies uint8 activations by int8 weights (u8 x s8). With VNNI
(AVX512-VNNI or AVX-VNNI) VPDPBUSD accumulates in int32. Without it, the AVX2 kernels use
VPMADDUBSW, which adds each pair of u8 x s8 products into a *saturating int16*: 255 x 127
x 2 = 64770 does not fit in 32767. Static Q/DQ makes this worse than it looks: symmetric
int8 activations are shifted to uint8 with zero point 128 before the integer kernel, so
every activation near zero is ~128 and two full-range weights of the same sign already
reach the limit. ONNX Runtime's documented remedy is reduce_range (7-bit weights,
[-64, 63]: 255 x 64 x 2 = 32640 fits). standard-int8 reached worst cosine 0.9975 on an
AVX2-only EPYC (issue 16) and 0.99976 on an AVX512-VNNI one (2026-12-01), same recipe;
benchmarks/int8_saturation.py emulates the AVX2 kernel on its MatMuls: 0.0001-0.12% of
pairs saturate, 0.4-5.7% relative error per product, ~10x int8 rounding.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.core.json_object import JsonObject

VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def has_vnni() -> bool:
    return any(f in cpu_flags() for f in VNNI_FLAGS)


def needs_reduced_range() -> bool:
    """x86 without VNNI: full-range int8 weights can saturate the u8 x s8 kernels."""
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
    return x86 and not has_vnni()


def reduce_range(weight_range: str) -> bool:
    return weight_range == "reduced" or (weight_range == "auto" and needs_reduced_range())


@dataclass(frozen=True)
class Int8Cpu:
    """What this CPU offers int8 kernels: its machine, the int8-relevant flags, VNNI or not."""

    machine: str
    int8_flags: list[str]
    vnni: bool

    def dump(self) -> JsonObject:
        return asdict(self)


def describe() -> Int8Cpu:
    flags = cpu_flags()
    return Int8Cpu(machine=platform.machine(),
                   int8_flags=sorted(f for f in flags if f in VNNI_FLAGS + ("avx2", "avx512f", "avx512bw")),
                   vnni=has_vnni())
