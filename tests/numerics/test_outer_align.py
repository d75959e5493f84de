"""Outer step, fused merge step, alignment and error-feedback updates against hand math."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numeric_strategies import contributions, fragment, layouts, seeds

from gm_core.numerics import (
    Contributions,
    Layout,
    align,
    apply_update,
    merge,
    merge_step,
    outer_step,
    publish_update,
    wire_layout,
)
from gm_core.records import Alignment, MergeRule, WireFormat

PATTERN = "embed"


@settings(max_examples=40, deadline=None)
@given(seeds(), st.integers(1, 50), st.integers(1, 4), st.floats(0.0, 1.5), st.floats(0.0, 0.99))
def test_nesterov_matches_scalar_hand_computation(
    seed: int, n: int, rounds: int, lr: float, beta: float
) -> None:
    """Element by element in Python floats: m ← βm + Δ; Θ ← Θ − η(Δ + βm)."""
    rng = np.random.default_rng(seed)
    theta, momentum = fragment(rng, n), fragment(rng, n)
    hand_theta, hand_m = theta.astype(np.float64), momentum.astype(np.float64)
    for _ in range(rounds):
        delta = fragment(rng, n)
        outer_step(theta, momentum, delta, lr, beta, final_only=False)
        for i in range(n):
            hand_m[i] = beta * hand_m[i] + float(delta[i])
            hand_theta[i] = hand_theta[i] - lr * (float(delta[i]) + beta * hand_m[i])
    scale = np.abs(hand_theta) + np.abs(hand_m) * (1 + lr) + 1.0
    np.testing.assert_array_less(np.abs(theta - hand_theta), 1e-5 * scale * rounds)
    np.testing.assert_array_less(np.abs(momentum - hand_m), 1e-5 * scale * rounds)


def test_nesterov_small_example() -> None:
    theta, m = np.array([1.0], np.float32), np.array([0.5], np.float32)
    outer_step(theta, m, np.array([0.25], np.float32), 0.5, 0.5, final_only=False)
    # m = 0.5·0.5 + 0.25 = 0.5; Θ = 1 − 0.5·(0.25 + 0.5·0.5) = 0.75
    assert (theta[0], m[0]) == (0.75, 0.5)


@settings(max_examples=40, deadline=None)
@given(layouts(), seeds(), st.integers(1, 5))
def test_lr_one_momentum_zero_is_federated_averaging(layout: Layout, seed: int, k: int) -> None:
    """Θ − Σ c_i (Θ − θ_i) = Σ c_i θ_i: the weighted average of the learners' parameters."""
    rng = np.random.default_rng(seed)
    anchor = fragment(rng, layout.total)
    learners = [anchor + fragment(rng, layout.total) for _ in range(k)]
    c = contributions(rng, k)
    theta, momentum = anchor.copy(), np.zeros(layout.total, np.float32)
    deltas = [anchor - t for t in learners]
    merge_step(deltas, c, layout, MergeRule.MEAN, PATTERN, theta, momentum, 1.0, 0.0)
    coefs = np.array(c.weights) / sum(c.weights)
    average = sum(w * t.astype(np.float64) for w, t in zip(coefs, learners, strict=True))
    magnitude = np.abs(anchor) + sum(np.abs(t) for t in learners)
    assert np.all(np.abs(theta - average) <= 1e-5 * magnitude)


@settings(max_examples=40, deadline=None)
@given(layouts(), seeds(), st.integers(1, 5), st.sampled_from(list(MergeRule)), st.booleans())
def test_fused_step_is_bit_identical_to_merge_then_step(
    layout: Layout, seed: int, k: int, rule: MergeRule, final: bool
) -> None:
    rng = np.random.default_rng(seed)
    deltas = [fragment(rng, layout.total) for _ in range(k)]
    c = contributions(rng, k)
    c = Contributions(learners=c.learners, weights=c.weights, final=(final,) * k)
    theta, momentum = fragment(rng, layout.total), fragment(rng, layout.total)
    theta2, momentum2 = theta.copy(), momentum.copy()
    merge_step(deltas, c, layout, rule, PATTERN, theta, momentum, 0.7, 0.9)
    merged = np.empty(layout.total, np.float32)
    merge(deltas, c, layout, rule, PATTERN, merged)
    outer_step(theta2, momentum2, merged, 0.7, 0.9, final_only=final)
    np.testing.assert_array_equal(theta, theta2)
    np.testing.assert_array_equal(momentum, momentum2)


def test_final_only_round_applies_the_plain_delta_and_keeps_momentum() -> None:
    layout = Layout.of([("w", (3,))])
    delta = np.array([1.0, 2.0, -4.0], np.float32)
    theta, momentum = (
        np.array([10.0, 10.0, 10.0], np.float32),
        np.array([1.0, 1.0, 1.0], np.float32),
    )
    c = Contributions(learners=("a",), weights=(1.0,), final=(True,))
    merge_step([delta], c, layout, MergeRule.MEAN, PATTERN, theta, momentum, 0.7, 0.9)
    assert theta.tolist() == [9.0, 8.0, 14.0]
    assert momentum.tolist() == [1.0, 1.0, 1.0]


@settings(max_examples=40, deadline=None)
@given(seeds(), st.integers(1, 300), st.floats(0.0, 1.0))
def test_alignment_rules(seed: int, n: int, mixing: float) -> None:
    rng = np.random.default_rng(seed)
    local, committed, snapshot = (fragment(rng, n) for _ in range(3))
    overwrite = local.copy()
    align(overwrite, committed, Alignment.OVERWRITE)
    np.testing.assert_array_equal(overwrite, committed)
    blend = local.copy()
    align(blend, committed, Alignment.BLEND, mixing)
    expected = (1 - mixing) * local.astype(np.float64) + mixing * committed.astype(np.float64)
    assert np.all(np.abs(blend - expected) <= 1e-6 * (np.abs(local) + np.abs(committed)))
    carry = local.copy()
    align(carry, committed, Alignment.CARRY, snapshot=snapshot)
    np.testing.assert_array_equal(carry, (local - snapshot) + committed)


def test_blend_with_mixing_one_is_overwrite() -> None:
    local, committed = np.array([3.0, -1.0], np.float32), np.array([0.1, 7.0], np.float32)
    align(local, committed, Alignment.BLEND, 1.0)
    np.testing.assert_array_equal(local, committed)


@settings(max_examples=30, deadline=None)
@given(
    layouts(), seeds(), st.sampled_from([WireFormat.F8_E4M3, WireFormat.F4_E2M1, WireFormat.BF16])
)
def test_error_feedback_mirror_tracks_master(layout: Layout, seed: int, fmt: WireFormat) -> None:
    """Followers applying the updates hold the mirror bit for bit; the residual never grows."""
    rng = np.random.default_rng(seed)
    wire = wire_layout(layout, fmt)
    master = fragment(rng, layout.total)
    mirror, follower = master.copy(), master.copy()
    codes, scales = np.empty(wire.code_bytes, np.uint8), np.empty(wire.scale_bytes, np.uint8)
    scratch = np.empty(layout.total, np.float32)
    worst_change = 0.0
    for _ in range(6):
        change = fragment(rng, layout.total) * np.float32(0.1)
        worst_change = max(worst_change, float(np.abs(change).max()))
        master += change
        publish_update(master, mirror, wire, codes, scales, scratch)
        apply_update(follower, codes, scales, wire, scratch)
        np.testing.assert_array_equal(follower, mirror)
        # Each round quantizes (old residual + change) and keeps at most a fraction ρ of its
        # largest element, so the residual r obeys r ≤ ρ(r + C): r ≤ ρC/(1 − ρ), every round.
        rho = {WireFormat.BF16: 2.0**-8, WireFormat.F8_E4M3: 2.0**-4, WireFormat.F4_E2M1: 0.5}[fmt]
        assert np.abs(master - mirror).max() <= rho / (1 - rho) * worst_change * (1 + 1e-6)
