"""Robust merge numerics: coordinate-wise trimmed means, and the numbers a screen needs.

Theory of operation
-------------------
:mod:`gm_core.robust` decides (from per-delta norms and cosines) which deltas
count, how much each is clipped and how many values each coordinate drops; this
module is the reference arithmetic for it, over flat fp32 buffers.

* Trimmed mean, per coordinate: the ``k`` values (each delta times its fp32 clip
  scale) are sorted, stably, so equal values keep learner order; the ``trim``
  lowest and highest are dropped and the rest averaged with their learners' fp32
  shares, renormalized over the survivors (``Σ s_j v_j / Σ s_j``; the plain mean
  of the survivors if all their shares are zero). The median is this with
  ``trim = (k-1)//2``. Work goes block by block through one ``k × block`` stack.
* Spread: each delta's norm and its cosine to a centre (the coordinate-wise
  median), with fp32 dot products per block and float64 across blocks, as
  :func:`~gm_core.numerics.merge.sq_norm`. A zero vector counts as orthogonal.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from gm_core.numerics.arrays import F32
from gm_core.numerics.blocks import BLOCK, blocks

if TYPE_CHECKING:  # merge imports this module: the class is only named in annotations here
    from gm_core.numerics.merge import Contributions


def trimmed_block(rows: F32, shares: F32, trim: int, out: F32) -> None:
    """``out`` = the trimmed, share-weighted mean of each column of ``rows`` (k × b)."""
    k = rows.shape[0]
    order = np.argsort(rows, axis=0, kind="stable")[trim : k - trim]
    kept = np.take_along_axis(rows, order, axis=0)
    weights = shares[order]
    total = weights.sum(axis=0)
    positive = total > 0.0
    np.divide((kept * weights).sum(axis=0), np.where(positive, total, np.float32(1.0)), out=out)
    if not positive.all():
        out[~positive] = kept.mean(axis=0)[~positive]


def trimmed_merge(deltas: Sequence[F32], contributions: Contributions, out: F32) -> None:
    """``out`` = the coordinate-wise trimmed mean of the clipped deltas (see the module doc)."""
    trimmed = Trimmer(deltas, contributions, out.shape[0])
    for lo, hi in blocks(0, out.shape[0]):
        trimmed(lo, hi, out[lo:hi])


class Trimmer:
    """The trimmed mean of the clipped deltas, a block of coordinates at a time, through
    one ``k × block`` stack (:func:`trimmed_merge`, and the fused step's blocks)."""

    def __init__(self, deltas: Sequence[F32], contributions: Contributions, n: int) -> None:
        self.deltas = deltas
        self.trim = contributions.trim
        self.shares = np.array(contributions.shares(), dtype=np.float32)
        self.scales = contributions.row_scales()
        self.stack = np.empty((len(deltas), min(BLOCK, n)), dtype=np.float32)

    def __call__(self, lo: int, hi: int, out: F32) -> None:
        """``out`` = the trimmed mean of coordinates ``lo:hi`` (at most a block of them)."""
        rows = self.stack[:, : hi - lo]
        for i, delta in enumerate(self.deltas):
            np.multiply(delta[lo:hi], self.scales[i], out=rows[i])
        trimmed_block(rows, self.shares, self.trim, out)


def cosines_from(sq_norms: Sequence[float], dots: Sequence[float], centre_sq: float) -> list[float]:
    """``dot_i / (‖Δ_i‖ ‖c‖)``, 0 where either is zero; overflowed inputs give NaN, not errors."""
    centre = math.sqrt(centre_sq)
    out: list[float] = []
    for sq, dot in zip(sq_norms, dots, strict=True):
        denominator = math.sqrt(sq) * centre
        out.append(dot / denominator if denominator > 0.0 else 0.0)
    return out


def spread_by(
    deltas: Sequence[Any],
    centre: Any,
    dot: Callable[[Any, Any], float],
    n: int,
    block: int = BLOCK,
) -> tuple[list[float], list[float]]:
    """Each delta's norm and cosine to ``centre``, from one framework's fp32 ``dot`` of slices.

    Every backend walks its own flat buffers through this, block by block, so norms and
    cosines differ between backends only by the rounding of their dot products.
    """
    sq_norms, dots, centre_sq = [0.0] * len(deltas), [0.0] * len(deltas), 0.0
    for lo, hi in blocks(0, n, block):
        part = centre[lo:hi]
        centre_sq += dot(part, part)
        for i, delta in enumerate(deltas):
            sq_norms[i] += dot(delta[lo:hi], delta[lo:hi])
            dots[i] += dot(delta[lo:hi], part)
    return [math.sqrt(s) for s in sq_norms], cosines_from(sq_norms, dots, centre_sq)


def _dot(a: F32, b: F32) -> float:
    return float(np.dot(a, b))


def spread(deltas: Sequence[F32], centre: F32) -> tuple[list[float], list[float]]:
    """Each delta's norm and its cosine to ``centre`` (the numpy reference of :func:`spread_by`)."""
    return spread_by(deltas, centre, _dot, centre.shape[0])
