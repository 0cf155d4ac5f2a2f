"""Give the heap's freed memory back to the system.

glibc keeps memory that Python, numpy and ONNX Runtime free in its heaps for reuse, and a
process that allocated large arrays and freed them (a check of a long prefill, run after run)
stays at its high-water mark: smollm2-long's optimize stage crept up ~1 GB a pass. `trim`
asks glibc to return what is free (malloc_trim); elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl): nothing to trim
        return None


def trim() -> bool:
    """malloc_trim(0); True when glibc released anything."""
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0))
