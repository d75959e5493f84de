"""Robust merges: which deltas of a round count, how far each is clipped, what is trimmed.

Theory of operation
-------------------
A weighted mean follows any one delta as far as it goes: a learner (or a forger
writing under its id) that sends ``100·Δ`` or ``−Δ`` moves the commit by as much.
A run can ask for three defences, all decided here from a few numbers per delta
(its norm and its cosine to the round's coordinate-wise median, which the shell's
backends compute) and carried out by those backends:

* **Rejection** (``outlier_norm_factor``, ``outlier_cosine``): a delta whose norm
  is above ``factor`` times the round's median norm, or whose cosine to the
  median is below the bound, is rejected by name (``outlier``) and merged with
  weight zero. Only rounds of 3 or more deltas are screened (with two there is no
  majority to call the other an outlier), and never more than ``(k-1)//2`` of
  ``k`` are rejected: the most extreme first, so the median of the survivors is
  still a value an honest majority produced.
* **Clipping** (``clip_norm_factor``): a surviving delta whose norm is above
  ``factor`` times the survivors' lower median norm is scaled down to exactly that norm,
  so no single delta moves the commit by more than ``factor`` typical steps.
* **Trimming** (``merge="trimmed_mean"`` or ``"median"``): at every coordinate
  the ``t`` lowest and ``t`` highest values are dropped and the rest averaged
  with their learners' shares (:func:`trim_count` says ``t``). The median is the
  trimmed mean with ``t = (k-1)//2``: the middle value, or the share-weighted
  mean of the middle two.

Token weighting under trimming: learners are *counted* to decide which values are
extreme (each learner one vote, whatever it reports), then *weighted* by their
shares (``tokens²/steps``, capped by ``max_share``) among the values that remain.
So up to ``t`` hostile learners can never move a coordinate outside the range of
the honest values there, however many tokens they claim; within that range the
honest learners that saw more data count more, as under the mean. A learner's
share of one coordinate is its share renormalized over that coordinate's
survivors, so it can exceed ``max_share`` there — but only ever towards a value
some other learner also lies beyond.

Two learners (the "2-learner gap", spec/protocol.md §11.3): with two deltas there is
no majority, so nothing can outvote a bad one, only bound it. Screening stays off; a
robust rule counts the two equally (:func:`counts_equally`: nothing can be trimmed,
and a share-weighted mean of two would follow whichever reports more tokens, which
``max_share`` does not cap at ``k <= max_share``); clipping bounds by the lower median
norm, the shorter of the two, so a x100 delta moves the commit at most
``clip_norm_factor`` times as far as the other. A sign-flipped delta then cancels the
honest one: no progress, but no harm.

Everything here is a total function of plain numbers: norms and cosines come
from peers' deltas, so NaN and ±Inf (an fp32 norm can overflow) are handled as
the most extreme values, never raised on.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence

import attrs

from gm_core import verdicts
from gm_core.records import AlgorithmConfig, MergeRule

ROBUST_RULES = frozenset({MergeRule.TRIMMED_MEAN, MergeRule.MEDIAN})
"""Merge rules that sort every coordinate's values (the others are weighted sums)."""

MIN_SCREENED = 3
"""The fewest deltas a round screens for outliers: with two, neither is a majority."""


def trim_count(rule: MergeRule, k: int, fraction: float) -> int:
    """How many values of each coordinate a rule drops at each end, for ``k`` deltas.

    ``median``: ``(k-1)//2`` (one or two values stay). ``trimmed_mean``:
    ``floor(fraction·k)``, at least 1 once ``fraction > 0`` and at most ``(k-1)//2``,
    so at least one value always stays and 3 deltas trim like a median. The weighted
    rules trim nothing.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 0.0 <= fraction < 0.5:
        raise ValueError(f"fraction must be in [0, 0.5), got {fraction}")
    most = (k - 1) // 2
    if rule is MergeRule.MEDIAN:
        return most
    if rule is not MergeRule.TRIMMED_MEAN or fraction == 0.0:
        return 0
    # Rounded first so that e.g. 0.3 * 10 (3.0000000000000004) trims 3, not 4.
    return min(max(1, math.floor(round(fraction * k, 9))), most)


def _norm_or_inf(norm: float) -> float:
    return norm if math.isfinite(norm) and norm >= 0.0 else math.inf


def median_norm(norms: Sequence[float]) -> float:
    """The median of ``norms``, NaN counted as +Inf (an overflowed or unreadable norm)."""
    if not norms:
        raise ValueError("the median of no norms")
    return statistics.median(_norm_or_inf(n) for n in norms)


def lower_median_norm(norms: Sequence[float]) -> float:
    """The lower median of ``norms`` (of an even count, the lower middle one), NaN as +Inf.

    What clipping bounds by: of two deltas the shorter one's norm, where the median (their
    mean) would let a delta scaled x100 through at half its length.
    """
    if not norms:
        raise ValueError("the median of no norms")
    return statistics.median_low(_norm_or_inf(n) for n in norms)


def _excess(norm: float, bound: float) -> float:
    """How far beyond ``bound`` a norm lies, relative to it (0 within, Inf for any norm over 0)."""
    if norm <= bound:
        return 0.0
    return math.inf if bound == 0.0 or math.isinf(norm) else norm / bound - 1.0


def outliers(
    norms: Sequence[float],
    cosines: Sequence[float],
    *,
    norm_factor: float | None,
    min_cosine: float | None,
) -> tuple[int, ...]:
    """Indices (ascending) of the deltas a round rejects as ``outlier``.

    Delta ``i`` is flagged when ``norms[i] > norm_factor · median(norms)`` or
    ``cosines[i] < min_cosine`` (its cosine to the coordinate-wise median; a NaN
    cosine is flagged). Rounds of fewer than :data:`MIN_SCREENED` reject nothing;
    of ``k`` deltas at most ``(k-1)//2`` are rejected, the most extreme first: by
    relative excess over the norm bound or absolute shortfall under the cosine bound,
    whichever is larger, ties to the lower index.
    """
    k = len(norms)
    if len(cosines) != k:
        raise ValueError(f"{k} norms but {len(cosines)} cosines")
    if k < MIN_SCREENED or (norm_factor is None and min_cosine is None):
        return ()
    bound = None if norm_factor is None else norm_factor * median_norm(norms)
    flagged: list[tuple[float, int]] = []
    for i in range(k):
        excess = 0.0 if bound is None else _excess(_norm_or_inf(norms[i]), bound)
        if min_cosine is not None:
            cosine = cosines[i]
            shortfall = math.inf if math.isnan(cosine) else max(min_cosine - cosine, 0.0)
            excess = max(excess, shortfall)
        if excess > 0.0:
            flagged.append((-excess, i))
    return tuple(sorted(i for _, i in sorted(flagged)[: (k - 1) // 2]))


def clip_scales(norms: Sequence[float], factor: float | None) -> tuple[float, ...]:
    """Per delta, the factor that brings its norm down to ``factor · lower_median(norms)``.

    1.0 for every delta within that bound (and for all when ``factor`` is None); a
    delta with an infinite or NaN norm is scaled to 0 unless the median itself is
    infinite (then nothing can be bounded and nothing is clipped). The *lower* median,
    so that two deltas are bounded too (:func:`lower_median_norm`); with an odd count it
    is the median. A factor below the smallest normal double is 0: a subnormal quotient
    has lost the precision that keeps the clipped norm within the bound (a norm over
    10³⁰⁸ times the bound), and such a delta is brought to nothing either way.
    """
    if factor is None or not norms:
        return tuple(1.0 for _ in norms)
    bound = factor * lower_median_norm(norms)
    scales: list[float] = []
    for raw in norms:
        norm = _norm_or_inf(raw)
        scale = 1.0 if norm <= bound or math.isinf(bound) else bound / norm
        scales.append(scale if scale >= sys.float_info.min else 0.0)
    return tuple(scales)


@attrs.frozen(kw_only=True)
class MergePlan:
    """What a closer merges of a round's accepted deltas, in their (learner) order.

    ``kept`` indexes the accepted deltas that are merged, ``rejected`` those that are
    outliers; ``shares`` and ``scales`` are per kept delta; ``trim`` is the count
    each coordinate drops at each end (0: a weighted sum under ``rule``).
    """

    kept: tuple[int, ...]
    rejected: tuple[int, ...]
    shares: tuple[float, ...]
    scales: tuple[float, ...]
    rule: MergeRule
    trim: int


def counts_equally(config: AlgorithmConfig, k: int) -> bool:
    """Whether a merge of ``k`` deltas under ``config`` gives each the same share.

    Only a robust rule that would trim but cannot: two deltas under ``median``, or under
    ``trimmed_mean`` with a ``trim_fraction`` above 0. Trimming nothing, the rule would be
    the share-weighted mean of both, so the one reporting more tokens (near 2^63, say)
    would decide every coordinate; counted equally, neither can pull a coordinate past
    the midpoint of the two values. (Three or more always trim, and counting decides what
    is trimmed, :func:`trim_count`.)
    """
    if k != 2 or config.merge not in ROBUST_RULES:
        return False
    return config.merge is MergeRule.MEDIAN or config.trim_fraction > 0.0


def screens(config: AlgorithmConfig) -> bool:
    """Whether a merge under ``config`` needs the deltas' norms and cosines first."""
    return (
        config.clip_norm_factor is not None
        or config.outlier_norm_factor is not None
        or config.outlier_cosine is not None
    )


def plan_merge(
    config: AlgorithmConfig,
    shares: Sequence[float],
    norms: Sequence[float] | None = None,
    cosines: Sequence[float] | None = None,
) -> MergePlan:
    """The merge of ``k`` accepted deltas with normalized ``shares``.

    ``norms`` and ``cosines`` (to the coordinate-wise median) are needed exactly when
    :func:`screens` says so. Rejected deltas' shares go to the survivors in
    proportion, capped again by ``max_share``, so the survivors' shares sum to 1 and
    obey the same cap as the mean's.
    """
    k = len(shares)
    if k < 1:
        raise ValueError("a merge needs at least one delta")
    if screens(config) and (norms is None or cosines is None):
        raise ValueError("this config screens deltas: pass their norms and cosines")
    rejected: tuple[int, ...] = ()
    if norms is not None and cosines is not None:
        rejected = outliers(
            norms,
            cosines,
            norm_factor=config.outlier_norm_factor,
            min_cosine=config.outlier_cosine,
        )
    kept = tuple(i for i in range(k) if i not in rejected)
    kept_shares = verdicts.capped_shares(
        verdicts.normalized_weights([shares[i] for i in kept]), config.max_share
    )
    if counts_equally(config, len(kept)):
        kept_shares = tuple(1.0 / len(kept) for _ in kept)
    scales = clip_scales([norms[i] for i in kept], config.clip_norm_factor) if norms else ()
    trim = trim_count(config.merge, len(kept), config.trim_fraction)
    return MergePlan(
        kept=kept,
        rejected=rejected,
        shares=kept_shares,
        scales=scales or tuple(1.0 for _ in kept),
        rule=MergeRule.MEAN if config.merge in ROBUST_RULES and trim == 0 else config.merge,
        trim=trim,
    )
