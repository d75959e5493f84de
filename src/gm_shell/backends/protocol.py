"""The compute backend protocol: gm's numerics over one framework's flat buffers.

Theory of operation
-------------------
A learner trains in torch or MLX; a closer may run anywhere. Each backend does the
same arithmetic as the numpy reference in :mod:`gm_core.numerics` over that
framework's own flat, contiguous fp32 buffers (type parameter ``A``), so tensors
never leave the device to be merged. Operations write in place into buffers the
caller allocated once (``empty``); a backend keeps its own scratch and reuses it.
Wire codes always live in host memory (numpy uint8 views, typically of the payload
file being written or read), since that is where payload bytes go.

Agreement with the reference: bit-exact for the wire codecs (codes, scales, bf16
rounding) and for the error-feedback mirror; within fp32 rounding for merges,
outer steps and alignment, whose multiply-adds a backend may fuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from gm_core.numerics.arrays import F32, U8
from gm_core.numerics.layout import Layout
from gm_core.numerics.merge import Contributions
from gm_core.numerics.quant import WireLayout
from gm_core.records import Alignment, MergeRule

A = TypeVar("A")


class Backend(Protocol[A]):
    """Numerics over flat fp32 buffers of type ``A``; every mutation is in place."""

    name: str

    def empty(self, n: int) -> A:
        """An uninitialized flat fp32 buffer of ``n`` elements on this backend's device."""
        ...

    def asarray(self, x: F32) -> A:
        """A buffer holding ``x`` (shares memory where the framework allows)."""
        ...

    def to_numpy(self, x: A) -> F32:
        """Host view or copy of ``x``."""
        ...

    def all_finite(self, x: A) -> bool:
        """True iff ``x`` has no NaN or ±Inf (checked before a delta is merged)."""
        ...

    def merge(
        self,
        deltas: Sequence[A],
        contributions: Contributions,
        layout: Layout,
        rule: MergeRule,
        embedding_pattern: str,
        out: A,
    ) -> None:
        """Merged delta into ``out`` (see :func:`gm_core.numerics.merge.merge`); with
        ``contributions.trim > 0`` the coordinate-wise trimmed mean of
        :func:`gm_core.numerics.robust.trimmed_merge`."""
        ...

    def outer_step(
        self, theta: A, momentum: A, delta: A, lr: float, beta: float, *, final_only: bool
    ) -> None:
        """Nesterov step, or ``Θ − Δ`` for a final-only round."""
        ...

    def merge_step(
        self,
        deltas: Sequence[A],
        contributions: Contributions,
        layout: Layout,
        rule: MergeRule,
        embedding_pattern: str,
        theta: A,
        momentum: A,
        lr: float,
        beta: float,
        out: A | None = None,
    ) -> None:
        """Fused merge and outer step (see :func:`gm_core.numerics.step.merge_step`): the new
        theta in ``theta``, or in ``out`` (which may be one of ``deltas``)."""
        ...

    def cosine(self, deltas: Sequence[A]) -> float | None:
        """Mean pairwise cosine of the deltas; ``None`` for fewer than two."""
        ...

    def spread(self, deltas: Sequence[A], centre: A) -> tuple[list[float], list[float]]:
        """Each delta's norm and cosine to ``centre`` (:func:`gm_core.numerics.robust.spread`)."""
        ...

    def align(
        self,
        theta: A,
        committed: A,
        alignment: Alignment,
        mixing: float = 1.0,
        snapshot: A | None = None,
    ) -> None:
        """Fold a commit into local parameters (see :mod:`gm_core.numerics.align`)."""
        ...

    def encode(self, x: A, wire: WireLayout, codes: U8, scales: U8) -> None:
        """Wire codes and scales of ``x`` into host byte regions."""
        ...

    def decode(self, codes: U8, scales: U8, wire: WireLayout, out: A) -> None:
        """Exact inverse of the codec into ``out``."""
        ...

    def publish_update(self, master: A, mirror: A, wire: WireLayout, codes: U8, scales: U8) -> None:
        """Encode ``master − mirror``; advance ``mirror`` by the decoded update."""
        ...

    def apply_update(self, theta: A, codes: U8, scales: U8, wire: WireLayout) -> None:
        """A follower's ``θ ← θ + decode(update)``."""
        ...
