"""One round's arithmetic at the closer, fused: merge the deltas and take the outer step.

Theory of operation
-------------------
Merging then stepping as two passes writes the merged delta to memory and reads
it back. For the weighted mean, this module instead walks the fragment once, block
by block: the block's merged delta is accumulated in a cache-resident scratch and
consumed at once by the Nesterov update of the same block. Elementwise it performs
exactly the operations of :func:`~gm_core.numerics.merge.merge` followed by
:func:`~gm_core.numerics.outer.outer_step`, so its result is bit-identical to
theirs. RDA needs a tensor's full mean before its scale is known; RDA tensors go
through a per-tensor merge into ``scratch`` then the same step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gm_core.numerics.arrays import F32, check_flat
from gm_core.numerics.blocks import BLOCK, blocks
from gm_core.numerics.layout import Layout
from gm_core.numerics.merge import Contributions, accumulate, merge, uses_rda
from gm_core.numerics.outer import nesterov_block, outer_step
from gm_core.records import MergeRule


def merge_step(
    deltas: Sequence[F32],
    contributions: Contributions,
    layout: Layout,
    rule: MergeRule,
    embedding_pattern: str,
    theta: F32,
    momentum: F32,
    lr: float,
    beta: float,
) -> None:
    """Merge ``deltas`` and commit them into ``theta``/``momentum`` in place."""
    n = layout.total
    check_flat(theta, n, "theta")
    check_flat(momentum, n, "momentum")
    sorts = contributions.trim > 0  # a robust rule needs every delta of a block at once
    if (
        contributions.all_final
        or sorts
        or any(uses_rda(s, rule, embedding_pattern) for s in layout.spans)
    ):
        merged = np.empty(n, dtype=np.float32)
        merge(deltas, contributions, layout, rule, embedding_pattern, merged)
        outer_step(theta, momentum, merged, lr, beta, final_only=contributions.all_final)
        return
    assert len(deltas) == len(contributions.learners), "one delta per contribution"
    for i, delta in enumerate(deltas):
        check_flat(delta, n, f"delta {i}")
    coefs = contributions.coefficients()
    acc_buffer = np.empty(min(BLOCK, n), dtype=np.float32)
    tmp_buffer = np.empty(min(BLOCK, n), dtype=np.float32)
    for lo, hi in blocks(0, n):
        acc = acc_buffer[: hi - lo]
        accumulate([d[lo:hi] for d in deltas], coefs, acc, (0, hi - lo), None, tmp_buffer)
        nesterov_block(theta[lo:hi], momentum[lo:hi], acc, lr, beta, tmp_buffer[: hi - lo])
