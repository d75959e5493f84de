"""The C allocator's hold on big buffers gm frees (glibc only; elsewhere nothing is done).

glibc's malloc serves a buffer of 128 KiB or more with its own ``mmap`` and gives it back
on ``free``, but it then raises that threshold to the size just freed (up to 32 MiB):
from the second payload on, a fragment's buffers (decoded deltas, commits, momentum,
captures, sealed bytes: megabytes each) come from the heap, where a freed one stays
resident until everything above it is freed too. With a 16 MiB model (one fragment) that
left a learner 120-160 MiB and a closer-learner 170-240 MiB above what they held (issue 12:
spec/threat-model.md §4.9, and ``bench/bench_memory.py``). A fixed threshold
(``mallopt(M_MMAP_THRESHOLD)``, which also stops the raising) sends every buffer of
``threshold`` bytes or more to ``mmap`` for good, so memory that gm frees leaves the
process at once (and a buffer of that size is faulted in afresh each time: a cost).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from typing import Any

M_MMAP_THRESHOLD = -3
"""mallopt's parameter number (malloc.h)."""
MAX_MMAP_THRESHOLD = 32 << 20
"""glibc refuses a fixed threshold above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit)."""


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 (musl has none: its malloc is another)
    except (OSError, AttributeError):
        return None
    return libc


def fix_mmap_threshold(threshold: int) -> bool:
    """Serve every allocation of ``threshold`` bytes or more (at most 32 MiB) with its own
    mapping, returned to the system when freed, for the rest of the process; False where
    the C library is not glibc or refuses the value (nothing changed)."""
    if not 0 < threshold <= MAX_MMAP_THRESHOLD:
        raise ValueError(f"an mmap threshold of {threshold} bytes is not in (0, 32 MiB]")
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(threshold)))


class _Mallinfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (malloc.h, glibc 2.33+): sizes in bytes."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


@functools.cache
def _mallinfo2() -> Any:
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    fn = libc.mallinfo2
    fn.restype = _Mallinfo2
    fn.argtypes = []
    return fn


def malloc_figures() -> dict[str, int]:
    """Bytes the C allocator holds: in use on its heaps, in its own mappings, and free on
    its heaps (resident until given back, or reused); empty where it is not glibc 2.33+."""
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        return {}
    info = mallinfo2()
    return {"heap_used": info.uordblks, "mapped": info.hblkhd, "heap_free": info.fordblks}
