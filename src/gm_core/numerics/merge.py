"""Merging the accepted deltas of a round: weighted mean, RDA, and their cosine.

Theory of operation
-------------------
A closer combines k deltas (``Δ = anchor − θ_local``, one per accepted snapshot)
into one. Each contribution carries a weight (the protocol uses
``tokens²/steps``); weights are normalized once, in float64, into fp32
coefficients ``c_i = w_i / Σw`` that every backend uses verbatim, so backends
differ only by the rounding of their fp32 arithmetic.

* Weighted mean: ``Σ c_i Δ_i``.
* RDA, per tensor: the weighted mean *direction* rescaled to the weighted mean
  *norm*, ``(Σ c_i ‖Δ_i‖) · m / ‖m‖`` with ``m = Σ c_i Δ_i``. Averaging shrinks
  the mean when deltas disagree; RDA restores the typical step length. Tensors
  whose name matches the embedding pattern use the plain weighted mean, since
  their rows are updated sparsely and their norm is no measure of a step.

Contributions are always summed in learner-id order so that a merge is a pure
function of the round's accepted set, bit for bit, on every closer that redoes it.
Sums run block by block (see :mod:`gm_core.numerics.blocks`): products and
partial sums stay in cache. Norms and dot products accumulate per block in fp32
and across blocks in float64.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import attrs
import numpy as np

from gm_core.numerics.arrays import F32, check_flat
from gm_core.numerics.blocks import BLOCK, blocks
from gm_core.numerics.layout import Layout, Span
from gm_core.numerics.robust import trimmed_merge
from gm_core.records import MergeRule


def _check_contributions(instance: Contributions) -> None:
    k = len(instance.learners)
    assert k >= 1, "a merge needs at least one contribution"
    assert len(instance.weights) == k, "one weight per learner"
    assert not instance.final or len(instance.final) == k, "final flags: none or one per learner"
    assert list(instance.learners) == sorted(set(instance.learners)), (
        f"contributions must be sorted by unique learner id: {instance.learners}"
    )
    assert all(math.isfinite(w) and w >= 0.0 for w in instance.weights), instance.weights
    assert math.fsum(instance.weights) > 0.0, "weights sum to zero"
    assert not instance.scales or len(instance.scales) == k, "scales: none or one per learner"
    assert all(math.isfinite(s) and 0.0 <= s <= 1.0 for s in instance.scales), instance.scales
    assert 0 <= instance.trim <= (k - 1) // 2, f"trim {instance.trim} leaves no value of {k}"


@attrs.frozen
class Contributions:
    """Who contributed to a merge, in learner order, with weights and final flags.

    ``final`` is empty when no contribution is final (the common case). ``scales``
    (empty: all 1) are clip factors in [0, 1] applied to each delta before it is
    merged; ``trim`` is how many values of every coordinate a robust rule drops at
    each end (see :mod:`gm_core.robust`; 0 under the weighted rules).
    """

    learners: tuple[str, ...]
    weights: tuple[float, ...]
    final: tuple[bool, ...] = ()
    scales: tuple[float, ...] = ()
    trim: int = 0

    def __attrs_post_init__(self) -> None:
        _check_contributions(self)

    @property
    def all_final(self) -> bool:
        """A round made only of flush-on-close deltas applies them without momentum."""
        return bool(self.final) and all(self.final)

    def coefficients(self) -> tuple[np.float32, ...]:
        """Normalized weights times clip scales, in float64 then rounded once to fp32.

        A weighted sum with these coefficients merges the clipped deltas: scaling a
        delta is scaling its coefficient (and under RDA its norm, by the same factor).
        """
        total = math.fsum(self.weights)
        scales = self.scales or (1.0,) * len(self.weights)
        return tuple(np.float32(w / total * s) for w, s in zip(self.weights, scales, strict=True))

    def shares(self) -> tuple[np.float32, ...]:
        """Normalized weights alone, rounded once to fp32 (a robust rule weighs survivors)."""
        total = math.fsum(self.weights)
        return tuple(np.float32(w / total) for w in self.weights)

    def row_scales(self) -> tuple[np.float32, ...]:
        """Clip scales rounded to fp32 (a robust rule scales values before sorting them)."""
        return tuple(np.float32(s) for s in self.scales or (1.0,) * len(self.weights))


def is_embedding(name: str, pattern: str) -> bool:
    """An empty pattern names no tensor (``re.search("")`` would match all)."""
    return bool(pattern) and re.search(pattern, name) is not None


def all_finite(x: F32) -> bool:
    """True iff no element is NaN or ±Inf; two reductions and no temporary.

    min and max propagate NaN and expose ±Inf, so a bad delta is caught before it
    reaches a merge (the closer rejects it as ``nonfinite``).
    """
    if x.size == 0:
        return True
    return bool(np.isfinite(x.min()) and np.isfinite(x.max()))


def accumulate(
    deltas: Sequence[F32],
    coefs: Sequence[np.float32],
    out: F32,
    span: tuple[int, int],
    sq_norms: list[float] | None = None,
    scratch: F32 | None = None,
) -> None:
    """``out[span] = Σ c_i Δ_i[span]`` in order; optionally add each ``‖Δ_i[span]‖²``.

    This is the reference's fused inner loop: one read of each delta, one write of
    ``out``, and the squared norms taken from the cached block.
    """
    if scratch is None:
        scratch = np.empty(min(BLOCK, span[1] - span[0]), dtype=np.float32)
    for lo, hi in blocks(*span):
        acc, tmp = out[lo:hi], scratch[: hi - lo]
        for i, (delta, coef) in enumerate(zip(deltas, coefs, strict=True)):
            block = delta[lo:hi]
            if i == 0:
                np.multiply(block, coef, out=acc)
            else:
                np.multiply(block, coef, out=tmp)
                np.add(acc, tmp, out=acc)
            if sq_norms is not None:
                sq_norms[i] += float(np.dot(block, block))


def rda_factor(
    coefs: Sequence[np.float32], sq_norms: Sequence[float], mean_sq_norm: float
) -> float:
    """``Σ c_i ‖Δ_i‖ / ‖m‖``; a zero mean has no direction, so it stays zero (factor 1)."""
    if mean_sq_norm <= 0.0:
        return 1.0
    target = math.fsum(float(c) * math.sqrt(s) for c, s in zip(coefs, sq_norms, strict=True))
    return target / math.sqrt(mean_sq_norm)


def sq_norm(x: F32, span: tuple[int, int]) -> float:
    """Squared norm: fp32 dot per block, float64 across blocks."""
    return math.fsum(float(np.dot(x[lo:hi], x[lo:hi])) for lo, hi in blocks(*span))


def uses_rda(span: Span, rule: MergeRule, embedding_pattern: str) -> bool:
    return rule is MergeRule.RDA and not is_embedding(span.name, embedding_pattern)


def needs_whole(
    contributions: Contributions, layout: Layout, rule: MergeRule, embedding_pattern: str
) -> bool:
    """Whether a fused step needs the fragment's merged delta whole before it steps: an
    RDA tensor's scale comes from its full mean (a robust rule never rescales)."""
    rda = any(uses_rda(span, rule, embedding_pattern) for span in layout.spans)
    return contributions.trim == 0 and rda


def merge(
    deltas: Sequence[F32],
    contributions: Contributions,
    layout: Layout,
    rule: MergeRule,
    embedding_pattern: str,
    out: F32,
) -> None:
    """Write the merged delta of ``deltas`` (in ``contributions`` order) into ``out``."""
    assert len(deltas) == len(contributions.learners), "one delta per contribution"
    for i, delta in enumerate(deltas):
        check_flat(delta, layout.total, f"delta {i}")
    check_flat(out, layout.total, "out")
    if contributions.trim > 0:
        assert rule in (MergeRule.TRIMMED_MEAN, MergeRule.MEDIAN), f"{rule} trims nothing"
        trimmed_merge(deltas, contributions, out)
        return
    coefs = contributions.coefficients()
    for span in layout.spans:
        bounds = (span.start, span.stop)
        if not uses_rda(span, rule, embedding_pattern):
            accumulate(deltas, coefs, out, bounds)
            continue
        sq_norms = [0.0] * len(deltas)
        accumulate(deltas, coefs, out, bounds, sq_norms)
        factor = np.float32(rda_factor(coefs, sq_norms, sq_norm(out, bounds)))
        np.multiply(out[span.start : span.stop], factor, out=out[span.start : span.stop])


def cosine_from_gram(gram: np.ndarray[tuple[int, int], np.dtype[np.float64]]) -> float | None:
    """Mean pairwise cosine from a Gram matrix; a zero delta counts as orthogonal."""
    k = gram.shape[0]
    if k < 2:
        return None
    norms = np.sqrt(np.clip(np.diag(gram), 0.0, None))
    total = 0.0
    for i in range(k):
        for j in range(i + 1, k):
            denominator = norms[i] * norms[j]
            total += float(gram[i, j] / denominator) if denominator > 0.0 else 0.0
    return total / (k * (k - 1) / 2)


def mean_pairwise_cosine(deltas: Sequence[F32]) -> float | None:
    """Mean over pairs ``i < j`` of ``cos(Δ_i, Δ_j)`` across the whole fragment.

    Reported in the round record as a cheap measure of how much learners agree.
    The Gram matrix is built block by block from a stacked cached block.
    """
    k = len(deltas)
    if k < 2:
        return None
    n = deltas[0].shape[0]
    gram = np.zeros((k, k), dtype=np.float64)
    stack = np.empty((k, min(BLOCK, n)), dtype=np.float32)
    for lo, hi in blocks(0, n):
        rows = stack[:, : hi - lo]
        for i, delta in enumerate(deltas):
            rows[i] = delta[lo:hi]
        gram += rows @ rows.T
    return cosine_from_gram(gram)
