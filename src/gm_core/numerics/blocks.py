"""Cache-sized blocks for streaming passes over long buffers.

Theory of operation
-------------------
A merge touches every element of k deltas, the parameters and the momentum.
Done as whole-buffer operations, every intermediate result would round-trip
through main memory; done block by block, the intermediates stay in the L2
cache and main memory sees each input read once and each output written once.
Every backend walks the same blocks so that results do not depend on the block
size chosen by one of them (elementwise operations are block-independent; only
the partial sums of norms and dot products follow the block boundaries).
"""

from __future__ import annotations

from collections.abc import Iterator

BLOCK = 1 << 16
"""Elements per block: 256 KiB of fp32, a few of which fit together in L2. A multiple of 32,
so F4 scale blocks never straddle two streaming blocks."""


def blocks(start: int, stop: int, block: int = BLOCK) -> Iterator[tuple[int, int]]:
    """Yield ``(lo, hi)`` covering ``[start, stop)`` in steps of ``block``."""
    for lo in range(start, stop, block):
        yield lo, min(lo + block, stop)
