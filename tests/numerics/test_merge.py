"""Merges: weighted mean and RDA invariants, embeddings, cosine, finiteness, ordering."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numeric_strategies import contributions, fragment, layouts, merge_bound, seeds

from gm_core.numerics import Contributions, Layout, all_finite, mean_pairwise_cosine, merge
from gm_core.records import MergeRule

PATTERN = "embed"


def merged(
    deltas: list[np.ndarray], c: Contributions, layout: Layout, rule: MergeRule
) -> np.ndarray:
    out = np.empty(layout.total, np.float32)
    merge(deltas, c, layout, rule, PATTERN, out)
    return out


def draw_case(layout: Layout, seed: int, k: int) -> tuple[list[np.ndarray], Contributions]:
    rng = np.random.default_rng(seed)
    return [fragment(rng, layout.total) for _ in range(k)], contributions(rng, k)


@settings(max_examples=50, deadline=None)
@given(layouts(), seeds(), st.integers(1, 6))
def test_weighted_mean_matches_float64(layout: Layout, seed: int, k: int) -> None:
    deltas, c = draw_case(layout, seed, k)
    weights = np.array(c.weights) / sum(c.weights)
    expected = sum(w * d.astype(np.float64) for w, d in zip(weights, deltas, strict=True))
    got = merged(deltas, c, layout, MergeRule.MEAN)
    assert np.all(np.abs(got - expected) <= merge_bound(deltas, c))


@settings(max_examples=50, deadline=None)
@given(layouts(), seeds(), st.integers(1, 6), st.sampled_from(list(MergeRule)), st.data())
def test_permutation_invariance(
    layout: Layout, seed: int, k: int, rule: MergeRule, data: st.DataObject
) -> None:
    """Relabelling learners (so they sort differently) changes only fp32 rounding."""
    deltas, c = draw_case(layout, seed, k)
    order = data.draw(st.permutations(range(k)))
    shuffled = Contributions(learners=c.learners, weights=tuple(c.weights[i] for i in order))
    a = merged(deltas, c, layout, rule)
    b = merged([deltas[i] for i in order], shuffled, layout, rule)
    rel = 2e-5 if rule is MergeRule.MEAN else 6e-5  # RDA adds the rounding of two norms
    assert np.all(np.abs(a - b) <= merge_bound(deltas, c, rel=rel))


@settings(max_examples=50, deadline=None)
@given(layouts(), seeds(), st.sampled_from(list(MergeRule)), st.floats(0.01, 100.0))
def test_single_contribution_is_the_identity(
    layout: Layout, seed: int, rule: MergeRule, weight: float
) -> None:
    delta = fragment(np.random.default_rng(seed), layout.total)
    c = Contributions(learners=("only",), weights=(weight,))
    got = merged([delta], c, layout, rule)
    np.testing.assert_allclose(got, delta, rtol=1e-6, atol=0)


@settings(max_examples=50, deadline=None)
@given(
    layouts(), seeds(), st.integers(1, 5), st.sampled_from(list(MergeRule)), st.integers(-20, 20)
)
def test_scaling(layout: Layout, seed: int, k: int, rule: MergeRule, exponent: int) -> None:
    """Scaling every weight changes nothing; scaling every delta by 2^e scales the merge."""
    deltas, c = draw_case(layout, seed, k)
    base = merged(deltas, c, layout, rule)
    heavier = Contributions(learners=c.learners, weights=tuple(7.0 * w for w in c.weights))
    np.testing.assert_allclose(merged(deltas, heavier, layout, rule), base, rtol=1e-5, atol=1e-30)
    factor = np.float32(2.0**exponent)
    scaled = merged([d * factor for d in deltas], c, layout, rule)
    np.testing.assert_allclose(scaled, base * factor, rtol=1e-5, atol=1e-30)


@settings(max_examples=50, deadline=None)
@given(layouts(), seeds(), st.integers(2, 5))
def test_rda_restores_the_weighted_mean_norm(layout: Layout, seed: int, k: int) -> None:
    """Per non-embedding tensor: direction of the mean, length Σ c_i ‖Δ_i‖."""
    deltas, c = draw_case(layout, seed, k)
    mean = merged(deltas, c, layout, MergeRule.MEAN)
    rda = merged(deltas, c, layout, MergeRule.RDA)
    coefs = np.array(c.weights) / sum(c.weights)
    for span in layout.spans:
        part = slice(span.start, span.stop)
        m = mean[part].astype(np.float64)
        if PATTERN in span.name or not np.any(m):
            np.testing.assert_array_equal(rda[part], mean[part])
            continue
        target = sum(
            w * np.linalg.norm(d[part].astype(np.float64))
            for w, d in zip(coefs, deltas, strict=True)
        )
        assert math.isclose(np.linalg.norm(rda[part].astype(np.float64)), target, rel_tol=1e-5)
        cos = float(m @ rda[part] / (np.linalg.norm(m) * np.linalg.norm(rda[part])))
        assert cos > 1 - 1e-6


def test_rda_differs_from_mean_when_deltas_disagree() -> None:
    layout = Layout.of([("w", (2,)), ("embed", (2,))])
    deltas = [np.array([1, 0, 1, 0], np.float32), np.array([0, 1, 0, 1], np.float32)]
    c = Contributions(learners=("a", "b"), weights=(1.0, 1.0))
    rda = merged(deltas, c, layout, MergeRule.RDA)
    np.testing.assert_allclose(rda[:2], [math.sqrt(0.5)] * 2, rtol=1e-6)
    np.testing.assert_array_equal(rda[2:], [0.5, 0.5])  # embedding: plain mean


def test_opposite_deltas_merge_to_zero_under_rda() -> None:
    layout = Layout.of([("w", (3,))])
    d = np.array([1, -2, 3], np.float32)
    c = Contributions(learners=("a", "b"), weights=(1.0, 1.0))
    assert not np.any(merged([d, -d], c, layout, MergeRule.RDA))


def test_contributions_must_be_sorted_unique_and_weighted() -> None:
    with pytest.raises(AssertionError, match="sorted"):
        Contributions(learners=("b", "a"), weights=(1.0, 1.0))
    with pytest.raises(AssertionError, match="sorted"):
        Contributions(learners=("a", "a"), weights=(1.0, 1.0))
    with pytest.raises(AssertionError):
        Contributions(learners=("a",), weights=(float("nan"),))
    with pytest.raises(AssertionError, match="zero"):
        Contributions(learners=("a", "b"), weights=(0.0, 0.0))
    assert Contributions(learners=("a", "b"), weights=(1, 2), final=(True, True)).all_final
    assert not Contributions(learners=("a", "b"), weights=(1, 2), final=(True, False)).all_final
    assert not Contributions(learners=("a",), weights=(1.0,)).all_final


@settings(max_examples=50, deadline=None)
@given(seeds(), st.integers(1, 500), st.sampled_from([np.nan, np.inf, -np.inf]))
def test_all_finite_finds_any_bad_element(seed: int, n: int, bad: float) -> None:
    rng = np.random.default_rng(seed)
    x = fragment(rng, n, spread=100.0)
    assert all_finite(x)
    x[rng.integers(n)] = bad
    assert not all_finite(x)


@settings(max_examples=50, deadline=None)
@given(seeds(), st.integers(1, 400), st.integers(2, 5))
def test_cosine(seed: int, n: int, k: int) -> None:
    rng = np.random.default_rng(seed)
    deltas = [fragment(rng, n) for _ in range(k)]
    cos = mean_pairwise_cosine(deltas)
    assert cos is not None
    expected = np.mean(
        [
            float(deltas[i].astype(np.float64) @ deltas[j])
            / (
                np.linalg.norm(deltas[i].astype(np.float64))
                * np.linalg.norm(deltas[j].astype(np.float64))
                or 1.0
            )
            for i in range(k)
            for j in range(i + 1, k)
        ]
    )
    assert math.isclose(cos, expected, abs_tol=1e-5)
    assert mean_pairwise_cosine(deltas[:1]) is None
    if np.any(deltas[0]):
        same = mean_pairwise_cosine([deltas[0], 3 * deltas[0]])
        opposite = mean_pairwise_cosine([deltas[0], -deltas[0]])
        assert same is not None
        assert math.isclose(same, 1.0, rel_tol=1e-5)
        assert opposite is not None
        assert math.isclose(opposite, -1.0, rel_tol=1e-5)
