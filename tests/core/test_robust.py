"""Robust-merge decisions: trim counts, outlier screens, clip scales and merge plans."""

from __future__ import annotations

import math
import statistics

import attrs
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gm_core import robust, verdicts
from gm_core.records import AlgorithmConfig, MergeRule

norms = st.floats(0.0, 1e30)
any_floats = st.floats(allow_nan=True, allow_infinity=True)
cosines = st.floats(-1.0, 1.0)
factors = st.none() | st.floats(1.0, 100.0)
fractions = st.floats(0.0, 0.5, exclude_max=True)


@given(st.sampled_from(MergeRule), st.integers(1, 200), fractions)
def test_trim_always_leaves_a_value(rule: MergeRule, k: int, fraction: float) -> None:
    t = robust.trim_count(rule, k, fraction)
    assert 0 <= t <= (k - 1) // 2
    assert k - 2 * t >= 1
    if rule is MergeRule.MEDIAN:
        assert k - 2 * t in (1, 2)  # the middle value, or the middle two
    if rule in (MergeRule.MEAN, MergeRule.RDA):
        assert t == 0
    if rule is MergeRule.TRIMMED_MEAN and k >= 3 and fraction > 0:
        assert t >= 1  # a trimmed mean of three or more always trims


@given(st.integers(1, 200), fractions, fractions)
def test_trimmed_mean_trims_more_with_a_larger_fraction(k: int, a: float, b: float) -> None:
    low, high = sorted((a, b))
    trim = robust.trim_count
    assert trim(MergeRule.TRIMMED_MEAN, k, low) <= trim(MergeRule.TRIMMED_MEAN, k, high)
    assert trim(MergeRule.TRIMMED_MEAN, k, high) <= trim(MergeRule.MEDIAN, k, 0.0)


def test_trim_counts_of_small_rounds() -> None:
    assert [robust.trim_count(MergeRule.TRIMMED_MEAN, k, 0.25) for k in range(1, 11)] == [
        0, 0, 1, 1, 1, 1, 1, 2, 2, 2,
    ]  # fmt: skip
    assert robust.trim_count(MergeRule.TRIMMED_MEAN, 10, 0.3) == 3  # 0.3 * 10 is 3.0000000000000004
    with pytest.raises(ValueError, match="fraction"):
        robust.trim_count(MergeRule.TRIMMED_MEAN, 4, 0.5)


@given(
    st.lists(st.tuples(any_floats, any_floats), max_size=12),
    factors,
    st.none() | cosines,
)
def test_outliers_are_a_minority_and_total(
    pairs: list[tuple[float, float]], norm_factor: float | None, min_cosine: float | None
) -> None:
    """Any numbers (NaN, ±Inf included): a sorted minority of indices, never an exception."""
    got = robust.outliers(
        [n for n, _ in pairs],
        [c for _, c in pairs],
        norm_factor=norm_factor,
        min_cosine=min_cosine,
    )
    k = len(pairs)
    assert list(got) == sorted(set(got))
    assert all(0 <= i < k for i in got)
    assert len(got) <= (k - 1) // 2 if k else not got
    if k < robust.MIN_SCREENED or (norm_factor is None and min_cosine is None):
        assert got == ()


@given(st.lists(st.tuples(norms, cosines), min_size=3, max_size=12), factors, st.none() | cosines)
def test_outliers_are_exactly_the_flagged_when_few(
    pairs: list[tuple[float, float]], norm_factor: float | None, min_cosine: float | None
) -> None:
    """Every rejected delta breaks a bound; when few break one, all of them are rejected."""
    ns, cs = [n for n, _ in pairs], [c for _, c in pairs]
    got = set(robust.outliers(ns, cs, norm_factor=norm_factor, min_cosine=min_cosine))
    median = statistics.median(ns)

    def breaks(i: int) -> bool:
        too_long = norm_factor is not None and ns[i] > norm_factor * median
        return too_long or (min_cosine is not None and cs[i] < min_cosine)

    flagged = {i for i in range(len(pairs)) if breaks(i)}
    assert got <= flagged
    if len(flagged) <= (len(pairs) - 1) // 2:
        assert got == flagged


@given(st.lists(norms, min_size=3, max_size=12), st.integers(0, 11), st.floats(1.0, 10.0))
def test_a_far_longer_delta_is_the_one_rejected(
    base: list[float], which: int, factor: float
) -> None:
    """A delta scaled far beyond the others (a x100 attack) is rejected by the norm screen."""
    ns = [1.0 + n % 1.0 for n in base]  # honest norms in [1, 2)
    i = which % len(ns)
    ns[i] = 2.0 * factor * max(ns) + 1.0
    got = robust.outliers(ns, [0.5] * len(ns), norm_factor=factor, min_cosine=None)
    assert i in got


@given(st.lists(cosines, min_size=3, max_size=12), st.integers(0, 11))
def test_a_delta_pointing_away_is_rejected(cs: list[float], which: int) -> None:
    """A sign-flipped delta (cosine < 0 to the median) among agreeing ones is rejected."""
    agreeing = [0.1 + abs(c) * 0.9 for c in cs]
    i = which % len(agreeing)
    agreeing[i] = -agreeing[i]
    got = robust.outliers([1.0] * len(cs), agreeing, norm_factor=None, min_cosine=0.0)
    assert got == (i,)


@given(st.lists(any_floats, max_size=12), factors)
@example([2.7854559868118544e242, 1.3906481912515835e-78], 2.0)  # a subnormal quotient
def test_clip_scales_bound_every_norm(ns: list[float], factor: float | None) -> None:
    scales = robust.clip_scales(ns, factor)
    assert len(scales) == len(ns)
    assert all(0.0 <= s <= 1.0 for s in scales)
    if factor is None or not ns:
        assert all(s == 1.0 for s in scales)
        return
    bound = factor * robust.lower_median_norm(ns)
    for n, s in zip(ns, scales, strict=True):
        if math.isfinite(n) and 0.0 <= n <= bound:
            assert s == 1.0  # within the bound: untouched
        elif math.isfinite(n) and math.isfinite(bound):
            assert n * s <= bound * (1 + 1e-12)  # beyond it: brought down to it


@st.composite
def configs(draw: st.DrawFn) -> AlgorithmConfig:
    return AlgorithmConfig(
        sync_every=1,
        fragments=1,
        merge=draw(st.sampled_from(MergeRule)),
        max_share=draw(st.none() | st.floats(1.0, 4.0)),
        trim_fraction=draw(fractions),
        clip_norm_factor=draw(factors),
        outlier_norm_factor=draw(factors),
        outlier_cosine=draw(st.none() | cosines),
    )


@given(
    configs(), st.lists(st.tuples(st.floats(0.01, 100.0), norms, cosines), min_size=1, max_size=9)
)
def test_a_plan_keeps_a_majority_with_capped_shares(
    config: AlgorithmConfig, rows: list[tuple[float, float, float]]
) -> None:
    shares = verdicts.capped_shares(verdicts.normalized_weights([w for w, _, _ in rows]), None)
    plan = robust.plan_merge(config, shares, [n for _, n, _ in rows], [c for _, _, c in rows])
    k = len(rows)
    assert sorted(plan.kept + plan.rejected) == list(range(k))
    assert len(plan.kept) > k // 2
    assert len(plan.shares) == len(plan.scales) == len(plan.kept)
    assert math.isclose(math.fsum(plan.shares), 1.0)
    if config.max_share is not None:
        cap = max(config.max_share, 1.0) / len(plan.kept)
        assert all(s <= cap * (1 + 1e-9) for s in plan.shares)
    assert plan.trim <= (len(plan.kept) - 1) // 2
    assert plan.rule is (
        MergeRule.MEAN if plan.trim == 0 and config.merge in robust.ROBUST_RULES else config.merge
    )


@given(configs(), st.lists(st.floats(0.01, 100.0), min_size=1, max_size=9))
def test_a_plan_without_screens_is_the_plain_merge(
    config: AlgorithmConfig, ws: list[float]
) -> None:
    plain = attrs.evolve(
        config, clip_norm_factor=None, outlier_norm_factor=None, outlier_cosine=None
    )
    shares = verdicts.capped_shares(verdicts.normalized_weights(ws), plain.max_share)
    plan = robust.plan_merge(plain, shares)
    assert plan.kept == tuple(range(len(ws)))
    assert plan.rejected == ()
    assert plan.scales == (1.0,) * len(ws)
    if robust.counts_equally(plain, len(ws)):  # two deltas under a robust rule (below)
        shares = (0.5, 0.5)
    assert all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(plan.shares, shares, strict=True))
    if robust.screens(config):
        with pytest.raises(ValueError, match="norms and cosines"):
            robust.plan_merge(config, shares)


# --- two learners (the "2-learner gap"): no majority to outvote either -------------------


@given(
    st.sampled_from([MergeRule.MEDIAN, MergeRule.TRIMMED_MEAN]),
    st.floats(0.01, 0.49),
    st.floats(1e-12, 1.0),
    st.none() | st.floats(1.0, 4.0),
)
def test_two_deltas_under_a_robust_rule_count_equally(
    rule: MergeRule, fraction: float, liar: float, max_share: float | None
) -> None:
    """Nothing can be trimmed of two values, so a robust rule would be the share-weighted
    mean, and a learner claiming 2^63 tokens would decide every coordinate; it counts the
    two learners equally instead (each 1/2), whatever they report."""
    config = AlgorithmConfig(
        sync_every=1, fragments=1, merge=rule, trim_fraction=fraction, max_share=max_share
    )
    shares = verdicts.capped_shares(verdicts.normalized_weights([liar, 1.0]), max_share)
    plan = robust.plan_merge(config, shares)
    assert plan.trim == 0
    assert plan.shares == (0.5, 0.5)


def test_two_deltas_under_the_mean_keep_their_token_shares() -> None:
    """The mean stays token-weighted at two learners; only ``max_share`` below 2 caps it."""
    for max_share, want in ((None, 0.9), (2.0, 0.9), (1.5, 0.75)):
        config = AlgorithmConfig(sync_every=1, fragments=1, max_share=max_share)
        shares = verdicts.capped_shares(verdicts.normalized_weights([9.0, 1.0]), max_share)
        assert math.isclose(robust.plan_merge(config, shares).shares[0], want)


normal_norms = st.just(0.0) | st.floats(1e-200, 1e30)  # (a subnormal bound rounds coarsely)


@given(normal_norms, normal_norms, st.floats(1.0, 100.0))
def test_clipping_two_deltas_bounds_the_longer_by_the_shorter(
    a: float, b: float, factor: float
) -> None:
    """The clip bound is ``factor`` times the *lower* median norm: of two deltas, the
    shorter's. So a delta scaled x100 moves the commit at most ``factor`` times as far as
    the other one (the mean of the two norms, the plain median, would let it through)."""
    scales = robust.clip_scales([a, b], factor)
    short, long_ = sorted((a, b))
    assert scales[[a, b].index(short)] == 1.0
    assert max(n * s for n, s in zip((a, b), scales, strict=True)) <= factor * short * (1 + 1e-12)
    if long_ > factor * short:
        assert min(scales) < 1.0
