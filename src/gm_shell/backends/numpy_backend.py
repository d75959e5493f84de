"""The numpy backend: the gm_core reference, plus reusable scratch.

Theory of operation
-------------------
The reference in :mod:`gm_core.numerics` is already written as in-place, blocked
numpy; this backend only adapts it to the :class:`Backend` protocol and keeps one
scratch buffer per size so that repeated rounds allocate nothing large.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gm_core import numerics
from gm_core.numerics import robust
from gm_core.numerics.arrays import F32, U8
from gm_core.numerics.layout import Layout
from gm_core.numerics.merge import Contributions
from gm_core.numerics.quant import WireLayout
from gm_core.records import Alignment, MergeRule


class NumpyBackend:
    """Host fp32 numpy arrays; bit-identical to the reference by construction."""

    name = "numpy"

    def __init__(self) -> None:
        self._scratch = np.empty(0, dtype=np.float32)

    def scratch(self, n: int) -> F32:
        """A reusable buffer of ``n`` elements; contents are not preserved between calls."""
        if self._scratch.shape[0] < n:
            self._scratch = np.empty(n, dtype=np.float32)
        return self._scratch[:n]

    def empty(self, n: int) -> F32:
        return np.empty(n, dtype=np.float32)

    def asarray(self, x: F32) -> F32:
        return np.ascontiguousarray(x, dtype=np.float32)

    def to_numpy(self, x: F32) -> F32:
        return x

    def all_finite(self, x: F32) -> bool:
        return numerics.all_finite(x)

    def merge(
        self,
        deltas: Sequence[F32],
        contributions: Contributions,
        layout: Layout,
        rule: MergeRule,
        embedding_pattern: str,
        out: F32,
    ) -> None:
        numerics.merge(deltas, contributions, layout, rule, embedding_pattern, out)

    def outer_step(
        self, theta: F32, momentum: F32, delta: F32, lr: float, beta: float, *, final_only: bool
    ) -> None:
        numerics.outer_step(theta, momentum, delta, lr, beta, final_only=final_only)

    def merge_step(
        self,
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
        numerics.merge_step(
            deltas, contributions, layout, rule, embedding_pattern, theta, momentum, lr, beta, out
        )

    def cosine(self, deltas: Sequence[F32]) -> float | None:
        return numerics.mean_pairwise_cosine(deltas)

    def spread(self, deltas: Sequence[F32], centre: F32) -> tuple[list[float], list[float]]:
        return robust.spread(deltas, centre)

    def align(
        self,
        theta: F32,
        committed: F32,
        alignment: Alignment,
        mixing: float = 1.0,
        snapshot: F32 | None = None,
    ) -> None:
        numerics.align(theta, committed, alignment, mixing, snapshot)

    def encode(self, x: F32, wire: WireLayout, codes: U8, scales: U8) -> None:
        numerics.encode(x, wire, codes, scales)

    def decode(self, codes: U8, scales: U8, wire: WireLayout, out: F32) -> None:
        numerics.decode(codes, scales, wire, out)

    def publish_update(
        self, master: F32, mirror: F32, wire: WireLayout, codes: U8, scales: U8
    ) -> None:
        scratch = self.scratch(wire.layout.total)
        numerics.publish_update(master, mirror, wire, codes, scales, scratch)

    def apply_update(self, theta: F32, codes: U8, scales: U8, wire: WireLayout) -> None:
        numerics.apply_update(theta, codes, scales, wire, self.scratch(wire.layout.total))
