"""Flat layout of a fragment: where each tensor lives in one contiguous fp32 buffer.

Theory of operation
-------------------
All numerics treat a fragment as one flat contiguous fp32 buffer, so a merge or
an outer step is a handful of long vector operations rather than one small
operation per tensor. A :class:`Layout` remembers the tensor boundaries inside
that buffer for the few operations that need them: RDA normalizes per tensor,
embeddings merge by plain weighted mean, and quantization scales are per tensor
(F8) or per block of 32 inside a tensor (F4). Tensors sit back to back in the
order given, which for a fragment is the order of the fragment plan.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import attrs

from gm_core.records import TensorSpec


@attrs.frozen
class Span:
    """One tensor's slice ``[start, stop)`` of the flat fragment buffer."""

    name: str
    shape: tuple[int, ...]
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def _check_spans(_: object, __: object, spans: tuple[Span, ...]) -> None:
    names = [s.name for s in spans]
    assert len(set(names)) == len(names), f"duplicate tensor names in layout: {names}"
    position = 0
    for span in spans:
        assert span.start == position, f"tensor {span.name!r} does not follow its predecessor"
        assert span.size == math.prod(span.shape), f"tensor {span.name!r}: size != prod(shape)"
        position = span.stop


@attrs.frozen
class Layout:
    """The tensors of a fragment, back to back, in plan order."""

    spans: tuple[Span, ...] = attrs.field(validator=_check_spans)

    @classmethod
    def of(cls, tensors: Iterable[tuple[str, Sequence[int]]]) -> Layout:
        """Lay out ``(name, shape)`` pairs back to back in the order given."""
        spans: list[Span] = []
        position = 0
        for name, shape in tensors:
            size = math.prod(shape)
            spans.append(Span(name=name, shape=tuple(shape), start=position, stop=position + size))
            position += size
        return cls(spans=tuple(spans))

    @classmethod
    def from_specs(cls, specs: Iterable[TensorSpec]) -> Layout:
        return cls.of((spec.name, spec.shape) for spec in specs)

    @property
    def total(self) -> int:
        """Number of fp32 elements in the flat fragment buffer."""
        return self.spans[-1].stop if self.spans else 0
