"""One round's arithmetic at the closer, fused: merge the deltas and take the outer step.

Theory of operation
-------------------
Merging then stepping as two passes writes the merged delta to memory and reads
it back. For the weighted mean, this module instead walks the fragment once, block
by block: the block's merged delta is accumulated in a cache-resident scratch and
consumed at once by the Nesterov update of the same block. Elementwise it performs
exactly the operations of :func:`~gm_core.numerics.merge.merge` followed by
:func:`~gm_core.numerics.outer.outer_step`, so its result is bit-identical to
theirs. So do a final-only round (``Θ − Δ`` a block at a time; the momentum is not
touched) and a robust rule (each block's trimmed mean from a ``k × block`` stack): no
merged delta of the fragment's size is ever made, which on a closer whose fragment is
the whole model is a model's bytes less at the peak. RDA needs a tensor's full mean
before its scale is known; RDA tensors go through a merge into a fragment-sized buffer
then the same step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from gm_core.numerics.arrays import F32, check_flat
from gm_core.numerics.blocks import BLOCK, blocks
from gm_core.numerics.layout import Layout
from gm_core.numerics.merge import Contributions, accumulate, merge, needs_whole
from gm_core.numerics.outer import nesterov_block, outer_step
from gm_core.numerics.robust import Trimmer
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
    out: F32 | None = None,
) -> None:
    """Merge ``deltas`` and commit them into ``theta``/``momentum`` in place (a final-only
    round leaves ``momentum`` as it was: it is read by no one here then).

    With ``out``, the new theta goes there and ``theta`` is only read: ``out`` may be one
    of ``deltas`` (a block of each delta is merged before that block of ``out`` is
    written), so a closer whose deltas are its own to overwrite makes no buffer for it."""
    n = layout.total
    check_flat(theta, n, "theta")
    check_flat(momentum, n, "momentum")
    dest = theta if out is None else out
    check_flat(dest, n, "out")
    final_only = contributions.all_final
    if needs_whole(contributions, layout, rule, embedding_pattern):
        merged = np.empty(n, dtype=np.float32)
        merge(deltas, contributions, layout, rule, embedding_pattern, merged)
        if dest is not theta:
            np.copyto(dest, theta)
        outer_step(dest, momentum, merged, lr, beta, final_only=final_only)
        return
    assert len(deltas) == len(contributions.learners), "one delta per contribution"
    for i, delta in enumerate(deltas):
        check_flat(delta, n, f"delta {i}")
    acc_buffer = np.empty(min(BLOCK, n), dtype=np.float32)
    tmp_buffer = np.empty(min(BLOCK, n), dtype=np.float32)
    merged_block = _merger(deltas, contributions, rule, n, tmp_buffer)
    for lo, hi in blocks(0, n):
        acc = acc_buffer[: hi - lo]
        merged_block(lo, hi, acc)
        if dest is not theta:
            dest[lo:hi] = theta[lo:hi]
        if final_only:
            np.subtract(dest[lo:hi], acc, out=dest[lo:hi])
        else:
            nesterov_block(dest[lo:hi], momentum[lo:hi], acc, lr, beta, tmp_buffer[: hi - lo])


def _merger(
    deltas: Sequence[F32], contributions: Contributions, rule: MergeRule, n: int, tmp: F32
) -> Callable[[int, int, F32], None]:
    """What writes the merged delta of coordinates ``lo:hi`` (a block at most) into a
    buffer: the trimmed mean under a robust rule, else the weighted sum."""
    if contributions.trim > 0:
        assert rule in (MergeRule.TRIMMED_MEAN, MergeRule.MEDIAN), f"{rule} trims nothing"
        return Trimmer(deltas, contributions, n)
    coefs = contributions.coefficients()

    def weighted(lo: int, hi: int, acc: F32) -> None:
        accumulate([d[lo:hi] for d in deltas], coefs, acc, (0, hi - lo), None, tmp)

    return weighted
