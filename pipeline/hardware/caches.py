"""This CPU's data caches, as Linux reports them (/sys/devices/system/cpu/cpu0/cache), to
size the working sets that measure each level's bandwidth.

Each cache is one level's size and the CPUs sharing one instance: L1d and L2 are per core on
today's x86 parts, L3 is shared by a group of cores (a CCX on AMD, the socket on Intel).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SYS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
# Used only where /sys says nothing (a container that hides it): typical of a server core.
ASSUMED = {1: 32 << 10, 2: 1 << 20, 3: 32 << 20}


@dataclass(frozen=True)
class Cache:
    level: int
    size_bytes: int
    shared_by: int  # CPUs sharing one instance
    source: str  # "/sys" or "assumed"


def _size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text)
    if match is None:
        raise ValueError(text)
    return int(match[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[match[2]]


def _cpu_count(cpu_list: str) -> int:
    """'0-1,4' -> 3."""
    count = 0
    for part in cpu_list.strip().split(","):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1
    return count


def data_caches(root: Path = SYS_CACHE) -> list[Cache]:
    """L1 data, L2 and L3 (unified), lowest first; assumed sizes where /sys lacks them."""
    found: dict[int, Cache] = {}
    for index in sorted(root.glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            size = _size((index / "size").read_text())
            shared = _cpu_count((index / "shared_cpu_list").read_text())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and level not in found:
            found[level] = Cache(level, size, shared, "/sys")
    for level, size in ASSUMED.items():
        found.setdefault(level, Cache(level, size, 1 if level < 3 else 0, "assumed"))
    return [found[level] for level in sorted(found) if level in ASSUMED]
